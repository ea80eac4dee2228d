"""Validation of snapshot generations before any record can become LLM context.

Validation (:func:`verify_generation`, before any record can become LLM context)
    Integrity only (bounds of the current configuration are applied per session by
    :func:`fit_session` when restoring): size <= the hard ceiling of
    ``max_snapshot_bytes``; magic, header checksum, known format and schema
    versions, namespace; payload length and SHA-256; then every session: UUID and
    channel of the key, session-id shape, unique keys and ids, integer timestamps in
    range and ordered, strictly increasing unique sequences within the counter, known
    kinds with their normalized role and exact field set, turn-id shape, byte counts
    that add up exactly, the hard ceilings, the live path's record validator
    (:mod:`memtier.memory.recordcheck`), a summary as compaction writes it,
    well-formed receipts -- and redaction holds: a record, turn id or summary for which
    :func:`memtier.redaction.contains_secret` is true rejects the whole generation.  A
    generation failing any check is quarantined and the next older one is tried.

Reading (:func:`verify_steps` pass 1, :func:`iter_generation` pass 2) decodes through
:mod:`~memtier.memory.snapshot.fileformat`; :func:`fit_session` applies today's bounds.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import orjson

from memtier import limits
from memtier.config import ConversationConfig
from memtier.memory.recordcheck import RecordInvalid, check_record, check_summary
from memtier.memory.snapshot.directory import GenerationFile
from memtier.memory.snapshot.fileformat import (
    HEADER_BLOCK,
    MAX_INT,
    MAX_TIME_MS,
    MIN_TIME_MS,
    RECORD_KEYS,
    SESSION_KEYS,
    SnapshotValidationError,
    fail,
    int_field,
    read_header,
    read_lines,
    time_field,
)
from memtier.memory.state import KIND_FIELDS, KIND_ROLES, StoredTurn
from memtier.redaction import contains_secret

__all__ = [
    "CHUNK_BYTES",
    "CHUNK_LINES",
    "SEPARATOR",
    "VERIFY_STEP_LINES",
    "FittedSession",
    "Rejection",
    "ValidatedSession",
    "VerifiedGeneration",
    "check_no_secrets",
    "check_session_line",
    "chunk_ends",
    "fit_session",
    "iter_generation",
    "iter_generation_sized",
    "validate_session",
    "verify_generation",
    "verify_steps",
]

_MAX_TURN: Final = int(limits.MAX_TURN_BYTES.ceiling)
_MAX_TURNS: Final = int(limits.MAX_TURNS_PER_SESSION.ceiling)
_MAX_SESSION: Final = int(limits.MAX_SESSION_BYTES.ceiling)
_MAX_TOOLS: Final = int(limits.MAX_TOOL_RESULTS.ceiling)
_MAX_SUMMARY: Final = int(limits.MAX_SUMMARY_BYTES.ceiling)
_SESSION_ID_RE: Final = re.compile(r"^ses_[A-Za-z0-9_\-]{16,64}$")
_TURN_ID_RE: Final = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_CANONICAL_UUID_RE: Final = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.ASCII
)
_RECEIPT_RE: Final = re.compile(
    r"^(ses_[A-Za-z0-9_\-]{16,64})\|(\d{1,16})\|(\d{1,16})\|(\d{1,16})\|(\d{1,16})\|([01])$"
)


@dataclass(frozen=True)
class Rejection:
    """Why a generation was not accepted (``reason`` is a stable word)."""

    reason: str
    detail: str


@dataclass(frozen=True)
class ValidatedSession:
    """A session line that passed every check: safe to restore."""

    member: str
    session_id: str
    created_ms: int
    created_wall_ms: int
    last_ms: int
    last_wall_ms: int
    age_ms: int
    read_wall_ms: int
    seq: int
    summary: str | None
    summary_version: int
    nbytes: int
    records: tuple[StoredTurn, ...]
    receipts: tuple[tuple[str, str], ...]

    @property
    def channel(self) -> str:
        return self.member.rpartition(":")[2]


# Joins the texts of one session for the secret prefilter.  No pattern of
# memtier.redaction matches across a blank line (tests/workers pin this property), so
# "no secret in the joined text" implies "no secret in any text"; when the joined text
# does match, every text is checked on its own and only a real hit rejects.
SEPARATOR: Final = "\n\n"

# A text to scan for secrets and what it is: a label, or (record seq, field name) --
# formatted only when the check fails (every record of every flush passes through here).
SecretText = tuple[str | tuple[int, str], str]


def _what(label: str | tuple[int, str]) -> str:
    if isinstance(label, tuple):
        return f"record {label[0]} {label[1]}"
    return label


def check_no_secrets(texts: list[SecretText]) -> None:
    """The secret re-check: raise if any text carries a secret pattern.

    The one place a snapshot line's texts (record turn ids and content fields, summary
    texts, receipt turn ids) are scanned for secrets (one regex pass per session, see
    :data:`SEPARATOR`).  Records the current redactor wrote could skip it; which texts
    are collected is decided per record in :func:`_check_record_line`.
    """
    if not texts or not contains_secret(SEPARATOR.join([t for _, t in texts])):
        return
    for what, text in texts:
        if contains_secret(text):
            raise fail("secret", f"{_what(what)} carries a secret pattern")


def _check_record_line(
    rec: Any,
    created_ms: int,
    last_ms: int,
    texts: list[SecretText] | None,
) -> tuple[int, int, bool]:
    """Check one record of a session line; returns its (seq, bytes, is_tool).

    Its turn id and content go into ``texts`` for the secret re-check (None: the
    current redactor wrote the record, see :func:`check_session_line`)."""
    if not isinstance(rec, dict) or rec.keys() != RECORD_KEYS:
        raise fail("invalid_record", "record fields")
    seq, clock, wall, nbytes = rec["seq"], rec["clock_ms"], rec["wall_ms"], rec["bytes"]
    # One inline test of the four integers (every record of every flush and recovery
    # comes here); on a miss the field checks below name the first bad one.
    if not (
        type(seq) is int
        and 1 <= seq <= MAX_INT
        and type(clock) is int
        and MIN_TIME_MS <= clock <= MAX_TIME_MS
        and type(wall) is int
        and MIN_TIME_MS <= wall <= MAX_TIME_MS
        and type(nbytes) is int
        and 0 <= nbytes <= _MAX_TURN
    ):
        seq = int_field(rec, "seq", 1)
        clock = time_field(rec, "clock_ms")
        wall = time_field(rec, "wall_ms")
        nbytes = int_field(rec, "bytes", 0, _MAX_TURN)
    kind, role, turn_id, fields, tool = rec["kind"], rec["role"], rec["id"], rec["f"], rec["tool"]
    if not isinstance(kind, str) or kind not in KIND_FIELDS or role != KIND_ROLES[kind]:
        raise fail("invalid_record", f"record {seq}: unknown kind or wrong role")
    is_tool = kind == "tool"
    if type(tool) is not int or tool != (1 if is_tool else 0):
        raise fail("invalid_record", f"record {seq}: tool flag")
    if not isinstance(turn_id, str) or not _TURN_ID_RE.match(turn_id):
        raise fail("invalid_record", f"record {seq}: turn id")
    if not created_ms <= clock <= last_ms:
        raise fail("invalid_record", f"record {seq}: clock outside the session's lifetime")
    try:
        # The live path's own validator (memtier.memory.recordcheck): same records accepted.
        sizes = check_record(kind, fields, turn_id)
    except RecordInvalid as exc:
        raise fail(exc.reason, f"record {seq}: {exc.detail}") from None
    total = 0
    for size in sizes.values():
        total += size
    if nbytes != total:
        raise fail("invalid_record", f"record {seq}: byte count does not match its content")
    if texts is not None:
        texts.append(((seq, "turn id"), turn_id))
        for name, value in fields.items():
            texts.append(((seq, name), value))
    return seq, nbytes, is_tool


def _session_times(obj: dict[str, Any]) -> tuple[int, int, int]:
    """Check the session's times and age; returns (created_ms, last_ms, read_wall_ms)."""
    created_ms, last_ms = obj["created_ms"], obj["last_ms"]
    created_wall, last_wall = obj["created_wall_ms"], obj["last_wall_ms"]
    age_ms, read_wall = obj["age_ms"], obj["read_wall_ms"]
    # The common case in one expression; on a miss the field checks name the first bad one
    # (in the order they were always checked).
    if not (
        type(created_ms) is int
        and MIN_TIME_MS <= created_ms <= MAX_TIME_MS
        and type(last_ms) is int
        and MIN_TIME_MS <= last_ms <= MAX_TIME_MS
        and type(created_wall) is int
        and MIN_TIME_MS <= created_wall <= MAX_TIME_MS
        and type(last_wall) is int
        and MIN_TIME_MS <= last_wall <= MAX_TIME_MS
        and created_ms <= last_ms
        and type(age_ms) is int
        and 0 <= age_ms <= MAX_INT
        and type(read_wall) is int
        and MIN_TIME_MS <= read_wall <= MAX_TIME_MS
    ):
        created_ms, last_ms = time_field(obj, "created_ms"), time_field(obj, "last_ms")
        time_field(obj, "created_wall_ms")
        time_field(obj, "last_wall_ms")
        if created_ms > last_ms:
            raise fail("invalid_session", "created after last activity")
        int_field(obj, "age_ms")
        read_wall = time_field(obj, "read_wall_ms")
    return created_ms, last_ms, read_wall


def check_session_line(
    obj: Any,
    *,
    flush_walls: tuple[int, int] | None = None,
    redacted: Sequence[bool] = (),
) -> None:
    """Every check of one session line (see the module docstring); raise
    :class:`SnapshotValidationError` on the first problem, build nothing.

    The flush runs this on every live session before writing it; recovery runs it (via
    :func:`validate_session`) on every line it reads.  Integrity only: every bound is
    checked against its hard ceiling, never against the current configuration.
    ``flush_walls`` = (earliest, latest) server wall time of the flush, from the header.

    ``redacted`` (the flush only): per record, True when its flags say the current
    redactor (:data:`~memtier.redaction.REDACTOR_VERSION`) wrote it
    (:func:`~memtier.memory.snapshot.pagecodec.decode_page`).  Such a record's turn id
    and content are not scanned for secrets again (nor a receipt of the same turn id):
    append redacted the content with this very redactor, whose output never matches
    (``contains_secret(redact(x).text)`` is False, tests/test_redaction.py), and
    refused a turn id that looks like a secret.  Every other check still runs on it,
    and every record of another or no version (the first format: before the version
    existed, or written by a restore), every summary and every other receipt is
    scanned as before.  Recovery passes nothing: it scans every text of every line.
    """
    if not isinstance(obj, dict) or obj.keys() != SESSION_KEYS:
        raise fail("invalid_session", "session fields")
    member = obj["member"]
    if not isinstance(member, str) or member.count(":") != 1:
        raise fail("invalid_session", "key")
    avatar, channel = member.split(":")
    # str(UUID(avatar)) == avatar, without building the UUID (every session of every
    # flush and recovery): exactly the lowercase 8-4-4-4-12 hex spelling (a test pins it).
    if _CANONICAL_UUID_RE.fullmatch(avatar) is None:
        raise fail("invalid_session", "avatar is not a canonical UUID")
    if channel != "public" and channel != "im":
        raise fail("invalid_session", "channel")
    sid = obj["id"]
    if not isinstance(sid, str) or not _SESSION_ID_RE.match(sid):
        raise fail("invalid_session", "session id")
    created_ms, last_ms, read_wall = _session_times(obj)
    if flush_walls is not None and not flush_walls[0] <= read_wall <= flush_walls[1]:
        raise fail("invalid_session", "read time outside the flush")
    seq = int_field(obj, "seq", 0)
    turns = int_field(obj, "turns", 0, _MAX_TURNS)
    nbytes = int_field(obj, "bytes", 0, _MAX_SESSION)
    tools = int_field(obj, "tools", 0, _MAX_TOOLS)
    summary_bytes = int_field(obj, "summary_bytes", 0, _MAX_SUMMARY)
    summary_version = int_field(obj, "summary_version", 0)
    records_raw = obj["records"]
    if not isinstance(records_raw, list) or len(records_raw) != turns:
        raise fail("invalid_session", "turn count does not match the records")
    texts: list[SecretText] = []
    # Every record first, then their order (a bad record is named before a bad order).
    if redacted:
        if len(redacted) != len(records_raw):
            raise ValueError("redacted must name every record of the line")
        checked = [
            _check_record_line(rec, created_ms, last_ms, None if done else texts)
            for rec, done in zip(records_raw, redacted, strict=True)
        ]
        # A receipt of a turn the current redactor wrote carries the same turn id.
        clean_ids = {rec["id"] for rec, done in zip(records_raw, redacted, strict=True) if done}
    else:
        checked = [_check_record_line(rec, created_ms, last_ms, texts) for rec in records_raw]
        clean_ids = set()
    previous = records_bytes = records_tools = 0
    for rec_seq, rec_bytes, rec_tool in checked:
        if rec_seq <= previous:
            raise fail("duplicate_sequence", f"sequence {rec_seq} not strictly increasing")
        previous = rec_seq
        records_bytes += rec_bytes
        records_tools += rec_tool
    if previous > seq or seq < turns:
        raise fail("invalid_session", "sequence counter behind its records")
    if records_tools != tools:
        raise fail("invalid_session", "tool-result count")
    summary = obj["summary"]
    if summary is None:
        if summary_bytes != 0:
            raise fail("invalid_session", "summary bytes without a summary")
    else:
        if not isinstance(summary, str) or len(summary.encode("utf-8")) != summary_bytes:
            raise fail("invalid_summary", "summary size")
        try:
            doc = orjson.loads(summary)
        except orjson.JSONDecodeError:
            raise fail("invalid_summary", "summary is not JSON") from None
        if summary_version < 1:
            raise fail("invalid_summary", "summary version")
        try:
            texts.extend(check_summary(doc))
        except RecordInvalid as exc:
            raise fail(exc.reason, exc.detail) from None
    if nbytes != records_bytes + summary_bytes:
        raise fail("invalid_session", "session bytes do not add up")
    receipts_raw = obj["receipts"]
    if not isinstance(receipts_raw, list) or len(receipts_raw) > limits.IDEMPOTENCY_WINDOW:
        raise fail("invalid_session", "receipts")
    seen_ids: set[str] = set()
    for item in receipts_raw:
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], str)
        ):
            raise fail("invalid_session", "receipt shape")
        turn_id, receipt = item
        m = _RECEIPT_RE.match(receipt)
        # A receipt names the session id the turn was first acknowledged under: this
        # session's, or the one it was restored from (recovery gives a new id, D7).
        if (
            not _TURN_ID_RE.match(turn_id)
            or turn_id in seen_ids
            or m is None
            or not 1 <= int(m.group(2)) <= seq
        ):
            raise fail("invalid_session", "receipt")
        if turn_id not in clean_ids:
            texts.append(("receipt turn id", turn_id))
        seen_ids.add(turn_id)
    check_no_secrets(texts)


def validate_session(
    obj: Any,
    conv: ConversationConfig | None = None,
    *,
    flush_walls: tuple[int, int] | None = None,
) -> ValidatedSession:
    """:func:`check_session_line`, then the session as a :class:`ValidatedSession`.

    ``conv`` is accepted for compatibility and not used (integrity only; today's bounds
    are applied per session by :func:`fit_session` when restoring, so lowering a limit
    never makes a whole generation unreadable).
    """
    check_session_line(obj, flush_walls=flush_walls)
    return _session_of(obj)


def _session_of(obj: dict[str, Any]) -> ValidatedSession:
    """A :class:`ValidatedSession` of a line that passed :func:`check_session_line`."""
    records = tuple(
        [
            StoredTurn(
                r["seq"],
                r["clock_ms"],
                r["wall_ms"],
                r["bytes"],
                r["kind"] == "tool",
                r["kind"],
                r["id"],
                dict(r["f"]),
            )
            for r in obj["records"]
        ]
    )
    return ValidatedSession(
        member=obj["member"],
        session_id=obj["id"],
        created_ms=obj["created_ms"],
        created_wall_ms=obj["created_wall_ms"],
        last_ms=obj["last_ms"],
        last_wall_ms=obj["last_wall_ms"],
        age_ms=obj["age_ms"],
        read_wall_ms=obj["read_wall_ms"],
        seq=obj["seq"],
        summary=obj["summary"],
        summary_version=obj["summary_version"],
        nbytes=obj["bytes"],
        records=records,
        receipts=tuple([(tid, receipt) for tid, receipt in obj["receipts"]]),
    )


@dataclass(frozen=True)
class FittedSession:
    """:func:`fit_session`'s verdict: the session to restore (None = skip it), and why."""

    session: ValidatedSession | None
    dropped: int  # oldest turns left out to fit today's bounds
    reason: str  # "" when nothing was changed


def fit_session(session: ValidatedSession, conv: ConversationConfig) -> FittedSession:
    """Today's per-session bounds: keep the summary and the newest turns that fit.

    A generation written under larger limits stays readable when a limit is lowered
    (``max_turns_per_session`` 200 -> 10, a smaller ``max_turn_bytes``...): the summary
    is kept and the longest run of newest turns that fits every bound is restored (a
    contiguous suffix, so sequences stay gapless).  A summary over today's
    ``max_summary_bytes`` (or a session left with nothing) is skipped alone.
    """
    summary_bytes = session.nbytes - sum(r.nbytes for r in session.records)
    if summary_bytes > conv.max_summary_bytes:
        return FittedSession(None, len(session.records), "summary over max_summary_bytes")
    if summary_bytes > conv.max_session_bytes:
        return FittedSession(None, len(session.records), "summary over max_session_bytes")
    kept: list[StoredTurn] = []
    nbytes, tools = summary_bytes, 0
    for record in reversed(session.records):
        body = sum(
            len(v.encode("utf-8")) for k, v in record.fields.items() if k not in ("tool", "action")
        )
        if (
            record.nbytes > conv.max_turn_bytes
            or (record.kind in ("tool", "action") and body > conv.max_tool_result_bytes)
            or len(kept) + 1 > conv.max_turns_per_session
            or nbytes + record.nbytes > conv.max_session_bytes
            or tools + record.is_tool > conv.max_tool_results
        ):
            break
        kept.append(record)
        nbytes += record.nbytes
        tools += record.is_tool
    dropped = len(session.records) - len(kept)
    if not dropped:
        return FittedSession(session, 0, "")
    if not kept and session.summary is None:
        return FittedSession(None, dropped, "no turn fits today's bounds")
    fitted = replace(session, records=tuple(reversed(kept)), nbytes=nbytes)
    return FittedSession(fitted, dropped, "over today's bounds")


@dataclass(frozen=True)
class VerifiedGeneration:
    """A generation that passed every check; ``header`` is its parsed header.

    ``chunks``: the SHA-256 of each chunk of payload lines pass 1 validated (see
    :func:`chunk_ends`): pass 2 restores a chunk without validating its lines again only
    when its bytes hash the same.  Empty: pass 2 validates every line again.
    """

    file: GenerationFile
    header: Mapping[str, Any]
    chunks: tuple[bytes, ...] = ()

    @property
    def flush_walls(self) -> tuple[int, int]:
        return int(self.header["flush_started_wall_ms"]), int(self.header["flush_wall_ms"])


# verify_steps yields after at most this many session lines (the restorer extends its
# lock), and after every CHUNK_BYTES of them.
VERIFY_STEP_LINES: Final = 256
# Pass 1 hashes the payload in chunks of at most this many lines, ending a chunk early
# once its bytes pass CHUNK_BYTES (one longer line is a chunk alone); pass 2 buffers one
# chunk (bounded memory), compares its hash and only then restores its sessions.
CHUNK_LINES: Final = VERIFY_STEP_LINES
CHUNK_BYTES: Final = 1024 * 1024


def chunk_ends(count: int, chunk_bytes: int) -> bool:
    """True when a chunk of ``count`` lines and ``chunk_bytes`` bytes is complete."""
    return count >= CHUNK_LINES or chunk_bytes >= CHUNK_BYTES


def verify_generation(
    gen: GenerationFile, namespace: str, conv: ConversationConfig, max_bytes: int
) -> VerifiedGeneration | Rejection:
    """Pass 1: every check of the module docstring, reading the file once."""
    steps = verify_steps(gen, namespace, conv, max_bytes)
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


def verify_steps(
    gen: GenerationFile, namespace: str, conv: ConversationConfig, max_bytes: int
) -> Generator[int, None, VerifiedGeneration | Rejection]:
    """:func:`verify_generation` as a generator: yields the lines read so far at the end
    of every chunk (:data:`VERIFY_STEP_LINES` lines, or :data:`CHUNK_BYTES`), returns
    the verdict."""
    try:
        size = gen.path.stat().st_size
        # Integrity is per file against the hard ceiling: a generation written before
        # max_snapshot_bytes was lowered stays readable (retention prunes it later).
        ceiling = int(limits.MAX_SNAPSHOT_BYTES.ceiling)
        if size > ceiling:
            return Rejection("oversized", f"{size} bytes > the snapshot ceiling {ceiling}")
        with open(gen.path, "rb") as fh:
            header = read_header(fh, namespace)
            if header["generation"] != gen.generation:
                return Rejection("bad_header", "generation does not match the file name")
            expected = HEADER_BLOCK + header["payload_bytes"]
            if size < expected:
                return Rejection("truncated", f"{size} of {expected} bytes")
            if size > expected:
                return Rejection("corrupt", f"{size - expected} bytes after the payload")
            sha = hashlib.sha256()
            walls = (header["flush_started_wall_ms"], header["flush_wall_ms"])
            members: set[str] = set()
            ids: set[str] = set()
            count = 0
            problem: SnapshotValidationError | None = None
            chunks: list[bytes] = []
            chunk = hashlib.sha256()
            chunk_lines = chunk_size = 0
            for line in read_lines(fh, header["payload_bytes"], sha):
                count += 1
                chunk.update(line)
                chunk_lines += 1
                chunk_size += len(line)
                if chunk_ends(chunk_lines, chunk_size):
                    chunks.append(chunk.digest())
                    chunk = hashlib.sha256()
                    chunk_lines = chunk_size = 0
                    # A step per chunk (lines or bytes): a file of few large sessions
                    # also lets the restorer extend its lock while it is read.
                    yield count
                if problem is not None:
                    continue  # keep hashing: a checksum mismatch names corruption best
                try:
                    obj = orjson.loads(line)
                    session = validate_session(obj, flush_walls=walls)
                    if session.member in members or session.session_id in ids:
                        raise fail("duplicate_session", "a key or session id appears twice")
                    members.add(session.member)
                    ids.add(session.session_id)
                except orjson.JSONDecodeError:
                    problem = fail("corrupt", f"session line {count} is not JSON")
                except SnapshotValidationError as exc:
                    problem = exc
            if sha.hexdigest() != header["payload_sha256"]:
                return Rejection("checksum", "payload checksum mismatch")
            if problem is not None:
                return Rejection(problem.reason, problem.detail)
            if count != header["sessions"]:
                return Rejection("corrupt", "session count does not match the header")
            if chunk_lines:
                chunks.append(chunk.digest())
            return VerifiedGeneration(gen, header, tuple(chunks))
    except SnapshotValidationError as exc:
        return Rejection(exc.reason, exc.detail)
    except FileNotFoundError:
        return Rejection("vanished", "the file disappeared")
    except OSError as exc:
        return Rejection("unreadable", exc.strerror or str(exc))


def iter_generation(
    verified: VerifiedGeneration, conv: ConversationConfig
) -> Iterator[ValidatedSession]:
    """Pass 2: the sessions of a verified generation, each validated again as it is read.

    Raises :class:`SnapshotValidationError` if the file changed since pass 1.
    """
    for session, _ in iter_generation_sized(verified):
        yield session


def iter_generation_sized(verified: VerifiedGeneration) -> Iterator[tuple[ValidatedSession, int]]:
    """:func:`iter_generation` with each session's line size in bytes (restore progress).

    With pass 1's chunk hashes (``verified.chunks``), each chunk of lines is read whole
    (bounded: :data:`CHUNK_LINES` lines or :data:`CHUNK_BYTES`, or one longer line) and
    hashed before any of its sessions is yielded: the same bytes as pass 1 validated are
    not validated again; different bytes raise ``changed`` before anything of the chunk
    is restored.  Without them every line is validated again as it is read.
    """
    header = verified.header
    sha = hashlib.sha256()
    try:
        fh = open(verified.file.path, "rb")  # noqa: SIM115 -- closed below; open errors typed
    except FileNotFoundError:
        raise fail("vanished", "the file disappeared after it was verified") from None
    except OSError as exc:
        raise fail("unreadable", exc.strerror or str(exc)) from None
    chunks = verified.chunks
    try:
        with fh:
            if read_header(fh, header["namespace"]) != header:
                raise fail("changed", "the header changed since it was verified")
            buffered: list[bytes] = []
            chunk = hashlib.sha256()
            chunk_size = index = 0
            for line in read_lines(fh, header["payload_bytes"], sha):
                if not chunks:
                    yield _parse_and_validate(line, verified.flush_walls), len(line)
                    continue
                buffered.append(line)
                chunk.update(line)
                chunk_size += len(line)
                if chunk_ends(len(buffered), chunk_size):
                    yield from _verified_chunk(buffered, chunk.digest(), chunks, index)
                    index += 1
                    buffered, chunk, chunk_size = [], hashlib.sha256(), 0
            if buffered:
                yield from _verified_chunk(buffered, chunk.digest(), chunks, index)
                index += 1
            if chunks and index != len(chunks):
                raise fail("changed", "the payload changed since it was verified")
    except OSError as exc:
        raise fail("unreadable", exc.strerror or str(exc)) from None
    if sha.hexdigest() != header["payload_sha256"]:
        raise fail("changed", "the payload changed since it was verified")


def _parse_and_validate(line: bytes, flush_walls: tuple[int, int]) -> ValidatedSession:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise fail("changed", "the payload changed since it was verified") from None
    return validate_session(obj, flush_walls=flush_walls)


def _verified_chunk(
    lines: list[bytes], digest: bytes, chunks: tuple[bytes, ...], index: int
) -> Iterator[tuple[ValidatedSession, int]]:
    """The sessions of one chunk whose bytes pass 1 validated (else ``changed``)."""
    if index >= len(chunks) or chunks[index] != digest:
        raise fail("changed", "the payload changed since it was verified")
    for line in lines:
        yield _session_of(orjson.loads(line)), len(line)
