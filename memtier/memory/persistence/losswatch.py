"""Data loss under running processes: the :class:`LossWatch` and its check plan.

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
import threading
import time
from dataclasses import dataclass, field
from typing import Final

from memtier.engine import Command, Plan
from memtier.memory.core import MemoryCore
from memtier.memory.persistence.recovery import RecoveryReport, recover_plan
from memtier.memory.snapshot.directory import SnapshotDir
from memtier.wire import text as _b

__all__ = ["LOSS_CHECK_MIN_S", "LOSS_CHECK_S", "LossWatch", "loss_check_plan"]

log = logging.getLogger("memtier.persistence")

# Data-loss checks: the default period, and its hard floor (a check is one HMGET).
LOSS_CHECK_S: Final = 5.0
LOSS_CHECK_MIN_S: Final = 0.05


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
