"""Ask an asyncio cluster client for a slot-map refresh and wait until it may run.

redis-py 8.2 paces the refreshes its error paths ask for (``topology_refresh_min_interval``,
one second by default): the refresh runs in the first ``initialize()`` once due.  Tests
that need the next call to re-read the map ask as memtier's lean path asks, then wait for
that moment (bounded) instead of reaching into redis-py's timers.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from memtier.aioleancluster import request_refresh


async def ask_refresh_and_wait_due(client: Any, timeout_s: float = 10.0) -> None:
    request_refresh(client)
    due = getattr(client, "_initialize_due", None)
    if due is None:  # redis-py < 8.2: the flag alone makes the next initialize() refresh
        return
    deadline = time.monotonic() + timeout_s
    while not due():
        assert time.monotonic() < deadline, "the requested refresh never became due"
        await asyncio.sleep(0.02)
