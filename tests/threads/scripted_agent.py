"""A scripted OpenAI Agents SDK model and agent (no network): the first model call of a turn
asks for the ``lookup`` tool, the next one answers with the tool's result.  A message that
contains "hang" makes the model wait (for cancellation tests).  Importable by ``memtier serve``
subprocesses (``--agent scripted_agent:agent``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, function_tool
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

TOOL_SECRET = "ghp_" + "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3i2"
TOKENS_PER_CALL = 30


def _text(item: Any) -> str:
    content = item.get("content") if isinstance(item, dict) else None
    return content if isinstance(content, str) else ""


class ScriptedModel(Model):
    def __init__(self) -> None:
        self.settings: list[Any] = []
        self.calls = 0

    async def get_response(
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: Any,
        tools: Any,
        output_schema: Any,
        handoffs: Any,
        tracing: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        self.calls += 1
        self.settings.append(model_settings)
        items = [input] if isinstance(input, str) else list(input)
        last = items[-1]
        usage = Usage(requests=1, input_tokens=20, output_tokens=10, total_tokens=TOKENS_PER_CALL)
        if isinstance(last, dict) and last.get("type") == "function_call_output":
            users = [i for i in items if isinstance(i, dict) and i.get("role") == "user"]
            answer = f"{last.get('output')} after {len(users) - 1} earlier questions"
            message = ResponseOutputMessage(
                id=f"msg_{self.calls}",
                type="message",
                role="assistant",
                status="completed",
                content=[ResponseOutputText(text=answer, type="output_text", annotations=[])],
            )
            return ModelResponse(output=[message], usage=usage, response_id=None)
        question = _text(last)
        if "hang" in question:
            await asyncio.sleep(120)
        call = ResponseFunctionToolCall(
            id=f"fc_{self.calls}",
            call_id=f"call_{self.calls}",
            name="lookup",
            arguments='{"q": "' + question.replace('"', "") + '"}',
            type="function_call",
            status="completed",
        )
        return ModelResponse(output=[call], usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model does not stream")


@function_tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q} (key {TOOL_SECRET})"


model = ScriptedModel()
agent = Agent(
    name="assistant", instructions="Answer with the lookup tool.", model=model, tools=[lookup]
)
