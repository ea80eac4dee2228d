"""The floor of a snapshot flush: the same ``snapshot_page`` calls, replies written raw.

:func:`flush_floor` reads every live session of a namespace with the calls the flush
makes -- ``HSCAN`` pages of each partition's index, then ``snapshot_page`` over members
grouped exactly as :func:`memtier.memory.persistence.flush_plan` groups them
(:data:`~memtier.memory.persistence.flush.PAGE_SESSIONS` sessions /
:data:`~memtier.memory.persistence.flush.PAGE_BYTES` of content, the members after the
script's work bound sent again) -- on one raw socket, and writes each page reply's RESP
bytes as they arrive to a file in the flush's directory (1 MiB buffered, SHA-256 of
every byte, ``fsync`` at the end).  No decoding into lines, no checks, no JSON: hiredis
parses each reply only to find its end and the last member returned (where the next
call resumes).  So its time is Redis running the pages, the round trips, and the
disk: what a flush of these sessions costs if the client's own work were free.

Compare a flush with it by time for the same sessions (``flush vs floor`` =
floor seconds / flush seconds), and against the disk as the flush's generation bytes
over the floor's seconds (``flush floor vs disk``: the flush/disk ratio a free client
would reach).
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from pathlib import Path
from typing import Any

__all__ = ["flush_floor"]

_BUFFER = 1024 * 1024


def _resp(*parts: Any) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode("utf-8")
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class _Raw:
    """One connection: send a command, read its whole reply (raw bytes and parsed)."""

    def __init__(self, host: str, port: int) -> None:
        import hiredis

        self.sock = socket.create_connection((host, port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()
        self.buf = bytearray(_BUFFER)

    def call(self, command: bytes, sink: Any = None) -> Any:
        self.sock.sendall(command)
        view = memoryview(self.buf)
        while True:
            n = self.sock.recv_into(self.buf)
            if n == 0:
                raise ConnectionError("server closed the connection")
            chunk = view[:n]
            if sink is not None:
                sink(chunk)
            self.reader.feed(chunk)  # type: ignore[arg-type]  # hiredis takes any buffer
            reply = self.reader.gets()
            if reply is not False:
                if isinstance(reply, Exception):
                    raise reply
                return reply

    def close(self) -> None:
        self.sock.close()


def flush_floor(store: Any, directory: Path) -> dict[str, Any]:
    """Read every live session of ``store``'s namespace as its flush does, writing the
    page replies raw (see the module docstring).  Returns ``seconds``, ``reply_bytes``,
    ``cpu_seconds``, ``page_calls``, ``sessions``; the file is removed."""
    from memtier.memory.persistence.flush import PAGE_BYTES, PAGE_SESSIONS, snapshot_page_call
    from memtier.memory.snapshot.fileformat import page_last_member

    kwargs = store.client.connection_pool.connection_kwargs
    raw = _Raw(kwargs.get("host", "127.0.0.1"), int(kwargs.get("port", 6379)))
    sha = store.scripts["snapshot_page"].sha
    core = store.core
    path = directory / f".flushfloor-{os.getpid()}"
    digest = hashlib.sha256()
    written = calls = sessions = 0
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        with open(path, "wb", buffering=_BUFFER) as fh:

            def sink(chunk: memoryview) -> None:
                nonlocal written
                fh.write(chunk)
                digest.update(chunk)
                written += len(chunk)

            def page(part: Any, members: list[str]) -> Any:
                call = snapshot_page_call(core, part, members)
                return raw.call(_resp("EVALSHA", sha, len(call.keys), *call.keys, *call.args), sink)

            page(core.keyspace.partition(0), [])  # the flush's first clock reading
            calls += 1
            for part in core.keyspace.all_partitions():
                cursor: Any = b"0"
                seen: set[bytes] = set()
                while True:
                    cursor, flat = raw.call(
                        _resp("HSCAN", part.index, cursor, "COUNT", PAGE_SESSIONS)
                    )
                    batch: list[str] = []
                    batch_bytes = 0
                    pages: list[list[str]] = []
                    for i in range(0, len(flat), 2):
                        if flat[i] in seen:
                            continue
                        seen.add(flat[i])
                        nbytes = int(flat[i + 1])
                        if batch and (
                            len(batch) >= PAGE_SESSIONS or batch_bytes + nbytes > PAGE_BYTES
                        ):
                            pages.append(batch)
                            batch, batch_bytes = [], 0
                        batch.append(flat[i].decode("utf-8"))
                        batch_bytes += nbytes
                    if batch:
                        pages.append(batch)
                    while pages:
                        members = pages.pop(0)
                        reply = page(part, members)
                        calls += 1
                        sessions += int(reply[2])
                        last = page_last_member(reply)
                        if last is not None:
                            rest = members[members.index(last) + 1 :]
                            if rest:
                                pages.insert(0, rest)
                    if cursor in (b"0", 0, "0"):
                        break
            page(core.keyspace.partition(0), [])  # and its last one
            calls += 1
            fh.flush()
            os.fsync(fh.fileno())
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        raw.close()
        path.unlink(missing_ok=True)
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "reply_bytes": written,
        "page_calls": calls,
        "sessions": sessions,
        "sha256": digest.hexdigest(),
    }
