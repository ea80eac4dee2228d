"""Wire models of the conversation-threads service: the spec's JSON, camelCase.

Python code uses snake_case attributes; JSON (HTTP bodies, exports) uses the
spec's camelCase names through pydantic aliases.  :meth:`WireModel.to_wire`
is the one serialization used on the wire (aliases, JSON types, ``None``
fields left out: the spec's optional fields are absent, not ``null``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from memtier.errors import ConversationError, ErrorCode
from memtier.keys import OWNER_ID_RE
from memtier.wire import ms_to_datetime

__all__ = [
    "MARKER",
    "RESERVED_EVENT_TYPES",
    "TERMINAL_EVENT_TYPES",
    "AgentIdentity",
    "ArchiveRequest",
    "BranchRef",
    "BranchRequest",
    "CancelResult",
    "CancelStatus",
    "ContinueRequest",
    "ContinueResult",
    "ContinueStatus",
    "ConversationEntry",
    "ConversationThread",
    "CreateThreadRequest",
    "DeleteResult",
    "EntryRole",
    "ErrorBody",
    "EventRecord",
    "ExportRequest",
    "ExportResult",
    "Ownership",
    "Principal",
    "ReplayPage",
    "ThreadPage",
    "ThreadState",
    "WireModel",
    "check_identity",
    "ms_to_datetime",
]

# The marker every thread hash carries (spec: "a prismConversation marker in metadata").
# A hash without it is not a conversation thread and is never served.
MARKER: Final = "memtier.conversation/1"

# Ledger rows that end a turn; ``terminal`` in replay pages refers to these.
TERMINAL_EVENT_TYPES: Final = frozenset({"agent_finished", "agent_denied", "error", "cancelled"})
# Written by the service itself; a runner may not emit them.
RESERVED_EVENT_TYPES: Final = TERMINAL_EVENT_TYPES | {
    "agent_started",
    "user_message",
    "assistant_message",
}


@dataclass(frozen=True, slots=True)
class Ownership:
    """Host-verified owner of a thread: ``Ownership(tenant_id, user_id)``.

    Both ids match ``[A-Za-z0-9_.@+-]{1,128}`` (they name a Redis hash tag, so
    braces and colons are refused; anything else -- e.g. opaque ids from an
    identity provider -- can be hex- or base64url-encoded by the host).
    Raises :class:`~memtier.errors.ConversationError` (``invalid_request``).
    """

    tenant_id: str
    user_id: str

    def __post_init__(self) -> None:
        for name, value in (("tenant_id", self.tenant_id), ("user_id", self.user_id)):
            if not isinstance(value, str) or not OWNER_ID_RE.match(value):
                raise ConversationError(
                    ErrorCode.INVALID_REQUEST,
                    f"ownership {name} must match [A-Za-z0-9_.@+-]{{1,128}}",
                )


_SCOPE_RE: Final = re.compile(r"^[A-Za-z0-9_.:/@+-]{1,128}\Z")
MAX_SCOPES: Final = 64


@dataclass(frozen=True, slots=True)
class AgentIdentity:
    """A verified identity of the calling agent, attached by the host's ``authorize`` hook.

    ``agent_id``, ``tenant_id`` and ``user_id`` follow the ownership grammar; ``scopes``
    are at most 64 strings of ``[A-Za-z0-9_.:/@+-]{1,128}`` (kept sorted, deduplicated).
    It must project onto the turn's :class:`Ownership` (same tenant and user): it can
    narrow what a runner does, never widen whose thread it is.
    """

    agent_id: str
    tenant_id: str
    user_id: str
    scopes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name, value in (
            ("agent_id", self.agent_id),
            ("tenant_id", self.tenant_id),
            ("user_id", self.user_id),
        ):
            if not isinstance(value, str) or not OWNER_ID_RE.match(value):
                raise ConversationError(
                    ErrorCode.INVALID_REQUEST,
                    f"identity {name} must match [A-Za-z0-9_.@+-]{{1,128}}",
                )
        scopes = self.scopes
        if isinstance(scopes, str) or not all(
            isinstance(x, str) and _SCOPE_RE.match(x) for x in scopes
        ):
            raise ConversationError(
                ErrorCode.INVALID_REQUEST,
                "identity scopes must be strings of [A-Za-z0-9_.:/@+-]{1,128}",
            )
        unique = tuple(sorted(set(scopes)))
        if len(unique) > MAX_SCOPES:
            raise ConversationError(
                ErrorCode.INVALID_REQUEST, f"at most {MAX_SCOPES} identity scopes"
            )
        object.__setattr__(self, "scopes", unique)

    def projects_onto(self, ownership: Ownership) -> bool:
        """True when this identity acts for exactly ``ownership`` (never wider)."""
        return self.tenant_id == ownership.tenant_id and self.user_id == ownership.user_id


@dataclass(frozen=True, slots=True)
class Principal:
    """What ``authorize`` may return instead of a bare :class:`Ownership`: the ownership
    and the agent identity verified with it."""

    ownership: Ownership
    identity: AgentIdentity | None = None


def check_identity(ownership: Ownership, identity: AgentIdentity | None) -> None:
    """``unauthorized`` unless ``identity`` is absent or projects onto ``ownership``
    (called before any Redis call)."""
    if identity is None:
        return
    if not isinstance(identity, AgentIdentity):
        raise ConversationError(ErrorCode.INVALID_REQUEST, "identity must be an AgentIdentity")
    if not identity.projects_onto(ownership):
        raise ConversationError(
            ErrorCode.UNAUTHORIZED,
            "the agent identity does not project onto the ownership (tenant or user differs)",
        )


class WireModel(BaseModel):
    """Base of every wire model: camelCase aliases, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, frozen=True, extra="forbid"
    )

    def to_wire(self) -> dict[str, Any]:
        """The JSON object sent on the wire (camelCase, ``None`` fields omitted)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class ThreadState(StrEnum):
    ACTIVE = "active"
    ARCHIVED = "archived"


class BranchRef(WireModel):
    """A recorded branch: the leaf entry a continue may fork from (append-only)."""

    leaf_id: str
    created_at: datetime


class ConversationThread(WireModel):
    """One thread: the spec's ``ConversationThread`` plus ``version``, ``headId``, ``legalHold``.

    ``version`` is what ``branch``/``archive`` compare-and-swap against;
    ``headId`` is the last entry of the most recent turn (where a continue
    without ``leafId`` attaches); ``tenantId``/``userId`` are the immutable
    ownership projection.
    """

    id: str
    title: str | None = None
    state: ThreadState
    branches: tuple[BranchRef, ...] = ()
    created_at: datetime
    updated_at: datetime
    tenant_id: str
    user_id: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    version: int
    head_id: str | None = None
    legal_hold: bool = False
    usage: dict[str, int] = Field(default_factory=dict)  # shared run-limit counters


class EntryRole(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"


class ConversationEntry(WireModel):
    """One durable entry of the thread's tree (content redacted and bounded)."""

    id: str
    parent_id: str | None = None
    role: EntryRole
    content: str
    created_at: datetime
    request_id: str | None = None
    truncated: bool | None = None


class EventRecord(WireModel):
    """One durable, redacted ledger row; ordered by ``(timestamp, id)``; dedupe by ``id``."""

    id: str
    thread_id: str
    type: str
    timestamp: datetime
    request_id: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    redacted: bool = True

    @property
    def terminal(self) -> bool:
        return self.type in TERMINAL_EVENT_TYPES


class ThreadPage(WireModel):
    """``list``: the owner's threads, newest first; ``nextCursor`` while more exist."""

    items: tuple[ConversationThread, ...]
    next_cursor: str | None = None


class ReplayPage(WireModel):
    """``replay``: a page of ledger rows.

    ``terminal`` is true when this page reaches the end of the ledger and the
    ledger's newest row is ``agent_finished``/``agent_denied``/``error`` (no run
    is writing).  ``nextCursor`` is absent exactly then (or for an empty
    ledger); otherwise resume with it -- it may return rows already seen
    (at-least-once across a reconnect): dedupe by ``id``.
    """

    records: tuple[EventRecord, ...]
    next_cursor: str | None = None
    terminal: bool = False


class ExportResult(WireModel):
    """``export``: the thread and its ledger, byte- and page-capped, resumable."""

    thread: ConversationThread
    events: tuple[EventRecord, ...]
    next_cursor: str | None = None
    truncated: bool = False


class DeleteResult(WireModel):
    """``delete``: ``deleted`` when every key is gone; ``held`` when a legal hold blocked it."""

    deleted: bool
    held: bool


class ContinueStatus(StrEnum):
    COMPLETED = "completed"
    DENIED = "denied"


class CancelStatus(StrEnum):
    CANCELLING = "cancelling"  # running: the signal is sent; the turn commits nothing
    CANCELLED = "cancelled"  # the turn ended cancelled
    COMPLETED = "completed"  # it finished before the cancel: unchanged
    DENIED = "denied"


class CancelResult(WireModel):
    """``DELETE {base}/{id}/runs/{requestId}``: what became of the run (idempotent)."""

    thread_id: str
    request_id: str
    status: CancelStatus


class ContinueResult(WireModel):
    """The result of one agent turn (the same result for every retry of its ``requestId``)."""

    thread_id: str
    request_id: str
    status: ContinueStatus
    leaf_id: str | None = None
    entries: tuple[ConversationEntry, ...] = ()
    reason: str | None = None


class ErrorBody(WireModel):
    """Every error response: a stable ``code`` and a human ``message``."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, frozen=True, extra="allow"
    )

    code: str
    message: str


# --- request bodies (HTTP) -----------------------------------------------------------------------


class RequestModel(BaseModel):
    """Base of the HTTP request bodies: exactly the documented camelCase fields.

    No snake_case aliases (``populate_by_name`` off), unknown fields refused, strict
    types (``expectedVersion`` is an integer: ``true``, ``"1"`` and ``1.0`` are refused).
    """

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=False, frozen=True, extra="forbid", strict=True
    )


# The documented grammar of an id given to create (threads.validation.create_thread_id
# also refuses the route names, which a JSON-schema pattern cannot express).
CREATE_ID_PATTERN: Final = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$"
ROUTE_NAMES: Final = ("openapi.json", "events", "continue", "branch", "archive", "export")
_ENTRY_ID_PATTERN: Final = r"^[A-Za-z0-9_.-]{1,128}$"


class CreateThreadRequest(RequestModel):
    title: str | None = None
    id: str | None = Field(
        default=None,
        pattern=CREATE_ID_PATTERN,
        json_schema_extra={"not": {"enum": list(ROUTE_NAMES)}},
    )
    request_id: str | None = Field(default=None, min_length=1)
    metadata: dict[str, Any] | None = None


class ContinueRequest(RequestModel):
    message: str = Field(min_length=1)
    request_id: str | None = Field(default=None, min_length=1)
    leaf_id: str | None = Field(default=None, pattern=_ENTRY_ID_PATTERN)


_VERSION_NOTE: Final = (
    "The thread version to compare-and-swap against: a JSON integer literal"
    ' (true, "1" and 1.0 are refused)'
)


class BranchRequest(RequestModel):
    leaf_id: str = Field(pattern=_ENTRY_ID_PATTERN)
    expected_version: int | None = Field(default=None, ge=0, description=_VERSION_NOTE)


class ArchiveRequest(RequestModel):
    expected_version: int | None = Field(default=None, ge=0, description=_VERSION_NOTE)


class ExportRequest(RequestModel):
    cursor: str | None = None
