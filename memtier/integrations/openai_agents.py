"""An OpenAI Agents SDK ``Session`` over memtier's conversation memory.

``pip install 'memtier[openai-agents]'``; then ``Runner.run(agent, text, session=session)``
with ``session = MemtierSession("user-123", store)``.

Mapping (see the README section "OpenAI Agents SDK"):

* ``session_id`` -> :class:`~memtier.ConversationKey`: avatar ``uuid5(namespace,
  session_id)`` (``namespace`` defaults to :data:`SESSION_NAMESPACE`), channel IM
  (24 h inactivity TTL) unless given; or pass ``key=`` directly.
* user message -> avatar turn; assistant message -> agent turn; ``function_call`` ->
  tool turn (tool = name, summary = arguments, turn id ``oa-call:<call_id>``);
  ``function_call_output`` -> tool turn (summary = output, turn id ``oa-out:<call_id>``).
* system / developer messages, reasoning items, hosted-tool and other item types, and the
  non-text parts of a message are not stored; each is counted by a
  :class:`~memtier.integrations._common.NotStoredReason` (``session.not_stored`` and the
  ``memtier_integration_items_not_stored_total`` metric).

Read back, every ``function_call`` has its ``function_call_output`` (same ``call_id``)
and vice versa: a half whose partner was compacted into the summary, popped or not yet
written is left out, so the Runner always gets a history the Responses API accepts.
"""

from __future__ import annotations

import uuid
from typing import Any

from agents.memory.session_settings import (
    SessionSettings,
    resolve_session_limit,
)

from memtier.errors import ValidationError
from memtier.integrations._common import (
    AnyStore,
    NotStoredReason,
    NotStoredTally,
    append_calls,
    call_store,
    session_key,
    tool_turn_id,
)
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

__all__ = [
    "CALL_PREFIX",
    "OUTPUT_PREFIX",
    "SESSION_NAMESPACE",
    "MemtierSession",
    "OpenAIAgentsRunner",
    "item_to_turn",
    "runner",
]

#: ``uuid5(NAMESPACE_URL, "memtier:integrations:openai-agents")``: the default namespace
#: of session ids (stable: changing it would orphan every stored session).
SESSION_NAMESPACE = uuid.UUID("d9a39379-04a6-550d-8315-7281efa5ef38")
CALL_PREFIX = "oa-call:"
OUTPUT_PREFIX = "oa-out:"
FRAMEWORK = "openai-agents"
_DEFAULT_TOOL = "function"  # the tool name of an output whose call is not in the batch
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})


def _as_dict(item: Any) -> dict[str, Any]:
    if isinstance(item, dict):
        return item
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        dumped = dump(exclude_unset=True)
        if isinstance(dumped, dict):
            return dumped
    raise ValidationError("a session item must be a dict (TResponseInputItem)", field="item")


def _text_of(content: Any, tally: NotStoredTally) -> str:
    """The text of message content (a string or a list of parts); other parts are counted."""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    dropped = False
    for part in content if isinstance(content, list) else []:
        part = part if isinstance(part, dict) else _as_dict(part)
        kind = part.get("type")
        text = part.get("text", part.get("refusal"))
        if kind in _TEXT_PARTS and isinstance(text, str):
            texts.append(text)
        else:
            dropped = True
    if dropped:
        tally.add(NotStoredReason.NON_TEXT_CONTENT)
    return "\n".join(texts)


def item_to_turn(
    item: Any, tally: NotStoredTally, call_names: dict[str, str] | None = None
) -> Turn | None:
    """The memtier turn of one SDK item, or None (counted in ``tally``) if not stored."""
    data = _as_dict(item)
    kind = data.get("type")
    role = data.get("role")
    if kind in (None, "message") and role in ("user", "assistant", "system", "developer"):
        if role in ("system", "developer"):
            tally.add(NotStoredReason.SYSTEM_MESSAGE)
            return None
        text = _text_of(data.get("content"), tally)
        if not text:
            tally.add(NotStoredReason.EMPTY_MESSAGE)
            return None
        return AvatarMessage(text=text) if role == "user" else AgentResponse(text=text)
    if kind == "function_call":
        name, call_id = data.get("name"), data.get("call_id")
        if not isinstance(name, str) or not name:
            raise ValidationError("function_call needs a name", field="name")
        if call_names is not None and isinstance(call_id, str):
            call_names[call_id] = name
        arguments = data.get("arguments")
        return ToolSummary(
            tool=name,
            summary=arguments if isinstance(arguments, str) else "",
            turn_id=tool_turn_id(CALL_PREFIX, call_id),
        )
    if kind == "function_call_output":
        call_id = data.get("call_id")
        output = data.get("output")
        text = output if isinstance(output, str) else _text_of(output, tally)
        name = (call_names or {}).get(call_id, _DEFAULT_TOOL) if isinstance(call_id, str) else ""
        return ToolSummary(
            tool=name or _DEFAULT_TOOL, summary=text, turn_id=tool_turn_id(OUTPUT_PREFIX, call_id)
        )
    if kind == "reasoning":
        tally.add(NotStoredReason.REASONING)
        return None
    tally.add(NotStoredReason.UNSUPPORTED_ITEM)
    return None


def _record_to_item(record: TurnRecord) -> dict[str, Any]:
    f = record.fields
    if record.kind == "avatar":
        return {"role": "user", "content": f["text"]}
    if record.kind == "agent":
        return {"role": "assistant", "content": f["text"]}
    if record.kind == "tool" and record.turn_id.startswith(CALL_PREFIX):
        return {
            "type": "function_call",
            "call_id": record.turn_id[len(CALL_PREFIX) :],
            "name": f["tool"],
            "arguments": f["summary"],
        }
    if record.kind == "tool" and record.turn_id.startswith(OUTPUT_PREFIX):
        return {
            "type": "function_call_output",
            "call_id": record.turn_id[len(OUTPUT_PREFIX) :],
            "output": f["summary"],
        }
    # A tool or action turn another memtier client wrote: untrusted user-role data.
    return dict(MemoryCore.project(None, [record])[0].to_openai())


def paired(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` without a function_call lacking its output or an output lacking its call."""
    calls = {i["call_id"] for i in items if i.get("type") == "function_call"}
    outputs = {i["call_id"] for i in items if i.get("type") == "function_call_output"}
    both = calls & outputs
    return [
        i
        for i in items
        if i.get("type") not in ("function_call", "function_call_output") or i["call_id"] in both
    ]


class MemtierSession:
    """The SDK's ``Session`` protocol over a memtier conversation-memory store.

    ``store`` is an :class:`~memtier.AsyncConversationStore` (awaited directly) or a
    :class:`~memtier.ConversationStore` (called in a worker thread).  Every text goes
    through the store's redaction and bounds, as every turn does.
    """

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        session_id: str,
        store: AnyStore,
        *,
        key: ConversationKey | None = None,
        namespace: uuid.UUID = SESSION_NAMESPACE,
        channel: Channel | str = Channel.IM,
        session_settings: SessionSettings | None = None,
        owns_store: bool = False,
    ) -> None:
        self.session_id = session_id
        self.key = (
            key
            if key is not None
            else session_key(session_id, namespace=namespace, channel=channel)
        )
        self.store = store
        self.session_settings = session_settings or SessionSettings()
        self.not_stored = NotStoredTally(FRAMEWORK)
        self._owns_store = owns_store

    @classmethod
    def from_url(cls, session_id: str, *, url: str, **options: Any) -> MemtierSession:
        """A session on its own :class:`~memtier.AsyncConversationStore` at ``url``."""
        from memtier.config import MemtierConfig
        from memtier.memory.aio import AsyncConversationStore

        store = AsyncConversationStore.from_config(MemtierConfig.load(redis_url=url))
        return cls(session_id, store, owns_store=True, **options)

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The history, oldest first: the compacted summary (if any) then the turns.

        ``limit`` (or ``session_settings.limit``) keeps the newest items; a call/output
        pair cut by it is left out whole, so fewer than ``limit`` items may come back.
        """
        effective = resolve_session_limit(limit, self.session_settings)
        ctx = await call_store(self.store, "context", self.key)
        items: list[dict[str, Any]] = []
        if ctx.summary is not None and ctx.messages:
            items.append(ctx.messages[0].to_openai())
        items += [_record_to_item(r) for r in ctx.turns]
        items = paired(items)
        if effective is not None and effective >= 0:
            items = paired(items[-effective:]) if effective else []
        return items

    async def add_items(self, items: list[Any]) -> None:
        """Append the items' turns in order with ``append_many`` (one round trip per 16
        turns).  Not one transaction: a refusal leaves the items before it stored
        (the error's ``stored`` detail counts them) and none after it."""
        call_names: dict[str, str] = {}
        turns = [item_to_turn(item, self.not_stored, call_names) for item in items]
        for batch in append_calls([turn for turn in turns if turn is not None]):
            await call_store(self.store, "append_many", self.key, batch)

    async def pop_item(self) -> Any | None:
        """Remove and return the newest stored item (one atomic script); None if empty."""
        record = await call_store(self.store, "pop", self.key)
        return None if record is None else _record_to_item(record)

    async def clear_session(self) -> None:
        """Delete this session's turns and summary (an ``operator_deleted`` event)."""
        await call_store(self.store, "delete", self.key)

    async def ping(self) -> bool:
        """True when the store's Redis answers."""
        try:
            await call_store(self.store, "stats")
        except Exception:
            return False
        return True

    async def close(self) -> None:
        """Close the store if this session made it (``from_url``)."""
        if self._owns_store:
            result = self.store.close()
            if result is not None:
                await result


# The threads runner lives in its own module; importing it here makes
# `memtier serve --runner memtier.integrations.openai_agents:runner --agent pkg.mod:agent`
# work as the issue (and docs/threads.md) spell it.
from memtier.integrations.openai_agents_runner import (  # noqa: E402
    OpenAIAgentsRunner,
    runner,
)
