"""The snapshot directory: layout, names, permissions, listing, quarantine and retention.

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
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from memtier.errors import SnapshotError

if TYPE_CHECKING:
    from memtier.memory.snapshot.writer import GenerationWriter

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "MAX_LINK_ATTEMPTS",
    "OPEN_TEMPS",
    "QUARANTINE",
    "GenerationFile",
    "SnapshotDir",
    "fsync_dir",
    "is_windows",
    "oserror",
]

DIR_MODE: Final = 0o700
FILE_MODE: Final = 0o600
QUARANTINE: Final = "quarantine"
# A generation number already taken (another process published it first): try the next,
# at most this often.
MAX_LINK_ATTEMPTS: Final = 64

_NAMESPACE_RE: Final = r"[A-Za-z0-9_.\-]{1,64}"
_NAME_RE: Final = re.compile(rf"^(?P<ns>{_NAMESPACE_RE})\.(?P<gen>\d{{20}})\.snapshot$")
_QNAME_RE: Final = re.compile(rf"^(?P<ns>{_NAMESPACE_RE})\.(?P<gen>\d{{20}})\.snapshot\.")
_TEMP_RE: Final = re.compile(rf"^\.tmp\.(?P<ns>{_NAMESPACE_RE})\.(?P<pid>\d{{1,10}})\.[0-9a-f]+$")

# Temp files this process is writing right now (cleanup_temps leaves them alone; a temp
# of this process that is not listed here is a leftover, e.g. an unlink that failed).
OPEN_TEMPS: set[str] = set()


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


def is_windows() -> bool:
    """Whether POSIX modes cannot be verified here (tests monkeypatch this)."""
    return os.name == "nt"


def fsync_dir(path: Path) -> None:
    if is_windows() or os.name == "nt":  # directories cannot be opened for fsync there
        return
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def oserror(what: str, exc: OSError) -> SnapshotError:
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
            raise oserror(f"cannot prepare snapshot directory {self.path}", exc) from exc
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
            raise oserror(f"cannot list snapshot directory {self.path}", exc) from exc
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
                raise oserror(f"cannot read snapshot directory {self.path}", exc) from exc
        return sorted(out, reverse=True)

    def quarantined(self) -> list[Path]:
        try:
            names = sorted(os.listdir(self.quarantine_path))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise oserror(f"cannot list {self.quarantine_path}", exc) from exc
        return [
            self.quarantine_path / n
            for n in names
            if (m := _QNAME_RE.match(n)) and m.group("ns") == self.namespace
        ]

    def highest_generation(self) -> int:
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
            if (pid == os.getpid() and str(self.path / name) in OPEN_TEMPS) or (
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
        from memtier.memory.snapshot.writer import GenerationWriter  # the writer needs this module

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
                    fsync_dir(directory)
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
            raise oserror(f"cannot quarantine {gen.path.name}", exc) from exc

    def _quarantine(self, gen: GenerationFile, reason: str) -> Path | None:
        try:
            self.quarantine_path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        except OSError as exc:
            raise oserror(f"cannot quarantine {gen.path.name}", exc) from exc
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
                    raise oserror(f"cannot quarantine {gen.path.name}", exc) from exc
            else:
                try:
                    os.unlink(gen.path)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    raise oserror(f"cannot move {gen.path.name} out of the way", exc) from exc
            with contextlib.suppress(OSError):
                fsync_dir(self.quarantine_path)
                fsync_dir(self.path)
            return target
        raise SnapshotError(f"cannot quarantine {gen.path.name}: too many quarantined copies")
