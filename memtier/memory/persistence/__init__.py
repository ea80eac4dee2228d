"""Flush and restart recovery as sans-I/O plans (driven by both stores).

One module per concern:

* :mod:`~memtier.memory.persistence.flush` -- the flush plan (live sessions into a new
  snapshot generation, bounded pages);
* :mod:`~memtier.memory.persistence.recovery` -- the recovery plan (the newest valid
  generation back into an empty namespace, create-only);
* :mod:`~memtier.memory.persistence.restorebatch` -- its pass 2's reading side (the
  generation's sessions as batches of ``restore_session`` calls);
* :mod:`~memtier.memory.persistence.gate` -- the restore gate that elects one restorer;
* :mod:`~memtier.memory.persistence.losswatch` -- data loss under running processes
  (:class:`LossWatch`, :func:`loss_check_plan`);
* :mod:`~memtier.memory.persistence.shared` -- the event call and the snapshot directory
  of a configuration.

The snapshot files themselves are :mod:`memtier.memory.snapshot`.  This package's
namespace is their public surface.
"""

from __future__ import annotations

from memtier.memory.persistence.flush import FlushResult, flush_plan, snapshot_page_call
from memtier.memory.persistence.gate import restore_gate_call
from memtier.memory.persistence.losswatch import (
    LOSS_CHECK_MIN_S,
    LOSS_CHECK_S,
    LossWatch,
    loss_check_plan,
)
from memtier.memory.persistence.recovery import RecoveryReport, RestoreProgress, recover_plan
from memtier.memory.persistence.restorebatch import restore_session_call
from memtier.memory.persistence.shared import emit_event_call, snapshot_dir_for

__all__ = [
    "LOSS_CHECK_MIN_S",
    "LOSS_CHECK_S",
    "FlushResult",
    "LossWatch",
    "RecoveryReport",
    "RestoreProgress",
    "emit_event_call",
    "flush_plan",
    "loss_check_plan",
    "recover_plan",
    "restore_gate_call",
    "restore_session_call",
    "snapshot_dir_for",
    "snapshot_page_call",
]
