"""Issue 12 (threads, branch threadsfast): the history a continue hands its runner, cheaper.

* ``run_claim`` reads the path root -> base from a cache in the parents hash (``~path``,
  extended by ``run_commit``) instead of one ``HGET`` per entry: a generated adversary
  (turns on the head and on older leaves, failed and denied turns, lost claim replies,
  a corrupt cache) checks after every step that the cache, where there is one, is the
  true path of the entry it ends at, and that the runner saw exactly the branch path.
* ``run_claim`` sends only the path after what this process's :class:`HistoryCache`
  holds: a generated adversary (turns on the head and on older leaves, turns by another
  process, the thread deleted and created again under the same id with other content,
  inline budgets down to nothing) checks that every runner sees exactly the history as
  stored; a commit keeps its own two entries, so a turn on the head is sent none, and
  an adversary that swaps the cache during the runner for another branch of the same
  length cannot make the commit extend that one.
* :class:`HistoryCache` hands back what it kept, and keeps its bounds.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from threadhelpers import OWNER, ModelRunner, counter_by_label

from memtier.threads import (
    ConversationService,
    historycache,
)
from memtier.threads import turns as turns_module
from memtier.threads.historycache import HistoryCache, KnownHistory
from memtier.threads.models import ConversationEntry
from memtier.threads.records import entry_from_json, entry_row
from memtier.threads.runner import RunnerReply, RunnerTurn

PATH_FIELD = "~path"


def _true_path(client: Any, parents_key: str, leaf: str) -> list[str]:
    path, cursor = [], leaf
    for _ in range(10_000):  # bounded: a path is never longer than the thread
        if not cursor:
            break
        path.append(cursor)
        raw = client.hget(parents_key, cursor)
        assert raw is not None, f"dangling parent of {cursor}"
        cursor = raw.decode() if isinstance(raw, bytes) else raw
    path.reverse()
    return path


@contextmanager
def _one_thread(
    backend: Any, runner: Any, **config: Any
) -> Iterator[tuple[Any, ConversationService, str, Any]]:
    """A service on a new client of ``backend`` (``config``: its config sections) with
    ``runner``, and one new thread: ``(client, service, thread id, the thread's keys)``;
    the service is closed after."""
    client = backend.sync_client()
    service = ConversationService(client, backend.config(**config), runner=runner)
    try:
        tid = service.create(OWNER).id
        yield (
            client,
            service,
            tid,
            service.core.keyspace.owner(OWNER.tenant_id, OWNER.user_id).thread(tid),
        )
    finally:
        service.close()


_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["ok", "ok", "ok", "fail", "deny"]),
        st.integers(min_value=-1, max_value=8),  # continue from the n-th reply (-1: head)
        st.sampled_from(["keep", "keep", "keep", "drop", "forge"]),  # what happens to ~path
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=_STEPS)
@example(steps=[("ok", -1, "keep"), ("ok", -1, "keep"), ("ok", 0, "keep"), ("ok", -1, "keep")])
@example(steps=[("ok", -1, "keep"), ("ok", -1, "forge"), ("ok", -1, "keep")])
@example(steps=[("ok", -1, "keep"), ("fail", -1, "keep"), ("deny", 0, "drop"), ("ok", 0, "keep")])
def test_the_path_cache_is_always_the_true_path_of_its_leaf(
    backend: Any, steps: list[tuple[str, int, str]]
) -> None:
    runner = ModelRunner()
    with _one_thread(backend, runner) as (client, service, tid, keys):
        replies: list[str] = []
        head: str | None = None
        for outcome, from_reply, cache_fate in steps:
            if cache_fate == "drop":
                client.hdel(keys.parents, PATH_FIELD)
            elif cache_fate == "forge" and head is not None:
                # a cache that does not end at the base is never used: written by hand,
                # by an older version, or for another leaf
                client.hset(keys.parents, PATH_FIELD, "e999 e1000")
            runner.outcome = outcome
            leaf = replies[from_reply] if 0 <= from_reply < len(replies) else None
            if leaf is not None:
                service.branch(OWNER, tid, leaf)
            base = leaf or head
            expected = tuple(_true_path(client, keys.parents, base)) if base else ()
            try:
                result = service.continue_(OWNER, tid, "hi", leaf_id=leaf)
            except Exception as exc:  # the failing runner
                assert outcome == "fail", exc
                result = None
            assert runner.seen[-1] == expected
            if result is not None and result.entries:
                replies.append(result.entries[-1].id)
                head = result.entries[-1].id
            cached = client.hget(keys.parents, PATH_FIELD)
            if cached is not None:
                ids = cached.decode().split(" ")
                if ids != ["e999", "e1000"]:  # the forged one stays until overwritten
                    assert ids == _true_path(client, keys.parents, ids[-1])


def test_a_continue_on_the_head_walks_no_parents(backend: Any) -> None:
    """Once cached, the claim reads the path in one HGET: no HGET per entry."""
    runner = ModelRunner()
    with _one_thread(backend, runner) as (client, service, tid, keys):
        for _ in range(6):
            service.continue_(OWNER, tid, "hi")
        cached = client.hget(keys.parents, PATH_FIELD)
        assert cached is not None
        assert cached.decode().split(" ") == [f"e{i}" for i in range(1, 13)]
        assert runner.seen[-1] == tuple(f"e{i}" for i in range(1, 11))


@pytest.mark.parametrize("fork_turn", [1, 2, 9])
def test_a_turn_on_another_branch_walks_back_only_to_where_the_branches_part(
    backend: Any, fork_turn: int
) -> None:
    """The cache holds one leaf's path; a turn on another branch walks the parents back
    to an entry that path holds (its text up to there is that entry's path), not to the
    root.  Shown by removing the parent links before the fork once they are cached: a
    walk past the fork would find no parent there and hand the runner a cut history.
    The walk back from the old head is longer than the steps looked up in the text by
    find, the rest in a set of the cached ids (fork_turn 1 and 2), or within them (9)."""
    runner = _HistoryRunner()
    with _one_thread(backend, runner) as (client, service, tid, keys):
        replies = [service.continue_(OWNER, tid, f"m{i}").entries[-1].id for i in range(10)]
        head, leaf = replies[-1], replies[fork_turn - 1]
        on_head = _stored_history(client, keys, head)
        service.branch(OWNER, tid, leaf)
        on_branch = _stored_history(client, keys, leaf)
        service.continue_(OWNER, tid, "on the branch", leaf_id=leaf)
        assert runner.seen[-1] == on_branch  # the leaf is on the cached head path: no walk
        before_fork = [e.id for e in on_branch[:-1]]
        if before_fork:
            client.hdel(keys.parents, *before_fork)  # never read again if the walk stops
        service.branch(OWNER, tid, head)  # the old head is a leaf now: the branch moved on
        service.continue_(OWNER, tid, "on the old head again", leaf_id=head)
        assert runner.seen[-1] == on_head
        cached = client.hget(keys.parents, PATH_FIELD)
        assert cached is not None
        assert cached.decode().split(" ")[: len(on_head)] == [e.id for e in on_head]


# --- HistoryCache: the claim sends only what follows the path this process holds --------


class _HistoryRunner:
    """Records the whole history each turn saw (the entries, not only their ids)."""

    def __init__(self) -> None:
        self.seen: list[tuple[ConversationEntry, ...]] = []

    def __call__(self, turn: RunnerTurn) -> RunnerReply:
        self.seen.append(tuple(turn.history))
        return RunnerReply(f"reply to {turn.message}")


def _stored_history(client: Any, keys: Any, base: str | None) -> tuple[ConversationEntry, ...]:
    """The path root -> base as stored, decoded without any cache."""
    if not base:
        return ()
    ids = _true_path(client, keys.parents, base)
    return tuple(entry_from_json(client.hget(keys.entries, i)) for i in ids)


_CACHE_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("turn"), st.integers(-1, 6)),  # from the n-th reply (-1: the head)
        st.tuples(st.just("recreate"), st.just(0)),  # delete, create again under the same id
        st.tuples(st.just("elsewhere"), st.integers(-1, 6)),  # a turn by another process
        st.tuples(st.just("limit"), st.integers(0, 2)),  # the inline budget: 1 MiB, 0, 150 B
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=_CACHE_STEPS)
# same ids, other content: a cache of the deleted thread must not be handed out again
@example(steps=[("turn", -1), ("turn", -1), ("recreate", 0), ("turn", -1), ("turn", -1)])
# the cache is a prefix of another branch's path, then of the head's again
@example(steps=[("turn", -1), ("turn", -1), ("turn", 0), ("turn", 1), ("turn", -1)])
# another process moved the head on: the cache still names a prefix
@example(steps=[("turn", -1), ("elsewhere", -1), ("elsewhere", -1), ("turn", -1)])
@example(steps=[("turn", -1), ("limit", 2), ("turn", -1), ("turn", -1), ("limit", 0)])
# a turn from a ref after this process's last entry, before the head another one moved on
@example(steps=[("turn", -1), ("turn", -1), ("elsewhere", -1), ("elsewhere", -1), ("turn", 2)])
def test_the_runner_sees_the_stored_history_whatever_the_cache_holds(
    backend: Any, monkeypatch: pytest.MonkeyPatch, steps: list[tuple[str, int]]
) -> None:
    runner, other_runner = _HistoryRunner(), _HistoryRunner()
    client = backend.sync_client()
    service = ConversationService(client, backend.config(), runner=runner)
    other = ConversationService(backend.sync_client(), backend.config(), runner=other_runner)
    try:
        tid = service.create(OWNER).id
        keys = service.core.keyspace.owner(OWNER.tenant_id, OWNER.user_id).thread(tid)
        replies: list[str] = []
        head: str | None = None
        for n, (what, arg) in enumerate(steps):
            if what == "recreate":
                service.delete(OWNER, tid)
                service.create(OWNER, thread_id=tid)
                replies, head = [], None
                continue
            if what == "limit":
                monkeypatch.setattr(turns_module, "_INLINE_HISTORY_BYTES", [1 << 20, 0, 150][arg])
                continue
            leaf = replies[arg] if 0 <= arg < len(replies) else None
            if leaf is not None:
                service.branch(OWNER, tid, leaf)  # a turn from a leaf names a branch ref
            base = leaf or head
            expected = _stored_history(client, keys, base)
            who, seen = (service, runner) if what == "turn" else (other, other_runner)
            result = who.continue_(OWNER, tid, f"message {n}", leaf_id=leaf)
            assert seen.seen[-1] == expected
            replies.append(result.entries[-1].id)
            head = result.entries[-1].id
    finally:
        other.close()
        service.close()


def _claim_replies(service: ConversationService) -> list[Any]:
    """Every run_claim reply the service's executor receives, in order."""
    got: list[Any] = []
    execute = service.executor.execute

    def watching(request: Any, operation: str | None = None) -> Any:
        reply = execute(request, operation)
        if getattr(request, "script", None) == "run_claim":
            got.append(reply)
        return reply

    service.executor.execute = watching  # type: ignore[method-assign]
    return got


def test_a_turn_on_the_head_is_sent_no_entry_this_process_wrote(backend: Any) -> None:
    runner = _HistoryRunner()
    service = ConversationService(backend.sync_client(), backend.config(), runner=runner)
    try:
        tid = service.create(OWNER).id
        replies = _claim_replies(service)
        for i in range(6):
            service.continue_(OWNER, tid, f"m{i}")
        sent = []
        for reply in replies:
            n_fields = int(reply[4])
            n_path, n_known = int(reply[5 + n_fields]), int(reply[6 + n_fields])
            sent.append((n_path, n_known, len(reply) - (7 + n_fields) - (n_path - n_known)))
        # (path length, held by this process, entries sent): each commit keeps the turn's
        # two entries in the history cache, so every later claim holds the whole path and
        # is sent nothing (before: the two entries it had just written, every turn)
        assert sent == [(0, 0, 0), (2, 2, 0), (4, 4, 0), (6, 6, 0), (8, 8, 0), (10, 10, 0)]
        assert [len(h) for h in runner.seen] == [0, 2, 4, 6, 8, 10]
        # a new process (an empty cache) is sent the whole path again
        fresh = ConversationService(backend.sync_client(), backend.config(), runner=runner)
        try:
            again = _claim_replies(fresh)
            fresh.continue_(OWNER, tid, "m6")
            n_fields = int(again[0][4])
            assert int(again[0][6 + n_fields]) == 0 and len(runner.seen[-1]) == 12
        finally:
            fresh.close()
    finally:
        service.close()


def _sent(reply: Any) -> tuple[int, int, int]:
    """(path length, entries the caller holds, entries sent inline) of a claim's reply."""
    n_fields = int(reply[4])
    n_path, n_known = int(reply[5 + n_fields]), int(reply[6 + n_fields])
    return n_path, n_known, len(reply) - (7 + n_fields) - (n_path - n_known)


def history_sources() -> dict[str, float]:
    """``memtier_thread_history_entries_total`` by source, as Prometheus reads it."""
    return counter_by_label("memtier_thread_history_entries", "source")


def test_the_history_sources_are_counted_for_operators(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``memtier_thread_history_entries_total{source}``: every entry a turn is handed,
    counted once by where it came from -- held by this process, sent by the claim, read
    after it -- so that a history cache too small for its threads shows as ``sent``."""
    runner = _HistoryRunner()

    def turns(service: ConversationService, tid: str, n: int) -> dict[str, float]:
        before = history_sources()
        for i in range(n):
            service.continue_(OWNER, tid, f"m{i}")
        after = history_sources()
        return {k: after.get(k, 0) - before.get(k, 0) for k in ("held", "sent", "read")}

    service = ConversationService(backend.sync_client(), backend.config(), runner=runner)
    try:
        tid = service.create(OWNER).id
        # histories of 0, 2, 4, 6 entries, all held: each turn's commit kept its entries
        assert turns(service, tid, 4) == {"held": 12, "sent": 0, "read": 0}
        fresh = ConversationService(backend.sync_client(), backend.config(), runner=runner)
        try:  # a process without the thread in its cache: all 8 are sent
            assert turns(fresh, tid, 1) == {"held": 0, "sent": 8, "read": 0}
        finally:
            fresh.close()
        monkeypatch.setattr(turns_module, "_INLINE_HISTORY_BYTES", 0)
        fresh = ConversationService(backend.sync_client(), backend.config(), runner=runner)
        try:  # nothing inline: all 10 are read after the claim
            assert turns(fresh, tid, 1) == {"held": 0, "sent": 0, "read": 10}
        finally:
            fresh.close()
        assert [len(h) for h in runner.seen] == [0, 2, 4, 6, 8, 10]
    finally:
        service.close()


@pytest.mark.parametrize(
    ("bounds", "held"),
    [
        ({}, 12),  # the defaults: the thread is kept, each turn's entries with it
        ({"history_cache_threads": 0}, 0),
        ({"history_cache_bytes": 0}, 0),
        ({"history_cache_bytes": 700}, 2),  # a history of ~300 B entries: the first two
    ],
)
def test_the_history_cache_keeps_within_the_configured_bounds(
    backend: Any, bounds: dict[str, int], held: int
) -> None:
    """``[threads]`` ``history_cache_bytes`` / ``history_cache_threads`` bound what a
    service keeps (0: nothing, every turn is sent its whole history); every runner still
    sees its history as stored."""
    runner = _HistoryRunner()
    with _one_thread(backend, runner, threads=bounds) as (client, service, tid, keys):
        before = history_sources()
        head = None
        for i in range(4):
            expected = _stored_history(client, keys, head)
            head = service.continue_(OWNER, tid, "x" * 200 + str(i)).entries[-1].id
            assert runner.seen[-1] == expected
        after = history_sources()
        assert after.get("held", 0) - before.get("held", 0) == held
        kept, size = service.core.history_cache.stats()
        assert size <= service.limits.history_cache_bytes
        assert kept <= service.limits.history_cache_threads


def test_a_turn_on_another_branch_is_sent_only_what_follows_the_fork(backend: Any) -> None:
    """Two branches of one thread, taken in turns by one process: each claim is sent the
    entries after the fork (and the new turn's), not the whole history, and each runner
    sees its branch's whole path as stored."""
    runner = _HistoryRunner()
    with _one_thread(backend, runner) as (client, service, tid, keys):
        tips = [service.continue_(OWNER, tid, f"m{i}").entries[-1].id for i in range(6)]
        fork = tips[1]  # entry 4: both branches share e1..e4
        service.branch(OWNER, tid, fork)
        replies = _claim_replies(service)
        tip = {"a": tips[-1], "b": fork}
        for turn in range(6):
            side = "ab"[turn % 2]
            service.branch(OWNER, tid, tip[side])
            expected = _stored_history(client, keys, tip[side])
            tip[side] = service.continue_(OWNER, tid, f"{side}{turn}", leaf_id=tip[side])
            tip[side] = tip[side].entries[-1].id
            assert runner.seen[-1] == expected
        sent = [_sent(reply) for reply in replies]
        # (path length, held, sent).  The first claim, on a's tip, holds its whole path
        # (the last turn's commit kept it); every later one switches branch and holds the 4 shared
        # entries: it is sent what follows them (the history cache keeps one path per
        # thread, so a switch sends that branch's own entries again, not the whole thread)
        assert sent[0] == (12, 12, 0)
        for (n_path, n_known, n_sent), before in zip(sent[1:], sent[:-1], strict=True):
            assert n_known == 4 and n_sent == n_path - 4, (n_path, n_known, n_sent, before)


def test_a_commit_keeps_its_entries_only_after_the_path_its_claim_handed_out(
    backend: Any,
) -> None:
    """The commit adds the turn's two entries to the history cache only when the cache
    ends at the turn's base.  The adversary: while the runner runs, the cache is made to
    hold another branch of the same thread, as long in entries and in bytes as the
    base's path (e1 e2 e5 e6 against e1 e2 e3 e4).  Appended to it, the new entries would
    end at the very byte where the thread's path text has them, the next claim's check
    would pass, and the next runner would be handed the other branch's entries.  Every
    runner must see its history as stored, and the turn after is told it holds only
    what the branches share."""
    swap: list[tuple[str, KnownHistory]] = []

    class _SwappingRunner(_HistoryRunner):
        def __call__(self, turn: RunnerTurn) -> RunnerReply:
            for key, other in swap:  # the adversary, once
                service.core.history_cache.forget(key)
                sizes = [other.sizes[0], *(b - a for a, b in pairwise(other.sizes))]
                ids = [entry.id for entry in other.entries]
                service.core.history_cache.keep(key, other.inc, ids, other.entries, sizes)
            swap.clear()
            return super().__call__(turn)

    runner = _SwappingRunner()
    with _one_thread(backend, runner) as (client, service, tid, keys):
        replies = _claim_replies(service)
        service.continue_(OWNER, tid, "m0")  # e1 e2
        a_tip = service.continue_(OWNER, tid, "m1").entries[-1].id  # e3 e4
        service.branch(OWNER, tid, a_tip)
        service.branch(OWNER, tid, "e2")
        b_tip = service.continue_(OWNER, tid, "b", leaf_id="e2").entries[-1].id  # e5 e6
        other = service.core.history_cache.known(keys.entries)
        assert other is not None and [e.id for e in other.entries] == ["e1", "e2", "e5", "e6"]
        assert b_tip == "e6" and a_tip == "e4"
        service.branch(OWNER, tid, b_tip)
        swap.append((keys.entries, other))
        expected = _stored_history(client, keys, a_tip)
        head = service.continue_(OWNER, tid, "on a", leaf_id=a_tip).entries[-1].id
        assert runner.seen[-1] == expected
        expected = _stored_history(client, keys, head)
        assert [e.id for e in expected] == ["e1", "e2", "e3", "e4", "e7", "e8"]
        service.continue_(OWNER, tid, "on a again")  # on the head: e8
        assert runner.seen[-1] == expected
        # the cache held e1 e2 e5 e6: the claim found the fork after e2 and sent the rest
        assert _sent(replies[-1]) == (6, 2, 4)


@pytest.mark.parametrize("back", [1, 3, 8])
def test_a_regenerate_is_told_what_it_holds_without_walking_back_from_the_head(
    backend: Any, back: int
) -> None:
    """A turn from a branch ref ``back`` turns behind the head (a regenerate) by the process
    that holds the head's path: the claim finds the ref in the cached path and counts what
    the process holds up to it in that text, without walking the parents back from the
    old head to the fork.  Shown by removing the parent links of the entries after the
    ref once they are cached: a walk from the head would find no parent there and the
    claim would send the whole history again.  The runner sees the ref's path as stored,
    and a second regenerate from the same ref, and a turn on the new head, still do.
    (The process holds what its last claim was given, the path up to the turn before
    the head: with ``back`` 1 that ends at the ref itself, the edge where nothing lies
    between the two; the old walk passed that one too.)"""
    runner = _HistoryRunner()
    with _one_thread(backend, runner) as (client, service, tid, keys):
        tips = [service.continue_(OWNER, tid, f"m{i}").entries[-1].id for i in range(10)]
        ref = tips[-1 - back]
        service.branch(OWNER, tid, ref)
        expected = _stored_history(client, keys, ref)
        after_ref = _true_path(client, keys.parents, tips[-1])[len(expected) :]
        client.hdel(keys.parents, *after_ref)  # never read again if nothing walks from the head
        replies = _claim_replies(service)
        again = service.continue_(OWNER, tid, "regenerated", leaf_id=ref).entries[-1].id
        assert runner.seen[-1] == expected
        # (path length, held, sent): the process holds the whole path up to the ref
        assert _sent(replies[-1]) == (len(expected), len(expected), 0)
        service.continue_(OWNER, tid, "regenerated again", leaf_id=ref)
        assert runner.seen[-1] == expected
        assert _sent(replies[-1]) == (len(expected), len(expected), 0)
        service.branch(OWNER, tid, again)
        expected = _stored_history(client, keys, again)
        last = service.continue_(OWNER, tid, "on the first regenerate", leaf_id=again)
        assert runner.seen[-1] == expected
        cached = client.hget(keys.parents, PATH_FIELD)
        assert cached is not None
        ids = cached.decode().split(" ")
        assert ids[-1] == last.entries[-1].id
        assert ids == _true_path(client, keys.parents, ids[-1])


_CONTENT = st.text(alphabet=st.sampled_from(["a", "é", '"', "\\", " ", "💥", "x"]), max_size=40)


def _entry(i: int, content: str) -> ConversationEntry:
    parent = f"e{i - 1}" if i > 1 else ""
    return entry_from_json(orjson.dumps(entry_row(f"e{i}", parent, "user", content, 1, "r", False)))


@settings(max_examples=60)
@given(
    keeps=st.lists(
        st.tuples(
            st.integers(0, 3), st.lists(_CONTENT, max_size=8), st.sampled_from(["a", "b", ""])
        ),
        min_size=1,
        max_size=8,
    )
)
def test_the_history_cache_hands_back_what_it_kept(keeps: list[tuple[int, list[str], str]]) -> None:
    cache = HistoryCache()
    for key, contents, inc in keeps:
        entries = [_entry(i + 1, c) for i, c in enumerate(contents)]
        ids = [e.id for e in entries]
        sizes = [len(c) + 50 for c in contents]
        cache.keep(f"k{key}", inc, ids, entries, sizes)
        known = cache.known(f"k{key}")
        if not inc or not entries:
            assert known is None
        else:
            assert known is not None
            assert (known.inc, known.entries, known.last_id) == (inc, tuple(entries), ids[-1])
            assert known.size == sum(sizes)
            assert known.text_bytes == len(" ".join(ids).encode())
        kept, size = cache.stats()
        assert kept <= 4 and size <= historycache.MAX_BYTES


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(0, 2),  # thread key
            st.booleans(),  # extend what is kept (else keep a whole new path)
            st.lists(st.integers(1, 200), max_size=6),  # sizes of the entries the claim sent
            st.integers(0, 2),  # ids sent beyond the inline entries (read by HMGET)
            st.sampled_from(["i", "j", ""]),  # the incarnation of a whole-path keep
            st.integers(0, 3),  # a turn on another branch: held entries past the fork
        ),
        min_size=1,
        max_size=12,
    )
)
@example(steps=[(0, False, [150, 150], 0, "i", 0), (0, True, [100], 0, "i", 0)])  # the bound
@example(steps=[(0, False, [450], 0, "i", 0), (0, True, [10], 1, "i", 0)])  # none fits
@example(steps=[(1, False, [2], 0, "i", 0), (0, False, [1], 0, "i", 0), (1, True, [], 0, "i", 0)])
@example(steps=[(0, False, [10, 20, 30], 0, "i", 0), (0, True, [40], 0, "i", 2)])  # a fork
def test_extending_a_kept_path_keeps_what_keeping_the_whole_path_keeps(
    steps: list[tuple[int, bool, list[int], int, str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``extend`` (a claim that named the kept path: only what follows is new), from the
    kept path or from its ``prefix`` up to a fork (a turn on another branch), against the
    model ``keep`` of the whole path, on two caches given the same steps, with bounds
    small enough that paths are cut (per thread) and threads dropped (in all).  (The
    bounds are patched once for all examples: every example starts new caches.)"""
    monkeypatch.setattr(historycache, "MAX_THREADS", 2)
    monkeypatch.setattr(historycache, "MAX_BYTES", 700)
    monkeypatch.setattr(historycache, "MAX_THREAD_BYTES", 400)
    fast, model = HistoryCache(), HistoryCache()
    paths: dict[int, list[str]] = {}  # each key's true path (ids), as the server has it
    size_of: dict[tuple[int, str], int] = {}  # each entry's stored bytes, by key and id
    made = 0  # ids made so far: every new entry has a new id (ids are unique in a thread)
    for key_n, extend, sizes, beyond, inc, past_fork in steps:
        key = f"k{key_n}"
        held = fast.known(key)
        assert held == model.known(key)
        new_ids = [f"e{made + i + 1}" for i in range(len(sizes) + beyond)]
        made += len(new_ids)
        if extend and held is not None:  # the claim sends the path after what is held
            shared = max(1, len(held.entries) - past_fork)
            if shared < len(held.entries):  # another branch: it parts after `shared`
                held = held.prefix(shared)
                path = [*paths[key_n][:shared], *new_ids]
            else:
                path = [*paths[key_n], *new_ids]
            held_ids = path[:shared]
            sent = path[shared:]
            entries = [_entry(int(i[1:]), "x") for i in sent[: len(sizes)]]
            sent_sizes = sizes[: len(entries)]
            size_of.update(((key_n, i), n) for i, n in zip(sent, sent_sizes, strict=False))
            kept = fast.extend(key, held, sent, entries, sent_sizes)
            model.keep(
                key,
                held.inc,
                [*held_ids, *sent],
                [*held.entries, *entries],
                [*(size_of[key_n, i] for i in held_ids), *sent_sizes],
            )
            got = fast.known(key)
            assert kept == (() if got is None else got.entries)
        else:
            path = new_ids
            entries = [_entry(int(i[1:]), "x") for i in path[: len(sizes)]]
            size_of.update(((key_n, i), n) for i, n in zip(path, sizes, strict=False))
            fast.keep(key, inc, path, entries, sizes)
            model.keep(key, inc, path, entries, sizes)
        paths[key_n] = path
        got = fast.known(key)
        assert got == model.known(key)
        assert fast.stats() == model.stats()
        if got is not None:
            ids = [e.id for e in got.entries]
            assert ids == path[: len(ids)] and got.last_id == ids[-1]  # the true path's start
            assert got.text_bytes == len(" ".join(ids).encode())
            sums = [sum(size_of[key_n, i] for i in ids[: k + 1]) for k in range(len(ids))]
            ends = [len(" ".join(ids[: k + 1]).encode()) for k in range(len(ids))]
            assert list(got.sizes) == sums and list(got.ends) == ends
            assert got.size == sums[-1]


def test_the_history_cache_keeps_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(historycache, "MAX_THREADS", 3)
    monkeypatch.setattr(historycache, "MAX_BYTES", 1_000)
    monkeypatch.setattr(historycache, "MAX_THREAD_BYTES", 400)
    cache = HistoryCache()
    entries = [_entry(i, "x") for i in range(1, 6)]
    ids = [e.id for e in entries]
    cache.keep("k0", "i", ids, entries, [150] * 5)  # a path over the per-thread bound
    known = cache.known("k0")
    assert known is not None and known.entries == tuple(entries[:2]) and known.size == 300
    cache.keep("k0", "i", ids, entries, [500] * 5)  # not even its first entry fits
    assert cache.known("k0") is None and cache.stats() == (0, 0)
    for i in range(1, 6):
        cache.keep(f"k{i}", "i", ids[:1], entries[:1], [300])
    assert cache.stats() == (3, 900)  # two of the others dropped, never the one just kept
    assert cache.known("k5") is not None
    assert sum(cache.known(f"k{i}") is None for i in range(1, 5)) == 2
    cache.keep("k6", "i", ids[:1], entries[:1], [400])  # 1,300 > MAX_BYTES: oldest go
    kept, size = cache.stats()
    assert size <= 1_000 and kept <= 3
    cache.keep("k6", "", ids[:1], entries[:1], [10])  # no incarnation: nothing kept
    assert cache.known("k6") is None


def test_the_history_cache_keeps_hits_when_threads_are_claimed_in_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One thread more than fit, claimed round-robin (a worker serving its threads in
    turn): dropping the least recently claimed would drop each just before its claim, and
    no claim would find its history.  Dropped at random, most claims find it."""
    monkeypatch.setattr(historycache, "MAX_THREADS", 4)
    cache = HistoryCache()
    entries = [_entry(1, "x")]
    hits = claims = 0
    for turn in range(200):
        key = f"k{turn % 5}"
        if turn >= 5:  # every thread was claimed once
            claims += 1
            hits += cache.known(key) is not None
        cache.keep(key, "i", ["e1"], entries, [10])
        assert cache.stats()[0] <= 4
    assert hits >= claims // 3, (hits, claims)
