"""memtier: a Redis-backed, distributed memory tier for LLM agents.

Two capabilities over one Redis (or one Redis Cluster): bounded, expiring
conversation memory per (avatar UUID, channel) -- :class:`ConversationStore`
and :class:`AsyncConversationStore` -- and durable conversation threads
(:mod:`memtier.threads`).
"""

from memtier._version import __version__
from memtier.config import ConversationConfig, MemtierConfig, ThreadsConfig
from memtier.errors import (
    BackendError,
    CapacityError,
    ConfigurationError,
    ConversationError,
    ConversationErrorCode,
    ErrorCode,
    InvalidCursorError,
    MemtierError,
    ScriptError,
    SessionFullError,
    SnapshotError,
    TransientBackendError,
    TurnTooLargeError,
    UnsupportedChannelError,
    ValidationError,
)
from memtier.memory.aio import AsyncConversationStore
from memtier.memory.models import (
    ActionResult,
    AgentResponse,
    AppendReceipt,
    AvatarMessage,
    Channel,
    Context,
    ContextMessage,
    ConversationKey,
    Event,
    MetadataPage,
    ReasonCode,
    Role,
    SessionMetadata,
    ToolSummary,
    Turn,
    TurnRecord,
    parse_turn,
)
from memtier.memory.store import ConversationStore

__all__ = [
    "ActionResult",
    "AgentResponse",
    "AppendReceipt",
    "AsyncConversationStore",
    "AvatarMessage",
    "BackendError",
    "CapacityError",
    "Channel",
    "ConfigurationError",
    "Context",
    "ContextMessage",
    "ConversationConfig",
    "ConversationError",
    "ConversationErrorCode",
    "ConversationKey",
    "ConversationStore",
    "ErrorCode",
    "Event",
    "InvalidCursorError",
    "MemtierConfig",
    "MemtierError",
    "MetadataPage",
    "ReasonCode",
    "Role",
    "ScriptError",
    "SessionFullError",
    "SessionMetadata",
    "SnapshotError",
    "ThreadsConfig",
    "ToolSummary",
    "TransientBackendError",
    "Turn",
    "TurnRecord",
    "TurnTooLargeError",
    "UnsupportedChannelError",
    "ValidationError",
    "__version__",
    "parse_turn",
]
