"""Reply decoding shared by the whole package: Redis text and Redis times.

redis-py returns bytes (``decode_responses=False``, memtier's setting) or str (a client
a host built with ``decode_responses=True``); :func:`text` is the one place that turns
either into ``str``.  :func:`ms_to_datetime` reads the millisecond wall times that the
scripts store and return.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

__all__ = ["ms_to_datetime", "text"]


def text(value: Any) -> str:
    """A reply element as ``str``: bytes are UTF-8; anything else goes through ``str()``."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def ms_to_datetime(ms: int) -> datetime:
    """A Unix time in milliseconds as an aware UTC datetime."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC)
