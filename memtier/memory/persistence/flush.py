"""The flush plan: every live session of the namespace into a new snapshot generation.

Flush
    Every partition's index hash is scanned with bounded ``HSCAN`` pages; the live
    sessions of a page are read by one ``snapshot_page`` script call (at most
    :data:`PAGE_SESSIONS` sessions and about :data:`PAGE_BYTES` of content), so each
    session is a consistent point-in-time copy and no call blocks appends for long.
    Sessions stream into a new generation file (:mod:`memtier.memory.snapshot`); each is
    checked with the recovery validator first (every check of
    :func:`~memtier.memory.snapshot.validation.check_session_line`, the secret re-check
    included for every record the current redactor did not write), so one bad live
    session cannot poison
    every future generation (it is left out and reported: ``skipped``, a
    ``snapshot_skipped`` event, a metric).  ``append`` runs the same record validator,
    so what the live path stores is always flushable.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from memtier import limits, metrics
from memtier.engine import Command, Overlap, Plan, ScriptCall
from memtier.errors import SnapshotError
from memtier.keys import PartitionKeys
from memtier.memory.core import MemoryCore
from memtier.memory.models import ReasonCode
from memtier.memory.persistence.shared import emit_event_call
from memtier.memory.scriptspecs import SNAPSHOT_PAGE
from memtier.memory.snapshot.directory import SnapshotDir
from memtier.memory.snapshot.fileformat import SnapshotValidationError, page_last_member
from memtier.memory.snapshot.pagecheck import check_page
from memtier.memory.snapshot.writer import GenerationWriter
from memtier.wire import text as _b

__all__ = [
    "MAX_PAGE_BYTES",
    "MAX_PAGE_SESSIONS",
    "PAGE_BYTES",
    "PAGE_SESSIONS",
    "FlushResult",
    "flush_plan",
    "snapshot_page_call",
]

log = logging.getLogger("memtier.persistence")

# One snapshot_page call reads at most this many sessions (and HSCAN asks for as many)...
PAGE_SESSIONS: Final = 32
# ...and stops adding sessions once their indexed bytes pass this (one big session still
# goes alone): bounds how long one call blocks the shard.  Measured with bench.flushprobe
# --bounds (SLOWLOG; 20k sessions of 4 turns, bounds interleaved in one run; docs/
# performance.md, "The page hold against its floor"): 64 / 32 KiB held the shard p50
# 0.6-0.75 ms, p99 1.1-2.9 ms under load; 32 / 16 KiB p50 0.3 ms, p99 0.76-1.07 ms in
# every run at the same flush rate (-3 % to +12 %); 16 / 8 KiB and 8 / 4 KiB cut p99
# further but cost 20-45 % of the rate in round trips.  The longest call is the same for
# every bound (2-9 ms even for 0.1 ms pages): redis-server preempted mid-script on this
# loaded machine (bench.pagehold reads its /proc counters around each page call: the
# holds past 2.6 ms were all preempted calls; undisturbed pages 1.3-2.6 ms at most).
PAGE_BYTES: Final = 16 * 1024
# Hard ceilings: flush_plan's arguments may lower the bounds, never pass these.
MAX_PAGE_SESSIONS: Final = 64  # snapshot_page-2.lua caps its members at 256
MAX_PAGE_BYTES: Final = 32 * 1024
# HSCAN pages per partition: a flush of the largest allowed partition finishes well within.
MAX_SCAN_ROUNDS: Final = 4 * int(limits.MAX_ACTIVE_SESSIONS.ceiling) // 10 + 10_000


def snapshot_page_call(core: MemoryCore, part: PartitionKeys, members: Iterable[str]) -> ScriptCall:
    return SNAPSHOT_PAGE.call_with_tail(
        {"index": part.index, "meta": part.meta},
        members,
        prefix=part.prefix,
        public_ttl_ms=core.conv.public_ttl_ms,
        im_ttl_ms=core.conv.im_ttl_ms,
        clock_override=core.clock_arg(),
    )


@dataclass(frozen=True)
class FlushResult:
    """One published generation.

    ``skipped``: live sessions the flush could not write, by reason (each also published
    as a ``snapshot_skipped`` event and counted in
    ``memtier_snapshot_sessions_skipped_total{stage="flush"}``).  ``durable``: False when
    the directory fsync after publication failed -- the generation is published and
    retention was applied, but its name may not survive a power loss.  ``warnings``: what
    went wrong after publication (directory fsync, temp removal, retention).
    """

    generation: int
    path: str
    sessions: int
    bytes: int
    skipped: dict[str, int]
    removed: tuple[str, ...]
    permissions_verified: bool
    duration_s: float
    durable: bool = True
    warnings: tuple[str, ...] = ()


class _PageWriter:
    """Decodes, checks and writes held pages (the work an :class:`Overlap` runs while the
    next request is in flight); the sessions it had to leave out wait in ``skipped``."""

    def __init__(self, writer: GenerationWriter) -> None:
        self.writer = writer
        self.skipped: list[tuple[SnapshotValidationError, str, str]] = []

    def write(self, reply: Sequence[Any]) -> None:
        writer = self.writer
        checked: list[dict[str, Any]] = []
        # Decoded and checked in one pass: every check of check_session_line, and for
        # records the current redactor wrote no secret re-check (only that).
        for session in check_page(reply):
            line, exc = session.line, session.rejected
            if exc is not None:
                # Left out, never written: it would reject the whole generation.
                # Reported three ways: FlushResult.skipped, an event, a metric (and a
                # log line now; the event goes after the request in flight).
                log.warning(
                    "snapshot: session left out of the flush (%s: %s)", exc.reason, exc.detail
                )
                writer.skip(exc.reason)
                metrics.SNAPSHOT_SESSIONS_SKIPPED.labels("flush", exc.reason).inc()
                self.skipped.append((exc, line["member"], line["id"]))
                continue
            checked.append(line)
        # One write and one hash update per page, in the page's order.
        writer.add_lines(checked)


def flush_plan(
    core: MemoryCore,
    directory: SnapshotDir,
    *,
    page_sessions: int = PAGE_SESSIONS,
    page_bytes: int = PAGE_BYTES,
) -> Plan[FlushResult]:
    """Write every live session of the namespace into a new generation; apply retention.

    Pipelined with bounded memory: each page reply is held (at most one) and written
    while the next request (page or ``HSCAN``) is in flight (:class:`Overlap`).
    ``page_sessions`` / ``page_bytes`` (default :data:`PAGE_SESSIONS` /
    :data:`PAGE_BYTES`) are clamped to the hard ceilings :data:`MAX_PAGE_SESSIONS` /
    :data:`MAX_PAGE_BYTES`.
    """
    started = time.monotonic()
    # Hard ceilings (arguments may not pass them): the page bounds of the 2 ms hold.
    page_sessions = max(1, min(page_sessions, MAX_PAGE_SESSIONS))
    page_bytes = max(1, min(page_bytes, MAX_PAGE_BYTES))
    verified = directory.ensure()
    if not verified:
        yield emit_event_call(core, ReasonCode.PERMISSIONS_NOT_VERIFIED, str(directory.path))
    directory.cleanup_temps()
    walls: list[int] = []
    clocks: list[int] = []
    writer = directory.begin()
    pages_out = _PageWriter(writer)
    held: list[Sequence[Any]] = []  # the page reply read last, not yet written

    def send(request: ScriptCall | Command) -> Plan[Any]:
        """``request``; the held page is written while it is in flight."""
        if not held:
            return (yield request)
        page = held.pop()
        reply = yield Overlap(request, lambda: pages_out.write(page))
        while pages_out.skipped:
            exc, member, session_id = pages_out.skipped.pop(0)
            yield emit_event_call(
                core,
                ReasonCode.SNAPSHOT_SKIPPED,
                f"{exc.reason}: {exc.detail}",
                member=member,
                session_id=session_id,
            )
        return reply

    try:
        first = yield snapshot_page_call(core, core.keyspace.partition(0), ())
        clocks.append(int(first[0]))
        walls.append(int(first[1]))
        for part in core.keyspace.all_partitions():
            seen: set[str] = set()
            cursor: Any = 0
            for _ in range(MAX_SCAN_ROUNDS):
                cursor, entries = yield from send(
                    Command("hscan", (part.index,), {"cursor": cursor, "count": page_sessions})
                )
                batch: list[str] = []
                batch_bytes = 0
                pages: list[list[str]] = []
                for raw_member, raw_bytes in entries.items():
                    member = _b(raw_member)
                    if member in seen:
                        continue  # HSCAN may return an entry twice
                    seen.add(member)
                    nbytes = int(raw_bytes)
                    if batch and (len(batch) >= page_sessions or batch_bytes + nbytes > page_bytes):
                        pages.append(batch)
                        batch, batch_bytes = [], 0
                    batch.append(member)
                    batch_bytes += nbytes
                if batch:
                    pages.append(batch)
                while pages:  # bounded: every call with a session consumes one member
                    members = pages.pop(0)
                    reply = yield from send(snapshot_page_call(core, part, members))
                    clocks.append(int(reply[0]))
                    walls.append(int(reply[1]))
                    last_member = page_last_member(reply)
                    if last_member is not None:
                        # The script stops after the session that passes its work bound:
                        # the members after the last one returned go again (the ones
                        # before it that it skipped were read and are not live).
                        rest = members[members.index(last_member) + 1 :]
                        if rest:
                            pages.insert(0, rest)
                        held.append(reply)
                if int(cursor) == 0:
                    break
            else:
                raise SnapshotError(f"scanning partition {part.partition} did not finish")
        last = yield from send(snapshot_page_call(core, core.keyspace.partition(0), ()))
        clocks.append(int(last[0]))
        walls.append(int(last[1]))
        published = writer.commit(
            {
                "partitions": core.config.partitions,
                "flush_started_wall_ms": min(walls),
                "flush_clock_ms": max(clocks),
                "flush_wall_ms": max(walls),
            }
        )
    except BaseException:
        writer.abort()
        raise
    # Retention runs for every published generation, durable or not (the new one is kept).
    removed = directory.retain(keep=published.generation)
    warnings = (*writer.warnings, *directory.retention_errors)
    for warning in warnings:
        log.warning("snapshot generation %d: %s", published.generation, warning)
    return FlushResult(
        generation=published.generation,
        path=str(published.path),
        sessions=writer.sessions,
        bytes=published.size,
        skipped=dict(writer.skipped),
        removed=tuple(str(p) for p in removed),
        permissions_verified=verified,
        duration_s=time.monotonic() - started,
        durable=writer.durable,
        warnings=tuple(warnings),
    )
