"""Flush and restart recovery as sans-I/O plans (driven by both stores; see plans.py).

Flush
    Every partition's index hash is scanned with bounded ``HSCAN`` pages; the live
    sessions of a page are read by one ``snapshot_page`` script call (at most
    :data:`PAGE_SESSIONS` sessions and about :data:`PAGE_BYTES` of content), so each
    session is a consistent point-in-time copy and no call blocks appends for long.
    Sessions stream into a new generation file (:mod:`memtier.memory.snapshot`); each is
    checked with the recovery validator first, so one bad live session cannot poison
    every future generation (it is left out and reported: ``skipped``, a
    ``snapshot_skipped`` event, a metric).  ``append`` runs the same record validator,
    so what the live path stores is always flushable.

Recovery (``recover_plan``), on start with persistence enabled
    1. ``restore_gate acquire``: exactly one worker gets the lock (random token, PX
       expiry, extended while it works); the others poll until it finishes (then use
       what it loaded) or their wait runs out (then they start without waiting longer;
       never fail).  A finished gate (the ``{ns:m:restore}:state`` hash) means Redis kept
       its data since the namespace was initialised: nothing to do.
    2. The namespace must be empty in Redis (no session in any partition); otherwise the
       live data wins and the gate is marked done.  A restorer that died midway left
       ``status=restoring``: the next one continues (restores are create-only).
    3. Generations newest first, read before anything is created or chmod-ed (read-only
       storage restores): verify (pass 1); a rejected one is quarantined (if the move
       fails it stays in place, ``quarantine_failed``), a ``quarantined`` event
       published, the next older one tried; a vanished or unreadable one is skipped.
       The first valid one is restored session by session: today's bounds applied per
       session (:func:`~memtier.memory.snapshot.fit_session`: trimmed to its newest
       turns, or skipped alone with a ``restore_skipped`` event), a new session id
       (D7: an acknowledged (session id, seq) lost with Redis is never reused), the
       create-only ``restore_session`` script.
    4. None valid: start empty, log it, and say so in the report.
    Startup never fails on a file: every file error is typed and ends in the report.

Data loss under running processes (``loss_check_plan``, with a :class:`LossWatch`)
    The gate state carries an ``epoch``: a random id written once, when the hash is
    created.  A process remembers the epoch it saw (its own start-up recovery, or its
    first check) and checks on a bounded schedule -- one ``HMGET`` of the state, never
    per append.  The state missing, or holding an epoch this process never saw whose
    outcome was ``live`` (a start after the loss found the new appends and restored
    nothing), means Redis lost its data under this process: it takes the gate and
    restores the newest valid generation *into the non-empty namespace*, create-only
    (a session re-created by an append after the loss stays as it is; every other
    absent session comes back under a new session id, D7).  Another epoch with any other
    outcome means someone else handled it: the new epoch is adopted.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from memtier import limits, metrics
from memtier.engine import Command, Plan, ScriptCall, Sleep
from memtier.errors import BackendError, MemtierError, SnapshotError
from memtier.keys import PartitionKeys
from memtier.memory.core import MemoryCore, new_session_id
from memtier.memory.models import Channel, ConversationKey, ReasonCode
from memtier.memory.snapshot import (
    GenerationFile,
    Rejection,
    SnapshotDir,
    SnapshotValidationError,
    ValidatedSession,
    VerifiedGeneration,
    fit_session,
    iter_generation,
    session_to_json,
    validate_session,
    verify_steps,
)
from memtier.memory.state import iter_sessions

__all__ = [
    "FlushResult",
    "LossWatch",
    "RecoveryReport",
    "emit_event_call",
    "flush_plan",
    "loss_check_plan",
    "recover_plan",
]

log = logging.getLogger("memtier.persistence")

# One snapshot_page call reads at most this many sessions (the script's own cap is 256)...
PAGE_SESSIONS: Final = 64
# ...and stops adding sessions once their indexed bytes pass this (one big session still
# goes alone): bounds how long one call blocks the shard (about a millisecond per 128 KiB).
PAGE_BYTES: Final = 128 * 1024
# HSCAN pages per partition: a flush of the largest allowed partition finishes well within.
MAX_SCAN_ROUNDS: Final = 4 * int(limits.MAX_ACTIVE_SESSIONS.ceiling) // 10 + 10_000
# Restore gate timings.
LOCK_MS: Final = 30_000  # the restorer extends it every EXTEND_EVERY sessions / second
EXTEND_EVERY: Final = 200
WAIT_S: Final = 120.0  # how long a non-restorer waits for the restorer
POLL_S: Final = 0.2
# Data-loss checks: the default period, and its hard floor (a check is one HMGET).
LOSS_CHECK_S: Final = 5.0
LOSS_CHECK_MIN_S: Final = 0.05


# --------------------------------------------------------------------------- script calls


def emit_event_call(
    core: MemoryCore,
    reason: ReasonCode,
    detail: str,
    *,
    partition: int = 0,
    member: str = "",
    session_id: str = "",
) -> ScriptCall:
    """Publish a ``quarantined`` / ``permissions_not_verified`` / ``snapshot_skipped`` /
    ``restore_skipped`` event: on the member's partition, else partition 0's stream."""
    if member:
        part = core.partition_for(ConversationKey.from_member(member))
    else:
        part = core.keyspace.partition(partition)
    return ScriptCall(
        "emit_event",
        (part.meta, part.events),
        (reason.value, member, session_id, detail[:512], core.conv.max_events, core.clock_arg()),
    )


def snapshot_page_call(core: MemoryCore, part: PartitionKeys, members: Iterable[str]) -> ScriptCall:
    return ScriptCall(
        "snapshot_page",
        (part.index, part.meta),
        (
            part.prefix,
            core.conv.public_ttl_ms,
            core.conv.im_ttl_ms,
            core.clock_arg(),
            *members,
        ),
    )


def restore_gate_call(
    core: MemoryCore,
    op: str,
    token: str,
    *,
    generation: str = "",
    outcome: str = "",
    force: bool = False,
    epoch: str = "",
    unhandled: str = "",
) -> ScriptCall:
    """``epoch``: recorded by begin/finish when the state has none yet; ``unhandled``:
    acquire again a gate whose ``live`` outcome under that epoch hid a data loss."""
    ks = core.keyspace
    return ScriptCall(
        "restore_gate",
        (ks.restore_lock, ks.restore_state),
        (op, token, LOCK_MS, generation, outcome, "1" if force else "", epoch, unhandled),
    )


def restore_session_call(
    core: MemoryCore, session: ValidatedSession, detail: str, *, session_id: str | None = None
) -> ScriptCall:
    """``session_id``: the id the restored session gets (recovery passes a new one)."""
    key = ConversationKey.from_member(session.member)
    part = core.partition_for(key)
    sk = part.session(session.member)
    other = Channel.IM if key.channel is Channel.PUBLIC else Channel.PUBLIC
    receipts: list[str] = []
    for turn_id, receipt in session.receipts:
        receipts += (turn_id, receipt)
    return ScriptCall(
        "restore_session",
        (
            sk.session,
            sk.turns,
            sk.turn_ids,
            part.lru(key.channel.value),
            part.lru(other.value),
            part.index,
            part.meta,
            part.events,
        ),
        (
            session.member,
            session_id or session.session_id,
            session.created_ms,
            session.created_wall_ms,
            session.last_ms,
            session.last_wall_ms,
            session.seq,
            session.summary or "",
            session.summary_version,
            session.age_ms,
            session.read_wall_ms,
            0,  # flush_wall_ms: filled by the caller (header value)
            core.ttl_ms(key.channel),
            limits.EXPIRY_GRACE_MS,
            core.max_sessions_per_partition,
            core.max_bytes_per_partition,
            core.conv.max_session_bytes,
            core.conv.max_turns_per_session,
            core.conv.max_events,
            core.clock_arg(),
            detail,
            len(session.records),
            *(r.encode() for r in session.records),
            *receipts,
        ),
    )


def _with_flush_wall(call: ScriptCall, flush_wall_ms: int) -> ScriptCall:
    args = list(call.args)
    args[11] = flush_wall_ms
    return ScriptCall(call.script, call.keys, tuple(args))


# --------------------------------------------------------------------------- flush


@dataclass(frozen=True)
class FlushResult:
    """One published generation.

    ``skipped``: live sessions the flush could not write, by reason (each also published
    as a ``snapshot_skipped`` event and counted in
    ``memtier_snapshot_sessions_skipped_total{stage="flush"}``).  ``durable``: False when
    the directory fsync after publication failed -- the generation is published and
    retention was applied, but its name may not survive a power loss.  ``warnings``: what
    went wrong after publication (directory fsync, temp removal, retention).
    """

    generation: int
    path: str
    sessions: int
    bytes: int
    skipped: dict[str, int]
    removed: tuple[str, ...]
    permissions_verified: bool
    duration_s: float
    durable: bool = True
    warnings: tuple[str, ...] = ()


def _b(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def flush_plan(
    core: MemoryCore,
    directory: SnapshotDir,
    *,
    page_sessions: int = PAGE_SESSIONS,
    page_bytes: int = PAGE_BYTES,
) -> Plan[FlushResult]:
    """Write every live session of the namespace into a new generation; apply retention."""
    started = time.monotonic()
    page_sessions = max(1, min(page_sessions, 256))
    verified = directory.ensure()
    if not verified:
        yield emit_event_call(core, ReasonCode.PERMISSIONS_NOT_VERIFIED, str(directory.path))
    directory.cleanup_temps()
    walls: list[int] = []
    clocks: list[int] = []
    writer = directory.begin()
    try:
        first = yield snapshot_page_call(core, core.keyspace.partition(0), ())
        clocks.append(int(first[0]))
        walls.append(int(first[1]))
        for part in core.keyspace.all_partitions():
            seen: set[str] = set()
            cursor: Any = 0
            for _ in range(MAX_SCAN_ROUNDS):
                cursor, entries = yield Command(
                    "hscan", (part.index,), {"cursor": cursor, "count": page_sessions}
                )
                batch: list[str] = []
                batch_bytes = 0
                pages: list[list[str]] = []
                for raw_member, raw_bytes in entries.items():
                    member = _b(raw_member)
                    if member in seen:
                        continue  # HSCAN may return an entry twice
                    seen.add(member)
                    nbytes = int(raw_bytes)
                    if batch and (len(batch) >= page_sessions or batch_bytes + nbytes > page_bytes):
                        pages.append(batch)
                        batch, batch_bytes = [], 0
                    batch.append(member)
                    batch_bytes += nbytes
                if batch:
                    pages.append(batch)
                while pages:  # bounded: every call with a session consumes one member
                    members = pages.pop(0)
                    reply = yield snapshot_page_call(core, part, members)
                    clocks.append(int(reply[0]))
                    walls.append(int(reply[1]))
                    states = list(iter_sessions(reply))
                    if states:
                        # The script stops after the session that passes its work bound:
                        # the members after the last one returned go again (the ones
                        # before it that it skipped were read and are not live).
                        rest = members[members.index(states[-1].member) + 1 :]
                        if rest:
                            pages.insert(0, rest)
                    for state in states:
                        line = session_to_json(state)
                        try:
                            validate_session(line)
                        except SnapshotValidationError as exc:
                            # Left out, never written: it would reject the whole generation.
                            # Reported three ways: FlushResult.skipped, an event, a metric.
                            log.warning(
                                "snapshot: session left out of the flush (%s: %s)",
                                exc.reason,
                                exc.detail,
                            )
                            writer.skip(exc.reason)
                            metrics.SNAPSHOT_SESSIONS_SKIPPED.labels("flush", exc.reason).inc()
                            yield emit_event_call(
                                core,
                                ReasonCode.SNAPSHOT_SKIPPED,
                                f"{exc.reason}: {exc.detail}",
                                member=state.member,
                                session_id=state.session_id,
                            )
                            continue
                        writer.add(line)
                if int(cursor) == 0:
                    break
            else:
                raise SnapshotError(f"scanning partition {part.partition} did not finish")
        last = yield snapshot_page_call(core, core.keyspace.partition(0), ())
        clocks.append(int(last[0]))
        walls.append(int(last[1]))
        published = writer.commit(
            {
                "partitions": core.config.partitions,
                "flush_started_wall_ms": min(walls),
                "flush_clock_ms": max(clocks),
                "flush_wall_ms": max(walls),
            }
        )
    except BaseException:
        writer.abort()
        raise
    # Retention runs for every published generation, durable or not (the new one is kept).
    removed = directory.retain(keep=published.generation)
    warnings = (*writer.warnings, *directory.retention_errors)
    for warning in warnings:
        log.warning("snapshot generation %d: %s", published.generation, warning)
    return FlushResult(
        generation=published.generation,
        path=str(published.path),
        sessions=writer.sessions,
        bytes=published.size,
        skipped=dict(writer.skipped),
        removed=tuple(str(p) for p in removed),
        permissions_verified=verified,
        duration_s=time.monotonic() - started,
        durable=writer.durable,
        warnings=tuple(warnings),
    )


# --------------------------------------------------------------------------- recovery


@dataclass
class RecoveryReport:
    """What a recovery attempt did.

    ``outcome`` is a stable word: ``restored``, ``empty`` (no valid generation: started
    empty), ``live`` (Redis had data: nothing restored), ``done_already`` (initialised
    before), ``waited`` (another worker restored while this one waited), ``timeout``,
    ``lost_lock``, ``error``.
    """

    outcome: str = "skipped"
    restorer: bool = False  # this process held the gate and did the work
    generation: int | None = None
    restored: int = 0
    existing: int = 0  # live in Redis already: not overwritten
    expired: int = 0  # past their TTL on recovery
    no_room: int = 0
    trimmed: int = 0  # restored without their oldest turns (over today's bounds)
    skipped: int = 0  # not restored: even trimmed they do not fit today's bounds
    quarantined: list[tuple[str, str]] = field(default_factory=list)  # (file, reason)
    # Rejected files that could not be moved to quarantine/ (file, why): left in place.
    quarantine_failed: list[tuple[str, str]] = field(default_factory=list)
    # Generations that vanished or became unreadable before or while being restored.
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    permissions_verified: bool = True
    message: str = ""
    # The gate state's epoch once the namespace is initialised (None: not finished).
    epoch: str | None = None
    # Run because Redis lost its data under a running process (restores into a
    # non-empty namespace, create-only).
    after_loss: bool = False

    @property
    def started_empty(self) -> bool:
        return self.outcome == "empty"


def _namespace_empty_plan(core: MemoryCore) -> Plan[bool]:
    for part in core.keyspace.all_partitions():
        reply = yield core.stats_call(part)
        if int(reply[0]) or int(reply[1]) or int(reply[2]):
            return False
    return True


def recover_plan(
    core: MemoryCore,
    directory: SnapshotDir,
    *,
    force: bool = False,
    wait_s: float = WAIT_S,
    poll_s: float = POLL_S,
    token: str | None = None,
    after_loss: bool = False,
    unhandled: str = "",
) -> Plan[RecoveryReport]:
    """Restore the newest valid generation into an empty namespace (see module docstring).

    ``force``: an operator restore -- ignore a finished gate and a non-empty namespace
    (still create-only: live keys are never overwritten).  ``after_loss``: Redis lost
    its data under a running process (:func:`loss_check_plan`): restore into the
    namespace even though appends made after the loss are in it (create-only), and
    with ``unhandled`` (the epoch of a ``live`` outcome that hid the loss) take a
    finished gate again.
    """
    report = RecoveryReport(after_loss=after_loss)
    token = token or secrets.token_hex(16)
    epoch = secrets.token_hex(8)  # recorded only if this restorer creates the state
    deadline = time.monotonic() + max(0.0, wait_s)
    # 1. The gate.
    while True:
        reply = yield restore_gate_call(
            core, "acquire", token, force=force, unhandled=unhandled if after_loss else ""
        )
        code = int(reply[0])
        if code == 2:
            if report.outcome == "skipped":  # someone else finished before we ever waited
                report.outcome = "done_already"
            else:
                report.outcome = "waited"
            report.message = f"namespace already initialised ({_b(reply[2])})"
            report.epoch = _b(reply[3]) if len(reply) > 3 else ""
            return report
        if code == 1:
            resuming = _b(reply[1]) == "restoring"
            break
        report.outcome = "waiting"
        if time.monotonic() >= deadline:
            report.outcome = "timeout"
            report.message = "another worker is still restoring; starting without waiting longer"
            # A running process's check meets a restorer at work: expected, not alarming.
            (log.info if after_loss else log.warning)("snapshot recovery: %s", report.message)
            return report
        yield Sleep(poll_s)
    report.restorer = True
    report.outcome = "skipped"
    try:
        return (
            yield from _recover_as_restorer(
                core, directory, report, _Gate(token, epoch), force or after_loss, resuming
            )
        )
    except (BackendError, SnapshotError, OSError) as exc:
        # Never fail startup: the gate lock expires and the next start tries again.
        report.outcome = "error"
        report.epoch = None
        report.message = f"recovery did not complete: {exc}"
        log.error("snapshot recovery: %s", report.message)
        return report


@dataclass(frozen=True)
class _Gate:
    token: str
    epoch: str  # recorded if this restorer creates the gate state


def _finish_plan(
    core: MemoryCore, gate: _Gate, report: RecoveryReport, outcome: str, generation: str = ""
) -> Plan[None]:
    reply = yield restore_gate_call(
        core, "finish", gate.token, generation=generation, outcome=outcome, epoch=gate.epoch
    )
    if int(reply[0]) == 1:
        report.epoch = _b(reply[1]) if len(reply) > 1 else ""


def _recover_as_restorer(
    core: MemoryCore,
    directory: SnapshotDir,
    report: RecoveryReport,
    gate: _Gate,
    into_live: bool,
    resuming: bool,
) -> Plan[RecoveryReport]:
    token = gate.token
    # 2. Only into an empty namespace (or to finish a restore that died midway, or an
    # operator restore, or after a data loss under running processes).
    if not into_live and not resuming:
        empty = yield from _namespace_empty_plan(core)
        if not empty:
            yield from _finish_plan(core, gate, report, "live")
            report.outcome = "live"
            report.message = "live data present in Redis; nothing restored"
            return report
    # 3. Newest valid generation.  Nothing is created or chmod-ed before reading: read-only
    # storage still restores (modes are tightened afterwards, best effort).
    for gen in directory.generations():  # an unreadable directory: outcome "error"
        result = yield from _verify_plan(core, directory, gen, token, report)
        if result is None:
            return report  # lost the gate
        if isinstance(result, Rejection):
            if result.reason in ("vanished", "unreadable"):
                # Gone, or an I/O error (EIO, EACCES): not proof the file is bad, so it is
                # not quarantined; the next start reads it again.
                report.unreadable.append((gen.path.name, result.detail))
                continue
            yield from _quarantine(core, directory, gen, result, report)
            continue
        begun = yield restore_gate_call(
            core, "begin", token, generation=str(gen.generation), epoch=gate.epoch
        )
        if int(begun[0]) != 1:
            report.outcome = "lost_lock"
            return report
        report.generation = gen.generation
        outcome = yield from _restore_generation_plan(core, directory, gen, result, gate, report)
        if outcome == "next":
            continue  # vanished or unreadable midway: the next older generation fills in
        if outcome != "restored":
            return report
        yield from _tighten_plan(core, directory, report)
        yield from _finish_plan(core, gate, report, "restored", str(gen.generation))
        report.outcome = "restored"
        report.message = (
            f"restored generation {gen.generation}: {report.restored} sessions"
            f" ({report.expired} expired on recovery, {report.existing} already live,"
            f" {report.no_room} without room, {report.trimmed} trimmed and"
            f" {report.skipped} skipped for today's bounds)"
        )
        if report.after_loss:
            report.message += " after Redis lost its data under running processes"
        log.info("snapshot recovery: %s", report.message)
        return report
    # 4. Nothing valid.
    yield from _tighten_plan(core, directory, report)
    yield from _finish_plan(core, gate, report, "empty")
    report.outcome = "empty"
    report.message = "no valid snapshot generation: starting empty"
    log.warning("snapshot recovery: %s (%s)", report.message, directory.path)
    return report


def _tighten_plan(core: MemoryCore, directory: SnapshotDir, report: RecoveryReport) -> Plan[None]:
    verified, why = directory.tighten()
    report.permissions_verified = verified
    if not verified:
        if why:
            log.warning("snapshot recovery: permissions not verified: %s", why)
        yield emit_event_call(
            core, ReasonCode.PERMISSIONS_NOT_VERIFIED, f"{directory.path}: {why}".rstrip(": ")
        )


def _verify_plan(
    core: MemoryCore,
    directory: SnapshotDir,
    gen: GenerationFile,
    token: str,
    report: RecoveryReport,
) -> Plan[VerifiedGeneration | Rejection | None]:
    """Pass 1 of one generation, extending the gate; None = the gate was lost."""
    steps = verify_steps(gen, directory.namespace, core.conv, directory.max_bytes)
    last_extend = time.monotonic()
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            result: VerifiedGeneration | Rejection = stop.value
            return result
        except (MemtierError, OSError, ValueError, TypeError, KeyError, RecursionError) as exc:
            # A validator bug must not stop startup either (the fuzzer in tests/faults
            # hunts these; this is the belt under it).
            log.exception("snapshot recovery: validator failed on %s", gen.path.name)
            return Rejection("validator_error", type(exc).__name__)
        if time.monotonic() - last_extend > 1.0:  # a large file: keep the gate
            last_extend = time.monotonic()
            ext = yield restore_gate_call(core, "extend", token)
            if int(ext[0]) != 1:
                report.outcome = "lost_lock"
                report.message = "the restore lock expired while verifying"
                return None


def _restore_generation_plan(
    core: MemoryCore,
    directory: SnapshotDir,
    gen: GenerationFile,
    verified: VerifiedGeneration,
    gate: _Gate,
    report: RecoveryReport,
) -> Plan[str]:
    """Pass 2: restore every session; returns ``restored``, ``next`` or ``stop``."""
    token = gate.token
    detail = f"generation={gen.generation}"
    flush_wall = int(verified.header["flush_wall_ms"])
    done = 0
    last_extend = time.monotonic()
    try:
        for session in iter_generation(verified, core.conv):
            fitted = fit_session(session, core.conv)
            if fitted.session is None:
                report.skipped += 1
                metrics.SNAPSHOT_SESSIONS_SKIPPED.labels("restore", "bounds").inc()
                yield emit_event_call(
                    core,
                    ReasonCode.RESTORE_SKIPPED,
                    f"{detail} {fitted.reason}",
                    member=session.member,
                    session_id=session.session_id,
                )
                continue
            # A new session id (D7): turns acknowledged after this flush and lost with
            # Redis had (old id, seq) pairs this session would otherwise hand out again.
            note = f"{detail} from={session.session_id}"
            if fitted.dropped:
                note += f" trimmed={fitted.dropped}"
            call = restore_session_call(core, fitted.session, note, session_id=new_session_id())
            out = yield _with_flush_wall(call, flush_wall)
            status = int(out[0])
            if status == 0:
                report.restored += 1
                if fitted.dropped:
                    report.trimmed += 1
            elif status == 1:
                report.existing += 1
            elif status == 2:
                report.expired += 1
            else:
                report.no_room += 1
            done += 1
            if done % EXTEND_EVERY == 0 or time.monotonic() - last_extend > 1.0:
                last_extend = time.monotonic()
                ext = yield restore_gate_call(core, "extend", token)
                if int(ext[0]) != 1:
                    report.outcome = "lost_lock"
                    report.message = "the restore lock expired; another worker continues"
                    return "stop"
    except SnapshotValidationError as exc:
        if exc.reason in ("vanished", "unreadable"):
            # Removed or unreadable between the passes (retention elsewhere, an
            # operator): what is restored stays (create-only), the next one fills in.
            report.unreadable.append((gen.path.name, exc.detail))
            log.warning("snapshot recovery: %s %s: %s", gen.path.name, exc.reason, exc.detail)
            return "next"
        # Changed on disk between the two passes: keep what is restored (create-only,
        # validated), quarantine the file and try no older one over it.
        yield from _quarantine(core, directory, gen, Rejection(exc.reason, exc.detail), report)
        report.outcome = "error"
        report.message = f"generation {gen.generation} changed while restoring"
        yield from _finish_plan(core, gate, report, "partial", str(gen.generation))
        return "stop"
    return "restored"


def _quarantine(
    core: MemoryCore,
    directory: SnapshotDir,
    gen: GenerationFile,
    rejection: Rejection,
    report: RecoveryReport,
) -> Plan[None]:
    name = gen.path.name
    try:
        target = directory.quarantine(gen, rejection.reason)
    except SnapshotError as exc:
        # Full or read-only storage: the rejected file stays where it is (it is rejected
        # again on the next start); recovery goes on with the next older generation.
        report.quarantine_failed.append((name, exc.message))
        log.error(
            "snapshot recovery: %s rejected (%s) but not quarantined: %s",
            name,
            rejection.reason,
            exc.message,
        )
        yield emit_event_call(
            core, ReasonCode.QUARANTINED, f"{name}: {rejection.reason} (not moved: {exc.message})"
        )
        return
    report.quarantined.append((name, rejection.reason))
    log.warning(
        "snapshot recovery: generation %s quarantined (%s: %s) -> %s",
        name,
        rejection.reason,
        rejection.detail,
        target,
    )
    yield emit_event_call(core, ReasonCode.QUARANTINED, f"{name}: {rejection.reason}")


# --------------------------------------------------------------------------- data loss


@dataclass
class LossWatch:
    """What one process knows about the gate state, for :func:`loss_check_plan`.

    ``epoch``: the gate epoch this process last saw (None: none yet).  ``retry_start``:
    the start-up recovery of this process did not finish (Redis was down, another
    restorer held the gate): the next check runs it again.  ``pending``: a data loss
    was detected and is not recovered yet (the worker holds its flushes back: a
    generation written now would lack every lost session and become the newest).
    Checks are spaced ``interval_s`` apart (floor :data:`LOSS_CHECK_MIN_S`); only one
    thread of a process checks at a time (:meth:`claim` never blocks).
    """

    interval_s: float = LOSS_CHECK_S
    epoch: str | None = None
    retry_start: bool = False
    pending: bool = False
    losses: int = 0  # data losses this process detected
    last: RecoveryReport | None = None  # the last recovery a check ran
    next_check: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.interval_s = max(LOSS_CHECK_MIN_S, float(self.interval_s))
        if not self.next_check:
            self.next_check = time.monotonic() + self.interval_s

    def saw(self, report: RecoveryReport) -> None:
        """Take in a recovery's result (the start-up one, or one a check ran)."""
        if report.epoch is not None:
            self.epoch = report.epoch
            self.retry_start = False
            self.pending = False
        elif self.epoch is None:
            self.retry_start = True
        elif report.after_loss:
            self.pending = True

    def claim(self, force: bool = False) -> bool:
        """True when a check is due and this thread got to do it (then :meth:`release`).

        The hot path: one clock read and a comparison unless a check is due.
        """
        now = time.monotonic()
        if not force and now < self.next_check:
            return False
        if not self._lock.acquire(blocking=False):
            return False
        self.next_check = now + self.interval_s
        return True

    def release(self) -> None:
        self._lock.release()


def loss_check_plan(
    core: MemoryCore, directory: SnapshotDir, watch: LossWatch
) -> Plan[RecoveryReport | None]:
    """One check for a data loss (see the module docstring); the recovery it ran, if any.

    Never waits for another restorer (``wait_s=0``): a busy gate is tried again at the
    next check.  Raises BackendError when Redis does not answer (the caller logs it).
    """
    reply = yield Command(
        "hmget", (core.keyspace.restore_state, ["status", "epoch", "outcome"]), {}
    )
    status, epoch, outcome = (None if v is None else _b(v) for v in reply)
    seen = watch.epoch
    after_loss = False
    unhandled = ""
    if status is None:  # no gate state
        if seen is None and not watch.retry_start:
            return None  # never initialised as far as this process knows: not evidence
        after_loss = seen is not None
    elif seen is None:
        if status == "done":
            watch.epoch = epoch or ""
            watch.retry_start = False
            return None
        # status "restoring": a restorer at work, or one that died midway (continue it).
    elif (epoch or "") == seen:
        if status == "done":
            return None  # the common case: nothing happened
    elif status == "done" and outcome != "live":
        watch.epoch = epoch or ""  # someone else restored (or started empty) after a loss
        watch.pending = False
        return None
    else:
        # Created again since this process saw it, and either a start after the loss
        # found the new appends as "live" and restored nothing, or a restore is running.
        after_loss = True
        unhandled = epoch or "" if status == "done" else ""
    if after_loss:
        watch.losses += 1
        log.warning(
            "snapshot recovery: Redis lost this namespace's data under a running process"
            " (restore gate state %s); restoring the absent sessions (create-only)",
            "missing" if status is None else f"re-created as {epoch!r}",
        )
    report = yield from recover_plan(
        core, directory, wait_s=0.0, after_loss=after_loss, unhandled=unhandled
    )
    watch.last = report
    watch.saw(report)
    if after_loss and report.epoch is None:
        watch.pending = True
    return report


def snapshot_dir_for(config: Any) -> SnapshotDir:
    """``<storage_path>/conversations`` of a :class:`~memtier.config.MemtierConfig`."""
    conv = config.conversation
    return SnapshotDir(
        conv.storage_path / "conversations", config.namespace, max_bytes=conv.max_snapshot_bytes
    )
