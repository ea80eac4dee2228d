"""Every public operation of conversation memory, as one sans-I/O plan.

:class:`~memtier.memory.store.ConversationStore` and
:class:`~memtier.memory.aio.AsyncConversationStore` drive these plans with
:class:`~memtier.executor.SyncExecutor` / :class:`~memtier.executor.AsyncExecutor`
and hold no other logic, so the two APIs cannot drift.  A plan reads the store it
runs for through :class:`MemoryHost` (configuration, the core, the summarizer hook,
the snapshot directory) and writes back only ``last_recovery``.

Work that may block between requests -- snapshot files (flush, recovery, the data-loss
check) and a host's summarizer hook (inline compaction) -- is a :class:`BlockingPlan`
handed off with :class:`~memtier.engine.Handoff`: the sync store drives it inline, the
asyncio store in a worker thread, so the asyncio hot path (append, context) steps on the
event loop without ever blocking it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from memtier import limits, metrics
from memtier.engine import Command, Handoff, Plan, ScriptCall
from memtier.errors import (
    MemtierError,
    SessionFullError,
    SnapshotError,
    ValidationError,
)
from memtier.memory.compaction import CompactionOutcome, compaction_plan
from memtier.memory.core import MemoryCore, PreparedTurn
from memtier.memory.models import (
    AppendReceipt,
    Context,
    ConversationKey,
    Event,
    MetadataPage,
    ReasonCode,
    Role,
    Turn,
    TurnRecord,
)
from memtier.memory.persistence import (
    FlushResult,
    LossWatch,
    RecoveryReport,
    RestoreProgress,
    flush_plan,
    loss_check_plan,
    recover_plan,
)
from memtier.memory.snapshot import SnapshotDir
from memtier.memory.summary import Summarizer, with_fallback

__all__ = [
    "BlockingPlan",
    "KeyLike",
    "MemoryHost",
    "StoreStats",
    "append",
    "append_many",
    "check_data_loss",
    "compact",
    "context",
    "drop",
    "events",
    "flush",
    "list_metadata",
    "load_scripts",
    "page_size",
    "pop",
    "recover",
    "stats",
    "sweep",
]

log = logging.getLogger("memtier")

KeyLike = ConversationKey | tuple[Any, Any]


class StoreStats(dict[str, int]):
    """``{"sessions": n, "bytes": n}`` summed over partitions."""


class MemoryHost(Protocol):
    """What a plan reads of the store it runs for (both stores are one)."""

    core: MemoryCore
    summarizer: Summarizer | None
    inline_compaction: bool
    snapshots: SnapshotDir | None
    loss_watch: LossWatch | None
    last_recovery: RecoveryReport | None


@dataclass(frozen=True, slots=True)
class BlockingPlan:
    """Hand-off work: a sub-plan whose steps may block (files, a summarizer hook).

    The sync store drives it inline; the asyncio store with ``offload=True``.
    """

    plan: Plan[Any]


def page_size(limit: int | None, bound: limits.Bound) -> int:
    """A page size within ``bound`` (its default when ``limit`` is None)."""
    if limit is None:
        return int(bound.default)
    if not 1 <= limit <= bound.ceiling:
        raise ValidationError(f"limit must be between 1 and {bound.ceiling:g}", field="limit")
    return int(limit)


def load_scripts(sources: Sequence[str]) -> Plan[None]:
    """``SCRIPT LOAD`` of every text (a Cluster client sends each to every primary)."""
    for source in sources:
        yield Command("script_load", (source,))


# --- append and context: the hot path ---------------------------------------------------------
def append(host: MemoryHost, key: KeyLike, turn: Turn) -> Plan[AppendReceipt]:
    """Append one turn (see :meth:`ConversationStore.append`).

    A session at one of its bounds is compacted inline (unless ``inline_compaction`` is
    off) and the same call -- the same turn id -- is sent once more.
    """
    core = host.core
    prepared = core.prepare_turn(core.coerce_key(key), turn)
    if host.loss_watch is not None:
        yield from check_data_loss(host)
    call = core.append_call(prepared)
    try:
        receipt = core.decode_append(prepared, (yield call))
    except SessionFullError as full:
        receipt = yield from _after_full(host, prepared, full, call)
    except Exception as exc:
        _count_append_error(prepared, exc, 0)
        raise
    return _count_append(prepared, receipt)


def append_many(host: MemoryHost, key: KeyLike, turns: Sequence[Turn]) -> Plan[list[AppendReceipt]]:
    """Append ``turns`` to one session, in order (see :meth:`ConversationStore.append_many`).

    Every turn is validated, redacted and bounded before anything is sent.  Then the
    turns go as ``append_turn`` calls of several turns each, one round trip each (at most
    ``APPEND_BATCH_TURNS`` turns and ``APPEND_BATCH_BYTES`` of payload).  The script
    handles a call's turns as the same calls one by one would, and stops at the first
    refusal, or before a turn that needs a sweep or partition pressure, which the next
    call sends first.  So what is stored is always what the same appends one by one
    would store: a prefix of ``turns`` in order, up to the first refusal, which is raised
    (a full session is compacted inline and its turn sent again first, as :func:`append`
    does).  The error's ``stored`` detail is how many of ``turns`` were stored (with
    ``outcome_unknown``, later ones may have been too: the same turn ids sent again store
    nothing twice).
    """
    core = host.core
    ckey = core.coerce_key(key)
    if len(turns) > limits.MAX_APPEND_MANY_TURNS:
        raise ValidationError(
            f"append_many takes at most {limits.MAX_APPEND_MANY_TURNS} turns a call",
            field="turns",
            limit=limits.MAX_APPEND_MANY_TURNS,
        )
    prepared = [core.prepare_turn(ckey, turn) for turn in turns]
    if host.loss_watch is not None:
        yield from check_data_loss(host)
    receipts: list[AppendReceipt] = []
    # The script handles each call's first turn (stored, a retry's answer, or refused:
    # raised), so there are at most len(turns) rounds.
    for _ in range(len(prepared)):
        start = len(receipts)
        if start == len(prepared):
            break
        batch = _next_batch(prepared, start)
        try:
            reply = yield core.append_call(batch[0], more=batch[1:])
        except Exception as exc:
            _count_append_error(batch[0], exc, 0)
            _note_stored(exc, start)
            raise
        # one reply per turn the script handled; a single turn's call, and a refusal of a
        # call's first turn, reply alone
        replies = reply if isinstance(reply[0], list) else (reply,)
        for p, turn_reply in zip(batch, replies, strict=False):
            try:
                receipt = yield from _batch_receipt(host, p, turn_reply)
            except Exception as exc:
                _note_stored(exc, len(receipts))
                raise
            receipts.append(_count_append(p, receipt))
    return receipts


def _batch_receipt(host: MemoryHost, prepared: PreparedTurn, reply: Any) -> Plan[AppendReceipt]:
    """The receipt of one of a batch's turns from its reply; a full session is compacted
    inline and the turn sent in a call of its own.  Failures are counted here."""
    try:
        return host.core.decode_append(prepared, reply)
    except SessionFullError as full:
        return (yield from _after_full(host, prepared, full, None))
    except Exception as exc:
        _count_append_error(prepared, exc, 0)
        raise


def _next_batch(prepared: Sequence[PreparedTurn], start: int) -> Sequence[PreparedTurn]:
    """The turns from ``start`` that one round trip sends (at least one)."""
    end, size = start, 0
    while end < len(prepared) and end - start < limits.APPEND_BATCH_TURNS:
        size += len(prepared[end].payload)
        if size > limits.APPEND_BATCH_BYTES and end > start:
            break
        end += 1
    return prepared[start:end]


def _after_full(
    host: MemoryHost, prepared: PreparedTurn, full: SessionFullError, call: ScriptCall | None
) -> Plan[AppendReceipt]:
    """The receipt of ``prepared`` after its session was full: compacted inline and the
    turn sent once more -- ``call`` again (the same turn id), or for a batch's turn
    (None) in a call of its own.  With ``inline_compaction`` off, ``full`` is raised.
    Failures are counted here."""
    core = host.core
    swept_first = int(full.details.get("swept", 0))  # what the refused attempt swept
    try:
        if not host.inline_compaction:
            raise full
        outcome: CompactionOutcome = yield Handoff(BlockingPlan(_inline_compaction(host, prepared)))
        metrics.COMPACTIONS.labels(outcome.status.value).inc()
        again = call if call is not None else core.append_call(prepared)
        receipt = core.decode_append(prepared, (yield again))
    except Exception as exc:
        # (full itself carries its swept count; a later failure adds it to its own)
        _count_append_error(prepared, exc, 0 if exc is full else swept_first)
        raise
    if swept_first:
        receipt = receipt.model_copy(update={"swept": receipt.swept + swept_first})
    return receipt


def _note_stored(exc: Exception, stored: int) -> None:
    """Name on ``exc`` how many turns of an ``append_many`` were stored before it."""
    if isinstance(exc, MemtierError):
        exc.details["stored"] = stored


def context(host: MemoryHost, key: KeyLike, limit: int) -> Plan[Context]:
    """The LLM-facing projection of exactly this key."""
    core = host.core
    ckey = core.coerce_key(key)
    if host.loss_watch is not None:
        yield from check_data_loss(host)
    return core.decode_context(ckey, (yield core.context_call(ckey, limit)))


def _inline_compaction(host: MemoryHost, prepared: PreparedTurn) -> Plan[CompactionOutcome]:
    """The compaction that makes room for ``prepared`` when its session is full."""
    return compaction_plan(
        host.core,
        prepared.key,
        summarizer=with_fallback(host.summarizer),
        force=True,
        incoming_bytes=prepared.turn_bytes,
        incoming_tool=prepared.turn.kind == "tool",
    )


# APPENDS children by (role, duplicate): a small fixed set (4 roles x 2 outcomes).
_APPEND_COUNTERS: dict[tuple[Role, bool], Any] = {}


def _count_append(prepared: PreparedTurn, receipt: AppendReceipt) -> AppendReceipt:
    outcome = (prepared.turn.role, receipt.duplicate)
    child = _APPEND_COUNTERS.get(outcome)
    if child is None:  # one lookup per (role, outcome) per process, not per append
        label = "duplicate" if receipt.duplicate else "stored"
        child = _APPEND_COUNTERS[outcome] = metrics.APPENDS.labels(outcome[0].value, label)
    child.inc()
    if receipt.duplicate:  # a retry's first receipt: its events were counted then
        return receipt
    # The events append_turn published (memtier_events_total), from its receipt.
    if receipt.rotated:  # two events: the old session `expired`, the new one `rotated`
        metrics.EXPIRIES.labels(ReasonCode.ROTATED.value).inc()
        metrics.count_event(ReasonCode.EXPIRED.value)
        metrics.count_event(ReasonCode.ROTATED.value)
    if receipt.swept:
        metrics.EXPIRIES.labels(ReasonCode.EXPIRED.value).inc(receipt.swept)
        metrics.count_event(ReasonCode.EXPIRED.value, receipt.swept)
    if receipt.evicted_for_sessions:
        metrics.EVICTIONS.labels(ReasonCode.EVICTED_SESSION_PRESSURE.value).inc(
            receipt.evicted_for_sessions
        )
        metrics.count_event(ReasonCode.EVICTED_SESSION_PRESSURE.value, receipt.evicted_for_sessions)
    if receipt.evicted > receipt.evicted_for_sessions:
        by_bytes = receipt.evicted - receipt.evicted_for_sessions
        metrics.EVICTIONS.labels(ReasonCode.EVICTED_AGGREGATE_PRESSURE.value).inc(by_bytes)
        metrics.count_event(ReasonCode.EVICTED_AGGREGATE_PRESSURE.value, by_bytes)
    return receipt


def _count_append_error(prepared: PreparedTurn, exc: BaseException, swept_before: int) -> None:
    """Count a failed append, and the expired sessions it swept before it was refused."""
    metrics.APPENDS.labels(prepared.turn.role.value, getattr(exc, "code", "error")).inc()
    details = getattr(exc, "details", None)
    swept = swept_before + (int(details.get("swept", 0)) if isinstance(details, dict) else 0)
    if swept:
        metrics.EXPIRIES.labels(ReasonCode.EXPIRED.value).inc(swept)


# --- metadata, operators, sweeps, stats, events -----------------------------------------------
def list_metadata(core: MemoryCore, cursor: str | None, limit: int | None) -> Plan[MetadataPage]:
    """One page of session metadata; its cursor names the next page (None: the last)."""
    count = page_size(limit, limits.METADATA_PAGE)
    partition, scan = core.decode_cursor(cursor)
    reply = yield core.metadata_call(core.keyspace.partition(partition), scan, count)
    next_scan, sessions = core.decode_metadata(reply)
    if next_scan != "0":
        next_cursor: str | None = core.encode_cursor(partition, next_scan)
    elif partition + 1 < core.config.partitions:
        next_cursor = core.encode_cursor(partition + 1, "0")
    else:
        next_cursor = None
    return MetadataPage(sessions=tuple(sessions), cursor=next_cursor)


def pop(core: MemoryCore, key: KeyLike) -> Plan[TurnRecord | None]:
    """Remove and return the newest turn of one exact key (None if none)."""
    record = core.decode_pop((yield core.pop_call(core.coerce_key(key))))
    metrics.POPS.labels("empty" if record is None else "popped").inc()
    return record


def drop(core: MemoryCore, key: KeyLike, reason: ReasonCode) -> Plan[bool]:
    """An operator delete or expiry of one exact key; False if it was absent.  The call
    carries its own receipt, so a retry after a lost reply returns the same answer."""
    reply = yield core.drop_call(core.coerce_key(key), reason)
    return int(reply[0]) == 1


def sweep(core: MemoryCore, max_per_partition: int) -> Plan[int]:
    """Remove expired sessions on every partition (at most SWEEP_ROUNDS calls each)."""
    total = 0
    for part in core.keyspace.all_partitions():
        for _ in range(limits.SWEEP_ROUNDS):
            swept, more = yield core.sweep_call(part, max_per_partition)
            total += int(swept)
            if not int(more):
                break
    if total:
        metrics.EXPIRIES.labels(ReasonCode.EXPIRED.value).inc(total)
    return total


def stats(core: MemoryCore) -> Plan[StoreStats]:
    """Live sessions and stored bytes over all partitions (also updates the gauges)."""
    replies = []
    for part in core.keyspace.all_partitions():
        replies.append((yield core.stats_call(part)))
    sessions = sum(int(r[0]) for r in replies)
    nbytes = sum(int(r[1]) for r in replies)
    metrics.STORE_GAUGES.set(sessions, nbytes)
    return StoreStats(sessions=sessions, bytes=nbytes)


def events(core: MemoryCore, after: str | None, limit: int | None) -> Plan[list[Event]]:
    """One page of the event queue in time order, after a cursor (None: from the start)."""
    count = page_size(limit, limits.EVENTS_PAGE)
    start = core.decode_events_cursor(after)
    pages = []
    for part, position in zip(core.keyspace.all_partitions(), start, strict=True):
        pages.append((yield Command("xrange", (part.events, "(" + position, "+", count))))
    return core.merge_events(pages, start, count)


# --- compaction and snapshots -----------------------------------------------------------------
def compact(host: MemoryHost, key: KeyLike, force: bool) -> Plan[CompactionOutcome]:
    """Compact one session now (asyncio: driven with ``offload``, the hook may block)."""
    core = host.core
    return compaction_plan(core, core.coerce_key(key), summarizer=host.summarizer, force=force)


def _snapshots(host: MemoryHost) -> SnapshotDir:
    if host.snapshots is None:
        raise SnapshotError("persistence is off (conversation.persistence_enabled = false)")
    return host.snapshots


def flush(host: MemoryHost) -> Plan[FlushResult]:
    """A new snapshot generation (asyncio: driven with ``offload``: file I/O)."""
    snapshots = _snapshots(host)
    try:
        result = yield from flush_plan(host.core, snapshots)
    except Exception:
        metrics.SNAPSHOT_FLUSHES.labels("error").inc()
        raise
    metrics.SNAPSHOT_FLUSHES.labels("ok" if result.durable else "not_durable").inc()
    return result


def recover(
    host: MemoryHost,
    force: bool,
    wait_s: float | None,
    progress: Callable[[RestoreProgress], Any] | None = None,
) -> Plan[RecoveryReport]:
    """Restore the newest valid generation if the namespace is empty (``offload``)."""
    options: dict[str, Any] = {"force": force, "progress": progress}
    if wait_s is not None:
        options["wait_s"] = wait_s
    report = yield from recover_plan(host.core, _snapshots(host), **options)
    host.last_recovery = report
    if host.loss_watch is not None:
        host.loss_watch.saw(report)
    return report


def check_data_loss(host: MemoryHost, force: bool = False) -> Plan[RecoveryReport | None]:
    """If a check is due (or ``force``): restore what Redis lost (see the store's method).

    Never raises: Redis not answering is logged and tried again at the next check.
    """
    watch = host.loss_watch
    if watch is None or host.snapshots is None or not watch.claim(force):
        return None
    try:
        report: RecoveryReport | None = yield Handoff(
            BlockingPlan(loss_check_plan(host.core, host.snapshots, watch))
        )
    except MemtierError as exc:
        log.warning("memtier: data-loss check failed (%s); trying again later", exc)
        return None
    finally:
        watch.release()
    if report is not None:
        host.last_recovery = report
    return report
