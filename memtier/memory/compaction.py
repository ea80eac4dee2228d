"""Deterministic compaction: fold a session's oldest turns into a bounded factual summary.

Pure and I/O-free, except :func:`compaction_plan`, a sans-I/O plan (see
:mod:`memtier.engine`) that the stores and ``memtier worker`` drive.

When
    ``append_turn`` queues a job on the partition's ``T:compact`` stream once a session
    passes :data:`~memtier.limits.COMPACTION_TRIGGER_PERCENT` of its turn, byte or
    tool-result bound (one job per session: the ``cq`` marker).  ``memtier worker``
    processes share those streams through a consumer group.  A host without workers
    still gets bounded sessions: ``append`` compacts inline when the script answers
    SESSION_FULL, then retries the append once (see ``ConversationStore.append``).

What is folded
    The newest turns are kept while they fit :data:`KEEP_PERCENT` of every bound
    (turns, bytes left next to a full summary, tool results); everything older is folded
    -- a contiguous prefix of the turns list, so turns appended meanwhile are untouched.

The summary itself (its model, rendering and byte budget) is :mod:`memtier.memory.summary`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import orjson

from memtier import limits
from memtier.config import ConversationConfig
from memtier.engine import Plan, ScriptCall
from memtier.errors import ScriptError
from memtier.memory.core import MemoryCore
from memtier.memory.models import ConversationKey
from memtier.memory.scriptspecs import APPLY_COMPACTION, READ_SESSION
from memtier.memory.state import SessionState, iter_sessions
from memtier.memory.summary import (
    SUMMARY_VERSION,
    Summarizer,
    SummaryFacts,
    build_summary,
    merge_facts,
)

__all__ = [
    "KEEP_PERCENT",
    "CompactionOutcome",
    "CompactionPlan",
    "CompactionStatus",
    "JobRef",
    "apply_call",
    "choose_fold",
    "compaction_plan",
    "needs_compaction",
    "plan_compaction",
    "read_session_call",
]


# After a compaction the kept turns use at most this share of each bound, so a session is
# not compacted again after a handful of turns.
KEEP_PERCENT: Final = 50
# A compaction that loses its compare-and-swap re-reads and re-plans at most this often.
MAX_CAS_ATTEMPTS: Final = 3


class CompactionStatus(StrEnum):
    """Outcome of one compaction attempt (worker job or inline)."""

    APPLIED = "applied"
    RELEASED = "released"  # nothing to fold (already compacted): job marker cleared
    NOT_FOUND = "not_found"  # session gone, expired, rotated, deleted or evicted
    CONFLICT = "conflict"  # lost the compare-and-swap MAX_CAS_ATTEMPTS times
    OVER_BOUND = "over_bound"  # no summary small enough to fit the bounds


class ApplyStatus:
    """Status codes of ``apply_compaction`` (mirrors the script header)."""

    APPLIED = 0
    RELEASED = 1
    NOT_FOUND = -1
    CONFLICT = -2
    OVER_BOUND = -3


# --------------------------------------------------------------------------- planning


def needs_compaction(state: SessionState, conv: ConversationConfig) -> bool:
    """True once the session passes COMPACTION_TRIGGER_PERCENT of a bound (as append does)."""
    p = limits.COMPACTION_TRIGGER_PERCENT
    return (
        state.turns * 100 >= conv.max_turns_per_session * p
        or state.nbytes * 100 >= conv.max_session_bytes * p
        or state.tools * 100 >= conv.max_tool_results * p
    )


def choose_fold(
    state: SessionState,
    conv: ConversationConfig,
    *,
    incoming_bytes: int = 0,
    incoming_tool: bool = False,
) -> int:
    """How many of the oldest records to fold: keep the newest that fit KEEP_PERCENT of every
    bound (and leave room for an incoming turn when compacting inline)."""
    keep_turns = min(
        conv.max_turns_per_session * KEEP_PERCENT // 100, conv.max_turns_per_session - 1
    )
    room = conv.max_session_bytes - conv.max_summary_bytes
    keep_bytes = min(room * KEEP_PERCENT // 100, room - incoming_bytes)
    keep_tools = min(
        conv.max_tool_results * KEEP_PERCENT // 100,
        conv.max_tool_results - (1 if incoming_tool else 0),
    )
    kept = kept_bytes = kept_tools = 0
    for record in reversed(state.records):
        tool = 1 if record.is_tool else 0
        if (
            kept + 1 > keep_turns
            or kept_bytes + record.nbytes > keep_bytes
            or kept_tools + tool > keep_tools
        ):
            break
        kept += 1
        kept_bytes += record.nbytes
        kept_tools += tool
    return len(state.records) - kept


@dataclass(frozen=True)
class CompactionPlan:
    """One compare-and-swap: fold ``fold_n`` records (seq first..last) into ``summary``."""

    member: str
    session_id: str
    expected_sv: int
    fold_n: int
    first_seq: int
    last_seq: int
    summary: bytes
    removed_bytes: int

    @property
    def summary_bytes(self) -> int:
        return len(self.summary)


def plan_compaction(
    state: SessionState,
    conv: ConversationConfig,
    summarizer: Summarizer | None = None,
    *,
    force: bool = False,
    incoming_bytes: int = 0,
    incoming_tool: bool = False,
    max_summary_bytes: int | None = None,
) -> CompactionPlan | None:
    """The compaction of ``state``, or None when there is nothing (or no need) to fold.

    Pure: the same ``state`` and bounds give the same plan, byte for byte.
    """
    if not force and not needs_compaction(state, conv):
        return None
    fold_n = choose_fold(state, conv, incoming_bytes=incoming_bytes, incoming_tool=incoming_tool)
    if fold_n <= 0:
        return None
    cap = conv.max_summary_bytes if max_summary_bytes is None else max_summary_bytes
    cap = min(cap, conv.max_summary_bytes)
    records = state.records
    prefix = [0]
    for record in records:
        prefix.append(prefix[-1] + record.nbytes)

    def attempt(n: int) -> CompactionPlan | None:
        # Never grow the session: the summary takes at most the bytes it replaces.
        budget = min(cap, prefix[n] + state.summary_bytes)
        summary = build_summary(state.summary, records[:n], budget, summarizer)
        if summary is None:
            return None
        return CompactionPlan(
            member=state.member,
            session_id=state.session_id,
            expected_sv=state.summary_version,
            fold_n=n,
            first_seq=records[0].seq,
            last_seq=records[n - 1].seq,
            summary=summary,
            removed_bytes=prefix[n],
        )

    plan = attempt(fold_n)
    if plan is not None or fold_n == len(records):
        return plan if plan is not None else _without_summary(state, prefix)
    # The replaced bytes cannot hold even the counts: fold just enough more turns that
    # they can (the facts of every record bound the facts of any prefix), else all.
    everything = merge_facts(SummaryFacts.from_json(_doc(state.summary)), records)
    need = len(
        orjson.dumps({"v": SUMMARY_VERSION, "untrusted": False, **everything.to_json(), "text": ""})
    )
    extended = next(
        (n for n in range(fold_n + 1, len(records)) if prefix[n] + state.summary_bytes >= need),
        len(records),
    )
    plan = attempt(extended)
    if plan is None and extended < len(records):
        plan = attempt(len(records))
    return plan if plan is not None else _without_summary(state, prefix)


def _doc(summary: str | None) -> dict[str, Any]:
    try:
        loaded = orjson.loads(summary) if summary else None
    except orjson.JSONDecodeError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _without_summary(state: SessionState, prefix: Sequence[int]) -> CompactionPlan | None:
    """Fold every record with no summary at all: only when there is none yet and all the
    turns together hold fewer bytes than the smallest summary (see the module docs)."""
    records = state.records
    if state.summary is not None or not records:
        return None
    return CompactionPlan(
        member=state.member,
        session_id=state.session_id,
        expected_sv=state.summary_version,
        fold_n=len(records),
        first_seq=records[0].seq,
        last_seq=records[-1].seq,
        summary=b"",
        removed_bytes=prefix[-1],
    )


# --------------------------------------------------------------------------- script calls


@dataclass(frozen=True)
class JobRef:
    """A compaction job being processed: its stream, consumer group and entry id."""

    stream: str
    group: str
    entry_id: str


def read_session_call(core: MemoryCore, key: ConversationKey) -> ScriptCall:
    part = core.partition_for(key)
    sk = part.session(key.member)
    return READ_SESSION.call(
        {"session": sk.session, "turns": sk.turns, "meta": part.meta},
        member=key.member,
        ttl_ms=core.ttl_ms(key.channel),
        clock_override=core.clock_arg(),
    )


def apply_call(
    core: MemoryCore,
    key: ConversationKey,
    session_id: str,
    plan: CompactionPlan | None,
    job: JobRef | None = None,
) -> ScriptCall:
    """``apply_compaction`` for ``plan``; ``plan=None`` only releases the job marker."""
    part = core.partition_for(key)
    sk = part.session(key.member)
    conv = core.conv
    keys = {
        "session": sk.session,
        "turns": sk.turns,
        "index": part.index,
        "meta": part.meta,
        "events": part.events,
        "compact": part.compact,
        "turn_ids": sk.turn_ids,
    }
    return APPLY_COMPACTION.call(
        keys,
        member=key.member,
        session_id=session_id,
        expected_sv=plan.expected_sv if plan else 0,
        fold_n=plan.fold_n if plan else 0,
        first_seq=plan.first_seq if plan else 0,
        last_seq=plan.last_seq if plan else 0,
        summary=plan.summary if plan else b"",
        ttl_ms=core.ttl_ms(key.channel),
        max_session_bytes=conv.max_session_bytes,
        max_summary_bytes=conv.max_summary_bytes,
        max_aggregate=core.max_bytes_per_partition,
        max_events=conv.max_events,
        clock_override=core.clock_arg(),
        group=job.group if job else "",
        job_id=job.entry_id if job else "",
    )


@dataclass(frozen=True)
class CompactionOutcome:
    """What one compaction did."""

    status: CompactionStatus
    session_id: str | None = None
    folded: int = 0
    removed_bytes: int = 0
    summary_bytes: int = 0
    session_bytes: int = 0
    attempts: int = 0


def compaction_plan(
    core: MemoryCore,
    key: ConversationKey,
    *,
    session_id: str | None = None,
    job: JobRef | None = None,
    summarizer: Summarizer | None = None,
    force: bool = False,
    incoming_bytes: int = 0,
    incoming_tool: bool = False,
) -> Plan[CompactionOutcome]:
    """Read, plan and compare-and-swap one compaction; re-plan on conflict (bounded).

    ``session_id``: the session the job was queued for (a different live id means the
    session rotated: the job is dropped).  ``job``: acknowledged by the script together
    with the outcome, so a job is done at most once even if a worker dies right after.
    """
    budget: int | None = None
    current_id = session_id
    for attempt in range(1, MAX_CAS_ATTEMPTS + 1):
        reply = yield read_session_call(core, key)
        states = list(iter_sessions(reply))
        if not states or (session_id is not None and states[0].session_id != session_id):
            # Gone, expired, rotated, deleted or evicted: nothing to fold; drop the job.
            if job is not None:
                yield apply_call(core, key, session_id or "-", None, job)
            return CompactionOutcome(CompactionStatus.NOT_FOUND, session_id, attempts=attempt)
        state = states[0]
        current_id = state.session_id
        plan = plan_compaction(
            state,
            core.conv,
            summarizer,
            force=force,
            incoming_bytes=incoming_bytes,
            incoming_tool=incoming_tool,
            max_summary_bytes=budget,
        )
        if plan is None:
            released = yield apply_call(core, key, state.session_id, None, job)
            status = (
                CompactionStatus.RELEASED
                if int(released[0]) == ApplyStatus.RELEASED
                else CompactionStatus.NOT_FOUND
            )
            return CompactionOutcome(status, state.session_id, attempts=attempt)
        result = yield apply_call(core, key, state.session_id, plan, job)
        code = int(result[0])
        if code == ApplyStatus.APPLIED:
            return CompactionOutcome(
                CompactionStatus.APPLIED,
                state.session_id,
                folded=int(result[1]),
                removed_bytes=int(result[2]),
                summary_bytes=plan.summary_bytes,
                session_bytes=int(result[4]),
                attempts=attempt,
            )
        if code == ApplyStatus.NOT_FOUND:
            return CompactionOutcome(CompactionStatus.NOT_FOUND, state.session_id, attempts=attempt)
        if code == ApplyStatus.OVER_BOUND:
            # Never grow the session: the summary may take at most what it replaces.
            if budget is not None and plan.summary_bytes <= budget:
                break
            budget = plan.removed_bytes + state.summary_bytes
        elif code != ApplyStatus.CONFLICT:
            raise ScriptError(f"apply_compaction returned unknown status {code}")
    # Out of attempts (or no summary fits): release the job so a later append can re-queue.
    yield apply_call(core, key, current_id or "-", None, job)
    final = CompactionStatus.OVER_BOUND if budget is not None else CompactionStatus.CONFLICT
    return CompactionOutcome(final, current_id, attempts=MAX_CAS_ATTEMPTS)
