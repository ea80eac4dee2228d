"""Model-based test of the conversation-memory store (issue 8, adversary 1).

A Hypothesis ``RuleBasedStateMachine`` drives a real :class:`ConversationStore` (embedded
fakeredis, a real redis-server, and -- marked slow -- a real Redis Cluster) next to the
pure-Python reference model in ``memory_model.py``: append of all four turn kinds (with
retries of the same turn id), context, list_metadata, delete, expire, sweep, clock steps
through the store's test clock (forwards, onto exact TTL boundaries, and backwards),
compaction, flush, and restore after Redis lost the namespace.  The store is configured
with tiny limits (4 sessions, 6 turns, 1 KiB per session, 2 KiB in all, 2 tool results,
16 events, one partition), so eviction, inline compaction and event trimming happen in
most runs.

After every step the invariants are compared: every session's id, sequence counter,
turn records (seq, clock, wall time, bytes, tool flag, kind, turn id, content), byte
totals per session and for the partition (index hash, partition total, ``stats()``),
the LRU indexes (last activity per channel), the clock high-water mark, the set of live
sessions with their metadata (``list_metadata``), and the event queue (reason code,
key, session id, time, detail: eviction victims and their tie-break order included).
Summaries are free text: the model is told how many turns a compaction folded and how
many bytes its summary takes, and checks those against the rules (see memory_model.py).

Known finding left unchecked here: compaction can grow a session (issue 8,
memtier/memory/compaction.py, another helper's part); ``CHECK_COMPACTION_NEVER_GROWS``
in memory_model.py switches that comparison on once the fix is merged.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from memory_model import (
    COMPACTION_BUDGET_FIX,
    AppendError,
    Event,
    Folded,
    Limits,
    ModelMismatch,
    Oracle,
    PreparedTurn,
    Receipt,
    StoreModel,
    prepare,
)

from memtier import (
    ActionResult,
    AgentResponse,
    AvatarMessage,
    CapacityError,
    ConversationKey,
    ConversationStore,
    SessionFullError,
    ToolSummary,
    metrics,
)
from memtier.config import MemtierConfig
from memtier.limits import EXPIRY_GRACE_MS
from memtier.memory.models import ms_to_datetime
from memtier.memory.persistence import snapshot_dir_for
from memtier.memory.turncodec import StoredTurn
from memtier.redaction import REDACTOR_VERSION

T0 = 1_800_000_000_000  # test epoch (ms)
SESSION_ID_RE = re.compile(r"^ses_[A-Za-z0-9_-]{22}$")  # 128 random bits, URL-safe

# Three avatars whose UUID order differs from their creation order; two channels each.
AVATARS = (
    uuid.UUID("7f000000-0000-4000-8000-000000000001"),
    uuid.UUID("00000000-0000-4000-8000-00000000000a"),
    uuid.UUID("ff000000-0000-4000-8000-000000000002"),
)
CHANNELS = ("public", "im")
MEMBERS = tuple(f"{a}:{c}" for a in AVATARS for c in CHANNELS)

CONVERSATION = {
    "max_active_sessions": 3,
    "max_turns_per_session": 4,
    "max_session_bytes": 1024,
    "max_aggregate_bytes": 1280,
    "max_tool_results": 2,
    "max_tool_result_bytes": 128,
    "max_summary_bytes": 256,
    "max_turn_bytes": 256,
    "max_events": 16,
    "max_snapshot_bytes": 1 << 20,
}
LIMITS = Limits(
    max_sessions=3,
    max_turns=4,
    max_session_bytes=1024,
    max_aggregate=1280,
    max_tool_results=2,
    max_tool_result_bytes=128,
    max_summary_bytes=256,
    max_turn_bytes=256,
    max_events=16,
)
PUBLIC_TTL = LIMITS.public_ttl_ms
IM_TTL = LIMITS.im_ttl_ms

# Text from words: multi-byte characters, cuts at max_turn_bytes, no secrets, no controls,
# no combining marks (so the model's code-point cut is the store's grapheme cut).
WORDS = ("hi", "sandbox", "région", "naïve", "€5", "😀", "ok?", "teleport", "x" * 40, "ß" * 30)
texts = (
    st.sampled_from((0, 2, 8, 16, 30, 30))
    .flatmap(lambda n: st.lists(st.sampled_from(WORDS), min_size=n, max_size=n))
    .map(" ".join)
)
names = st.sampled_from(("search", "weather", "teleport", "give", "map.region-2"))
turn_ids = st.one_of(st.none(), st.sampled_from([f"t{i}" for i in range(6)]))
members = st.sampled_from(MEMBERS)
kinds = st.sampled_from(("avatar", "agent", "tool", "action"))
# Clock steps (ms): nothing (LRU ties), the sweep interval, the two TTLs and around them.
deltas = st.sampled_from(
    (0, 1, 999, 1000, 60_000, PUBLIC_TTL - 1, PUBLIC_TTL, IM_TTL - 1, IM_TTL, IM_TTL + 1)
)


def make_turn(kind: str, text: str, name: str, turn_id: str | None) -> Any:
    if kind == "avatar":
        return AvatarMessage(text=text, turn_id=turn_id)
    if kind == "agent":
        return AgentResponse(text=text, turn_id=turn_id)
    if kind == "tool":
        return ToolSummary(tool=name, summary=text, turn_id=turn_id)
    return ActionResult(action=name, outcome=text, turn_id=turn_id)


def raw_fields(kind: str, text: str, name: str) -> dict[str, str]:
    if kind in ("avatar", "agent"):
        return {"text": text}
    if kind == "tool":
        return {"tool": name, "summary": text}
    return {"action": name, "outcome": text}


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class StoreMachine(RuleBasedStateMachine):
    """One store on a fresh namespace per example, and the model next to it."""

    backend: ClassVar[Any] = None
    client: ClassVar[Any] = None

    def __init__(self) -> None:
        super().__init__()
        self.namespace = "mdl" + uuid.uuid4().hex[:12]
        self.tmp = Path(tempfile.mkdtemp(prefix="memtier-model-"))
        self.now = T0
        conv = {**CONVERSATION, "persistence_enabled": True, "storage_path": str(self.tmp)}
        self.config = MemtierConfig.load(
            redis_url=self.backend.url, namespace=self.namespace, partitions=1, conversation=conv
        )
        self.store = ConversationStore(
            self.client,
            self.config,
            clock=lambda: self.now,
            snapshots=snapshot_dir_for(self.config),
        )
        self.model = StoreModel(LIMITS, T0)
        self.part = self.store.core.keyspace.partition(0)
        self.event_cursor: str | None = None
        self.history: list[tuple[str, Any]] = []  # (member, turn) of appends, for retries

    def teardown(self) -> None:
        try:
            self._wipe()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # --- plumbing ----------------------------------------------------------------------------
    def _set_clock(self, value: int) -> None:
        self.now = value
        self.model.clock = value

    def _wipe(self) -> None:
        """Delete every key of this example's namespace (only ours: a unique namespace)."""
        pattern = self.store.core.keyspace.pattern()
        if self.backend.is_cluster:
            found = list(
                self.client.scan_iter(match=pattern, count=1000, target_nodes=self.client.PRIMARIES)
            )
        else:
            found = list(self.client.scan_iter(match=pattern, count=1000))
        for key in found:
            self.client.delete(key)

    def _new_events(self) -> list[Any]:
        return self.store.events(after=self.event_cursor, limit=1000)

    def _mark_events(self) -> None:
        """Later oracles look only at events after this point."""
        new = self._new_events()
        if new:
            self.event_cursor = new[-1].cursor

    def _oracle(self, member: str, receipt: Any = None) -> Oracle:
        """What only the store knows, read back from it after the operation."""
        compacted = [
            e
            for e in self._new_events()
            if e.reason.value == "compacted"
            and e.channel
            and f"{e.avatar}:{e.channel.value}" == member
        ]

        def new_session_id(_member: str) -> str:
            if receipt is None:
                raise ModelMismatch(f"the model expected {member} to start a session; it failed")
            return str(receipt.session_id)

        def turn_id(_member: str, seq: int) -> str:
            for record in self.client.lrange(self.part.session(member).turns, 0, -1):
                stored = StoredTurn.parse(record)
                if stored.seq == seq:
                    return stored.turn_id
            raise ModelMismatch(f"{member}: no stored record with seq {seq}")

        def compaction(_member: str) -> Folded | None:
            if not compacted:
                return None
            if len(compacted) != 1:
                raise ModelMismatch(f"{member}: {len(compacted)} compactions in one call")
            detail = compacted[0].detail or ""
            folded = int(detail.split()[0].removeprefix("folded="))
            h = {
                _s(a): _s(b)
                for a, b in self.client.hgetall(self.part.session(member).session).items()
            }
            if not h.get("summary"):
                return Folded(folded, int(h.get("summary_bytes", 0)), None)
            summary = orjson.loads(h["summary"])
            return Folded(folded, int(h["summary_bytes"]), bool(summary["untrusted"]))

        return Oracle(new_session_id, turn_id, compaction)

    def _receipt_matches(self, expected: Receipt, got: Any) -> None:
        observed = Receipt(
            got.session_id,
            got.seq,
            round(got.timestamp.timestamp() * 1000),
            got.bytes,
            got.rotated,
            got.session_bytes,
            got.turn_count,
            got.truncated,
            got.duplicate,
            got.evicted,
            got.evicted_for_sessions,
            got.swept,
        )
        assert observed == expected, f"receipt\n store: {observed}\n model: {expected}"
        assert got.redactions == ()

    def _events_of_store(self) -> list[Event]:
        out = []
        for e in self.store.events(limit=1000):
            member = f"{e.avatar}:{e.channel.value}" if e.avatar and e.channel else ""
            out.append(
                Event(
                    e.reason.value,
                    member,
                    e.session_id or "",
                    round(e.timestamp.timestamp() * 1000),
                    e.detail or "",
                )
            )
        return out

    # --- rules -------------------------------------------------------------------------------
    @initialize()
    def start(self) -> None:
        assert self.store.stats() == {"sessions": 0, "bytes": 0}

    def _append(self, member: str, turn: Any) -> None:
        fields = turn.content_fields()
        prepared: PreparedTurn = prepare(turn.kind, fields, LIMITS)
        key = ConversationKey.from_member(member)
        got: Any = None
        error: Exception | None = None
        try:
            got = self.store.append(key, turn)
        except (SessionFullError, CapacityError) as exc:
            error = exc
        oracle = self._oracle(member, got)
        try:
            expected = self.model.append(member, prepared, turn.turn_id, oracle)
        except AppendError as exc:
            assert error is not None, f"model: {exc.code} ({exc.detail}); store stored {got}"
            assert getattr(error, "code", None) == exc.code, (error, exc.code, exc.detail)
            return
        finally:
            self._mark_events()
        assert error is None, f"store raised {error!r}; model stored {expected}"
        self._receipt_matches(expected, got)
        self.history.append((member, turn))

    @rule(
        member=members,
        kind=st.sampled_from(("avatar", "agent", "tool", "action")),
        text=texts,
        name=names,
        turn_id=turn_ids,
    )
    def append(self, member: str, kind: str, text: str, name: str, turn_id: str | None) -> None:
        self._append(member, make_turn(kind, text, name, turn_id))

    @rule(turns=st.lists(st.tuples(members, kinds, texts, names, turn_ids), min_size=2, max_size=5))
    def append_burst(self, turns: list[tuple[str, str, str, str, str | None]]) -> None:
        """Several appends at the same clock value: LRU ties, session and byte pressure."""
        for member, kind, text, name, turn_id in turns:
            self._append(member, make_turn(kind, text, name, turn_id))

    @rule(
        member=members,
        turns=st.lists(st.tuples(kinds, texts, names, turn_ids), min_size=3, max_size=7),
    )
    def append_to_one(self, member: str, turns: list[tuple[str, str, str, str | None]]) -> None:
        """A run of turns on one key: session bounds, inline compaction, retries."""
        for kind, text, name, turn_id in turns:
            self._append(member, make_turn(kind, text, name, turn_id))

    @precondition(lambda self: bool(self.history))
    @rule(pick=st.integers(min_value=0, max_value=1 << 16))
    def retry(self, pick: int) -> None:
        """The exact same call again (same turn id, or a fresh one if it had none)."""
        member, turn = self.history[-1 - pick % min(len(self.history), 4)]
        self._append(member, turn)

    @rule(member=members, limit=st.sampled_from((0, 0, 1, 3)))
    def context(self, member: str, limit: int) -> None:
        ctx = self.store.context(ConversationKey.from_member(member), limit=limit)
        if not self.model.is_live(member):
            assert ctx.session_id is None and ctx.messages == () and ctx.turns == ()
            return
        session = self.model.sessions[member]
        assert ctx.session_id == session.sid
        turns = session.turns[-limit:] if limit else session.turns
        got = [
            (t.seq, t.clock_ms, t.timestamp, t.kind, t.turn_id, dict(t.fields)) for t in ctx.turns
        ]
        want = [
            (t.seq, t.clock, ms_to_datetime(t.wall), t.kind, t.turn_id, t.fields) for t in turns
        ]
        assert got == want, f"context of {member}\n store: {got}\n model: {want}"
        messages = list(ctx.messages)
        assert (ctx.summary is not None) == (session.summary_untrusted is not None)
        if session.summary_untrusted is not None:
            head = messages.pop(0)
            assert head.role == "user" and head.untrusted == session.summary_untrusted
            assert head.content.startswith('<untrusted-data source="summary">') == head.untrusted
        assert len(messages) == len(turns)
        for message, turn in zip(messages, turns, strict=True):
            if turn.kind == "agent":
                assert (message.role, message.content, message.untrusted) == (
                    "assistant",
                    turn.fields["text"],
                    False,
                )
            else:
                assert message.role == "user" and message.untrusted
                assert message.content.startswith("<untrusted-data source=")
                assert message.content.endswith("</untrusted-data>")

    @rule(member=members, expire=st.booleans())
    def operator_drop(self, member: str, expire: bool) -> None:
        key = ConversationKey.from_member(member)
        got = self.store.expire(key) if expire else self.store.delete(key)
        reason = "operator_expired" if expire else "operator_deleted"
        assert got == self.model.operator_drop(member, reason)

    @rule(delta=st.sampled_from((0, PUBLIC_TTL, IM_TTL)))
    def sweep(self, delta: int) -> None:
        """A worker's sweep (possibly right after a TTL passed, before any append)."""
        self._set_clock(self.now + delta)
        assert self.store.sweep() == self.model.sweep()

    @rule(member=members, force=st.booleans())
    def compact(self, member: str, force: bool) -> None:
        outcome = self.store.compact(ConversationKey.from_member(member), force=force)
        expected = self.model.compact(member, self._oracle(member), force=force)
        self._mark_events()
        assert outcome.status.value == expected, (outcome, expected)

    @precondition(lambda self: bool(self.model.sessions))
    @rule(pick=st.integers(min_value=0, max_value=7), delta=st.sampled_from((0, 1, 60_000)))
    def compact_stored(self, pick: int, delta: int) -> None:
        """A worker's compaction of a stored session, some time after its last activity."""
        self._set_clock(self.now + delta)
        stored = sorted(self.model.sessions)
        self.compact(stored[pick % len(stored)], force=True)

    @rule(delta=deltas)
    def advance(self, delta: int) -> None:
        self._set_clock(self.now + delta)

    @precondition(lambda self: bool(self.model.sessions))
    @rule(pick=st.integers(min_value=0, max_value=7), offset=st.sampled_from((-1, 0, 1)))
    def advance_to_deadline(self, pick: int, offset: int) -> None:
        """Exactly onto a session's TTL boundary (or 1 ms either side), never backwards."""
        stored = sorted(self.model.sessions)
        member = stored[pick % len(stored)]
        self._set_clock(max(self.now, self.model.deadline(member) + offset))
        self.context(member, 0)  # live 1 ms before the deadline, gone at it

    @rule(back=st.sampled_from((1, 1000, 120_000, PUBLIC_TTL)))
    def clock_steps_back(self, back: int) -> None:
        """The clock moves backwards: the high-water mark keeps TTL arithmetic monotonic."""
        self._set_clock(self.now - back)

    @rule()
    def flush(self) -> None:
        result = self.store.flush()
        snap = self.model.flush()
        assert result.skipped == {}, result.skipped
        assert (result.generation, result.sessions) == (snap.generation, len(snap.sessions))

    @rule(delta=deltas)
    def flush_then_lose_redis(self, delta: int) -> None:
        """Flush, let time pass while Redis is down, restore (TTL applied to the gap)."""
        self.flush()
        self._set_clock(self.now + delta)
        self.restore_after_redis_lost_everything()

    @precondition(lambda self: self.model.snapshot is not None)
    @rule()
    def restore_after_redis_lost_everything(self) -> None:
        self._wipe()
        self.model.wipe()
        self.event_cursor = None
        report = self.store.recover()
        expected = self.model.recover()
        got = {"outcome": report.outcome, "restored": report.restored, "expired": report.expired}
        assert got == expected, (report, expected)
        if self.model.snapshot is not None:
            assert report.generation == self.model.snapshot.generation
        # Sessions come back in file order: compare this step's events as a multiset, then
        # take the store's order.  A restored session keeps its id, or (where recovery
        # gives restored sessions new ids) gets a fresh one never used before, with
        # "from=<old id>" in the detail; the model follows either.
        store_events = self._events_of_store()
        snap = self.model.snapshot
        fresh: dict[str, str] = {}
        canonical = []
        for event in store_events:
            saved = snap.sessions.get(event.member) if snap else None
            if saved is not None and event.reason in ("restored", "expired"):
                if event.sid != saved.sid:
                    assert SESSION_ID_RE.match(event.sid), event
                    assert event.sid not in self.model.session_ids, event
                    fresh[event.member] = event.sid
                    event = replace(event, sid=saved.sid)
                event = replace(event, detail=event.detail.removesuffix(f" from={saved.sid}"))
            canonical.append(event)
        assert Counter(canonical) == Counter(self.model.events), (
            canonical,
            list(self.model.events),
        )
        for member, sid in fresh.items():
            self.model.session_ids.add(sid)
            if member in self.model.sessions:
                self.model.sessions[member].sid = sid
        self.model.events.clear()
        self.model.events.extend(store_events)
        # Restored keys carry a Redis TTL of the remaining inactivity TTL + 5 s grace, in the
        # server's real time.  Check it, then re-arm it: the test clock runs apart from the
        # server's, and a session restored 1 ms before its deadline would otherwise vanish
        # from Redis 5 real seconds later, in the middle of the example.
        now = self.model.now()
        for member, session in self.model.sessions.items():
            keys = self.part.session(member)
            remaining = session.last + self.model.ttl(member) - now
            pttl = int(self.client.pttl(keys.session))
            assert 0 < pttl <= remaining + EXPIRY_GRACE_MS, (member, pttl, remaining)
            for name in (keys.session, keys.turns, keys.turn_ids):
                self.client.pexpire(name, 3_600_000)

    # --- invariants --------------------------------------------------------------------------
    @invariant()
    def store_matches_model(self) -> None:
        model = self.model
        # Events: reason codes, keys, session ids, times, details, order; bounded queue.
        events = self._events_of_store()
        assert events == list(model.events), (
            "events\n store: "
            + "\n  ".join(map(str, events))
            + "\n model: "
            + "\n  ".join(map(str, model.events))
        )
        self._mark_events()
        # Stored sessions and bytes (expired-but-unswept sessions included).
        assert self.store.stats() == {
            "sessions": len(model.sessions),
            "bytes": model.partition_bytes,
        }
        self._raw_state_matches()
        # Live sessions and their metadata, paged.
        got = sorted(
            (
                (
                    m.session_id,
                    f"{m.avatar}:{m.channel.value}",
                    m.created_at,
                    m.last_active_at,
                    m.turn_count,
                    m.bytes,
                )
                for m in self.store.iter_metadata(page_size=3)
            ),
            key=lambda row: row[1],
        )
        want = [
            (
                s.sid,
                m,
                ms_to_datetime(s.created_wall),
                ms_to_datetime(s.last_wall),
                len(s.turns),
                s.nbytes,
            )
            for m in model.live_members()
            for s in [model.sessions[m]]
        ]
        assert got == want, f"metadata\n store: {got}\n model: {want}"
        # The model's own rules: gapless sequences, bounds.
        for member, session in model.sessions.items():
            seqs = [t.seq for t in session.turns]
            assert seqs == list(range(session.seq - len(seqs) + 1, session.seq + 1)), member
            assert len(session.turns) <= LIMITS.max_turns
            assert session.nbytes <= LIMITS.max_session_bytes
            assert session.tools <= LIMITS.max_tool_results
        assert len(model.sessions) <= LIMITS.max_sessions
        assert model.partition_bytes <= LIMITS.max_aggregate

    def _raw_state_matches(self) -> None:
        """The documented key schema holds exactly what the model says (README, Key schema)."""
        model, part, client = self.model, self.part, self.client
        index = {_s(a): int(b) for a, b in client.hgetall(part.index).items()}
        assert index == {m: s.nbytes for m, s in model.sessions.items()}, index
        meta = {_s(a): _s(b) for a, b in client.hgetall(part.meta).items()}
        assert int(meta.get("bytes", 0)) == model.partition_bytes, meta
        assert int(meta.get("clock", 0)) == model.hwm, (meta, model.hwm)
        for channel, lru in (("public", part.lru_public), ("im", part.lru_im)):
            got_lru = {_s(m): int(score) for m, score in client.zrange(lru, 0, -1, withscores=True)}
            want_lru = {m: s.last for m, s in model.sessions.items() if m.endswith(":" + channel)}
            assert got_lru == want_lru, (channel, got_lru, want_lru)
        for member, session in model.sessions.items():
            keys = part.session(member)
            h = {_s(a): _s(b) for a, b in client.hgetall(keys.session).items()}
            got = {
                k: h.get(k)
                for k in (
                    "id",
                    "created",
                    "created_wall",
                    "last",
                    "last_wall",
                    "seq",
                    "turns",
                    "bytes",
                    "tools",
                    "summary_bytes",
                )
            }
            want = {
                "id": session.sid,
                "created": str(session.created),
                "created_wall": str(session.created_wall),
                "last": str(session.last),
                "last_wall": str(session.last_wall),
                "seq": str(session.seq),
                "turns": str(len(session.turns)),
                "bytes": str(session.nbytes),
                "tools": str(session.tools),
                "summary_bytes": str(session.summary_bytes),
            }
            assert got == want, f"session hash of {member}\n store: {got}\n model: {want}"
            records = []
            for raw in client.lrange(keys.turns, 0, -1):
                t = StoredTurn.parse(raw)  # either record format (restores write the first)
                assert t.redactor_version in (None, REDACTOR_VERSION), raw
                records.append(
                    (t.seq, t.clock_ms, t.wall_ms, t.nbytes, t.is_tool, t.kind, t.turn_id, t.fields)
                )
            want_records = [
                (t.seq, t.clock, t.wall, t.nbytes, t.is_tool, t.kind, t.turn_id, t.fields)
                for t in session.turns
            ]
            assert records == want_records, (
                f"turns of {member}\n store: {records}\n model: {want_records}"
            )


def run_machine(backend: Any, max_examples: int, steps: int) -> None:
    class Machine(StoreMachine):
        pass

    Machine.backend = backend
    Machine.client = backend.sync_client()
    run_state_machine_as_test(
        Machine, settings=settings(max_examples=max_examples, stateful_step_count=steps)
    )


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("fake", marks=pytest.mark.fake),
        pytest.param("real", marks=pytest.mark.real),
        pytest.param("cluster", marks=[pytest.mark.cluster, pytest.mark.slow]),
    ],
    indirect=True,
)
@pytest.mark.timeout(900)  # a failure is shrunk for up to ~5 minutes before it is reported
def test_store_matches_reference_model(backend: Any) -> None:
    run_machine(backend, max_examples=60, steps=50)


# --- known bug, pinned (see CHECK_INLINE_COMPACTION_ALWAYS_MAKES_ROOM in memory_model.py) ---


@pytest.mark.xfail(
    not COMPACTION_BUDGET_FIX,
    strict=True,
    reason="issue 8 compaction: a full session of small turns cannot be compacted inline"
    " at the aggregate ceiling (the summary would grow the session; no fallback fits);"
    " fixed where compaction never grows a session (memtier/memory/compaction.py)",
)
def test_inline_compaction_of_small_turns_at_the_aggregate_ceiling(backend: Any) -> None:
    """Found by the state machine: 'appends of small turns never start failing' (issue 8)."""
    clock = [T0]
    config = backend.config(partitions=1, conversation=CONVERSATION)
    store = ConversationStore(backend.sync_client(), config, clock=lambda: clock[0])
    small = ConversationKey(AVATARS[0], "public")
    big = ConversationKey(AVATARS[1], "im")
    for _ in range(4):  # the big session: 4 x 256 bytes = its whole byte bound
        store.append(big, AvatarMessage(text="x" * 256))
    store.append(ConversationKey(AVATARS[2], "public"), AvatarMessage(text="y" * 250))
    for _ in range(4):  # the small one: at its turn bound, 0 bytes
        store.append(small, AvatarMessage(text=""))
    assert store.stats() == {"sessions": 3, "bytes": 1274}  # 6 bytes below the ceiling
    store.append(small, AvatarMessage(text=""))  # raises SessionFullError today


def test_sweep_before_an_inline_compaction_is_counted_in_the_receipt(backend: Any) -> None:
    """Found by the state machine: an append that sweeps an expired session, meets its own
    turn bound and compacts inline reported ``swept=0`` (the first attempt's count was lost,
    so ``memtier_expiries_total{reason="expired"}`` missed it too)."""
    clock = [T0]
    config = backend.config(partitions=1, conversation=CONVERSATION)
    store = ConversationStore(backend.sync_client(), config, clock=lambda: clock[0])
    stale = ConversationKey(AVATARS[1], "public")
    full = ConversationKey(AVATARS[0], "im")
    store.append(stale, AvatarMessage(text="old"))
    clock[0] += PUBLIC_TTL - 10_000
    for i in range(4):  # at its turn bound
        store.append(full, AvatarMessage(text=f"turn {i}"))
    clock[0] += 20_000  # ``stale`` expired 10 s ago; the next opportunistic sweep is due
    expired_metric = metrics.EXPIRIES.labels("expired")
    counted_before = expired_metric._value.get()
    receipt = store.append(full, AvatarMessage(text="one more"))
    assert (receipt.swept, receipt.seq) == (1, 5)
    assert expired_metric._value.get() == counted_before + 1
    reasons = [e.reason.value for e in store.events(limit=100)]
    assert reasons == ["expired", "compacted"]
    assert store.stats()["sessions"] == 1
