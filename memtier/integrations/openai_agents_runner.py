"""A conversation-threads runner that runs an OpenAI Agents SDK ``Agent`` for each turn.

::

    from memtier.integrations.openai_agents_runner import OpenAIAgentsRunner
    service = create_async_conversation_service(runner=OpenAIAgentsRunner(agent))

    memtier serve --runner memtier.integrations.openai_agents_runner:runner \\
                  --agent package.module:agent --api-keys keys.toml

(``pip install 'memtier[openai-agents]'``.)  One turn = one ``Runner.run`` of the agent on
the thread's history (the durable entries along the branch, root first) plus the user's
message, with:

* **run options** -- :class:`OpenAIAgentsRunOptions` (``temperature``, ``top_p``,
  ``max_tokens``, ``tool_choice``, ``parallel_tool_calls``, ``max_turns``) is the
  runner's ``run_options_schema``; a turn's validated options become the SDK's
  ``RunConfig.model_settings`` (and ``max_turns``);
* **ledger events** -- SDK lifecycle hooks are mapped to runner events as they happen:
  ``model.response`` (per model call: output item types, token counts), ``tool.call``
  and ``tool.output`` (the tool's name only: arguments and outputs are raw payloads,
  never recorded -- and the service redacts event data anyway), ``agent.handoff``;
* **RunLimits** -- every model response is reported as ``usage`` (``tokens`` = total
  tokens, ``model_calls`` = 1) and every tool call as ``usage`` (``tool_calls`` = 1):
  a report past the turn's allowance raises ``limit_exceeded`` inside the SDK's hook,
  which stops the run (the turn then ends ``limit_exceeded`` and commits nothing);
* **cancellation** -- the runner is asyncio code: a cancelled turn cancels
  ``Runner.run`` (``CancelledError``), so no further model or tool call starts.

Tracing is disabled unless the host passes its own ``run_config``: the SDK's default
exporter would send turn data to OpenAI.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from memtier.errors import ConfigurationError
from memtier.threads.runner import AsyncRunnerTurn, RunnerEvent, RunnerReply

try:
    from agents import Agent, ModelSettings, RunConfig, RunHooks, Runner
    from agents.items import ModelResponse
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "memtier.integrations.openai_agents_runner needs `pip install 'memtier[openai-agents]'`"
    ) from exc

__all__ = ["OpenAIAgentsRunOptions", "OpenAIAgentsRunner", "runner"]

MAX_TURNS_CEILING = 50  # SDK turns (model calls) one thread turn may take at most


class OpenAIAgentsRunOptions(BaseModel):
    """The run options a caller may pass (``runOptions``), mapped onto the SDK's run config."""

    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    tool_choice: Literal["auto", "required", "none"] | None = None
    parallel_tool_calls: bool | None = None
    max_turns: int | None = Field(default=None, ge=1, le=MAX_TURNS_CEILING)


_SETTINGS_FIELDS = ("temperature", "top_p", "max_tokens", "tool_choice", "parallel_tool_calls")


class _LedgerHooks(RunHooks[Any]):
    """SDK lifecycle hooks -> the turn's ledger events and RunLimits consumption."""

    def __init__(self, turn: AsyncRunnerTurn) -> None:
        self.turn = turn
        self.tokens = 0

    async def on_llm_end(self, context: Any, agent: Any, response: ModelResponse) -> None:
        usage = response.usage
        total = int(getattr(usage, "total_tokens", 0) or 0)
        self.tokens += total
        items = [str(getattr(item, "type", type(item).__name__)) for item in response.output]
        await self.turn.emit(
            RunnerEvent(
                "model.response",
                {
                    "agent": agent.name,
                    "items": items[:32],
                    "inputTokens": int(getattr(usage, "input_tokens", 0) or 0),
                    "outputTokens": int(getattr(usage, "output_tokens", 0) or 0),
                },
            )
        )
        await self.turn.emit(RunnerEvent("usage", {"tokens": total, "model_calls": 1}))

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        await self.turn.emit(RunnerEvent("usage", {"tool_calls": 1}))
        await self.turn.emit(RunnerEvent("tool.call", {"agent": agent.name, "tool": tool.name}))

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: object) -> None:
        # The output is a raw payload: only its tool and size are recorded.
        await self.turn.emit(
            RunnerEvent("tool.output", {"tool": tool.name, "chars": len(str(result))})
        )

    async def on_handoff(self, context: Any, from_agent: Any, to_agent: Any) -> None:
        await self.turn.emit(
            RunnerEvent("agent.handoff", {"from": from_agent.name, "to": to_agent.name})
        )


def _input(turn: AsyncRunnerTurn) -> list[Any]:
    """The thread's history and the new message in the Responses input format."""
    items: list[Any] = [
        {"role": entry.role.value, "content": entry.content} for entry in turn.history
    ]
    items.append({"role": "user", "content": turn.message})
    return items


class OpenAIAgentsRunner:
    """An asyncio threads runner over an SDK ``Agent`` (see the module documentation).

    ``run_config`` is the host's base config (tracing disabled when omitted); a turn's
    run options are applied over its ``model_settings``.  ``max_turns`` bounds the SDK's
    loop (at most :data:`MAX_TURNS_CEILING`).
    """

    run_options_schema = OpenAIAgentsRunOptions

    def __init__(
        self, agent: Agent[Any], *, run_config: RunConfig | None = None, max_turns: int = 10
    ) -> None:
        if not isinstance(agent, Agent):
            raise ConfigurationError(f"OpenAIAgentsRunner needs an agents.Agent, not {agent!r}")
        if not 1 <= max_turns <= MAX_TURNS_CEILING:
            raise ConfigurationError(f"max_turns must be within 1..{MAX_TURNS_CEILING}")
        self.agent = agent
        self.run_config = run_config if run_config is not None else RunConfig(tracing_disabled=True)
        self.max_turns = max_turns

    def _config(self, options: Mapping[str, Any] | None) -> tuple[RunConfig, int]:
        if not options:
            return self.run_config, self.max_turns
        chosen = {k: options[k] for k in _SETTINGS_FIELDS if options.get(k) is not None}
        base = self.run_config.model_settings or ModelSettings()
        settings = base.resolve(ModelSettings(**chosen))
        config = dataclasses.replace(self.run_config, model_settings=settings)
        return config, min(int(options.get("max_turns") or self.max_turns), MAX_TURNS_CEILING)

    async def __call__(self, turn: AsyncRunnerTurn) -> RunnerReply:
        config, max_turns = self._config(turn.run_options)
        hooks = _LedgerHooks(turn)
        result = await Runner.run(
            self.agent, _input(turn), run_config=config, hooks=hooks, max_turns=max_turns
        )
        output = result.final_output
        return RunnerReply(output if isinstance(output, str) else str(output))


def runner(agent: Agent[Any] | None = None) -> OpenAIAgentsRunner:
    """The ``memtier serve --runner ...:runner --agent package.module:agent`` factory."""
    if agent is None:
        raise ConfigurationError(
            "memtier.integrations.openai_agents_runner:runner needs --agent package.module:agent"
        )
    return OpenAIAgentsRunner(agent)
