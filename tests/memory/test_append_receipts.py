"""Idempotent retries without a receipt per turn (issue 12), and the two record formats.

``append_turn`` no longer writes ``r:<turn_id>`` into the session hash for every turn: a
retry is found by the id zset (``ZADD NX``) and answered from the turn's own record, or
from a receipt where one exists -- written by ``apply_compaction`` for folded turns still
in the window, by ``restore_session``, and by the previous version for every turn.

The adversary: random sequences of appends drawn from a small pool of turn ids (so most
are retries), pops, forced compactions, expiries (rotation: the ``r`` flag), and
conversion of a session to what the previous version left in Redis (records of the first
format, ``<seq>|<clock>|<wall>|<bytes>|<0/1>|<json>``, and a receipt per turn: a rolling
upgrade).  Promise checked after every append: a retry of a turn id in the window stores
nothing and returns the first answer (session id, seq, timestamp, bytes, rotated); any
other append stores exactly one record.  The restore test adds a flush, a lost Redis and
a recovery: old-format and new-format records flushed, restored, and retried.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from memhelpers import Clock, sync_store

from memtier import AvatarMessage, ConversationKey, ToolSummary
from memtier.memory.models import AppendReceipt
from memtier.memory.turncodec import StoredTurn, window_receipts
from memtier.redaction import REDACTOR_VERSION

PUBLIC_TTL_MS = 60_000
_avatars = itertools.count(1)  # a fresh avatar per example: examples never share keys

Answer = tuple[str, int, Any, int, bool]

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 1), st.integers(0, 7), st.booleans()),
        st.tuples(st.just("pop"), st.integers(0, 1)),
        st.tuples(st.just("legacy"), st.integers(0, 1)),
        st.tuples(st.just("compact"), st.integers(0, 1)),
        st.tuples(st.just("expire"), st.integers(0, 1)),
    ),
    min_size=1,
    max_size=30,
)


def _answer(receipt: AppendReceipt) -> Answer:
    return (receipt.session_id, receipt.seq, receipt.timestamp, receipt.bytes, receipt.rotated)


def _keys(store: Any, k: ConversationKey) -> Any:
    return store.core.partition_for(k).session(k.member)


def _records(store: Any, k: ConversationKey) -> list[StoredTurn]:
    return [StoredTurn.parse(r) for r in store.client.lrange(_keys(store, k).turns, 0, -1)]


def to_first_format(store: Any, k: ConversationKey) -> None:
    """Make ``k``'s session what the previous append_turn left: records of the first
    format and a receipt ``r:<turn_id>`` for every turn id of the window."""
    sk = _keys(store, k)
    client = store.client
    sid = client.hget(sk.session, "id")
    if sid is None:
        return
    in_window = {m.decode(): int(s) for m, s in client.zrange(sk.turn_ids, 0, -1, withscores=True)}
    receipts: dict[str, str] = {}
    for i, record in enumerate(_records(store, k)):
        client.lset(sk.turns, i, replace(record, rotated=False, redactor_version=None).encode())
        if record.turn_id in in_window:
            receipts["r:" + record.turn_id] = (
                f"{sid.decode()}|{record.seq}|{record.clock_ms}|{record.wall_ms}|"
                f"{record.nbytes}|{1 if record.rotated else 0}"
            )
    if receipts:
        client.hset(sk.session, mapping=receipts)


def _turn(tid: str, tool: bool, n: int) -> Any:
    if tool:
        return ToolSummary(tool="search", summary=f"found {n}", turn_id=tid)
    return AvatarMessage(text=f"message {n} " + "x" * (n % 5), turn_id=tid)


class _Oracle:
    """The first answer of every turn id in each session's window."""

    def __init__(self, store: Any, clock: Clock, keys: list[ConversationKey]) -> None:
        self.store, self.clock, self.keys = store, clock, keys
        self.first: dict[tuple[int, str], Answer] = {}
        self.n = 0

    def append(self, who: int, tid: str, tool: bool) -> None:
        k = self.keys[who]
        before = len(_records(self.store, k))
        self.n += 1
        receipt = self.store.append(k, _turn(tid, tool, self.n))
        known = self.first.get((who, tid))
        if known is not None:
            assert receipt.duplicate, (who, tid)
            assert _answer(receipt) == known
            assert len(_records(self.store, k)) == before  # nothing stored twice
        else:
            assert not receipt.duplicate, (who, tid)
            self.first[(who, tid)] = _answer(receipt)
            assert not receipt.rotated or receipt.seq == 1
        ids = [r.turn_id for r in _records(self.store, k)]
        assert len(ids) == len(set(ids))  # every stored turn id once

    def pop(self, who: int) -> None:
        popped = self.store.pop(self.keys[who])
        if popped is not None:  # its id leaves the window: appending it stores it again
            del self.first[(who, popped.turn_id)]

    def expire(self, who: int) -> None:
        """Let every session expire: the next append to each rotates (and keeps nothing)."""
        self.clock.advance(PUBLIC_TTL_MS)
        self.first.clear()

    def retry_all(self) -> None:
        for (who, tid), answer in sorted(self.first.items()):
            k = self.keys[who]
            before = len(_records(self.store, k))
            receipt = self.store.append(k, AvatarMessage(text="a different text", turn_id=tid))
            assert receipt.duplicate and _answer(receipt) == answer, (who, tid)
            assert len(_records(self.store, k)) == before

    def run(self, ops: list[Any]) -> None:
        for op in ops:
            if op[0] == "append":
                self.append(op[1], f"t{op[2]}", op[3])
            elif op[0] == "pop":
                self.pop(op[1])
            elif op[0] == "legacy":
                to_first_format(self.store, self.keys[op[1]])
            elif op[0] == "compact":
                self.store.compact(self.keys[op[1]], force=True)
            else:
                self.expire(op[1])
        self.retry_all()


def _store(backend: Any, clock: Clock, tmp_path: Path | None = None) -> Any:
    conv: dict[str, Any] = {"max_turns_per_session": 5, "public_ttl_seconds": PUBLIC_TTL_MS // 1000}
    if tmp_path is not None:
        conv.update(persistence_enabled=True, storage_path=str(tmp_path))
    return sync_store(backend, clock, conversation=conv)


def _wipe(backend: Any) -> None:
    """A clean namespace for each example (the partition's clock high-water mark too)."""
    if backend.is_fake:
        backend.sync_client().flushall()
    else:
        backend.delete_namespace()


def _two_keys() -> list[ConversationKey]:
    return [
        ConversationKey(f"00000000-0000-4000-8000-{next(_avatars):012d}", "public") for _ in "ab"
    ]


def test_a_retry_returns_the_first_answer_through_pops_compactions_and_upgrades(
    backend: Any,
) -> None:
    @settings(max_examples=40)
    @given(ops=OPS)
    # a retry of a turn whose record a compaction folded (answered from its receipt)
    @example(ops=[("append", 0, i, False) for i in range(6)] + [("append", 0, 0, False)])
    # the first turn of a rotation, retried from its record (the `r` flag) and after an
    # upgrade from the first format
    @example(ops=[("append", 0, 0, False), ("expire", 0), ("append", 0, 1, True)])
    @example(
        ops=[
            ("append", 0, 0, False),
            ("append", 0, 1, False),
            ("legacy", 0),
            ("pop", 0),
            ("append", 0, 1, False),
            ("append", 0, 2, True),
            ("compact", 0),
        ]
    )
    def check(ops: list[Any]) -> None:
        _wipe(backend)
        clock = Clock()
        _Oracle(_store(backend, clock), clock, _two_keys()).run(ops)

    check()


def test_new_records_carry_the_redactor_version_and_no_receipt(backend: Any) -> None:
    clock = Clock()
    store = _store(backend, clock)
    k = _two_keys()[0]
    store.append(k, AvatarMessage(text="hello", turn_id="a"))
    clock.advance(PUBLIC_TTL_MS)
    rotated = store.append(k, ToolSummary(tool="search", summary="hi", turn_id="b"))
    assert rotated.rotated and rotated.seq == 1
    raw = store.client.lrange(_keys(store, k).turns, 0, -1)
    assert len(raw) == 1 and raw[0].startswith(b"1|%d||8|1rv%d|" % (clock.now, REDACTOR_VERSION))
    (record,) = _records(store, k)
    assert record.redactor_version == REDACTOR_VERSION and record.rotated and record.is_tool
    fields = store.client.hkeys(_keys(store, k).session)
    assert not [f for f in fields if f.startswith(b"r:")]  # no per-turn receipt
    assert store.context(k).turns[0].turn_id == "b"


def test_old_and_new_records_flush_restore_and_keep_their_first_answers(
    backend: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    @settings(max_examples=12)
    @given(ops=OPS, legacy_before_flush=st.booleans())
    @example(ops=[("append", 0, i, i % 2 == 0) for i in range(7)], legacy_before_flush=True)
    @example(
        ops=[("append", 1, 0, False), ("expire", 0), ("append", 1, 1, False)],
        legacy_before_flush=False,
    )
    def check(ops: list[Any], legacy_before_flush: bool) -> None:
        _wipe(backend)
        clock = Clock()
        store = _store(backend, clock, tmp_path_factory.mktemp("snap"))
        oracle = _Oracle(store, clock, _two_keys())
        oracle.run(ops)
        if legacy_before_flush:
            for k in oracle.keys:
                to_first_format(store, k)
        contexts = {k.member: store.context(k) for k in oracle.keys}
        store.flush()
        _wipe(backend)
        report = store.recover()
        assert report.outcome == "restored"
        for k in oracle.keys:
            again = store.context(k)
            assert again.turns == contexts[k.member].turns
        oracle.retry_all()  # the first answers, under the sessions' ids before the restore

    check()


@given(
    n=st.integers(0, 40),
    stored=st.sets(st.integers(1, 40), max_size=10),
    window=st.integers(1, 12),
)
@example(n=3, stored={1}, window=2)  # the stored receipt is the oldest: cut first
@example(n=0, stored={5, 9}, window=1)
def test_window_receipts_keep_the_newest_ids_and_stored_receipts_win(
    n: int, stored: set[int], window: int
) -> None:
    records = [
        StoredTurn(s, 10 * s, 10 * s + 1, 2, False, "avatar", f"t{s}", {"text": "hi"}, s == 1, 1)
        for s in range(1, n + 1)
    ]
    kept = {f"t{s}": f"ses_stored_receipt_00|{s}|0|0|2|0" for s in stored}
    out = window_receipts("ses_current_session_0", records, kept, window=window)
    seqs = sorted({*range(1, n + 1), *stored}, reverse=True)[:window]
    assert sorted(int(tid[1:]) for tid in out) == sorted(seqs)  # the newest `window` by seq
    for tid, value in out.items():
        s = int(tid[1:])
        if tid in kept:
            assert value == kept[tid]  # stored receipts win
        else:
            rotated = 1 if s == 1 else 0
            assert value == f"ses_current_session_0|{s}|{10 * s}|{10 * s + 1}|2|{rotated}"


@pytest.mark.parametrize("ahead", [1, 5])
def test_a_claimed_turn_id_without_its_turn_is_taken_over(backend: Any, ahead: int) -> None:
    """An id in the zset above the session's seq was claimed by a call that never stored
    its turn (it failed after the claim): the next append of that id stores it once."""
    store = _store(backend, Clock())
    k = _two_keys()[0]
    first = store.append(k, AvatarMessage(text="one", turn_id="a"))
    store.client.zadd(_keys(store, k).turn_ids, {"b": first.seq + ahead})
    got = store.append(k, AvatarMessage(text="two", turn_id="b"))
    assert not got.duplicate and got.seq == first.seq + 1
    again = store.append(k, AvatarMessage(text="two", turn_id="b"))
    assert again.duplicate and _answer(again) == _answer(got)
    assert [r.turn_id for r in _records(store, k)] == ["a", "b"]
