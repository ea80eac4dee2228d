"""Contract tests of every lua/threads script: each ``Output`` code of its header, by hand-built
KEYS/ARGV, on fakeredis, a real Redis and a real Redis Cluster."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from redis.crc import key_slot

from memtier.errors import ScriptError
from memtier.keys import OwnerKeys, ThreadKeys, ThreadKeyspace
from memtier.scripts import expand_includes, load_registry, lua_root
from memtier.threads.core import ThreadStatus as S
from memtier.threads.models import MARKER

SCRIPTS = load_registry("threads")
NOW = 1_700_000_000_000
OWNER = ("acme", "alice")


class Harness:
    def __init__(self, backend: Any) -> None:
        self.client = backend.sync_client()
        self.owner: OwnerKeys = ThreadKeyspace(backend.namespace).owner("acme", "alice")
        self.keys: ThreadKeys = self.owner.thread("conv_1")

    def run(self, name: str, keys: tuple[str, ...], *args: Any) -> list[Any]:
        reply = SCRIPTS[name](self.client, keys, args)
        return [x.decode() if isinstance(x, bytes) else x for x in reply]

    def create(self, fingerprint: str = "fp", max_threads: int = 100, **kw: Any) -> list[Any]:
        k = self.keys
        title = kw.get("title")
        return self.run(
            "create",
            (k.thread, self.owner.index),
            MARKER,
            "conv_1",
            "acme",
            "alice",
            kw.get("now", NOW),
            "0" if title is None else "1",
            title or "",
            "{}",
            fingerprint,
            f"{NOW:020d}|conv_1",
            max_threads,
        )

    def fields(self) -> dict[str, str]:
        raw = self.client.hgetall(self.keys.thread)
        return {k.decode(): v.decode() for k, v in raw.items()}

    def claim(self, request_id: str = "r1", token: str = "tok1", **kw: Any) -> list[Any]:
        k = self.keys
        record = json.dumps({"s": "running", "tok": token, "fp": kw.get("fp", "fp1"), "at": NOW})
        return self.run(
            "run_claim",
            (k.thread, k.runs, k.lease, k.parents, k.events, k.entries),
            MARKER,
            request_id,
            token,
            kw.get("fp", "fp1"),
            kw.get("lease_ms", 30_000),
            kw.get("leaf", ""),
            kw.get("max_entries", 100),
            2,
            kw.get("max_events", 1000),
            10,
            kw.get("max_bytes", 10**9),
            kw.get("turn_bytes", 1000),
            record,
            *kw.get("owner", ("acme", "alice")),
            NOW,
            f'{{"requestId":"{request_id}","leafId":',
            "}",
            '{"entryId":',
            ',"content":"hi"}',
            kw.get("inline_bytes", 10**6),
            # (incarnation, path entries held, last id, where it ends in the path's text)
            *kw.get("known", ("", 0, "", 0)),
            0,
        )

    def commit(self, request_id: str = "r1", token: str = "tok1", count: int = 0) -> list[Any]:
        k = self.keys
        u, a = f"e{count + 1}", f"e{count + 2}"
        parent = "" if count == 0 else f"e{count}"
        done = json.dumps({"s": "done", "tok": token, "fp": "fp1", "res": {"status": "completed"}})
        return self.run(
            "run_commit",
            (k.thread, k.entries, k.parents, k.runs, k.lease, k.events),
            MARKER,
            token,
            request_id,
            NOW,
            count,
            a,
            done,
            2,
            1,
            "",  # no run-limit usage
            u,
            parent,
            json.dumps({"id": u}),
            a,
            u,
            json.dumps({"id": a}),
            "agent_finished",
            "{}",
        )

    def turn(self, request_id: str, token: str, count: int) -> None:
        assert self.claim(request_id, token)[0] == S.OK
        assert self.commit(request_id, token, count) == [S.OK]


def split_claim(
    reply: list[Any], known: int = 0
) -> tuple[list[Any], dict[str, str], list[str], list[Any]]:
    """run_claim's OK reply: (status, base, count, first), thread hash, the path ids sent,
    inline entries; ``known``: how many path entries it must say the caller holds."""
    n_fields = reply[4]
    flat = reply[5 : 5 + n_fields]
    n_path, n_known = reply[5 + n_fields], reply[6 + n_fields]
    assert n_known == known
    sent = n_path - n_known
    path = reply[7 + n_fields : 7 + n_fields + sent]
    return (
        reply[:4],
        dict(zip(flat[::2], flat[1::2], strict=True)),
        path,
        reply[7 + n_fields + sent :],
    )


@pytest.fixture
def h(backend: Any) -> Harness:
    return Harness(backend)


def test_every_script_is_registered_with_its_key_count() -> None:
    assert {s.name: s.num_keys for s in SCRIPTS} == {
        "archive": 1,
        "branch": 2,
        "create": 2,
        "delete": 8,
        "events_append": 3,
        "hold": 1,
        "lease_renew": 2,
        "read_events": 3,
        "run_abort": 4,
        "run_cancel": 4,
        "run_claim": 6,
        "run_commit": 6,
    }


def test_all_keys_of_an_owner_share_one_slot() -> None:
    for tenant, user in [("acme", "alice"), ("t", "u+x@example.com"), ("a.b-c_d", "0")]:
        owner = ThreadKeyspace("ns").owner(tenant, user)
        keys = [
            owner.index,
            owner.recent_deletes,
            *owner.thread("conv_1").all(),
            *owner.thread("other").all(),
        ]
        assert len({key_slot(k.encode()) for k in keys}) == 1
    assert ThreadKeyspace("ns").owner("acme", "alice").tag == "{ns:o:acme:alice}"


def test_create(h: Harness) -> None:
    created = h.create(title="t")
    assert created[0] == S.OK
    assert dict(zip(created[1::2], created[2::2], strict=True))["title"] == "t"
    assert h.create(title="t")[0] == S.EXISTED  # same fingerprint
    assert h.create("other") == [S.METADATA_CONFLICT]
    assert h.client.zcard(h.owner.index) == 1
    second = Harness.__new__(Harness)
    second.__dict__.update(h.__dict__)
    second.keys = h.owner.thread("conv_2")
    assert second.create(max_threads=1) == [S.LIMIT_EXCEEDED, 1]
    with pytest.raises(ScriptError):
        h.run("create", (h.keys.thread, h.owner.index), MARKER, "x", "a", "u", "soon")


def test_branch(h: Harness) -> None:
    k = (h.keys.thread, h.keys.parents)
    assert h.run("branch", k, MARKER, "e1", 1, 16, NOW, *OWNER) == [S.NOT_FOUND]
    h.create()
    h.turn("r1", "t1", 0)
    assert h.run("branch", k, MARKER, "e9", 1, 16, NOW, *OWNER) == [S.UNKNOWN_LEAF]
    assert h.run("branch", k, MARKER, "e2", 1, 0, NOW, *OWNER) == [S.BRANCH_LIMIT, 0]
    ok = h.run("branch", k, MARKER, "e2", 1, 16, NOW, *OWNER)
    assert ok[0] == S.OK and h.fields()["version"] == "2"
    assert json.loads(h.fields()["branches"]) == [{"leafId": "e2", "createdAt": str(NOW)}]
    assert h.run("branch", k, MARKER, "e2", 0, 16, NOW, *OWNER)[0] == S.EXISTED  # already a ref
    assert h.run("branch", k, MARKER, "e1", 1, 16, NOW, *OWNER) == [S.METADATA_CONFLICT, 2]
    h.client.hset(h.keys.thread, "state", "archived")
    assert h.run("branch", k, MARKER, "e1", 2, 16, NOW, *OWNER) == [S.THREAD_ARCHIVED]
    with pytest.raises(ScriptError):
        h.run("branch", k, MARKER, "", 1, 16, NOW, *OWNER)


def test_archive(h: Harness) -> None:
    k = (h.keys.thread,)
    assert h.run("archive", k, MARKER, 1, NOW, *OWNER) == [S.NOT_FOUND]
    h.create()
    assert h.run("archive", k, MARKER, 7, NOW, *OWNER) == [S.METADATA_CONFLICT, 1]
    assert h.run("archive", k, MARKER, 1, NOW + 5, *OWNER)[0] == S.OK
    assert h.fields()["state"] == "archived" and h.fields()["version"] == "2"
    assert h.run("archive", k, MARKER, 0, NOW, *OWNER)[0] == S.EXISTED
    assert h.fields()["version"] == "2"
    with pytest.raises(ScriptError):
        h.run("archive", k, MARKER, -1, NOW, *OWNER)


def test_hold_and_delete(h: Harness) -> None:
    k = h.keys
    all_keys = (*k.all(), h.owner.index, h.owner.recent_deletes)

    def delete(token: str = "d1", now: int = NOW) -> list[Any]:
        return h.run("delete", all_keys, MARKER, *OWNER, "conv_1", token, now, 600_000, 3)

    assert h.run("hold", (k.thread,), MARKER, "1", *OWNER) == [S.NOT_FOUND]
    assert delete() == [S.NOT_FOUND]
    h.create()
    h.turn("r1", "t1", 0)
    assert h.run("hold", (k.thread,), MARKER, "1", *OWNER)[0] == S.OK
    assert delete() == [S.HELD]  # held: nothing removed
    assert h.client.exists(k.thread, k.entries, k.parents, k.runs, k.events) == 5
    h.run("hold", (k.thread,), MARKER, "0", *OWNER)
    assert delete() == [S.OK]
    assert h.client.exists(*all_keys[:-1]) == 0
    assert delete() == [S.DONE]  # a retry of the same delete (its reply was lost)
    assert delete("d2") == [S.NOT_FOUND]  # another delete: the thread is gone
    # the recent-deletes set is bounded by age and by size
    for i in range(5):
        h.create()
        assert h.run("delete", all_keys, MARKER, *OWNER, "conv_1", f"x{i}", NOW + 1, 600_000, 3)
    assert h.client.zcard(h.owner.recent_deletes) == 3
    h.create()
    assert delete("late", NOW + 700_000) == [S.OK]
    assert h.client.zrange(h.owner.recent_deletes, 0, -1) == [b"conv_1|late"]
    with pytest.raises(ScriptError):
        h.run("hold", (k.thread,), MARKER, "yes", *OWNER)


def test_run_claim_outcomes(h: Harness) -> None:
    assert h.claim() == [S.NOT_FOUND]
    h.create()
    h.turn("r1", "t1", 0)
    assert h.claim("r1", "t2", fp="other") == [S.REQUEST_CONFLICT]
    done = h.claim("r1", "t2")
    assert done[0] == S.DONE and json.loads(done[1])["s"] == "done"
    assert h.claim("r2", "t2", leaf="e1") == [S.UNKNOWN_LEAF]
    assert h.claim("r2", "t2", max_entries=3) == [S.LIMIT_EXCEEDED, "entries"]
    assert h.claim("r2", "t2", max_events=10) == [S.LIMIT_EXCEEDED, "events"]
    assert h.claim("r2", "t2", max_bytes=10, turn_bytes=100) == [S.LIMIT_EXCEEDED, "bytes"]
    rows_before = h.client.xlen(h.keys.events)
    claimed = h.claim("r2", "t2")
    # base, count, first entry number (from the never-reused id sequence), the thread hash,
    # the path root -> base, then the path's entries inline (root first)
    head, fields, path, inline = split_claim(claimed)
    assert head == [S.OK, "e2", 2, 3]
    assert fields["eidseq"] == "4" and fields["eseq"] == "1" and fields["marker"] == MARKER
    assert path == ["e1", "e2"]
    assert [json.loads(x)["id"] for x in inline] == ["e1", "e2"]
    # the opening rows (emit batch 1), their data filled in with the base and the first id
    rows = h.client.xrange(h.keys.events)[rows_before:]
    assert [(r[1][b"type"], json.loads(r[1][b"data"])) for r in rows] == [
        (b"agent_started", {"requestId": "r2", "leafId": "e2"}),
        (b"user_message", {"entryId": "e3", "content": "hi"}),
    ]
    assert int(fields["bytes"]) == int(h.fields()["bytes"])
    # a replay of our own claim (its reply was lost): the same turn, the same ids, and the
    # opening rows are not written twice
    replayed = h.claim("r2", "t2")
    assert replayed == claimed
    assert h.client.xlen(h.keys.events) == rows_before + 2
    # the inline history stops at inline_bytes (the caller reads the rest by id)
    _, _, path_again, part = split_claim(h.claim("r2", "t2", inline_bytes=20))
    assert path_again == path and len(part) == 1
    assert split_claim(h.claim("r2", "t2", inline_bytes=0))[3] == []
    assert h.claim("r2", "t3") == [S.REQUEST_IN_PROGRESS]  # a duplicate while it runs
    assert h.claim("r3", "t4") == [S.THREAD_BUSY]  # another request while it runs
    h.client.delete(h.keys.lease)  # the first attempt died: its lease expired
    assert h.claim("r2", "t5")[0] == S.OK  # abandoned run taken over
    h.client.hset(h.keys.thread, "state", "archived")
    h.client.delete(h.keys.lease)
    assert h.claim("r9", "t6") == [S.THREAD_ARCHIVED]
    with pytest.raises(ScriptError):
        h.claim("r9", "t6", lease_ms=0)


def test_run_claim_sends_only_the_path_after_what_the_caller_holds(h: Harness) -> None:
    """The first claim sets the thread's incarnation ("inc", its token); a claim naming
    that incarnation, a path length and the id at that place gets only what follows; any
    other naming (another incarnation, id or place, a longer path than the thread's) gets
    the whole path.  A thread deleted and created again has a new incarnation."""
    h.create()
    h.turn("r1", "t1", 0)
    inc = h.fields()["inc"]
    assert inc == "t1"  # set once, by the first claim
    h.turn("r2", "t2", 2)
    assert h.fields()["inc"] == inc  # never changed after that
    full = split_claim(h.claim("r3", "t3"))
    assert full[2] == ["e1", "e2", "e3", "e4"] and len(full[3]) == 4
    for known in [(inc, 2, "e2", 5), (inc, 4, "e4", 11), (inc, 1, "e1", 2)]:
        head, fields, ids, inline = split_claim(h.claim("r3", "t3", known=known), known[1])
        assert head == full[0] and fields == full[1]
        assert ids == full[2][known[1] :] and inline == full[3][known[1] :]
    for known in [
        ("other", 2, "e2", 5),  # another incarnation
        (inc, 2, "e3", 5),  # another id at that place
        (inc, 5, "e4", 11),  # more entries than the thread has
        (inc, 3, "e4", 50),  # past the path's text, and not its place
        ("", 2, "e2", 5),
    ]:
        assert split_claim(h.claim("r3", "t3", known=known)) == full
    # The right id at the right place, a wrong end: the whole cached path is split and the
    # place checked there (as for a path walked without a cache): the same answer.
    two = split_claim(h.claim("r3", "t3", known=(inc, 2, "e2", 5)), 2)
    for end in (4, 8, 50):
        assert split_claim(h.claim("r3", "t3", known=(inc, 2, "e2", end)), 2) == two
    h.client.delete(h.keys.lease)
    for key in (*h.keys.all(), h.owner.index):  # as if deleted (delete's own test: below)
        h.client.delete(key)
    h.create()
    h.turn("r4", "t4", 0)
    assert h.fields()["inc"] == "t4"  # the new incarnation
    again = split_claim(h.claim("r5", "t5", known=(inc, 2, "e2", 5)))  # the old cache's naming
    assert again[2] == ["e1", "e2"] and len(again[3]) == 2


def test_the_path_finder_matches_whole_ids_only(h: Harness) -> None:
    """``thread_path_find`` (run_claim's walk, which stops at an entry the cached path
    holds): the place where a whole id starts in a
    cached path, against a model, on paths whose ids contain each other ("e1" in "e12",
    "e2" in "e12", "e12" in "e123"), in any order, the id present or not."""
    source = expand_includes(
        '--- @include "thread_common"\nreturn thread_path_find(ARGV[1], ARGV[2]) or 0',
        lua_root(),
    )
    rng = random.Random(12)
    universe = ["e1", "e2", "e12", "e21", "e123", "e3", "e31", "e1e", "x", "e"]
    for _ in range(150):
        ids = rng.sample(universe, rng.randint(1, 7))
        target = rng.choice(universe)
        cached = " ".join(ids)
        expected = 1 + sum(len(i) + 1 for i in ids[: ids.index(target)]) if target in ids else 0
        got = h.client.eval(source, 1, h.keys.parents, cached, target)
        assert got == expected, (cached, target)


def test_the_path_check_matches_whole_ids_at_their_place_only(h: Harness) -> None:
    """``thread_path_has_at`` (run_claim's skip): true exactly when a whole id of a cached
    path ends at the given byte, against a model, on paths whose ids contain each other
    ("e1" in "e12", "e2" in "e12", "e12" in "e123"), at every byte from before the text to
    past it, ids present or not, and the empty id."""
    source = expand_includes(
        '--- @include "thread_common"\n'
        "return thread_path_has_at(ARGV[1], ARGV[2], tonumber(ARGV[3])) and 1 or 0",
        lua_root(),
    )
    rng = random.Random(12)
    universe = ["e1", "e2", "e12", "e21", "e123", "e3", "e31", "e1e", "x", "e", ""]
    for _ in range(60):
        ids = rng.sample(universe[:-1], rng.randint(1, 7))
        target = rng.choice(universe)
        cached = " ".join(ids)
        ends = {sum(len(i) + 1 for i in ids[: k + 1]) - 1: i for k, i in enumerate(ids)}
        for at_end in range(-1, len(cached) + 3):
            expected = 1 if target and ends.get(at_end) == target else 0
            got = h.client.eval(source, 1, h.keys.parents, cached, target, at_end)
            assert got == expected, (cached, target, at_end)


def test_run_claim_lease_expires(h: Harness) -> None:
    h.create()
    assert h.claim("r1", "t1", lease_ms=1)[0] == S.OK
    assert h.client.pttl(h.keys.lease) <= 1


def test_events_append_and_lease_renew(h: Harness) -> None:
    k = h.keys
    ev = (k.thread, k.events, k.lease)
    assert h.run("events_append", ev, MARKER, "t1", 1, 30000, NOW, "r1", 0) == [S.NOT_FOUND]
    assert h.run("lease_renew", (k.thread, k.lease), MARKER, "t1", 30000) == [S.NOT_FOUND]
    h.create()
    h.claim("r1", "t1")
    assert h.run("events_append", ev, MARKER, "bad", 1, 30000, NOW, "r1", 0) == [S.LEASE_LOST]
    # run_claim wrote the opening rows (batch 1, ids NOW-0 and NOW-1): the runner's are 2, 3...
    assert h.run("events_append", ev, MARKER, "t1", 1, 30000, NOW, "r1", 1, "a", "{}") == [
        S.EXISTED
    ]
    appended = h.run(
        "events_append", ev, MARKER, "t1", 2, 30000, NOW, "r1", 2, "a", "{}", "b", "{}"
    )
    assert appended[0] == S.OK and appended[1] == f"{NOW}-3"
    again = h.run("events_append", ev, MARKER, "t1", 2, 30000, NOW, "r1", 1, "a", "{}")
    assert again == [S.EXISTED]  # batch seq 2 already applied
    assert h.client.xlen(k.events) == 4
    # a clock that went backwards still appends after the newest row
    later = h.run("events_append", ev, MARKER, "t1", 3, 30000, NOW - 5000, "r1", 1, "c", "{}")
    assert later[1] == f"{NOW}-4"
    assert h.run("lease_renew", (k.thread, k.lease), MARKER, "t1", 30000) == [S.OK]
    assert h.run("lease_renew", (k.thread, k.lease), MARKER, "zz", 30000) == [S.LEASE_LOST]
    with pytest.raises(ScriptError):
        h.run("events_append", ev, MARKER, "t1", 4, 30000, NOW, "r1", 2, "only-one", "{}")
    # ... and so does every row of one call after the first (which alone reads the newest)
    rows = ("d", "{}", "e", "{}", "f", "{}")
    batch = h.run("events_append", ev, MARKER, "t1", 4, 30000, NOW - 5000, "r1", 3, *rows)
    assert batch[1] == f"{NOW}-7"
    ids = [i.decode() for i, _ in h.client.xrange(k.events)]
    assert ids == [f"{NOW}-{n}" for n in range(8)]


def test_run_commit_outcomes(h: Harness) -> None:
    assert h.commit() == [S.NOT_FOUND]
    h.create()
    h.claim("r1", "t1")
    assert h.commit("r1", "other") == [S.LEASE_LOST]
    assert h.commit("r1", "t1", count=5) == [S.LEASE_LOST]  # entry ids were derived from 0
    assert h.commit("r1", "t1") == [S.OK]
    assert h.commit("r1", "t1") == [S.DONE]  # a replayed commit changes nothing
    fields = h.fields()
    assert (fields["entries"], fields["head"]) == ("2", "e2")
    assert h.client.exists(h.keys.lease) == 0
    assert h.client.hget(h.keys.parents, "e2") == b"e1"
    assert h.client.xlen(h.keys.events) == 3  # the claim's 2 opening rows + 1
    # ... also once another request holds the thread (the lease is not this run's: its
    # done record answers, and nothing of the other run changes)
    assert h.claim("r2", "t2")[0] == S.OK
    assert h.commit("r1", "t1") == [S.DONE]
    assert h.client.get(h.keys.lease) == b"t2"
    assert h.commit("r2", "t2", count=2) == [S.OK]  # the holder's own first commit
    assert h.client.hget(h.keys.thread, "head") == b"e4"


def test_run_abort_outcomes(h: Harness) -> None:
    k = h.keys
    abort = (k.thread, k.runs, k.lease, k.events)
    assert h.run("run_abort", abort, MARKER, "t1", "r1", NOW, "error", "{}") == [S.NOT_FOUND]
    h.create()
    h.claim("r1", "t1")
    assert h.run("run_abort", abort, MARKER, "zz", "r1", NOW, "error", "{}") == [S.LEASE_LOST]
    assert h.run("run_abort", abort, MARKER, "t1", "r1", NOW, "error", "{}") == [S.OK]
    assert h.client.hexists(k.runs, "r1") == 0 and h.client.exists(k.lease) == 0
    assert h.claim("r1", "t2")[0] == S.OK  # the request may run again


def test_read_events(h: Harness) -> None:
    k = h.keys
    read = (k.thread, k.events, k.lease)
    assert h.run("read_events", read, MARKER, "-", 10, *OWNER) == [S.NOT_FOUND]
    h.create()
    assert h.run("read_events", read, MARKER, "-", 10, *OWNER) == [S.OK, 0, ""]
    h.turn("r1", "t1", 0)
    assert h.run("read_events", read, MARKER, "-", 10, *OWNER)[:3] == [S.OK, 0, "agent_finished"]
    h.claim("r2", "t2")
    assert h.run("read_events", read, MARKER, "-", 10, *OWNER)[1] == 1  # a turn holds the lease
    h.client.xadd(k.events, {"type": "raw", "data": "{}"})  # not written by the service
    reply = h.run("read_events", read, MARKER, "-", 10, *OWNER)
    assert reply[:3] == [S.OK, 1, ""]  # the newest row is not a redacted one
    rows = [reply[3 + 5 * i : 8 + 5 * i] for i in range((len(reply) - 3) // 5)]
    assert [(r[1], r[3], r[4]) for r in rows] == [
        ("agent_started", "r1", "1"),
        ("user_message", "r1", "1"),
        ("agent_finished", "r1", "1"),
        ("agent_started", "r2", "1"),
        ("user_message", "r2", "1"),
        ("raw", "", ""),
    ]
    after = h.run("read_events", read, MARKER, "(" + rows[-2][0], 10, *OWNER)
    assert after[4] == "raw" and len(after) == 8
    assert h.run("read_events", read, MARKER, "(0-0", 1, *OWNER)[3] == rows[0][0]
    with pytest.raises(ScriptError):
        h.run("read_events", read, MARKER, "-", 0, *OWNER)


@pytest.mark.parametrize("stored_owner", [("evil", "alice"), ("acme", "mallory")])
def test_every_writing_script_checks_the_stored_owner_before_it_writes(
    h: Harness, stored_owner: tuple[str, str]
) -> None:
    """A row under the caller's key whose stored owner differs (corruption, a hand-written
    row) is not-found to every script, and no script changes a byte of it."""
    h.create()
    h.turn("r1", "t1", 0)
    h.client.hset(h.keys.thread, mapping={"tenant": stored_owner[0], "user": stored_owner[1]})
    k = h.keys
    before = {key: h.client.dump(key) for key in (*k.all(), h.owner.index)}
    all_keys = (*k.all(), h.owner.index, h.owner.recent_deletes)
    assert h.run("branch", (k.thread, k.parents), MARKER, "e2", 1, 16, NOW, *OWNER) == [S.NOT_FOUND]
    assert h.run("archive", (k.thread,), MARKER, 1, NOW, *OWNER) == [S.NOT_FOUND]
    assert h.run("hold", (k.thread,), MARKER, "1", *OWNER) == [S.NOT_FOUND]
    assert h.run("delete", all_keys, MARKER, *OWNER, "conv_1", "d", NOW, 600_000, 10) == [
        S.NOT_FOUND
    ]
    assert h.claim("r2", "t2") == [S.NOT_FOUND]
    assert h.run("read_events", (k.thread, k.events, k.lease), MARKER, "-", 10, *OWNER) == [
        S.NOT_FOUND
    ]
    assert h.create() == [S.METADATA_CONFLICT]  # same fingerprint, but not this owner's row
    cancel = (k.thread, k.runs, k.lease, k.events)
    assert h.run("run_cancel", cancel, MARKER, "r1", *OWNER, NOW, "{}") == [S.NOT_FOUND]
    assert {key: h.client.dump(key) for key in before} == before
    assert h.client.exists(h.owner.recent_deletes) == 0
