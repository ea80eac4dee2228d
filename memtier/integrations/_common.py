"""What the conversation-memory adapters share: session-id mapping and not-stored counts."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any, TypeVar

from memtier import limits, metrics
from memtier.errors import ValidationError
from memtier.memory.aio import AsyncConversationStore
from memtier.memory.models import Channel, ConversationKey, Turn
from memtier.memory.store import ConversationStore

__all__ = [
    "MAX_SESSION_ID_CHARS",
    "AnyStore",
    "NotStoredReason",
    "NotStoredTally",
    "append_calls",
    "call_store",
    "session_key",
    "tool_turn_id",
]

T = TypeVar("T")
AnyStore = ConversationStore | AsyncConversationStore

MAX_SESSION_ID_CHARS = 1024  # a session id is a name, not content
_CALL_ID_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,112}\Z")  # + an 8-char prefix fits a turn id


class NotStoredReason(StrEnum):
    """Why an adapter did not store a framework item (stable codes, only added)."""

    SYSTEM_MESSAGE = "system_message"  # system / developer instructions: not memory
    REASONING = "reasoning"  # hidden reasoning / scratchpad: never stored
    NON_TEXT_CONTENT = "non_text_content"  # images, files, audio parts of a message
    UNSUPPORTED_ITEM = "unsupported_item"  # hosted-tool calls and other item types
    EMPTY_MESSAGE = "empty_message"  # nothing textual left to store


def session_key(
    session_id: str, *, namespace: uuid.UUID, channel: Channel | str = Channel.IM
) -> ConversationKey:
    """The stable key of a framework session id: ``uuid5(namespace, session_id)`` + channel."""
    if not isinstance(session_id, str) or not 1 <= len(session_id) <= MAX_SESSION_ID_CHARS:
        raise ValidationError(
            f"session id must be a string of 1 to {MAX_SESSION_ID_CHARS} characters",
            field="session_id",
        )
    return ConversationKey(uuid.uuid5(namespace, session_id), channel)


def tool_turn_id(prefix: str, call_id: Any) -> str:
    """The turn id that carries a tool call id through the store (``<prefix><call id>``)."""
    if not isinstance(call_id, str) or not _CALL_ID_RE.match(call_id):
        raise ValidationError(
            f"tool call id must match {_CALL_ID_RE.pattern} to be stored", field="call_id"
        )
    return prefix + call_id


class NotStoredTally:
    """Counts what an adapter dropped, per reason: on the instance and as a metric."""

    def __init__(self, framework: str) -> None:
        self.framework = framework
        self.counts: Counter[str] = Counter()

    def add(self, reason: NotStoredReason) -> None:
        self.counts[reason.value] += 1
        metrics.INTEGRATION_ITEMS_NOT_STORED.labels(self.framework, reason.value).inc()


def append_calls(turns: Sequence[Turn]) -> list[Sequence[Turn]]:
    """``turns`` as the ``append_many`` calls that store them (each takes at most
    ``MAX_APPEND_MANY_TURNS``: a framework's batch of more goes in several calls)."""
    step = limits.MAX_APPEND_MANY_TURNS
    return [turns[i : i + step] for i in range(0, len(turns), step)]


async def call_store(store: AnyStore, method: str, *args: Any) -> Any:
    """Call a store method from asyncio: awaited on the async store, in a thread on the sync."""
    fn: Callable[..., Any] = getattr(store, method)
    if isinstance(store, AsyncConversationStore):
        return await fn(*args)
    return await asyncio.to_thread(fn, *args)
