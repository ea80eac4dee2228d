"""A scripted LangChain chat model (no network) that records the messages it was given."""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult


class RecordingChatModel(BaseChatModel):
    """Answers with ``replies`` in order; ``seen`` holds each call's input messages."""

    replies: list[AIMessage]
    seen: list[list[BaseMessage]] = []

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:  # create_agent binds its tools
        return self

    @property
    def _llm_type(self) -> str:
        return "memtier-test-recording"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self.seen.append(list(messages))
        if len(self.seen) > len(self.replies):
            raise AssertionError("the scripted chat model ran out of replies")
        reply = self.replies[len(self.seen) - 1]
        return ChatResult(generations=[ChatGeneration(message=reply)])


def kinds(messages: list[BaseMessage]) -> list[tuple[str, str]]:
    return [(m.type, str(m.content)) for m in messages]
