"""A small pure-Python reference model of the conversation-memory rules (one partition).

Written from the seed spec (/work/shared/seeds/000_*.txt) and the README's "What the store
guarantees", not from the Lua: sessions per (avatar, channel) key, session-id rotation
after the inactivity TTL (30 min public, 24 h IM, exact: a turn at ``last + ttl`` rotates,
1 ms earlier continues), gapless sequences, exact byte totals per session and partition,
LRU eviction for session-count and aggregate pressure with the UUID-then-channel
tie-break, idempotent retries by turn id, bounded events with stable reason codes,
snapshot flush and restore with the time rules of recovery.

What the model cannot know it is told by an :class:`Oracle` that the state machine fills
in from the store after each operation: random session ids and generated turn ids (the
store draws them), and the outcome of a compaction (how many of the oldest turns were
folded and how many bytes the new summary takes: summaries are free text).  Everything
the model is told is checked against the rules before it is adopted (a compaction folds
an oldest prefix of at least one turn, its summary fits ``max_summary_bytes``, never grows
the session, and stays untrusted when it folded untrusted data).

Time: ``clock`` is the test clock (the store's test-only clock hook, ms).  As in the
README, the store's clock is that value made non-decreasing by a per-partition high-water
mark (``hwm``); receipts, records and events also carry the wall value itself.

Fixed protocol bounds (README, "Fixed bounds") are constants here on purpose: a change of
them should be a conscious change of this model too.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memtier.memory import summary as _summary

PUBLIC_TTL_MS = 30 * 60 * 1000  # seed: exactly 30 minutes
IM_TTL_MS = 24 * 3600 * 1000  # seed: exactly 24 hours
SWEEP_INTERVAL_MS = 1_000  # opportunistic sweep at most once a second per partition...
SWEEP_PER_WRITE = 8  # ...of at most this many expired sessions per channel
SWEEP_PER_CALL = 256
MAX_EVICTIONS = 64
MAX_NAME_BYTES = 128
COMPACTION_TRIGGER_PERCENT = 80

UNTRUSTED_KINDS = frozenset({"avatar", "tool", "action"})
KIND_FIELDS: dict[str, tuple[str, ...]] = {
    "avatar": ("text",),
    "agent": ("text",),
    "tool": ("tool", "summary"),
    "action": ("action", "outcome"),
}


class ModelMismatch(AssertionError):
    """The store did something the rules do not allow (raised by the model itself)."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise ModelMismatch(message)


@dataclass(frozen=True)
class Limits:
    max_sessions: int
    max_turns: int
    max_session_bytes: int
    max_aggregate: int
    max_tool_results: int
    max_tool_result_bytes: int
    max_summary_bytes: int
    max_turn_bytes: int
    max_events: int
    public_ttl_ms: int = PUBLIC_TTL_MS
    im_ttl_ms: int = IM_TTL_MS


def channel_of(member: str) -> str:
    return member.rsplit(":", 1)[1]


def bound_text(text: str, max_bytes: int) -> tuple[str, bool]:
    """The longest prefix of whole code points within ``max_bytes`` UTF-8 bytes.

    (The generated text has no combining marks, joiners or secrets, so redaction leaves it
    alone and a grapheme-aware cut is a code-point cut.)
    """
    out: list[str] = []
    used = 0
    for ch in text:
        n = len(ch.encode("utf-8"))
        if used + n > max_bytes:
            return "".join(out), True
        out.append(ch)
        used += n
    return text, False


def nbytes(text: str) -> int:
    return len(text.encode("utf-8"))


@dataclass
class PreparedTurn:
    """A turn as the rules store it: bounded fields, its byte count, the tool flag."""

    kind: str
    fields: dict[str, str]
    nbytes: int
    truncated: bool

    @property
    def is_tool(self) -> bool:  # only tool summaries count against max_tool_results
        return self.kind == "tool"


def prepare(kind: str, raw: dict[str, str], limits: Limits) -> PreparedTurn:
    """Names are cut to 128 bytes; the body gets the rest of max_turn_bytes (tool and action
    bodies at most max_tool_result_bytes)."""
    out: dict[str, str] = {}
    truncated = False
    used = 0
    for name in ("tool", "action"):
        if name in raw:
            text, cut = bound_text(raw[name], MAX_NAME_BYTES)
            out[name] = text
            truncated |= cut
            used += nbytes(text)
    budget = limits.max_turn_bytes - used
    if kind in ("tool", "action"):
        budget = min(budget, limits.max_tool_result_bytes)
    for name in ("text", "summary", "outcome"):
        if name in raw:
            text, cut = bound_text(raw[name], budget)
            out[name] = text
            truncated |= cut
            used += nbytes(text)
    ordered = {name: out[name] for name in KIND_FIELDS[kind]}
    return PreparedTurn(kind, ordered, used, truncated)


@dataclass
class Turn:
    seq: int
    clock: int
    wall: int
    nbytes: int
    is_tool: bool
    kind: str
    turn_id: str
    fields: dict[str, str]


@dataclass(frozen=True)
class Receipt:
    session_id: str
    seq: int
    wall: int
    nbytes: int
    rotated: bool
    session_bytes: int = 0
    turn_count: int = 0
    truncated: bool = False
    duplicate: bool = False
    evicted: int = 0
    evicted_for_sessions: int = 0
    swept: int = 0


@dataclass
class Session:
    member: str
    sid: str
    created: int
    created_wall: int
    last: int
    last_wall: int
    seq: int = 0
    turns: list[Turn] = field(default_factory=list)
    summary_bytes: int = 0
    summary_untrusted: bool | None = None  # None = no summary
    summary_version: int = 0
    # turn id -> (sid, seq, clock, wall, bytes, rotated) of the first attempt
    receipts: dict[str, tuple[str, int, int, int, int, bool]] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.turns) + self.summary_bytes

    @property
    def tools(self) -> int:
        return sum(1 for t in self.turns if t.is_tool)


@dataclass(frozen=True)
class Event:
    reason: str
    member: str
    sid: str
    wall: int
    detail: str = ""


@dataclass(frozen=True)
class Folded:
    """What the store's compaction did to one session (told by the oracle)."""

    fold_n: int
    summary_bytes: int  # 0: folded with no summary at all
    summary_untrusted: bool | None  # None: no summary


class Oracle:
    """Values only the store can know; the state machine fills them in after each call."""

    def __init__(
        self,
        new_session_id: Callable[[str], str] | None = None,
        turn_id: Callable[[str, int], str] | None = None,
        compaction: Callable[[str], Folded | None] | None = None,
    ) -> None:
        self._sid = new_session_id
        self._turn_id = turn_id
        self._compaction = compaction

    def new_session_id(self, member: str) -> str:
        expect(self._sid is not None, f"a new session for {member} was not expected by the test")
        assert self._sid is not None
        return self._sid(member)

    def generated_turn_id(self, member: str, seq: int) -> str:
        assert self._turn_id is not None
        return self._turn_id(member, seq)

    def compaction(self, member: str) -> Folded | None:
        return None if self._compaction is None else self._compaction(member)


class AppendError(Exception):
    """The error an append must raise, by memtier error code."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(code, detail)
        self.code = code
        self.detail = detail


@dataclass
class Snapshot:
    """A flushed generation, as the model sees it."""

    generation: int
    read_clock: int  # the store's clock when the flush read the sessions
    read_wall: int
    sessions: dict[str, Session]


# Compaction may grow a session (issue 8, "Compaction can grow a session"), and then a full
# session of small turns cannot be compacted inline at the aggregate ceiling (the summary
# would pass max_aggregate_bytes; no fallback fits; the append raises SessionFullError --
# minimal reproduction: test_inline_compaction_of_small_turns_at_the_aggregate_ceiling).
# The fix lives in memtier/memory/compaction.py (another helper's part: "compaction never
# grows a session", which adds ``minimal_summary_bytes``).  Where it is present both checks
# are on; where it is not, the model records what they would have found in ``grown`` and
# ``inline_failures`` instead of failing.
COMPACTION_BUDGET_FIX = hasattr(_summary, "minimal_summary_bytes")
CHECK_COMPACTION_NEVER_GROWS = COMPACTION_BUDGET_FIX
CHECK_INLINE_COMPACTION_ALWAYS_MAKES_ROOM = COMPACTION_BUDGET_FIX


class StoreModel:
    """The rules of one partition (``partitions = 1``: LRU and ceilings are global)."""

    def __init__(self, limits: Limits, start_clock: int) -> None:
        self.limits = limits
        self.clock = start_clock
        self.hwm = 0
        self.next_sweep = 0
        self.sessions: dict[str, Session] = {}  # stored (in the LRU), maybe past deadline
        self.events: deque[Event] = deque(maxlen=limits.max_events)
        self.session_ids: set[str] = set()
        self.generation = 0
        self.snapshot: Snapshot | None = None
        self.grown: list[str] = []  # compactions that grew a session (see the flag above)
        self.inline_failures: list[str] = []  # full sessions not compacted (see above)

    # --- time --------------------------------------------------------------------------------
    def ttl(self, member: str) -> int:
        return self.limits.im_ttl_ms if channel_of(member) == "im" else self.limits.public_ttl_ms

    def now(self) -> int:
        return max(self.clock, self.hwm)

    def tick(self) -> int:
        """A writing script's clock: the high-water mark moves up to the test clock."""
        self.hwm = self.now()
        return self.hwm

    def deadline(self, member: str) -> int:
        return self.sessions[member].last + self.ttl(member)

    def is_live(self, member: str, now: int | None = None) -> bool:
        now = self.now() if now is None else now
        return member in self.sessions and now < self.deadline(member)

    def live_members(self) -> list[str]:
        now = self.now()
        return sorted(m for m in self.sessions if now < self.deadline(m))

    @property
    def partition_bytes(self) -> int:
        return sum(s.nbytes for s in self.sessions.values())

    # --- events and drops --------------------------------------------------------------------
    def emit(self, reason: str, member: str, sid: str, detail: str = "") -> None:
        self.events.append(Event(reason, member, sid, self.clock, detail))

    def drop(self, member: str, reason: str) -> None:
        session = self.sessions.pop(member)
        self.emit(reason, member, session.sid)

    def lru_order(self) -> list[str]:
        """Least recently active first; ties by avatar UUID, then channel (im before public)."""
        return sorted(self.sessions, key=lambda m: (self.sessions[m].last, m))

    def sweep_channel(self, channel: str, now: int, max_n: int, skip: str = "") -> int:
        expired = [
            m
            for m in self.lru_order()
            if channel_of(m) == channel and self.sessions[m].last + self.ttl(m) <= now
        ][:max_n]
        swept = 0
        for member in expired:
            if member != skip:
                self.drop(member, "expired")
                swept += 1
        return swept

    def write_sweep(self, member: str, now: int) -> tuple[int, int]:
        """The bounded sweep an append runs (own channel first): (swept, next sweep time).

        Due once a second, and at once again while a channel yields a full batch.
        """
        own = channel_of(member)
        other = "im" if own == "public" else "public"
        a = self.sweep_channel(own, now, SWEEP_PER_WRITE, member)
        b = self.sweep_channel(other, now, SWEEP_PER_WRITE, member)
        full_batch = a + 1 >= SWEEP_PER_WRITE or b + 1 >= SWEEP_PER_WRITE
        return a + b, now if full_batch else now + SWEEP_INTERVAL_MS

    # --- append ------------------------------------------------------------------------------
    def append(
        self,
        member: str,
        turn: PreparedTurn,
        turn_id: str | None,
        oracle: Oracle,
        *,
        inline_compaction: bool = True,
    ) -> Receipt:
        """One ``store.append``; raises :class:`AppendError` where the store must raise."""
        limits = self.limits
        swept_before = 0
        for attempt in (1, 2):
            now = self.tick()
            rotated = False
            session = self.sessions.get(member)
            if session is not None and now >= session.last + self.ttl(member):
                self.drop(member, "expired")
                rotated = True
                session = None
            if session is not None and turn_id is not None and turn_id in session.receipts:
                sid, seq, _clock, wall, size, was_rotated = session.receipts[turn_id]
                return Receipt(
                    sid,
                    seq,
                    wall,
                    size,
                    was_rotated,
                    session.nbytes,
                    len(session.turns),
                    turn.truncated,
                    duplicate=True,
                )
            swept = 0
            sweep_done = False
            pending_sweep = self.next_sweep
            if now >= self.next_sweep:
                swept, pending_sweep = self.write_sweep(member, now)
                sweep_done = True
            full = ""
            if session is not None:
                if len(session.turns) + 1 > limits.max_turns:
                    full = "turns"
                elif session.nbytes + turn.nbytes > limits.max_session_bytes:
                    full = "bytes"
                elif turn.is_tool and session.tools + 1 > limits.max_tool_results:
                    full = "tools"
            if full:
                assert session is not None
                # Nothing stored; what the sweep did stays (and is counted in the receipt).
                if sweep_done:
                    self.next_sweep = pending_sweep
                if attempt == 2 or not inline_compaction:
                    raise AppendError("session_full", full)
                self.compact(member, oracle, force=True, required=True)
                swept_before += swept
                continue
            # Pressure: victims in LRU order, chosen before anything is evicted.
            excess_sessions = len(self.sessions) + 1 - limits.max_sessions if session is None else 0
            excess_bytes = self.partition_bytes + turn.nbytes - limits.max_aggregate
            if (excess_sessions > 0 or excess_bytes > 0) and not sweep_done:
                swept, pending_sweep = self.write_sweep(member, now)
                sweep_done = True
                excess_sessions = (
                    len(self.sessions) + 1 - limits.max_sessions if session is None else 0
                )
                excess_bytes = self.partition_bytes + turn.nbytes - limits.max_aggregate
            victims: list[str] = []
            if excess_sessions > 0 or excess_bytes > 0:
                freed = 0
                for candidate in self.lru_order():
                    if len(victims) >= excess_sessions and freed >= excess_bytes:
                        break
                    if len(victims) >= MAX_EVICTIONS:
                        break
                    if candidate == member:
                        continue
                    victims.append(candidate)
                    freed += self.sessions[candidate].nbytes
                if len(victims) < excess_sessions or freed < excess_bytes:
                    if sweep_done:
                        self.next_sweep = pending_sweep
                    raise AppendError("capacity_exceeded")
            for_sessions = 0
            for idx, victim in enumerate(victims):
                if excess_sessions > 0 and idx < excess_sessions:
                    self.drop(victim, "evicted_session_pressure")
                    for_sessions += 1
                else:
                    self.drop(victim, "evicted_aggregate_pressure")
            if session is None:
                sid = oracle.new_session_id(member)
                expect(sid not in self.session_ids, f"session id {sid} reused")
                self.session_ids.add(sid)
                session = Session(
                    member,
                    sid,
                    created=now,
                    created_wall=self.clock,
                    last=now,
                    last_wall=self.clock,
                )
                self.sessions[member] = session
                if rotated:
                    self.emit("rotated", member, sid)
            session.seq += 1
            tid = turn_id if turn_id is not None else oracle.generated_turn_id(member, session.seq)
            session.turns.append(
                Turn(
                    session.seq,
                    now,
                    self.clock,
                    turn.nbytes,
                    turn.is_tool,
                    turn.kind,
                    tid,
                    dict(turn.fields),
                )
            )
            session.last, session.last_wall = now, self.clock
            session.receipts[tid] = (
                session.sid,
                session.seq,
                now,
                self.clock,
                turn.nbytes,
                rotated,
            )
            if sweep_done:
                self.next_sweep = pending_sweep
            return Receipt(
                session.sid,
                session.seq,
                self.clock,
                turn.nbytes,
                rotated,
                session.nbytes,
                len(session.turns),
                turn.truncated,
                duplicate=False,
                evicted=len(victims),
                evicted_for_sessions=for_sessions,
                swept=swept_before + swept,
            )
        raise AssertionError("unreachable")

    # --- compaction --------------------------------------------------------------------------
    def needs_compaction(self, session: Session) -> bool:
        p, lim = COMPACTION_TRIGGER_PERCENT, self.limits
        return (
            len(session.turns) * 100 >= lim.max_turns * p
            or session.nbytes * 100 >= lim.max_session_bytes * p
            or session.tools * 100 >= lim.max_tool_results * p
        )

    def compact(self, member: str, oracle: Oracle, *, force: bool, required: bool = False) -> str:
        """One compaction; returns the expected outcome ("applied", "released", "not_found").

        ``required``: an inline compaction of a full session -- it must fold something.
        """
        if not self.is_live(member):
            expect(oracle.compaction(member) is None, f"{member}: compacted a dead session")
            return "not_found"
        session = self.sessions[member]
        if not force and not self.needs_compaction(session):
            expect(oracle.compaction(member) is None, f"{member}: compacted below the trigger")
            return "released"
        folded = oracle.compaction(member)
        if folded is None:
            if required:
                self.inline_failures.append(
                    f"{member}: {len(session.turns)} turns,"
                    f" {session.nbytes} bytes, partition"
                    f" {self.partition_bytes}"
                )
                expect(
                    not CHECK_INLINE_COMPACTION_ALWAYS_MAKES_ROOM,
                    f"{member}: a full session was not compacted",
                )
            return "released"
        limits = self.limits
        expect(
            1 <= folded.fold_n <= len(session.turns),
            f"{member}: folded {folded.fold_n} of {len(session.turns)} turns",
        )
        expect(
            0 <= folded.summary_bytes <= limits.max_summary_bytes,
            f"{member}: summary of {folded.summary_bytes} bytes (max {limits.max_summary_bytes})",
        )
        before = session.nbytes
        gone = session.turns[: folded.fold_n]
        if folded.summary_untrusted is None:  # folded with no summary: all of a small session
            expect(
                folded.summary_bytes == 0
                and session.summary_untrusted is None
                and folded.fold_n == len(session.turns),
                f"{member}: folded {folded.fold_n} of {len(session.turns)} turns without a summary",
            )
        else:
            # Untrusted data stays untrusted; marking more than that is allowed (safe).
            untrusted = bool(session.summary_untrusted) or any(
                t.kind in UNTRUSTED_KINDS for t in gone
            )
            expect(
                folded.summary_untrusted or not untrusted,
                f"{member}: summary untrusted={folded.summary_untrusted}, folded kinds"
                f" {[t.kind for t in gone]} (previous summary untrusted="
                f"{session.summary_untrusted})",
            )
        session.turns = session.turns[folded.fold_n :]
        session.summary_bytes = folded.summary_bytes
        session.summary_untrusted = folded.summary_untrusted
        session.summary_version += 1
        if session.nbytes > before:
            self.grown.append(f"{member}: {before} -> {session.nbytes} bytes")
            if CHECK_COMPACTION_NEVER_GROWS:
                raise ModelMismatch(f"compaction grew {self.grown[-1]}")
        expect(
            session.nbytes <= limits.max_session_bytes,
            f"{member}: {session.nbytes} bytes after compaction",
        )
        self.emit(
            "compacted",
            member,
            session.sid,
            f"folded={folded.fold_n} seq={gone[0].seq}-{gone[-1].seq}",
        )
        # Compaction is not activity: last activity, LRU order and deadline are unchanged.
        return "applied"

    # --- operators and sweeps ----------------------------------------------------------------
    def operator_drop(self, member: str, reason: str) -> bool:
        self.tick()
        if member not in self.sessions:
            return False
        self.drop(member, reason)
        return True

    def sweep(self) -> int:
        now = self.tick()
        total = 0
        for _ in range(64):  # SWEEP_ROUNDS
            swept = self.sweep_channel("public", now, SWEEP_PER_CALL)
            swept += self.sweep_channel("im", now, SWEEP_PER_CALL)
            total += swept
            more = any(self.sessions[m].last + self.ttl(m) <= now for m in self.sessions)
            if not more:
                break
        return total

    # --- snapshots ---------------------------------------------------------------------------
    def flush(self) -> Snapshot:
        """Every live session, as read at the flush (a point-in-time copy)."""
        now = self.now()
        self.generation += 1
        live = {m: copy.deepcopy(self.sessions[m]) for m in self.live_members()}
        self.snapshot = Snapshot(self.generation, now, self.clock, live)
        return self.snapshot

    def wipe(self) -> None:
        """Redis lost the namespace: sessions, indexes, events, clock and sweep marks."""
        self.sessions.clear()
        self.events.clear()
        self.hwm = 0
        self.next_sweep = 0

    def recover(self) -> dict[str, Any]:
        """Restore the newest generation into the (empty) namespace.

        Inactivity at the flush plus the time elapsed since (zero if the clock is now
        behind the flush) counts against the channel TTL; the clocks of a restored session
        move into the new epoch by one shift, wall times stay.  Sessions come back in file
        order, which the model does not know: the caller compares this step's events as a
        multiset.
        """
        snap = self.snapshot
        if snap is None:
            return {"outcome": "empty", "restored": 0, "expired": 0}
        restored = expired = 0
        for member, saved in snap.sessions.items():
            now = self.tick()
            elapsed = self.clock - snap.read_wall if self.clock > snap.read_wall else 0
            age = max(0, snap.read_clock - saved.last) + elapsed
            if age >= self.ttl(member):
                self.emit("expired", member, saved.sid, "recovery")
                expired += 1
                continue
            session = copy.deepcopy(saved)
            shift = (now - age) - saved.last
            session.last = now - age
            session.created += shift
            for turn in session.turns:
                turn.clock += shift
            self.sessions[member] = session
            self.emit("restored", member, session.sid, f"generation={snap.generation}")
            restored += 1
        return {"outcome": "restored", "restored": restored, "expired": expired}
