"""Snapshot generation files: format, crash-safe write protocol, validation, quarantine, retention.

Pure file I/O; no Redis (the flush and recovery plans in :mod:`memtier.memory.persistence`
feed sessions in and take them out).

Directory
    ``<storage_path>/conversations`` -- mode 0700, generation files 0600, both forced on
    Linux and other Unix systems on every flush and recovery.  On Windows the modes are
    not verifiable; the store publishes ``permissions_not_verified`` and operators must
    restrict the directory ACL to the service identity (see ``docs/workers.md``).
    Rejected generations move to ``quarantine/`` inside it.

Names
    ``<namespace>.<generation, 20 digits>.snapshot`` -- zero-padded, so lexical order is
    numeric order; generations are numbered from the highest one ever seen in the
    directory or its quarantine, and a name is never reused or overwritten.

Write protocol (:class:`GenerationWriter`)
    temp file ``.tmp.<namespace>.<pid>.<random>`` created O_EXCL, mode 0600, in the same
    directory -> header block placeholder, then one JSON line per session (streamed,
    hashed) -> the real header written over the placeholder -> ``flush`` -> ``fsync``
    -> ``os.link(temp, final)`` (fails rather than overwrite; a taken number moves on to
    the next) -> unlink the temp -> fsync the directory.  Any error unlinks the temp and
    leaves every published generation untouched.  A crash at any point leaves either no
    new generation or a complete, fsynced one; stale temps of dead processes are removed
    by the next flush.

File layout (format 1, schema 1)
    bytes ``0 .. 4095``: ``MEMTIER-SNAPSHOT\\n``, the header JSON, space padding, ``\\n``.
    The header holds ``format``, ``format_version``, ``schema_version``, ``namespace``,
    ``generation``, ``created_by``, ``partitions``, the server clock and wall time of the
    flush (``flush_started_wall_ms``, ``flush_clock_ms``, ``flush_wall_ms``),
    ``sessions``, ``payload_bytes``, ``payload_sha256`` and ``header_sha256`` (SHA-256
    of the canonical header JSON without that field).  Then the payload: one JSON object
    per line per live session (see :func:`session_to_json`): key, session id,
    timestamps, sequence counter, counters, summary, receipts and every turn record with
    its seq, clock, wall time, bytes, kind, role, turn id and content fields.

Retention
    After a flush (durable or not: see :attr:`GenerationWriter.durable`) only the newest
    generations whose total size fits ``max_snapshot_bytes`` are kept.  A flush whose
    own file would exceed it fails with :class:`~memtier.errors.SnapshotError` before
    publishing; older generations stay.
    The quarantine folder is pruned (oldest first) to the same ceiling.

Errors
    Every file-system error is a :class:`~memtier.errors.SnapshotError` (errno in its
    details), never a raw ``OSError``.  After ``os.link`` the generation is published:
    a failed temp unlink or directory fsync is reported (``warnings``, ``durable``),
    not raised.

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
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, Final
from uuid import UUID

import orjson

from memtier import limits
from memtier._version import __version__
from memtier.config import ConversationConfig
from memtier.errors import SnapshotError
from memtier.memory.recordcheck import RecordInvalid, check_record, check_summary
from memtier.memory.state import KIND_FIELDS, KIND_ROLES, SessionState, StoredTurn
from memtier.redaction import contains_secret

__all__ = [
    "FORMAT_VERSION",
    "HEADER_BLOCK",
    "SCHEMA_VERSION",
    "FittedSession",
    "GenerationFile",
    "GenerationWriter",
    "Rejection",
    "SnapshotDir",
    "SnapshotValidationError",
    "ValidatedSession",
    "VerifiedGeneration",
    "fit_session",
    "is_windows",
    "iter_generation",
    "session_to_json",
    "validate_session",
    "verify_generation",
    "verify_steps",
]

MAGIC: Final = b"MEMTIER-SNAPSHOT\n"
FORMAT: Final = "memtier-snapshot"
FORMAT_VERSION: Final = 1
SCHEMA_VERSION: Final = 1
# Fixed-size header block: written last (over a placeholder) so the payload streams to
# disk with constant memory while the checksum is computed.
HEADER_BLOCK: Final = 4096
DIR_MODE: Final = 0o700
FILE_MODE: Final = 0o600
QUARANTINE: Final = "quarantine"
# A generation number already taken (another process published it first): try the next,
# at most this often.
MAX_LINK_ATTEMPTS: Final = 64
# One session line: its bytes, receipts and JSON escaping (<= 6x for control characters)
# stay well under this for the largest session the hard ceilings allow.
MAX_LINE_BYTES: Final = 8 * int(limits.MAX_SESSION_BYTES.ceiling) + 1024 * 1024
READ_CHUNK: Final = 1024 * 1024
# Plausible timestamps: 2000-01-01 .. 9999-12-31 (ms).  Clocks come from Redis TIME.
MIN_TIME_MS: Final = 946_684_800_000
MAX_TIME_MS: Final = 253_402_300_799_999
MAX_INT: Final = 2**53

_HEADER_KEYS: Final = frozenset(
    {
        "format",
        "format_version",
        "schema_version",
        "namespace",
        "generation",
        "created_by",
        "partitions",
        "flush_started_wall_ms",
        "flush_clock_ms",
        "flush_wall_ms",
        "sessions",
        "payload_bytes",
        "payload_sha256",
        "header_sha256",
    }
)
_SESSION_KEYS: Final = frozenset(
    {
        "member",
        "id",
        "created_ms",
        "created_wall_ms",
        "last_ms",
        "last_wall_ms",
        "age_ms",
        "read_wall_ms",
        "seq",
        "turns",
        "bytes",
        "tools",
        "summary_bytes",
        "summary_version",
        "summary",
        "records",
        "receipts",
    }
)
_RECORD_KEYS: Final = frozenset(
    {"seq", "clock_ms", "wall_ms", "bytes", "tool", "kind", "role", "id", "f"}
)
_SESSION_ID_RE: Final = re.compile(r"^ses_[A-Za-z0-9_\-]{16,64}$")
_TURN_ID_RE: Final = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_RECEIPT_RE: Final = re.compile(
    r"^(ses_[A-Za-z0-9_\-]{16,64})\|(\d{1,16})\|(\d{1,16})\|(\d{1,16})\|(\d{1,16})\|([01])$"
)
_NAMESPACE_RE: Final = r"[A-Za-z0-9_.\-]{1,64}"
_NAME_RE: Final = re.compile(rf"^(?P<ns>{_NAMESPACE_RE})\.(?P<gen>\d{{20}})\.snapshot$")
_QNAME_RE: Final = re.compile(rf"^(?P<ns>{_NAMESPACE_RE})\.(?P<gen>\d{{20}})\.snapshot\.")
_TEMP_RE: Final = re.compile(rf"^\.tmp\.(?P<ns>{_NAMESPACE_RE})\.(?P<pid>\d{{1,10}})\.[0-9a-f]+$")


def is_windows() -> bool:
    """Whether POSIX modes cannot be verified here (tests monkeypatch this)."""
    return os.name == "nt"


def _fsync_dir(path: Path) -> None:
    if is_windows() or os.name == "nt":  # directories cannot be opened for fsync there
        return
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _oserror(what: str, exc: OSError) -> SnapshotError:
    reason = "no space left on device" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
    return SnapshotError(
        f"{what}: {reason}", errno=exc.errno, errno_name=errno.errorcode.get(exc.errno or 0, "")
    )


# --------------------------------------------------------------------------- the directory


@dataclass(frozen=True, order=True)
class GenerationFile:
    """One published generation file."""

    generation: int
    path: Path = field(compare=False)
    size: int = field(compare=False)


@dataclass(frozen=True)
class Rejection:
    """Why a generation was not accepted (``reason`` is a stable word)."""

    reason: str
    detail: str


class SnapshotValidationError(Exception):
    """One failed check (internal: becomes a :class:`Rejection`)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class SnapshotDir:
    """The generation files of one namespace in ``<storage_path>/conversations``."""

    def __init__(self, path: Path | str, namespace: str, *, max_bytes: int) -> None:
        self.path = Path(path)
        self.namespace = namespace
        self.max_bytes = int(max_bytes)
        # What the last retain() could not do (the files stay; the next flush retries).
        self.retention_errors: list[str] = []

    @property
    def quarantine_path(self) -> Path:
        return self.path / QUARANTINE

    # --- permissions ---------------------------------------------------------------------------
    def ensure(self) -> bool:
        """Create the directories; force 0700 / 0600 on Unix.  False = not verifiable (Windows)."""
        try:
            for directory in (self.path, self.quarantine_path):
                directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            if is_windows():
                return False
            for directory in (self.path, self.quarantine_path):
                os.chmod(directory, DIR_MODE)
            for gen in self.generations():
                if (gen.path.stat().st_mode & 0o777) != FILE_MODE:
                    os.chmod(gen.path, FILE_MODE)
        except OSError as exc:
            raise _oserror(f"cannot prepare snapshot directory {self.path}", exc) from exc
        return True

    def tighten(self) -> tuple[bool, str]:
        """Recovery's :meth:`ensure`: best effort, after reading, never raising.

        Read-only or foreign storage must still restore (a chmod that fails is reported,
        not fatal).  Returns (verified, why not).
        """
        if is_windows():
            return False, "POSIX modes are not verifiable on Windows"
        if not self.path.is_dir():
            return True, ""  # nothing on disk: the first flush creates it
        try:
            return self.ensure(), ""
        except SnapshotError as exc:
            return False, exc.message

    # --- listing -------------------------------------------------------------------------------
    def generations(self) -> list[GenerationFile]:
        """Published generations of this namespace, newest first."""
        out = []
        try:
            entries = list(os.scandir(self.path))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise _oserror(f"cannot list snapshot directory {self.path}", exc) from exc
        for entry in entries:
            m = _NAME_RE.match(entry.name)
            if not (m and m.group("ns") == self.namespace):
                continue
            try:
                if entry.is_file(follow_symlinks=False):
                    size = entry.stat(follow_symlinks=False).st_size
                    out.append(GenerationFile(int(m.group("gen")), Path(entry.path), size))
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise _oserror(f"cannot read snapshot directory {self.path}", exc) from exc
        return sorted(out, reverse=True)

    def quarantined(self) -> list[Path]:
        try:
            names = sorted(os.listdir(self.quarantine_path))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise _oserror(f"cannot list {self.quarantine_path}", exc) from exc
        return [
            self.quarantine_path / n
            for n in names
            if (m := _QNAME_RE.match(n)) and m.group("ns") == self.namespace
        ]

    def _highest_generation(self) -> int:
        top = max((g.generation for g in self.generations()), default=0)
        for path in self.quarantined():
            m = _QNAME_RE.match(path.name)
            if m:
                top = max(top, int(m.group("gen")))
        return top

    def name_of(self, generation: int) -> str:
        return f"{self.namespace}.{generation:020d}.snapshot"

    # --- writing -------------------------------------------------------------------------------
    def cleanup_temps(self) -> int:
        """Remove temp files left by dead processes of this host; returns how many."""
        removed = 0
        try:
            names = os.listdir(self.path)
        except OSError:
            return 0  # the flush itself reports an unusable directory
        for name in names:
            m = _TEMP_RE.match(name)
            if not m or m.group("ns") != self.namespace:
                continue
            pid = int(m.group("pid"))
            if (pid == os.getpid() and str(self.path / name) in _OPEN_TEMPS) or (
                pid != os.getpid() and _pid_alive(pid)
            ):
                continue
            try:
                os.unlink(self.path / name)
                removed += 1
            except OSError:
                continue  # best effort: a later flush tries again
        return removed

    def begin(self) -> GenerationWriter:
        """Open a new generation (a temp file until :meth:`GenerationWriter.commit`)."""
        return GenerationWriter(self)

    def retain(self, keep: int | None = None) -> list[Path]:
        """Delete the oldest generations beyond ``max_bytes`` in total; returns what went.

        ``keep`` (a generation number) is never deleted: the one just written.
        """
        removed: list[Path] = []
        self.retention_errors = []
        total = 0
        try:
            generations = self.generations()
            quarantined = self.quarantined()
        except SnapshotError as exc:
            self.retention_errors.append(exc.message)
            return removed
        for gen in generations:  # newest first; the one just written counts first
            total += gen.size
            if total > self.max_bytes and gen.generation != keep:
                self._remove(gen.path, removed)
        q_total = 0
        q_files = []
        for path in quarantined:
            with contextlib.suppress(OSError):
                st = path.stat()
                q_files.append((st.st_mtime_ns, path.name, path, st.st_size))
        for _, _, path, size in sorted(q_files, reverse=True):
            q_total += size
            if q_total > self.max_bytes:
                self._remove(path, removed)
        if removed:
            for directory in (self.path, self.quarantine_path):
                try:
                    _fsync_dir(directory)
                except OSError as exc:
                    self.retention_errors.append(f"fsync {directory.name}: {exc.strerror}")
        return removed

    def _remove(self, path: Path, removed: list[Path]) -> None:
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass
        except OSError as exc:  # kept: the next flush's retention tries again
            self.retention_errors.append(f"cannot remove {path.name}: {exc.strerror}")

    # --- quarantine ----------------------------------------------------------------------------
    def quarantine(self, gen: GenerationFile, reason: str) -> Path | None:
        """Move a rejected generation to ``quarantine/`` (never overwriting); None if gone.

        Raises :class:`~memtier.errors.SnapshotError` when it cannot be moved (full or
        read-only storage, ``quarantine/`` on another file system): the file stays.
        """
        try:
            return self._quarantine(gen, reason)
        except OSError as exc:
            raise _oserror(f"cannot quarantine {gen.path.name}", exc) from exc

    def _quarantine(self, gen: GenerationFile, reason: str) -> Path | None:
        try:
            self.quarantine_path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        except OSError as exc:
            raise _oserror(f"cannot quarantine {gen.path.name}", exc) from exc
        base = f"{gen.path.name}.{reason}"
        for attempt in range(MAX_LINK_ATTEMPTS):
            target = self.quarantine_path / (base if attempt == 0 else f"{base}.{attempt}")
            try:
                os.link(gen.path, target)
            except FileExistsError:
                continue
            except FileNotFoundError:
                return None
            except OSError:  # no hard links here: a rename that checked the name first
                if target.exists():
                    continue
                try:
                    os.rename(gen.path, target)
                except FileNotFoundError:
                    return None
                except OSError as exc:  # ENOSPC, EROFS, EXDEV...: the file stays where it is
                    raise _oserror(f"cannot quarantine {gen.path.name}", exc) from exc
            else:
                try:
                    os.unlink(gen.path)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    raise _oserror(f"cannot move {gen.path.name} out of the way", exc) from exc
            with contextlib.suppress(OSError):
                _fsync_dir(self.quarantine_path)
                _fsync_dir(self.path)
            return target
        raise SnapshotError(f"cannot quarantine {gen.path.name}: too many quarantined copies")


# Temp files this process is writing right now (cleanup_temps leaves them alone; a temp
# of this process that is not listed here is a leftover, e.g. an unlink that failed).
_OPEN_TEMPS: set[str] = set()


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


class GenerationWriter:
    """A generation being written: stream sessions in, then :meth:`commit` or :meth:`abort`."""

    def __init__(self, directory: SnapshotDir) -> None:
        self.dir = directory
        self.temp = (
            directory.path / f".tmp.{directory.namespace}.{os.getpid()}.{secrets.token_hex(6)}"
        )
        self._sha = hashlib.sha256()
        self.sessions = 0
        self.payload_bytes = 0
        self.skipped: dict[str, int] = {}
        # After publication: False if the directory fsync failed (the generation is
        # visible but its name may not survive a power loss), and what went wrong.
        self.durable = True
        self.warnings: list[str] = []
        self._closed = False
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        flags |= getattr(os, "O_BINARY", 0)
        try:
            fd = os.open(self.temp, flags, FILE_MODE)
        except OSError as exc:
            raise _oserror(f"cannot create a snapshot file in {directory.path}", exc) from exc
        _OPEN_TEMPS.add(str(self.temp))
        try:
            if not is_windows():
                os.fchmod(fd, FILE_MODE)
            self._file: BinaryIO = os.fdopen(fd, "wb", buffering=READ_CHUNK)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.close(fd)
            self._closed = True
            self._unlink_temp()
            raise _oserror("cannot set the mode of a new snapshot file", exc) from exc
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            self._closed = True
            self._unlink_temp()
            raise
        try:
            self._file.write(b" " * HEADER_BLOCK)
        except OSError as exc:
            self.abort()
            raise _oserror("cannot write snapshot file", exc) from exc

    def add(self, line: Mapping[str, Any]) -> None:
        """Append one session line (already validated by the caller)."""
        data = orjson.dumps(line) + b"\n"
        if HEADER_BLOCK + self.payload_bytes + len(data) > self.dir.max_bytes:
            raise SnapshotError(
                "this flush alone would exceed max_snapshot_bytes"
                f" ({self.dir.max_bytes} bytes); older generations are kept",
                limit_bytes=self.dir.max_bytes,
            )
        try:
            self._file.write(data)
        except OSError as exc:
            self.abort()
            raise _oserror("cannot write snapshot file", exc) from exc
        self._sha.update(data)
        self.payload_bytes += len(data)
        self.sessions += 1

    def skip(self, reason: str) -> None:
        """Count a live session left out of the generation (it would fail validation)."""
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def commit(self, header: Mapping[str, Any]) -> GenerationFile:
        """Write the header, fsync, publish under a fresh generation number, fsync the dir."""
        base = dict(header)
        base.update(
            format=FORMAT,
            format_version=FORMAT_VERSION,
            schema_version=SCHEMA_VERSION,
            namespace=self.dir.namespace,
            created_by=f"memtier {__version__}",
            sessions=self.sessions,
            payload_bytes=self.payload_bytes,
            payload_sha256=self._sha.hexdigest(),
        )
        try:
            generation = self.dir._highest_generation() + 1
            block = _header_block({**base, "generation": generation})
            self._file.flush()
            self._file.seek(0)
            self._file.write(block)
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._closed = True
            for _ in range(MAX_LINK_ATTEMPTS):
                final = self.dir.path / self.dir.name_of(generation)
                try:
                    os.link(self.temp, final)
                    break
                except FileExistsError:
                    generation = max(generation + 1, self.dir._highest_generation() + 1)
                    # The number is inside the header: rewrite it for the new name.
                    with open(self.temp, "r+b") as fh:
                        fh.write(_header_block({**base, "generation": generation}))
                        fh.flush()
                        os.fsync(fh.fileno())
            else:
                raise SnapshotError("cannot publish a snapshot: no free generation number")
        except OSError as exc:
            self.abort()
            raise _oserror("cannot publish snapshot file", exc) from exc
        except BaseException:
            self.abort()
            raise
        # Published: from here on nothing may report the flush as failed.  What is left
        # (remove the temp name, fsync the directory) is reported as it is.
        try:
            os.unlink(self.temp)
        except FileNotFoundError:
            pass
        except OSError as exc:  # a second name of the same complete file; removed later
            self.warnings.append(f"temp file not removed: {exc.strerror}")
        _OPEN_TEMPS.discard(str(self.temp))
        try:
            _fsync_dir(self.dir.path)
        except OSError as exc:
            self.durable = False
            self.warnings.append(
                f"directory fsync failed ({errno.errorcode.get(exc.errno or 0, exc.strerror)}):"
                " the generation is published but its name may not survive a power loss"
            )
        return GenerationFile(generation, final, HEADER_BLOCK + self.payload_bytes)

    def abort(self) -> None:
        """Close and unlink the temp file; published generations are untouched."""
        if not self._closed:
            self._closed = True
            with contextlib.suppress(OSError):
                self._file.close()
        self._unlink_temp()

    def _unlink_temp(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.temp)
        _OPEN_TEMPS.discard(str(self.temp))


def _canonical(header: Mapping[str, Any]) -> bytes:
    return orjson.dumps(
        {k: v for k, v in header.items() if k != "header_sha256"}, option=orjson.OPT_SORT_KEYS
    )


def _header_block(header: Mapping[str, Any]) -> bytes:
    full = dict(header)
    full["header_sha256"] = hashlib.sha256(_canonical(full)).hexdigest()
    body = MAGIC + orjson.dumps(full, option=orjson.OPT_SORT_KEYS)
    if len(body) + 1 > HEADER_BLOCK:
        raise SnapshotError("snapshot header does not fit its block")
    return body + b" " * (HEADER_BLOCK - len(body) - 1) + b"\n"


# --------------------------------------------------------------------------- session lines


def session_to_json(state: SessionState) -> dict[str, Any]:
    """The payload line of one session (schema 1)."""
    return {
        "member": state.member,
        "id": state.session_id,
        "created_ms": state.created_ms,
        "created_wall_ms": state.created_wall_ms,
        "last_ms": state.last_ms,
        "last_wall_ms": state.last_wall_ms,
        "age_ms": state.age_ms,
        "read_wall_ms": state.read_wall_ms,
        "seq": state.seq,
        "turns": state.turns,
        "bytes": state.nbytes,
        "tools": state.tools,
        "summary_bytes": state.summary_bytes,
        "summary_version": state.summary_version,
        "summary": state.summary,
        "records": [
            {
                "seq": r.seq,
                "clock_ms": r.clock_ms,
                "wall_ms": r.wall_ms,
                "bytes": r.nbytes,
                "tool": 1 if r.is_tool else 0,
                "kind": r.kind,
                "role": r.role,
                "id": r.turn_id,
                "f": dict(r.fields),
            }
            for r in state.records
        ],
        "receipts": [[tid, state.receipts[tid]] for tid in sorted(state.receipts)],
    }


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


def _fail(reason: str, detail: str) -> SnapshotValidationError:
    return SnapshotValidationError(reason, detail)


def _int(obj: Mapping[str, Any], name: str, lo: int = 0, hi: int = MAX_INT) -> int:
    value = obj.get(name)
    if type(value) is not int or not lo <= value <= hi:
        raise _fail("invalid_session", f"{name} must be an integer in [{lo}, {hi}]")
    return value


def _time(obj: Mapping[str, Any], name: str) -> int:
    return _int(obj, name, MIN_TIME_MS, MAX_TIME_MS)


# Joins the texts of one session for the secret prefilter.  No pattern of
# memtier.redaction matches across a blank line (tests/workers pin this property), so
# "no secret in the joined text" implies "no secret in any text"; when the joined text
# does match, every text is checked on its own and only a real hit rejects.
_SEPARATOR: Final = "\n\n"


def _no_secrets(texts: list[tuple[str, str]]) -> None:
    """Raise if any ``(what, text)`` carries a secret pattern (one regex pass per session)."""
    if not texts or not contains_secret(_SEPARATOR.join(t for _, t in texts)):
        return
    for what, text in texts:
        if contains_secret(text):
            raise _fail("secret", f"{what} carries a secret pattern")


def _validate_record(
    rec: Any,
    created_ms: int,
    last_ms: int,
    texts: list[tuple[str, str]],
) -> StoredTurn:
    if not isinstance(rec, dict) or set(rec) != _RECORD_KEYS:
        raise _fail("invalid_record", "record fields")
    seq = _int(rec, "seq", 1)
    clock = _time(rec, "clock_ms")
    wall = _time(rec, "wall_ms")
    nbytes = _int(rec, "bytes", 0, int(limits.MAX_TURN_BYTES.ceiling))
    kind, role, turn_id, fields, tool = rec["kind"], rec["role"], rec["id"], rec["f"], rec["tool"]
    if not isinstance(kind, str) or kind not in KIND_FIELDS or role != KIND_ROLES[kind]:
        raise _fail("invalid_record", f"record {seq}: unknown kind or wrong role")
    if type(tool) is not int or tool != (1 if kind == "tool" else 0):
        raise _fail("invalid_record", f"record {seq}: tool flag")
    if not isinstance(turn_id, str) or not _TURN_ID_RE.match(turn_id):
        raise _fail("invalid_record", f"record {seq}: turn id")
    if not created_ms <= clock <= last_ms:
        raise _fail("invalid_record", f"record {seq}: clock outside the session's lifetime")
    try:
        # The live path's own validator (memtier.memory.recordcheck): same records accepted.
        sizes = check_record(kind, fields, turn_id)
    except RecordInvalid as exc:
        raise _fail(exc.reason, f"record {seq}: {exc.detail}") from None
    if nbytes != sum(sizes.values()):
        raise _fail("invalid_record", f"record {seq}: byte count does not match its content")
    texts.append((f"record {seq} turn id", turn_id))
    texts.extend((f"record {seq} {name}", value) for name, value in fields.items())
    return StoredTurn(seq, clock, wall, nbytes, kind == "tool", kind, turn_id, dict(fields))


def validate_session(
    obj: Any,
    conv: ConversationConfig | None = None,
    *,
    flush_walls: tuple[int, int] | None = None,
) -> ValidatedSession:
    """Check one session line; raise :class:`SnapshotValidationError` on the first problem.

    Integrity only: every bound is checked against its hard ceiling, never against the
    current configuration (``conv`` is accepted for compatibility and not used).  Today's
    bounds are applied per session by :func:`fit_session` when restoring, so lowering a
    limit never makes a whole generation unreadable.
    ``flush_walls`` = (earliest, latest) server wall time of the flush, from the header.
    """
    if not isinstance(obj, dict) or set(obj) != _SESSION_KEYS:
        raise _fail("invalid_session", "session fields")
    member = obj["member"]
    if not isinstance(member, str) or member.count(":") != 1:
        raise _fail("invalid_session", "key")
    avatar, channel = member.split(":")
    try:
        if str(UUID(avatar)) != avatar:
            raise ValueError(avatar)
    except ValueError:
        raise _fail("invalid_session", "avatar is not a canonical UUID") from None
    if channel not in ("public", "im"):
        raise _fail("invalid_session", "channel")
    sid = obj["id"]
    if not isinstance(sid, str) or not _SESSION_ID_RE.match(sid):
        raise _fail("invalid_session", "session id")
    created_ms, last_ms = _time(obj, "created_ms"), _time(obj, "last_ms")
    created_wall, last_wall = _time(obj, "created_wall_ms"), _time(obj, "last_wall_ms")
    if created_ms > last_ms:
        raise _fail("invalid_session", "created after last activity")
    age_ms = _int(obj, "age_ms")
    read_wall = _time(obj, "read_wall_ms")
    if flush_walls is not None and not flush_walls[0] <= read_wall <= flush_walls[1]:
        raise _fail("invalid_session", "read time outside the flush")
    seq = _int(obj, "seq", 0)
    turns = _int(obj, "turns", 0, int(limits.MAX_TURNS_PER_SESSION.ceiling))
    nbytes = _int(obj, "bytes", 0, int(limits.MAX_SESSION_BYTES.ceiling))
    tools = _int(obj, "tools", 0, int(limits.MAX_TOOL_RESULTS.ceiling))
    summary_bytes = _int(obj, "summary_bytes", 0, int(limits.MAX_SUMMARY_BYTES.ceiling))
    summary_version = _int(obj, "summary_version", 0)
    records_raw = obj["records"]
    if not isinstance(records_raw, list) or len(records_raw) != turns:
        raise _fail("invalid_session", "turn count does not match the records")
    texts: list[tuple[str, str]] = []
    records = tuple(_validate_record(r, created_ms, last_ms, texts) for r in records_raw)
    previous = 0
    for record in records:
        if record.seq <= previous:
            raise _fail("duplicate_sequence", f"sequence {record.seq} not strictly increasing")
        previous = record.seq
    if previous > seq or seq < turns:
        raise _fail("invalid_session", "sequence counter behind its records")
    if sum(r.is_tool for r in records) != tools:
        raise _fail("invalid_session", "tool-result count")
    summary = obj["summary"]
    if summary is None:
        if summary_bytes != 0:
            raise _fail("invalid_session", "summary bytes without a summary")
    else:
        if not isinstance(summary, str) or len(summary.encode("utf-8")) != summary_bytes:
            raise _fail("invalid_summary", "summary size")
        try:
            doc = orjson.loads(summary)
        except orjson.JSONDecodeError:
            raise _fail("invalid_summary", "summary is not JSON") from None
        if summary_version < 1:
            raise _fail("invalid_summary", "summary version")
        try:
            texts.extend(check_summary(doc))
        except RecordInvalid as exc:
            raise _fail(exc.reason, exc.detail) from None
    if nbytes != sum(r.nbytes for r in records) + summary_bytes:
        raise _fail("invalid_session", "session bytes do not add up")
    receipts_raw = obj["receipts"]
    if not isinstance(receipts_raw, list) or len(receipts_raw) > limits.IDEMPOTENCY_WINDOW:
        raise _fail("invalid_session", "receipts")
    receipts: list[tuple[str, str]] = []
    seen_ids: set[str] = set()
    for item in receipts_raw:
        if not (
            isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)
        ):
            raise _fail("invalid_session", "receipt shape")
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
            raise _fail("invalid_session", "receipt")
        texts.append(("receipt turn id", turn_id))
        seen_ids.add(turn_id)
        receipts.append((turn_id, receipt))
    _no_secrets(texts)
    return ValidatedSession(
        member=member,
        session_id=sid,
        created_ms=created_ms,
        created_wall_ms=created_wall,
        last_ms=last_ms,
        last_wall_ms=last_wall,
        age_ms=age_ms,
        read_wall_ms=read_wall,
        seq=seq,
        summary=summary,
        summary_version=summary_version,
        nbytes=nbytes,
        records=records,
        receipts=tuple(receipts),
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


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class VerifiedGeneration:
    """A generation that passed every check; ``header`` is its parsed header."""

    file: GenerationFile
    header: Mapping[str, Any]

    @property
    def flush_walls(self) -> tuple[int, int]:
        return int(self.header["flush_started_wall_ms"]), int(self.header["flush_wall_ms"])


def _read_header(fh: BinaryIO, namespace: str) -> dict[str, Any]:
    block = fh.read(HEADER_BLOCK)
    if len(block) < HEADER_BLOCK:
        raise _fail("truncated", "shorter than its header block")
    if not block.startswith(MAGIC):
        raise _fail("bad_magic", "not a memtier snapshot")
    if block[-1:] != b"\n":
        raise _fail("bad_header", "header block terminator")
    body = block[len(MAGIC) : -1].rstrip(b" ")
    if b"\n" in body or block[len(MAGIC) + len(body) : -1].strip(b" "):
        raise _fail("bad_header", "header padding")
    try:
        header = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise _fail("bad_header", "header is not JSON") from None
    if not isinstance(header, dict):
        raise _fail("bad_header", "header is not an object")
    if header.get("format") != FORMAT:
        raise _fail("unsupported", f"format {str(header.get('format'))[:32]!r}")
    if (
        header.get("format_version") != FORMAT_VERSION
        or header.get("schema_version") != SCHEMA_VERSION
    ):
        raise _fail(
            "unsupported",
            f"format {header.get('format_version')!r} / schema {header.get('schema_version')!r}",
        )
    if set(header) != _HEADER_KEYS:
        raise _fail("bad_header", "header fields")
    if hashlib.sha256(_canonical(header)).hexdigest() != header["header_sha256"]:
        raise _fail("checksum", "header checksum mismatch")
    if header["namespace"] != namespace:
        raise _fail("bad_header", "namespace does not match the file name")
    for name in ("generation", "sessions", "payload_bytes", "partitions"):
        _int(header, name)
    for name in ("flush_started_wall_ms", "flush_clock_ms", "flush_wall_ms"):
        _time(header, name)
    if header["flush_started_wall_ms"] > header["flush_wall_ms"]:
        raise _fail("bad_header", "flush times")
    return header


def _lines(fh: BinaryIO, payload_bytes: int, sha: Any) -> Iterator[bytes]:
    """Payload lines, hashed as read; bounded line length and total length."""
    remaining = payload_bytes
    while remaining > 0:
        line = fh.readline(min(remaining, MAX_LINE_BYTES + 1))
        if not line:
            raise _fail("truncated", "payload shorter than the header says")
        remaining -= len(line)
        sha.update(line)
        if not line.endswith(b"\n"):
            if len(line) > MAX_LINE_BYTES:
                raise _fail("oversized", "a session line exceeds its bound")
            raise _fail("truncated", "last line is cut")
        yield line


# verify_steps yields after this many session lines (the restorer extends its lock).
VERIFY_STEP_LINES: Final = 256


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
    """:func:`verify_generation` as a generator: yields the lines read so far every
    :data:`VERIFY_STEP_LINES` lines, returns the verdict."""
    try:
        size = gen.path.stat().st_size
        # Integrity is per file against the hard ceiling: a generation written before
        # max_snapshot_bytes was lowered stays readable (retention prunes it later).
        ceiling = int(limits.MAX_SNAPSHOT_BYTES.ceiling)
        if size > ceiling:
            return Rejection("oversized", f"{size} bytes > the snapshot ceiling {ceiling}")
        with open(gen.path, "rb") as fh:
            header = _read_header(fh, namespace)
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
            for line in _lines(fh, header["payload_bytes"], sha):
                count += 1
                if count % VERIFY_STEP_LINES == 0:
                    yield count
                if problem is not None:
                    continue  # keep hashing: a checksum mismatch names corruption best
                try:
                    obj = orjson.loads(line)
                    session = validate_session(obj, flush_walls=walls)
                    if session.member in members or session.session_id in ids:
                        raise _fail("duplicate_session", "a key or session id appears twice")
                    members.add(session.member)
                    ids.add(session.session_id)
                except orjson.JSONDecodeError:
                    problem = _fail("corrupt", f"session line {count} is not JSON")
                except SnapshotValidationError as exc:
                    problem = exc
            if sha.hexdigest() != header["payload_sha256"]:
                return Rejection("checksum", "payload checksum mismatch")
            if problem is not None:
                return Rejection(problem.reason, problem.detail)
            if count != header["sessions"]:
                return Rejection("corrupt", "session count does not match the header")
            return VerifiedGeneration(gen, header)
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
    header = verified.header
    sha = hashlib.sha256()
    try:
        fh = open(verified.file.path, "rb")  # noqa: SIM115 -- closed below; open errors typed
    except FileNotFoundError:
        raise _fail("vanished", "the file disappeared after it was verified") from None
    except OSError as exc:
        raise _fail("unreadable", exc.strerror or str(exc)) from None
    try:
        with fh:
            if _read_header(fh, header["namespace"]) != header:
                raise _fail("changed", "the header changed since it was verified")
            for line in _lines(fh, header["payload_bytes"], sha):
                try:
                    obj = orjson.loads(line)
                except orjson.JSONDecodeError:
                    raise _fail("changed", "the payload changed since it was verified") from None
                yield validate_session(obj, flush_walls=verified.flush_walls)
    except OSError as exc:
        raise _fail("unreadable", exc.strerror or str(exc)) from None
    if sha.hexdigest() != header["payload_sha256"]:
        raise _fail("changed", "the payload changed since it was verified")
