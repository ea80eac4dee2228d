"""Conversation-memory models: keys, turns, receipts, context, metadata, events.

Every model is strict: unknown fields, roles and channels are rejected with a
:class:`~memtier.errors.ValidationError` (stable code), never a bare pydantic
error.  There is deliberately no system-message, scratchpad, hidden-reasoning,
credential, capability-URL or binary turn type.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from functools import lru_cache
from typing import Annotated, Any, ClassVar, Final, Literal
from uuid import UUID

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import PydanticCustomError

from memtier import limits
from memtier.errors import ErrorCode, InvalidNameError, UnsupportedChannelError, ValidationError
from memtier.redaction import sanitize
from memtier.trustedmodels import trusted
from memtier.wire import ms_to_datetime

__all__ = [
    "NAME_GRAMMAR",
    "ActionResult",
    "AgentResponse",
    "AppendReceipt",
    "AvatarMessage",
    "Channel",
    "Context",
    "ContextMessage",
    "ConversationKey",
    "Event",
    "FrozenFields",
    "MetadataPage",
    "ReasonCode",
    "Role",
    "SessionMetadata",
    "ToolSummary",
    "Turn",
    "TurnRecord",
    "check_name",
    "ms_to_datetime",
    "name_problem",
    "parse_turn",
    "trusted",
]

TurnId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._:\-]{1,128}$")]

# Tool and action names: short ASCII labels.  They end up inside the ``source="tool:..."``
# attribute of the untrusted-data delimiter, so the grammar has no quote, no angle
# bracket, no space, no control or non-ASCII character -- nothing an LLM could read as the
# end of the attribute or of the delimiter.  The grammar is matched in full (no trailing
# newline), and a name the redactor would change (it looks like a secret) is refused too,
# so what is stored is exactly what was given.  The live path (append) and the snapshot
# validator both call :func:`check_name`: they accept exactly the same names.
NAME_GRAMMAR: Final = f"[A-Za-z0-9][A-Za-z0-9_.:-]{{0,{limits.MAX_NAME_BYTES - 1}}}"
_NAME_RE: Final = re.compile(NAME_GRAMMAR)


def name_problem(value: object) -> str | None:
    """Why ``value`` is not a valid tool/action name (None: it is one)."""
    if not isinstance(value, str):
        return "must be a string"
    if _NAME_RE.fullmatch(value) is None:
        return (
            f"must match {NAME_GRAMMAR} (1-64 ASCII letters, digits and _ . : -, starting"
            " with a letter or digit)"
        )
    if _looks_like_secret(value):
        return "looks like a secret (a name is a label, never a credential)"
    return None


@lru_cache(maxsize=4096)  # names are a small vocabulary of <= 64 bytes; redaction is not free
def _looks_like_secret(name: str) -> bool:
    return sanitize(name, len(name)).text != name  # ASCII: bytes == characters


def check_name(value: object, field: str = "name") -> str:
    """``value`` if it is a valid tool/action name, else :class:`InvalidNameError`.

    The one validator of names: the grammar, and no secret (the redactor leaves it
    unchanged).  Used by the turn models, by append and by snapshot validation alike.
    """
    problem = name_problem(value)
    if problem is not None:
        raise InvalidNameError(f"invalid {field}: {problem}", field=field)
    assert isinstance(value, str)
    return value


def _grammar_name(value: str) -> str:
    problem = name_problem(value)
    if problem is not None:
        raise PydanticCustomError(ErrorCode.INVALID_NAME.value, problem)
    return value


Name = Annotated[str, AfterValidator(_grammar_name)]


class Channel(StrEnum):
    """The only two channel kinds: public chat and direct IM (no group or conference)."""

    PUBLIC = "public"
    IM = "im"


class Role(StrEnum):
    """Normalized roles of stored turns."""

    AVATAR = "avatar"
    AGENT = "agent"
    TOOL = "tool"


class ReasonCode(StrEnum):
    """Stable reason codes published on the event queue (never renamed, only added)."""

    EXPIRED = "expired"
    ROTATED = "rotated"
    COMPACTED = "compacted"
    EVICTED_SESSION_PRESSURE = "evicted_session_pressure"
    EVICTED_AGGREGATE_PRESSURE = "evicted_aggregate_pressure"
    OPERATOR_DELETED = "operator_deleted"
    OPERATOR_EXPIRED = "operator_expired"
    QUARANTINED = "quarantined"
    PERMISSIONS_NOT_VERIFIED = "permissions_not_verified"
    RESTORED = "restored"
    SNAPSHOT_SKIPPED = "snapshot_skipped"
    RESTORE_SKIPPED = "restore_skipped"
    POPPED = "popped"


def _raise_validation(exc: PydanticValidationError, what: str) -> None:
    problems = []
    error_type: type[ValidationError] = ValidationError
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or what
        problems.append(f"{loc}: {err['msg']}")
        if err["type"] == ErrorCode.INVALID_NAME.value:
            error_type = InvalidNameError
    raise error_type(f"invalid {what}: " + "; ".join(problems), fields=problems) from None


class _Strict(BaseModel):
    """Frozen, extra="forbid", and raising memtier's ValidationError."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except PydanticValidationError as exc:
            _raise_validation(exc, type(self).__name__)


class ConversationKey:
    """The immutable (avatar UUID, channel) a session belongs to.

    Only :class:`Channel.PUBLIC` and :class:`Channel.IM` exist; ``"group"`` or
    ``"conference"`` raise :class:`~memtier.errors.UnsupportedChannelError`.
    """

    # ``_member``: the member string, built on first use (``str(UUID)`` costs ~1 us and the
    # hot path needs it several times per call).
    __slots__ = ("_member", "avatar", "channel")

    avatar: UUID
    channel: Channel
    _member: str

    def __init__(self, avatar: UUID | str, channel: Channel | str) -> None:
        try:
            avatar_uuid = avatar if isinstance(avatar, UUID) else UUID(str(avatar))
        except (ValueError, TypeError, AttributeError):
            raise ValidationError("avatar must be a UUID", field="avatar") from None
        try:
            chan = Channel(channel)
        except ValueError:
            raise UnsupportedChannelError(
                f"unsupported channel {str(channel)[:32]!r}: only 'public' and 'im' exist"
                " (group and conference conversations are not representable)",
                field="channel",
            ) from None
        object.__setattr__(self, "avatar", avatar_uuid)
        object.__setattr__(self, "channel", chan)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("ConversationKey is immutable")

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ConversationKey)
            and other.avatar == self.avatar
            and other.channel == self.channel
        )

    def __hash__(self) -> int:
        return hash((self.avatar, self.channel))

    def __repr__(self) -> str:
        return f"ConversationKey(avatar={str(self.avatar)!r}, channel={self.channel.value!r})"

    @property
    def member(self) -> str:
        """``<avatar>:<channel>``, the name of this key inside its partition."""
        try:
            return self._member
        except AttributeError:
            member = f"{self.avatar}:{self.channel.value}"
            object.__setattr__(self, "_member", member)
            return member

    @classmethod
    def from_member(cls, member: str) -> ConversationKey:
        avatar, _, channel = member.rpartition(":")
        return cls(avatar, channel)


class _TurnBase(_Strict):
    kind: ClassVar[str]
    role: ClassVar[Role]
    untrusted: ClassVar[bool]

    turn_id: TurnId | None = None

    def content_fields(self) -> dict[str, str]:
        raise NotImplementedError


class AvatarMessage(_TurnBase):
    """Input from the avatar (a person in the world): untrusted."""

    kind: ClassVar[str] = "avatar"
    role: ClassVar[Role] = Role.AVATAR
    untrusted: ClassVar[bool] = True
    text: str

    def content_fields(self) -> dict[str, str]:
        return {"text": self.text}


class AgentResponse(_TurnBase):
    """A response the agent made visible to the avatar."""

    kind: ClassVar[str] = "agent"
    role: ClassVar[Role] = Role.AGENT
    untrusted: ClassVar[bool] = False
    text: str

    def content_fields(self) -> dict[str, str]:
        return {"text": self.text}


class ToolSummary(_TurnBase):
    """A bounded summary of one tool result: untrusted data."""

    kind: ClassVar[str] = "tool"
    role: ClassVar[Role] = Role.TOOL
    untrusted: ClassVar[bool] = True
    tool: Name
    summary: str

    def content_fields(self) -> dict[str, str]:
        return {"tool": self.tool, "summary": self.summary}


class ActionResult(_TurnBase):
    """The externally meaningful result of an action the agent took (e.g. a teleport).

    Stored with the ``tool`` role and kept untrusted: outcomes often carry text
    that came from the world, not from the agent.
    """

    kind: ClassVar[str] = "action"
    role: ClassVar[Role] = Role.TOOL
    untrusted: ClassVar[bool] = True
    action: Name
    outcome: str

    def content_fields(self) -> dict[str, str]:
        return {"action": self.action, "outcome": self.outcome}


Turn = AvatarMessage | AgentResponse | ToolSummary | ActionResult
TURN_TYPES: dict[str, type[_TurnBase]] = {
    t.kind: t for t in (AvatarMessage, AgentResponse, ToolSummary, ActionResult)
}


def parse_turn(data: dict[str, Any]) -> Turn:
    """Build a turn from a JSON-like dict with a ``kind`` field (avatar/agent/tool/action)."""
    if not isinstance(data, dict):
        raise ValidationError("a turn must be an object")
    fields = dict(data)
    kind = fields.pop("kind", None)
    turn_type = TURN_TYPES.get(kind) if isinstance(kind, str) else None
    if turn_type is None:
        raise ValidationError(
            f"unknown turn kind {str(kind)[:32]!r}: one of {sorted(TURN_TYPES)}"
            " (no system, scratchpad, reasoning, credential, capability-URL or binary turns)",
            field="kind",
        )
    return turn_type(**fields)  # type: ignore[return-value]


class AppendReceipt(_Strict):
    """What one append stored: ``seq`` is gapless within ``session_id``."""

    session_id: str
    seq: int
    timestamp: datetime
    bytes: int = Field(description="UTF-8 content bytes this turn stored")
    rotated: bool = Field(description="a new session began because the old one expired")
    session_bytes: int
    turn_count: int
    truncated: bool = False
    redactions: tuple[str, ...] = ()
    duplicate: bool = Field(default=False, description="a retry: the first receipt, nothing stored")
    evicted: int = Field(default=0, description="other sessions evicted to make room")
    evicted_for_sessions: int = Field(
        default=0, description="of those, evicted for session-count (not byte) pressure"
    )
    swept: int = Field(default=0, description="other expired sessions removed on the way")


class FrozenFields(dict[str, str]):
    """A turn record's fields: a ``dict`` that refuses every change (``TypeError``).

    A :class:`TurnRecord` is frozen, and its fields are too, so a record read back is a
    value: the context read hands the same instances to every read of unchanged records
    (:mod:`memtier.memory.contextdecode`), and no caller can change what another read
    returns.  Reading, comparing with a ``dict``, ``dict(fields)``, ``fields | other``
    (a new plain dict), JSON, pickling and copying work as for a ``dict``.
    """

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a turn record's fields cannot be changed (copy them: dict(fields))")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[Any, ...]:  # pickle / copy rebuild it without __setitem__
        return (FrozenFields, (dict(self),))

    def __copy__(self) -> FrozenFields:
        return self  # immutable: a copy is itself

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenFields:
        return self


class TurnRecord(_Strict):
    """One stored turn, as read back (content already redacted and bounded)."""

    seq: int
    timestamp: datetime
    clock_ms: int
    kind: Literal["avatar", "agent", "tool", "action"]
    role: Role
    turn_id: str
    # Always a FrozenFields (validation converts a plain dict): see FrozenFields.
    fields: Annotated[dict[str, str], AfterValidator(FrozenFields)]

    @property
    def untrusted(self) -> bool:
        return TURN_TYPES[self.kind].untrusted


class ContextMessage(_Strict):
    """One chat-completions message: role ``user`` or ``assistant``.

    ``untrusted`` marks data that came from an avatar or a tool (or a summary
    built from them); its ``content`` is wrapped in a visible
    ``<untrusted-data ...>`` delimiter as well.
    """

    role: Literal["user", "assistant"]
    content: str
    untrusted: bool

    def to_openai(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


class Context(_Strict):
    """The LLM-facing projection of one key: summary (if any) then recent turns."""

    key_avatar: UUID
    key_channel: Channel
    session_id: str | None
    messages: tuple[ContextMessage, ...]
    turns: tuple[TurnRecord, ...] = ()
    summary: str | None = None

    def to_openai(self) -> list[dict[str, str]]:
        return [m.to_openai() for m in self.messages]


class SessionMetadata(_Strict):
    """Metadata of one live session: never content."""

    session_id: str
    avatar: UUID
    channel: Channel
    created_at: datetime
    last_active_at: datetime
    turn_count: int
    bytes: int


class MetadataPage(_Strict):
    """One page of :class:`SessionMetadata`; pass ``cursor`` back for the next (None = done)."""

    sessions: tuple[SessionMetadata, ...]
    cursor: str | None


class Event(_Strict):
    """One reason-code event: key, session, time; never content."""

    id: str
    cursor: str
    reason: ReasonCode
    avatar: UUID | None
    channel: Channel | None
    session_id: str | None
    timestamp: datetime
    detail: str | None = None
