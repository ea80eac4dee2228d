"""The durable writer of one snapshot generation (crash-safe: a complete generation or none).

Write protocol (:class:`GenerationWriter`)
    temp file ``.tmp.<namespace>.<pid>.<random>`` created O_EXCL, mode 0600, in the same
    directory -> header block placeholder, then one JSON line per session (streamed,
    hashed) -> the real header written over the placeholder -> ``flush`` -> ``fsync``
    -> ``os.link(temp, final)`` (fails rather than overwrite; a taken number moves on to
    the next) -> unlink the temp -> fsync the directory.  Any error unlinks the temp and
    leaves every published generation untouched.  A crash at any point leaves either no
    new generation or a complete, fsynced one; stale temps of dead processes are removed
    by the next flush.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO, Final

import orjson

from memtier._version import __version__
from memtier.errors import SnapshotError
from memtier.memory.snapshot import directory as _dir
from memtier.memory.snapshot.directory import (
    FILE_MODE,
    MAX_LINK_ATTEMPTS,
    OPEN_TEMPS,
    GenerationFile,
    SnapshotDir,
    oserror,
)
from memtier.memory.snapshot.fileformat import (
    FORMAT,
    FORMAT_VERSION,
    HEADER_BLOCK,
    SCHEMA_VERSION,
    encode_header,
)

__all__ = ["WRITE_BUFFER", "GenerationWriter"]

# Buffered writes of the payload (the header block is written over its placeholder last).
WRITE_BUFFER: Final = 1024 * 1024


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
            raise oserror(f"cannot create a snapshot file in {directory.path}", exc) from exc
        OPEN_TEMPS.add(str(self.temp))
        try:
            if not _dir.is_windows():
                os.fchmod(fd, FILE_MODE)
            self._file: BinaryIO = os.fdopen(fd, "wb", buffering=WRITE_BUFFER)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.close(fd)
            self._closed = True
            self._unlink_temp()
            raise oserror("cannot set the mode of a new snapshot file", exc) from exc
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
            raise oserror("cannot write snapshot file", exc) from exc

    def add(self, line: Mapping[str, Any]) -> None:
        """Append one session line (already validated by the caller)."""
        self.add_lines((line,))

    def add_lines(self, lines: Sequence[Mapping[str, Any]]) -> None:
        """Append several session lines (already validated by the caller) in one write
        and one hash update: the flush's call, once per page.  All or none of them
        count; past ``max_snapshot_bytes`` nothing of them is written."""
        if not lines:
            return
        dumps = orjson.dumps
        data = b"\n".join([dumps(line) for line in lines]) + b"\n"
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
            raise oserror("cannot write snapshot file", exc) from exc
        self._sha.update(data)
        self.payload_bytes += len(data)
        self.sessions += len(lines)

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
            generation = self.dir.highest_generation() + 1
            block = encode_header({**base, "generation": generation})
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
                    generation = max(generation + 1, self.dir.highest_generation() + 1)
                    # The number is inside the header: rewrite it for the new name.
                    with open(self.temp, "r+b") as fh:
                        fh.write(encode_header({**base, "generation": generation}))
                        fh.flush()
                        os.fsync(fh.fileno())
            else:
                raise SnapshotError("cannot publish a snapshot: no free generation number")
        except OSError as exc:
            self.abort()
            raise oserror("cannot publish snapshot file", exc) from exc
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
        OPEN_TEMPS.discard(str(self.temp))
        try:
            _dir.fsync_dir(self.dir.path)
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
        OPEN_TEMPS.discard(str(self.temp))
