"""Snapshot generation files: pure file I/O, no Redis.

The flush and recovery plans in :mod:`memtier.memory.persistence` feed sessions in and
take them out.  One module per concern:

* :mod:`~memtier.memory.snapshot.directory` -- ``<storage_path>/conversations``: names,
  permissions, listing, quarantine and retention (:class:`SnapshotDir`);
* :mod:`~memtier.memory.snapshot.writer` -- the crash-safe write protocol
  (:class:`GenerationWriter`);
* :mod:`~memtier.memory.snapshot.fileformat` -- the one owner of the file format: header
  block and session lines, encoded and decoded;
* :mod:`~memtier.memory.snapshot.validation` -- every check before a record can become
  LLM context (:func:`verify_generation`, :func:`iter_generation`), and today's bounds
  per session (:func:`fit_session`).

This package's namespace is their public surface.
"""

from __future__ import annotations

from memtier.memory.snapshot.directory import GenerationFile, SnapshotDir, is_windows
from memtier.memory.snapshot.fileformat import (
    FORMAT_VERSION,
    HEADER_BLOCK,
    MAGIC,
    SCHEMA_VERSION,
    SnapshotValidationError,
    session_to_json,
)
from memtier.memory.snapshot.validation import (
    FittedSession,
    Rejection,
    ValidatedSession,
    VerifiedGeneration,
    fit_session,
    iter_generation,
    validate_session,
    verify_generation,
    verify_steps,
)
from memtier.memory.snapshot.writer import GenerationWriter

__all__ = [
    "FORMAT_VERSION",
    "HEADER_BLOCK",
    "MAGIC",
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
