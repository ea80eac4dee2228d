"""Worst-case script time at the hard ceilings stays under a low busy-reply threshold.

A running script blocks its shard.  On a private server with
``busy-reply-threshold`` set low (other clients would get BUSY past it), the
heaviest calls memtier can make are timed by Redis itself (SLOWLOG, microseconds
of server time): an append that evicts MAX_EVICTIONS_PER_CALL sessions each at
the turn ceiling, the snapshot pages of those sessions, and their restore.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from faultservers import fault_redis
from servers import require_real_redis

from bench.workerbench import populate_sessions
from memtier import AvatarMessage, ConversationKey, ConversationStore, MemtierConfig, limits
from memtier.scripts import load_registry

pytestmark = [pytest.mark.real, pytest.mark.slow]

BUSY_REPLY_THRESHOLD_MS = 100  # Redis default: 5000 ms
TURNS = int(limits.MAX_TURNS_PER_SESSION.ceiling)  # every victim at the turn ceiling
VICTIMS = limits.MAX_EVICTIONS_PER_CALL


def _slowest(conn: Any, script: str) -> tuple[int, int]:
    """(calls, longest duration in µs) of ``script`` in the SLOWLOG since the last reset."""
    sha = load_registry("memory")[script].sha.encode()
    entries = [e for e in conn.slowlog_get(100_000) if sha in e["command"]]
    return len(entries), max((int(e["duration"]) for e in entries), default=0)


def test_worst_case_scripts_stay_under_the_busy_threshold(tmp_path: Path) -> None:
    require_real_redis("redis-server")
    namespace = "w" + uuid.uuid4().hex[:8]
    server_config = {
        "busy-reply-threshold": str(BUSY_REPLY_THRESHOLD_MS),
        "slowlog-log-slower-than": "0",
        "slowlog-max-len": "100000",
    }
    limit_us = BUSY_REPLY_THRESHOLD_MS * 1000
    with fault_redis(server_config) as server:
        config = MemtierConfig.load(
            redis_url=server.url,
            namespace=namespace,
            conversation={
                "max_turns_per_session": TURNS,
                "max_aggregate_bytes": VICTIMS * TURNS,  # 1-byte turns: exactly full
                "max_turn_bytes": VICTIMS * TURNS,
                "max_session_bytes": VICTIMS * TURNS,
                "max_active_sessions": int(limits.MAX_ACTIVE_SESSIONS.ceiling),
                "persistence_enabled": True,
                "storage_path": str(tmp_path),
            },
        )
        with ConversationStore.from_config(config, recover=False, inline_compaction=False) as store:
            populate_sessions(store, VICTIMS, turns=TURNS, text_bytes=1, batch=2000)
            assert store.stats() == {"sessions": VICTIMS, "bytes": VICTIMS * TURNS}
            with server.admin() as conn:
                conn.slowlog_reset()
                flushed = store.flush()
                pages, page_us = _slowest(conn, "snapshot_page")
            assert flushed.sessions == VICTIMS and pages >= 1

            with server.admin() as conn:
                conn.slowlog_reset()
                big = ConversationKey(uuid.uuid4(), "im")
                receipt = store.append(big, AvatarMessage(text="x" * (VICTIMS * TURNS)))
                appends, evict_us = _slowest(conn, "append_turn")
            assert receipt.evicted == VICTIMS, receipt
            assert appends == 1

            with server.admin() as conn:
                for key in conn.scan_iter(match="*" + namespace + "*", count=1000):
                    conn.delete(key)
                conn.slowlog_reset()
                report = store.recover(force=True)
                restores, restore_us = _slowest(conn, "restore_session")
            assert report.restored == VICTIMS, report
            assert restores >= VICTIMS

    measured = {"snapshot_page": page_us, "append_evicting_64": evict_us, "restore": restore_us}
    print(f"worst-case script time (µs of Redis time): {measured}")
    for name, us in measured.items():
        assert 0 < us < limit_us, f"{name} ran {us} µs, over {BUSY_REPLY_THRESHOLD_MS} ms"
