"""A scripted OpenAI Agents SDK model (no network) that records every input it was given."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

from agents import Model, ModelResponse, set_tracing_disabled
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

# The SDK would export traces to OpenAI: these tests never touch the network.
set_tracing_disabled(True)


def say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg_fake",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def call(name: str, arguments: str, call_id: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id="fc_" + call_id, type="function_call", name=name, arguments=arguments, call_id=call_id
    )


class ScriptedModel(Model):
    """Answers from a fixed script of turns; ``inputs`` holds each call's input items."""

    def __init__(self, script: list[list[Any]]) -> None:
        self.script = list(script)
        self.inputs: list[list[dict[str, Any]]] = []

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        self.inputs.append(copy.deepcopy([dict(i) for i in items]))
        if not self.script:
            raise AssertionError("the scripted model ran out of turns")
        return ModelResponse(output=self.script.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("not used by these tests")


def shape(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(kind, text or call id) of each history item: what the tests compare."""
    out = []
    for i in items:
        kind = i.get("type") or "message"
        if kind == "message":
            content = i["content"]
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content)
            out.append((i["role"], content))
        elif kind in ("function_call", "function_call_output"):
            out.append((kind, i["call_id"]))
        else:
            out.append((kind, ""))
    return out


def assert_pairs_intact(items: list[dict[str, Any]]) -> None:
    """Every function_call has exactly one output with its call_id, after it; and back."""
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
    outs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
    assert sorted(calls) == sorted(outs), (calls, outs)
    assert len(set(calls)) == len(calls)
    position = {(i.get("type"), i.get("call_id")): n for n, i in enumerate(items)}
    for c in calls:
        assert position[("function_call", c)] < position[("function_call_output", c)]
