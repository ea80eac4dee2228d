"""The status convention of the thread scripts (``lua/threads``), and its errors.

Every thread script answers ``{ status, ... }``: a negative status means the script
refused and wrote nothing (each maps to one error below); zero means it did what was
asked; a positive value is a documented variant of a successful answer (the request was
already applied, the thread is held, ...).  Each script's header lists every status it
returns by value and member name; tests/threads/test_threads_status_contract.py checks
the headers, the ``return`` statements and this enum against each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import Any, Final

from memtier.errors import ConversationError, ErrorCode
from memtier.wire import text

__all__ = ["ThreadStatus", "status_error"]

Code = ErrorCode


class ThreadStatus(IntEnum):
    """Outcomes of the thread scripts (mirrored in ``lua/includes/thread_common.lua``)."""

    OK = 0  # done as asked (a run claimed, a batch appended, a thread deleted, ...)
    EXISTED = 1  # already so: create repeated, a branch ref already, archived, a batch replayed
    ENDED_CANCELLED = 2  # run_cancel: the run already ended cancelled
    DONE = 3  # this request already completed (run_claim, run_commit, run_cancel, delete)
    HELD = 4  # delete: a legal hold blocks it; nothing removed
    NOT_FOUND = -1
    METADATA_CONFLICT = -2
    THREAD_ARCHIVED = -3
    BRANCH_LIMIT = -4
    UNKNOWN_LEAF = -5
    LIMIT_EXCEEDED = -6
    THREAD_BUSY = -7
    REQUEST_IN_PROGRESS = -8
    REQUEST_CONFLICT = -9
    LEASE_LOST = -10
    CANCELLED = -11


# What each refusal means to the caller.
STATUS_ERRORS: Final[dict[int, tuple[ErrorCode, str]]] = {
    ThreadStatus.NOT_FOUND: (Code.NOT_FOUND, "conversation not found"),
    ThreadStatus.METADATA_CONFLICT: (
        Code.METADATA_CONFLICT,
        "the thread changed concurrently (version conflict); re-read and retry",
    ),
    ThreadStatus.THREAD_ARCHIVED: (Code.THREAD_ARCHIVED, "the thread is archived"),
    ThreadStatus.BRANCH_LIMIT: (Code.BRANCH_LIMIT, "the thread has its maximum of branches"),
    ThreadStatus.UNKNOWN_LEAF: (Code.UNKNOWN_LEAF, "leafId is not known on this thread"),
    ThreadStatus.LIMIT_EXCEEDED: (Code.LIMIT_EXCEEDED, "a thread limit would be exceeded"),
    ThreadStatus.THREAD_BUSY: (
        Code.THREAD_BUSY,
        "another continue is running on this thread; retry when it finished",
    ),
    ThreadStatus.REQUEST_IN_PROGRESS: (
        Code.REQUEST_IN_PROGRESS,
        "this requestId is still running; retry to get its result",
    ),
    ThreadStatus.REQUEST_CONFLICT: (
        Code.REQUEST_CONFLICT,
        "this requestId was already used for a different message or leaf",
    ),
    ThreadStatus.CANCELLED: (
        Code.RUN_CANCELLED,
        "the run was cancelled; nothing was committed (a retry is a new run)",
    ),
    ThreadStatus.LEASE_LOST: (
        Code.THREAD_BUSY,
        "the turn lost its lease on the thread before it was recorded; retry",
    ),
}


def status_error(status: int, reply: Sequence[Any] = ()) -> ConversationError:
    """The error of a refusal (an unexpected status: ``backend_unavailable``)."""
    code, message = STATUS_ERRORS.get(status, (Code.BACKEND_UNAVAILABLE, "unexpected reply"))
    details: dict[str, Any] = {}
    if status == ThreadStatus.LIMIT_EXCEEDED and len(reply) > 1:
        value = reply[1]
        details["limit"] = text(value)
    return ConversationError(code, message, **details)
