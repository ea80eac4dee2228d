"""A LangChain ``BaseChatMessageHistory`` over memtier's conversation memory.

``pip install 'memtier[langchain]'``; then ``RunnableWithMessageHistory(chain,
lambda session_id: MemtierChatMessageHistory(session_id, store))``.

Mapping (README section "LangChain"): ``HumanMessage`` -> avatar turn, ``AIMessage`` ->
agent turn (its text; turn id ``lc-ai:`` when it carries tool calls), each tool call ->
tool turn (tool = name, summary = JSON arguments, turn id ``lc-call:<id>``),
``ToolMessage`` -> tool turn (summary = content, turn id ``lc-out:<tool_call_id>``).
``SystemMessage`` and other message types are not stored, and counted.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from memtier.errors import ConfigurationError, ValidationError
from memtier.integrations._common import (
    NotStoredReason,
    NotStoredTally,
    append_calls,
    session_key,
    tool_turn_id,
)
from memtier.memory.aio import AsyncConversationStore
from memtier.memory.core import MemoryCore
from memtier.memory.models import (
    AgentResponse,
    AvatarMessage,
    Channel,
    ConversationKey,
    ToolSummary,
    Turn,
    TurnRecord,
)
from memtier.memory.store import ConversationStore

__all__ = ["HISTORY_NAMESPACE", "MemtierChatMessageHistory"]

#: ``uuid5(NAMESPACE_URL, "memtier:integrations:langchain")``: the default namespace of
#: session ids (stable: changing it would orphan every stored history).
HISTORY_NAMESPACE = uuid.UUID("bc90d51a-b9ae-5e9c-b38e-e6dbbfc6c800")
AI_WITH_CALLS_PREFIX = "lc-ai:"
CALL_PREFIX = "lc-call:"
OUTPUT_PREFIX = "lc-out:"
FRAMEWORK = "langchain"
_TEXT_BLOCKS = frozenset({"text", "input_text", "output_text"})


def _text(content: Any, tally: NotStoredTally) -> str:
    if isinstance(content, str):
        return content
    texts: list[str] = []
    dropped = False
    for block in content if isinstance(content, list) else []:
        if isinstance(block, str):
            texts.append(block)
        elif (
            isinstance(block, dict)
            and block.get("type") in _TEXT_BLOCKS
            and isinstance(block.get("text"), str)
        ):
            texts.append(block["text"])
        else:
            dropped = True
    if dropped:
        tally.add(NotStoredReason.NON_TEXT_CONTENT)
    return "".join(texts)


def message_to_turns(message: BaseMessage, tally: NotStoredTally) -> list[Turn]:
    """The memtier turns of one LangChain message ([] when not stored, counted)."""
    if isinstance(message, SystemMessage):
        tally.add(NotStoredReason.SYSTEM_MESSAGE)
        return []
    if isinstance(message, ToolMessage):
        return [
            ToolSummary(
                tool=message.name or "tool",
                summary=_text(message.content, tally),
                turn_id=tool_turn_id(OUTPUT_PREFIX, message.tool_call_id),
            )
        ]
    if isinstance(message, HumanMessage):
        text = _text(message.content, tally)
        if not text:
            tally.add(NotStoredReason.EMPTY_MESSAGE)
            return []
        return [AvatarMessage(text=text)]
    if isinstance(message, AIMessage):
        text = _text(message.content, tally)
        turns: list[Turn] = []
        calls = [c for c in message.tool_calls if c.get("id")]
        if len(calls) < len(message.tool_calls):
            tally.add(NotStoredReason.UNSUPPORTED_ITEM)  # a call without an id cannot pair
        if text:
            prefix = AI_WITH_CALLS_PREFIX if calls else None
            turns.append(
                AgentResponse(text=text, turn_id=prefix + uuid.uuid4().hex if prefix else None)
            )
        for call in calls:
            turns.append(
                ToolSummary(
                    tool=call["name"] or "tool",
                    summary=json.dumps(call.get("args", {}), ensure_ascii=False, sort_keys=True),
                    turn_id=tool_turn_id(CALL_PREFIX, call["id"]),
                )
            )
        if not turns:
            tally.add(NotStoredReason.EMPTY_MESSAGE)
        return turns
    tally.add(NotStoredReason.UNSUPPORTED_ITEM)
    return []


def _args(text: str) -> dict[str, Any]:
    """Tool-call arguments as stored; redaction or bounding may have broken the JSON."""
    try:
        value = json.loads(text)
    except ValueError:
        return {"_memtier_text": text}
    return value if isinstance(value, dict) else {"_memtier_value": value}


def records_to_messages(summary: str | None, records: Sequence[TurnRecord]) -> list[BaseMessage]:
    """Messages, oldest first, with every tool call paired with its ToolMessage."""
    out: list[BaseMessage] = []
    if summary is not None:
        projected = MemoryCore.project({"text": summary}, [])[0]
        out.append(HumanMessage(content=projected.content))
    # An AIMessage with tool calls is stored as its text (turn id lc-ai:...) then one turn
    # per call: ``pending`` gathers them back into one message.
    pending: tuple[str, list[dict[str, Any]]] | None = None

    def flush() -> None:
        nonlocal pending
        if pending is not None:
            out.append(AIMessage(content=pending[0], tool_calls=pending[1]))
            pending = None

    for rec in records:
        f, tid = rec.fields, rec.turn_id
        if rec.kind == "tool" and tid.startswith(CALL_PREFIX):
            call = {"name": f["tool"], "args": _args(f["summary"]), "id": tid[len(CALL_PREFIX) :]}
            if pending is None:
                pending = ("", [])
            pending[1].append(call)
            continue
        flush()
        if rec.kind == "agent" and tid.startswith(AI_WITH_CALLS_PREFIX):
            pending = (f["text"], [])
        elif rec.kind == "avatar":
            out.append(HumanMessage(content=f["text"]))
        elif rec.kind == "agent":
            out.append(AIMessage(content=f["text"]))
        elif rec.kind == "tool" and tid.startswith(OUTPUT_PREFIX):
            out.append(
                ToolMessage(
                    content=f["summary"], tool_call_id=tid[len(OUTPUT_PREFIX) :], name=f["tool"]
                )
            )
        else:  # a tool or action turn another memtier client wrote: untrusted user data
            out.append(HumanMessage(content=MemoryCore.project(None, [rec])[0].content))
    flush()
    return _paired(out)


def _paired(messages: list[BaseMessage]) -> list[BaseMessage]:
    calls = {c["id"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls}
    outputs = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    both = calls & outputs
    out: list[BaseMessage] = []
    for m in messages:
        if isinstance(m, ToolMessage):
            if m.tool_call_id in both:
                out.append(m)
        elif isinstance(m, AIMessage) and m.tool_calls:
            kept = [c for c in m.tool_calls if c["id"] in both]
            if kept or m.content:
                out.append(AIMessage(content=m.content, tool_calls=kept))
        else:
            out.append(m)
    return out


class MemtierChatMessageHistory(BaseChatMessageHistory):
    """LangChain chat history of one session, stored as memtier conversation turns.

    ``store``: a :class:`~memtier.ConversationStore` for the sync methods; ``astore``: an
    :class:`~memtier.AsyncConversationStore` for the ``a*`` methods (without one they run
    the sync store in a worker thread).  The key is ``uuid5(namespace, session_id)`` on
    ``channel`` (IM by default), or ``key=``.
    """

    def __init__(
        self,
        session_id: str,
        store: ConversationStore | None = None,
        *,
        astore: AsyncConversationStore | None = None,
        key: ConversationKey | None = None,
        namespace: uuid.UUID = HISTORY_NAMESPACE,
        channel: Channel | str = Channel.IM,
    ) -> None:
        if store is None and astore is None:
            raise ConfigurationError("MemtierChatMessageHistory needs a store or an astore")
        self.session_id = session_id
        self.key = (
            key
            if key is not None
            else session_key(session_id, namespace=namespace, channel=channel)
        )
        self.store = store
        self.astore = astore
        self.not_stored = NotStoredTally(FRAMEWORK)

    def _sync(self) -> ConversationStore:
        if self.store is None:
            raise ConfigurationError("this history has no sync store (pass store=)")
        return self.store

    def _turns(self, messages: Sequence[BaseMessage]) -> list[Turn]:
        turns: list[Turn] = []
        for message in messages:
            if not isinstance(message, BaseMessage):
                raise ValidationError("a chat history holds BaseMessage objects", field="message")
            turns += message_to_turns(message, self.not_stored)
        return turns

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """Every stored message, oldest first (the compacted summary first, if any)."""
        ctx = self._sync().context(self.key)
        return records_to_messages(ctx.summary, ctx.turns)

    def last(self, n: int) -> list[BaseMessage]:
        """The newest ``n`` messages; a tool call cut from its result is left out whole."""
        if not isinstance(n, int) or n < 0:
            raise ValidationError("n must be a non-negative integer", field="n")
        return _paired(self.messages[-n:]) if n else []

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append the messages' turns in order with ``append_many`` (validated and
        redacted first: bad input stores nothing; one round trip per 16 turns)."""
        store = self._sync()
        for turns in append_calls(self._turns(messages)):
            store.append_many(self.key, turns)

    def clear(self) -> None:
        self._sync().delete(self.key)

    async def aget_messages(self) -> list[BaseMessage]:
        if self.astore is None:
            return await asyncio.to_thread(lambda: self.messages)
        ctx = await self.astore.context(self.key)
        return records_to_messages(ctx.summary, ctx.turns)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        if self.astore is None:
            await asyncio.to_thread(self.add_messages, messages)
            return
        for turns in append_calls(self._turns(messages)):
            await self.astore.append_many(self.key, turns)

    async def aclear(self) -> None:
        if self.astore is None:
            await asyncio.to_thread(self.clear)
            return
        await self.astore.delete(self.key)
