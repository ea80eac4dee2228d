"""The recovery plan: restore the newest valid generation into an empty namespace.

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

The gate (:mod:`~memtier.memory.persistence.gate`) elects the one restorer; sessions are
restored by ``restore_session`` (statuses: :class:`~memtier.memory.restorestatus.RestoreStatus`).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from memtier import metrics
from memtier.engine import Overlap, Plan, ScriptBatch, Sleep
from memtier.errors import BackendError, MemtierError, SnapshotError
from memtier.memory.core import MemoryCore
from memtier.memory.models import ReasonCode
from memtier.memory.persistence.gate import restore_gate_call
from memtier.memory.persistence.restorebatch import (
    RESTORE_BATCH_BYTES,
    RESTORE_BATCH_RECORDS,
    RESTORE_BATCH_SESSIONS,
    BatchReader,
    Restore,
    restore_session_call,
)
from memtier.memory.persistence.shared import emit_event_call
from memtier.memory.restorestatus import GateStatus, RestoreStatus
from memtier.memory.snapshot.directory import GenerationFile, SnapshotDir
from memtier.memory.snapshot.validation import (
    Rejection,
    VerifiedGeneration,
    verify_steps,
)
from memtier.wire import text as _b

__all__ = [
    "POLL_S",
    "PROGRESS_INTERVAL_S",
    "RESTORE_BATCH_BYTES",
    "RESTORE_BATCH_RECORDS",
    "RESTORE_BATCH_SESSIONS",
    "WAIT_S",
    "RecoveryReport",
    "RestoreProgress",
    "RestoreStatus",
    "recover_plan",
    "restore_session_call",
]

log = logging.getLogger("memtier.persistence")

EXTEND_EVERY: Final = 200
WAIT_S: Final = 120.0  # how long a non-restorer waits for the restorer
POLL_S: Final = 0.2
# The progress callback is called at most this often (and once at the end).
PROGRESS_INTERVAL_S: Final = 1.0


@dataclass(frozen=True)
class RestoreProgress:
    """How far the restore of one generation is (``recover(progress=...)``).

    ``sessions_done`` counts the generation's sessions handled so far (restored, live
    already, expired, without room, or skipped for today's bounds) and ``bytes_done``
    their payload bytes in the file; both only grow and end at ``sessions_total`` /
    ``bytes_total`` (the header's) when the generation is restored completely.
    """

    generation: int
    sessions_done: int
    sessions_total: int
    bytes_done: int
    bytes_total: int
    restored: int
    elapsed_s: float

    @property
    def finished(self) -> bool:
        return self.sessions_done == self.sessions_total and self.bytes_done == self.bytes_total


ProgressCallback = Callable[[RestoreProgress], Any]


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
    progress: ProgressCallback | None = None,
    progress_interval_s: float = PROGRESS_INTERVAL_S,
) -> Plan[RecoveryReport]:
    """Restore the newest valid generation into an empty namespace (see module docstring).

    ``force``: an operator restore -- ignore a finished gate and a non-empty namespace
    (still create-only: live keys are never overwritten).  ``after_loss``: Redis lost
    its data under a running process (:func:`loss_check_plan`): restore into the
    namespace even though appends made after the loss are in it (create-only), and
    with ``unhandled`` (the epoch of a ``live`` outcome that hid the loss) take a
    finished gate again.  ``progress``: called with a :class:`RestoreProgress` while a
    generation is restored, at most every ``progress_interval_s`` and once when it is
    complete (from the thread driving the plan; an exception it raises is logged and
    ignored: progress never stops a recovery).
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
        if code == GateStatus.INITIALISED:
            if report.outcome == "skipped":  # someone else finished before we ever waited
                report.outcome = "done_already"
            else:
                report.outcome = "waited"
            report.message = f"namespace already initialised ({_b(reply[2])})"
            report.epoch = _b(reply[3]) if len(reply) > 3 else ""
            return report
        if code == GateStatus.OK:
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
                core,
                directory,
                report,
                _Gate(token, epoch),
                force or after_loss,
                resuming,
                _Progress(progress, progress_interval_s),
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


class _Progress:
    """Counts a generation's restore (the metrics, always) and feeds the caller's
    progress callback (at most every ``interval_s``, and at the end)."""

    def __init__(self, callback: ProgressCallback | None, interval_s: float) -> None:
        self.callback = callback
        self.interval_s = max(0.0, interval_s)
        self.started = time.monotonic()
        self.last = float("-inf")
        self.generation = 0
        self.header: Any = {}
        self.sessions = 0
        self.bytes = 0

    def begin(self, generation: int, header: Any) -> None:
        self.generation, self.header = generation, header
        self.sessions = self.bytes = 0
        self.report(0, final=False)

    def advance(self, sessions: int, nbytes: int, restored: int) -> None:
        self.sessions += sessions
        self.bytes += nbytes
        metrics.SNAPSHOT_RESTORE_SESSIONS.inc(sessions)
        metrics.SNAPSHOT_RESTORE_BYTES.inc(nbytes)
        self.report(restored, final=False)

    def report(self, restored: int, *, final: bool) -> None:
        if self.callback is None:
            return
        now = time.monotonic()
        if not final and now - self.last < self.interval_s:
            return
        self.last = now
        state = RestoreProgress(
            generation=self.generation,
            sessions_done=self.sessions,
            sessions_total=int(self.header["sessions"]),
            bytes_done=self.bytes,
            bytes_total=int(self.header["payload_bytes"]),
            restored=restored,
            elapsed_s=now - self.started,
        )
        try:
            self.callback(state)
        except Exception:
            log.exception("snapshot recovery: the progress callback failed (ignored)")


def _finish_plan(
    core: MemoryCore, gate: _Gate, report: RecoveryReport, outcome: str, generation: str = ""
) -> Plan[None]:
    reply = yield restore_gate_call(
        core, "finish", gate.token, generation=generation, outcome=outcome, epoch=gate.epoch
    )
    if int(reply[0]) == GateStatus.OK:
        report.epoch = _b(reply[1]) if len(reply) > 1 else ""


def _recover_as_restorer(
    core: MemoryCore,
    directory: SnapshotDir,
    report: RecoveryReport,
    gate: _Gate,
    into_live: bool,
    resuming: bool,
    progress: _Progress,
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
        if int(begun[0]) != GateStatus.OK:
            report.outcome = "lost_lock"
            return report
        report.generation = gen.generation
        outcome = yield from _restore_generation_plan(
            core, directory, gen, result, gate, report, progress
        )
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
            if int(ext[0]) != GateStatus.OK:
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
    progress: _Progress,
) -> Plan[str]:
    """Pass 2: restore every session; returns ``restored``, ``next`` or ``stop``.

    Sessions go in batches (:data:`RESTORE_BATCH_SESSIONS`, :data:`RESTORE_BATCH_BYTES`,
    :data:`RESTORE_BATCH_RECORDS`): one round trip of independent create-only
    ``restore_session`` calls, while the next batch is read (:class:`BatchReader`).
    """
    token = gate.token
    detail = f"generation={gen.generation}"
    reader = BatchReader(core, verified, detail)
    done = 0
    last_extend = time.monotonic()
    progress.begin(gen.generation, verified.header)
    batch = reader.fill()
    while True:  # bounded: every fill reads at least one line or ends the reading
        for session, reason, line_bytes in reader.take_skipped():
            report.skipped += 1
            metrics.SNAPSHOT_SESSIONS_SKIPPED.labels("restore", "bounds").inc()
            yield emit_event_call(
                core,
                ReasonCode.RESTORE_SKIPPED,
                f"{detail} {reason}",
                member=session.member,
                session_id=session.session_id,
            )
            progress.advance(1, line_bytes, report.restored)
        if not batch:
            if reader.ended:
                break
            batch = reader.fill()
            continue
        request = ScriptBatch(tuple(r.call for r in batch))
        if reader.ended:
            replies = yield request
        else:  # the next batch is read while Redis restores this one
            replies = yield Overlap(request, reader.read_ahead)
        _count_restored(report, batch, replies)
        before = done
        done += len(batch)
        progress.advance(len(batch), sum(r.line_bytes for r in batch), report.restored)
        if done // EXTEND_EVERY != before // EXTEND_EVERY or time.monotonic() - last_extend > 1.0:
            last_extend = time.monotonic()
            ext = yield restore_gate_call(core, "extend", token)
            if int(ext[0]) != GateStatus.OK:
                report.outcome = "lost_lock"
                report.message = "the restore lock expired; another worker continues"
                return "stop"
        batch = reader.take_ahead()
    exc = reader.error
    if exc is not None:
        # The sessions read before the problem passed every check and are restored (as
        # the one-by-one restore did: create-only); now the file.
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
    progress.report(report.restored, final=True)
    return "restored"


def _count_restored(report: RecoveryReport, batch: list[Restore], replies: list[Any]) -> None:
    for restore, out in zip(batch, replies, strict=True):
        status = int(out[0])
        if status == RestoreStatus.RESTORED:
            report.restored += 1
            if restore.dropped:
                report.trimmed += 1
        elif status == RestoreStatus.EXISTS:
            report.existing += 1
        elif status == RestoreStatus.EXPIRED:
            report.expired += 1
        else:  # RestoreStatus.NO_ROOM
            report.no_room += 1


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
