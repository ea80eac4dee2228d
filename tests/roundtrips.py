"""Round trips to Redis, counted by the writes that carry them (every test folder)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.connection

# The real servers, standalone and Cluster, for the tests that count round trips
# (fakeredis has no connections to count).
ROUND_TRIP_BACKENDS = [
    pytest.param("real", marks=pytest.mark.real),
    pytest.param("cluster", marks=pytest.mark.cluster),
    pytest.param("valkey", marks=pytest.mark.valkey),
    pytest.param("valkey-cluster", marks=[pytest.mark.valkey, pytest.mark.cluster]),
]


class Writes:
    """Counts writes to Redis (one per round trip): ``send_packed_command`` of every sync
    redis-py connection, Cluster nodes included, and every write to an asyncio stream --
    where redis-py's asyncio connections and memtier's auto-pipeline (which writes a
    batch to the transport itself, ``memtier.autopipeline._write``) both write."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        sync_send = redis.connection.AbstractConnection.send_packed_command
        stream_writelines = asyncio.StreamWriter.writelines
        stream_write = asyncio.StreamWriter.write

        def counted(conn: Any, *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return sync_send(conn, *args, **kwargs)

        def counted_writelines(writer: asyncio.StreamWriter, data: Any) -> None:
            self.count += 1
            stream_writelines(writer, data)

        def counted_write(writer: asyncio.StreamWriter, data: Any) -> None:
            self.count += 1
            stream_write(writer, data)

        monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
        monkeypatch.setattr(asyncio.StreamWriter, "writelines", counted_writelines)
        monkeypatch.setattr(asyncio.StreamWriter, "write", counted_write)
