"""The OpenAI Agents SDK threads runner (issue 15) with a scripted model (no network): history,
ledger events (tool payloads never recorded), run options -> the SDK's model settings,
RunLimits and cancellation -- on every backend through the Python service, and over real HTTP
on a real Redis through ``memtier serve --runner ...:runner --agent ...``."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import scripted_agent
from httphelpers import serve_process
from servers import RedisServer
from threadhelpers import OWNER

from memtier.errors import ConfigurationError, ConversationError
from memtier.integrations.openai_agents_runner import OpenAIAgentsRunner, runner
from memtier.threads import AsyncConversationService, RunLimits


@pytest.fixture
def agent() -> Any:
    return importlib.reload(scripted_agent).agent  # a fresh scripted model per test


def _ledger(page: Any) -> str:
    return orjson.dumps([r.to_wire() for r in page.records]).decode()


async def test_a_turn_runs_the_agent_on_the_threads_history(
    make_async_service: Callable[..., AsyncConversationService], agent: Any
) -> None:
    service = make_async_service(runner=OpenAIAgentsRunner(agent))
    thread = await service.create(OWNER)
    first = await service.continue_(OWNER, thread.id, "what is up")
    assert first.entries[1].content.startswith("found what is up")
    assert first.entries[1].content.endswith("after 0 earlier questions")
    assert scripted_agent.TOOL_SECRET not in first.entries[1].content  # redacted before Redis
    second = await service.continue_(
        OWNER, thread.id, "and now", run_options={"temperature": 0.25, "max_tokens": 64}
    )
    assert second.entries[1].content.endswith("after 1 earlier questions")  # it saw the history
    settings = agent.model.settings
    assert [s.temperature for s in settings] == [None, None, 0.25, 0.25]
    assert settings[-1].max_tokens == 64
    page = await service.replay(OWNER, thread.id)
    types = [r.type for r in page.records]
    assert types.count("tool.call") == 2 and types.count("tool.output") == 2
    assert types.count("model.response") == 4
    ledger = _ledger(page)
    assert scripted_agent.TOOL_SECRET not in ledger and '"q"' not in ledger  # no tool payloads
    await service.aclose()


async def test_run_limits_stop_the_agent(
    make_async_service: Callable[..., AsyncConversationService], agent: Any
) -> None:
    # one turn = 2 model calls of 30 tokens and 1 tool call
    limits = RunLimits(per_turn={"tokens": 45}, per_thread={"tool_calls": 2})
    service = make_async_service(runner=OpenAIAgentsRunner(agent), run_limits=limits)
    thread = await service.create(OWNER)
    with pytest.raises(ConversationError) as err:
        await service.continue_(OWNER, thread.id, "expensive")
    assert err.value.code == "limit_exceeded" and err.value.details["limit"] == "run:tokens"
    after = await service.get(OWNER, thread.id)
    # only limited meters are counted (model_calls is reported but not limited here)
    assert after.head_id is None and after.usage == {"tokens": 30, "tool_calls": 1}
    await service.aclose()


async def test_a_cancelled_turn_stops_the_agent(
    make_async_service: Callable[..., AsyncConversationService], agent: Any
) -> None:
    service = make_async_service(runner=OpenAIAgentsRunner(agent))
    thread = await service.create(OWNER)
    turn = asyncio.ensure_future(service.continue_(OWNER, thread.id, "hang on", request_id="h"))
    for _ in range(600):  # bounded: until the scripted model is waiting
        if agent.model.calls:
            break
        await asyncio.sleep(0.05)
    assert (await service.cancel_run(OWNER, thread.id, "h")).status == "cancelling"
    with pytest.raises(ConversationError) as err:
        await asyncio.wait_for(turn, 60)
    assert err.value.code == "run_cancelled" and agent.model.calls == 1
    assert (await service.replay(OWNER, thread.id)).records[-1].type == "cancelled"
    await service.aclose()


def test_the_factory_needs_an_agent() -> None:
    with pytest.raises(ConfigurationError):
        runner()
    with pytest.raises(ConfigurationError):
        OpenAIAgentsRunner("not an agent")  # type: ignore[arg-type]


def test_memtier_serve_runs_the_agent_over_http(tmp_path: Path, redis_server: RedisServer) -> None:
    (tmp_path / "scripted_agent.py").write_text(
        Path(scripted_agent.__file__).read_text(encoding="utf-8"), encoding="utf-8"
    )
    args = [
        "--redis-url",
        redis_server.url,
        "--insecure-dev-auth",
        "--runner",
        "memtier.integrations.openai_agents:runner",
        "--agent",
        "scripted_agent:agent",
        "--namespace",
        "oa" + tmp_path.name[-8:].replace("_", ""),
    ]
    base = "/memtier/conversations"
    with serve_process(args, tmp_path) as serve, httpx.Client(base_url=serve.url, timeout=60) as c:
        tid = c.post(base, json={}).json()["id"]
        body = {"message": "weather", "runOptions": {"temperature": 0.5, "tool_choice": "auto"}}
        done = c.post(f"{base}/{tid}/continue", json=body)
        assert done.status_code == 200, done.text + serve.log()
        assert done.json()["entries"][1]["content"].startswith("found weather")
        bad = c.post(f"{base}/{tid}/continue", json={"message": "x", "runOptions": {"seed": 1}})
        assert bad.json()["code"] == "invalid_request"
        records = c.get(f"{base}/{tid}/events").json()["records"]
        assert {"tool.call", "tool.output", "model.response"} <= {r["type"] for r in records}
        started = next(r for r in records if r["type"] == "agent_started")
        assert started["data"]["runOptions"] == {"temperature": 0.5, "tool_choice": "auto"}
        assert scripted_agent.TOOL_SECRET not in str(records)
        doc = c.get(f"{base}/openapi.json").json()
        options = doc["components"]["schemas"]["OpenAIAgentsRunOptions"]
        assert set(options["properties"]) >= {"temperature", "tool_choice", "max_turns"}
