"""Conversation threads: durable, ownership-scoped threads on Redis (design notes below).

Public API: :func:`create_conversation_service` / :class:`ConversationService`
(sync), :func:`create_async_conversation_service` /
:class:`AsyncConversationService` (asyncio), the wire models
(:class:`ConversationThread`, ...), :class:`Ownership`, the runner protocol,
and the HTTP app (:func:`memtier.threads.http.create_conversation_app`,
needs ``memtier[http]``).
"""

from memtier.errors import ConversationError, ConversationErrorCode
from memtier.threads.aio import AsyncConversationService, create_async_conversation_service
from memtier.threads.models import (
    BranchRef,
    ContinueResult,
    ContinueStatus,
    ConversationEntry,
    ConversationThread,
    DeleteResult,
    EntryRole,
    EventRecord,
    ExportResult,
    Ownership,
    ReplayPage,
    ThreadPage,
    ThreadState,
)
from memtier.threads.runner import (
    AgentDenied,
    AsyncConversationRunner,
    AsyncRunnerTurn,
    ConversationRunner,
    EchoRunner,
    RunnerEvent,
    RunnerReply,
    RunnerTurn,
)
from memtier.threads.service import ConversationService, create_conversation_service

__all__ = [
    "AgentDenied",
    "AsyncConversationRunner",
    "AsyncConversationService",
    "AsyncRunnerTurn",
    "BranchRef",
    "ContinueResult",
    "ContinueStatus",
    "ConversationEntry",
    "ConversationError",
    "ConversationErrorCode",
    "ConversationRunner",
    "ConversationService",
    "ConversationThread",
    "DeleteResult",
    "EchoRunner",
    "EntryRole",
    "EventRecord",
    "ExportResult",
    "Ownership",
    "ReplayPage",
    "RunnerEvent",
    "RunnerReply",
    "RunnerTurn",
    "ThreadPage",
    "ThreadState",
    "create_async_conversation_service",
    "create_conversation_service",
]
