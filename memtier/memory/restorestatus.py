"""Status values of the ``restore_gate`` and ``restore_session`` scripts (first reply item).

One convention for every memtier script: negative = refused, zero = done, positive = a
documented variant.  The scripts' headers list the same values under the same names;
tests/workers/test_restore_status_contract.py keeps the three (Lua returns, header,
these enums) in step.  A leaf module (no imports) so :mod:`memtier.metrics` can read
it too.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["GateStatus", "RestoreStatus"]


class GateStatus(IntEnum):
    """``restore_gate``: ``{status, ...}``."""

    OK = 0  # acquire: the gate is the caller's; begin / extend / finish: done
    INITIALISED = 1  # acquire: the namespace was initialised already (generation, outcome, epoch)
    LOST = -1  # begin / extend / finish: the lock is no longer the caller's
    BUSY = -2  # acquire: another worker holds the lock


class RestoreStatus(IntEnum):
    """``restore_session``: ``{status, ...}``."""

    RESTORED = 0  # {0, bytes, last_ms}
    EXISTS = 1  # {1}: the key is live in Redis; nothing changed
    EXPIRED = 2  # {2, age_ms}: past its TTL on recovery
    NO_ROOM = -1  # {-1, "sessions" | "bytes"}: the partition's ceilings are full
