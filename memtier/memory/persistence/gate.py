"""The restore gate: exactly one process restores a namespace; the gate state records it.

Its statuses are :class:`~memtier.memory.restorestatus.GateStatus` (see
``lua/memory/restore_gate-2.lua``).  The gate's lock expires after :data:`LOCK_MS`
unless the restorer extends it.
"""

from __future__ import annotations

from typing import Final

from memtier.engine import ScriptCall
from memtier.memory.core import MemoryCore
from memtier.memory.scriptspecs import RESTORE_GATE

__all__ = ["LOCK_MS", "restore_gate_call"]

LOCK_MS: Final = 30_000  # the restorer extends it every EXTEND_EVERY sessions / second


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
    return RESTORE_GATE.call(
        {"lock": ks.restore_lock, "state": ks.restore_state},
        op=op,
        token=token,
        lock_ms=LOCK_MS,
        generation=generation,
        outcome=outcome,
        force="1" if force else "",
        epoch=epoch,
        unhandled=unhandled,
    )
