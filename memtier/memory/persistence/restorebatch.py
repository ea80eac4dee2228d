"""Pass 2 of a restore, its reading side: a verified generation's sessions as batches of
``restore_session`` calls.

:class:`BatchReader` reads the file again (pass 2: :func:`iter_generation_sized`, whose
chunks must hash as pass 1 verified them), fits each session to today's bounds and
builds its call; the recovery plan (:mod:`~memtier.memory.persistence.recovery`) sends
one batch while the reader fills the next (an :class:`~memtier.engine.Overlap`).  It
makes no Redis request itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from memtier import limits
from memtier.engine import ScriptCall
from memtier.keys import PartitionKeys
from memtier.memory.core import MemoryCore, new_session_id
from memtier.memory.models import Channel
from memtier.memory.scriptspecs import RESTORE_SESSION
from memtier.memory.snapshot.fileformat import SnapshotValidationError
from memtier.memory.snapshot.validation import (
    ValidatedSession,
    VerifiedGeneration,
    fit_session,
    iter_generation_sized,
)
from memtier.scriptspec import BoundSpec

__all__ = [
    "RESTORE_BATCH_BYTES",
    "RESTORE_BATCH_RECORDS",
    "RESTORE_BATCH_SESSIONS",
    "BatchReader",
    "Restore",
    "RestoreCalls",
    "restore_session_call",
]

# restore_session calls sent in one round trip (a ScriptBatch): at most this many
# sessions, and no more once their record bytes pass RESTORE_BATCH_BYTES (one larger
# session goes alone).  The server runs a batch's calls back to back, so the batch is
# bounded like one snapshot page (~32 KiB): about 1-2 ms of Redis time; one round trip
# per session was most of the restore's time (bench.workerbench.bench_flush_restore).
RESTORE_BATCH_SESSIONS: Final = 16
RESTORE_BATCH_BYTES: Final = 48 * 1024
# ...and no more once their records pass this (per-record work dominates for small
# turns; snapshot_page's own bound): a session at the turn ceiling goes alone.
RESTORE_BATCH_RECORDS: Final = 4096


# What each restore_session call gives besides its partition's bound inputs, in the
# order RestoreCalls.call passes them (checked against the spec when bound).
_RESTORE_FREE: Final = (
    ("session", "turns", "turn_ids"),
    (
        "member",
        "session_id",
        "created_ms",
        "created_wall_ms",
        "last_ms",
        "last_wall_ms",
        "seq",
        "summary",
        "summary_version",
        "age_ms",
        "read_wall_ms",
        "clock_override",
        "detail",
        "n_records",
    ),
)


class RestoreCalls:
    """The ``restore_session`` calls of one restore.  The inputs every session of one
    partition and channel sends alike -- its partition's keys, TTL, bounds and the
    generation's flush time -- are bound once (a :class:`~memtier.scriptspec.BoundSpec`
    per partition and channel, at most two per partition); each session gives the rest
    by position, with no mapping built and no names checked per call: pass 2's reading
    side takes a third less CPU per session than when each call was built from names
    (docs/performance.md, "The restore's calls bound per partition")."""

    __slots__ = ("_bounds", "core", "flush_wall_ms")

    def __init__(self, core: MemoryCore, flush_wall_ms: int = 0) -> None:
        self.core = core
        self.flush_wall_ms = flush_wall_ms
        self._bounds: dict[tuple[int, str], BoundSpec] = {}

    def call(
        self, session: ValidatedSession, detail: str, session_id: str | None = None
    ) -> ScriptCall:
        """``session``'s call; ``session_id``: the id the restored session gets
        (recovery passes a new one), else the one it had."""
        member = session.member
        part, sk = self.core.route(member)
        channel = session.channel
        bound = self._bounds.get((part.partition, channel))
        if bound is None:
            bound = self._bounds[(part.partition, channel)] = self._bind(part, channel)
        tail: list[str | int | bytes] = [r.encode() for r in session.records]
        for turn_id, receipt in session.receipts:
            tail += (turn_id, receipt)
        return bound.call_with_tail(
            (sk.session, sk.turns, sk.turn_ids),
            (
                member,
                session_id or session.session_id,
                session.created_ms,
                session.created_wall_ms,
                session.last_ms,
                session.last_wall_ms,
                session.seq,
                session.summary or "",
                session.summary_version,
                session.age_ms,
                session.read_wall_ms,
                self.core.clock_arg(),
                detail,
                len(session.records),
            ),
            tail,
        )

    def _bind(self, part: PartitionKeys, channel_name: str) -> BoundSpec:
        core = self.core
        channel = Channel(channel_name)
        other = Channel.IM if channel is Channel.PUBLIC else Channel.PUBLIC
        keys = {
            "lru": part.lru(channel.value),
            "other_lru": part.lru(other.value),
            "index": part.index,
            "meta": part.meta,
            "events": part.events,
        }
        argv: dict[str, str | int | bytes] = {
            "flush_wall_ms": self.flush_wall_ms,
            "ttl_ms": core.ttl_ms(channel),
            "grace_ms": limits.EXPIRY_GRACE_MS,
            "max_sessions": core.max_sessions_per_partition,
            "max_aggregate": core.max_bytes_per_partition,
            "max_session_bytes": core.conv.max_session_bytes,
            "max_turns": core.conv.max_turns_per_session,
            "max_events": core.conv.max_events,
        }
        bound = RESTORE_SESSION.bind(keys, argv)
        if bound.names != _RESTORE_FREE:  # a spec change must update call's order
            raise AssertionError(f"restore_session's free inputs are {bound.names}")
        return bound


def restore_session_call(
    core: MemoryCore,
    session: ValidatedSession,
    detail: str,
    *,
    session_id: str | None = None,
    flush_wall_ms: int = 0,
) -> ScriptCall:
    """One session's call (:class:`RestoreCalls`, for a single call); ``session_id``:
    the id the restored session gets; ``flush_wall_ms``: the generation header's."""
    return RestoreCalls(core, flush_wall_ms).call(session, detail, session_id)


@dataclass(frozen=True, slots=True)
class Restore:
    """One session's ``restore_session`` call in a batch, with what the plan counts."""

    call: ScriptCall
    dropped: int  # turns today's bounds trimmed
    line_bytes: int  # its line in the file (progress)
    nbytes: int  # its record bytes (the batch's bound)
    records: int


class BatchReader:
    """Pass 2's reading side: the generation's sessions, fitted to today's bounds, built
    into batches of ``restore_session`` calls -- one batch per :meth:`fill`, the work an
    :class:`~memtier.engine.Overlap` runs while Redis restores the batch before it.

    It makes no Redis request: the sessions today's bounds refuse wait in ``skipped``
    for the plan to report (at most :data:`RESTORE_BATCH_SESSIONS` of them per fill),
    and a :class:`SnapshotValidationError` ends the reading and waits in ``error`` (the
    batch read before it is still restored, as every session of it passed the checks).
    """

    def __init__(self, core: MemoryCore, verified: VerifiedGeneration, detail: str) -> None:
        self.core = core
        self.detail = detail
        self.calls = RestoreCalls(core, int(verified.header["flush_wall_ms"]))
        self.sessions = iter_generation_sized(verified)
        self.carried: Restore | None = None  # read, but past the last batch's bound
        self.skipped: list[tuple[ValidatedSession, str, int]] = []  # (session, why, bytes)
        self.error: SnapshotValidationError | None = None
        self.ended = False
        self.ahead: list[Restore] = []  # read by read_ahead, restored next

    def fill(self) -> list[Restore]:
        """The next batch: up to the batch bounds, the end, or a full ``skipped``."""
        batch: list[Restore] = []
        nbytes = nrecords = 0
        if self.carried is not None:
            batch.append(self.carried)
            nbytes, nrecords = self.carried.nbytes, self.carried.records
            self.carried = None
        while (
            not self.ended
            and len(batch) < RESTORE_BATCH_SESSIONS
            and len(self.skipped) < RESTORE_BATCH_SESSIONS
        ):
            restore = self._next()
            if restore is None:  # skipped, or the reading ended
                continue
            if batch and (
                nbytes + restore.nbytes > RESTORE_BATCH_BYTES
                or nrecords + restore.records > RESTORE_BATCH_RECORDS
            ):
                self.carried = restore  # it opens the next batch (one larger goes alone)
                break
            batch.append(restore)
            nbytes += restore.nbytes
            nrecords += restore.records
        return batch

    def _next(self) -> Restore | None:
        """The next session's call; None when it is skipped, or at the end or an error
        (``ended``)."""
        try:
            item = next(self.sessions, None)
        except SnapshotValidationError as exc:
            self.error, self.ended = exc, True
            return None
        if item is None:
            self.ended = True
            return None
        session, line_bytes = item
        fitted = fit_session(session, self.core.conv)
        if fitted.session is None:
            self.skipped.append((session, fitted.reason, line_bytes))
            return None
        # A new session id (D7): turns acknowledged after this flush and lost with Redis
        # had (old id, seq) pairs this session would otherwise hand out again.
        note = f"{self.detail} from={session.session_id}"
        if fitted.dropped:
            note += f" trimmed={fitted.dropped}"
        kept = fitted.session
        call = self.calls.call(kept, note, new_session_id())
        return Restore(call, fitted.dropped, line_bytes, kept.nbytes, len(kept.records))

    def read_ahead(self) -> None:
        """:meth:`fill` into ``ahead`` (an Overlap's work returns nothing)."""
        self.ahead = self.fill()

    def take_ahead(self) -> list[Restore]:
        taken, self.ahead = self.ahead, []
        return taken

    def take_skipped(self) -> list[tuple[ValidatedSession, str, int]]:
        taken, self.skipped = self.skipped, []
        return taken
