"""One agent turn's items in one call, asyncio, one connection.

An agent framework stores a turn's items together: the OpenAI Agents SDK's Runner calls
``session.add_items`` once per turn with the user's message, the tool calls, their
outputs and the answer.  The rows (each op is one call with the same four items: a user
message, a ``function_call``, its ``function_call_output`` and the assistant's answer,
300 B of text each):

* the SDK's own ``RedisSession.add_items`` (the baseline: one pipeline of its commands);
* memtier's ``MemtierSession.add_items`` (the adapter: one ``append_many``, one round
  trip for the four turns);
* the same four turns as four ``store.append`` calls, one round trip each (what the
  adapter sent before ``append_many``).

Every op uses new call ids, so no turn is a retry of an earlier one.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from bench.framework import Measure
from bench.peers import PeerSet, Unavailable, _why
from bench.server import HOST
from bench.workloads import APPEND_POOL, MemtierBench

__all__ = ["TURN_ITEMS", "turn_items", "turn_items_measures"]

TURN_ITEMS = 4
SIZE = "300B"
PEER = "peer.openai-agents"


def turn_items(text: str, call_id: str) -> list[dict[str, Any]]:
    """The four items of one agent turn that used one tool."""
    return [
        {"role": "user", "content": text},
        {"type": "function_call", "call_id": call_id, "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": call_id, "output": text},
        {"role": "assistant", "content": text},
    ]


def turn_items_measures(peers: PeerSet, mem: MemtierBench, text: str) -> list[Measure]:
    """The group's rows; without the SDK, none (the peer is reported unavailable)."""
    try:
        import redis.asyncio
        from agents.extensions.memory.redis_session import RedisSession

        from memtier.integrations.openai_agents import MemtierSession
        from memtier.integrations.openai_agents import item_to_turn as to_turn
    except Exception as exc:
        peers.unavailable.append(
            Unavailable(
                f"{PEER}.turn{TURN_ITEMS}", "OpenAI Agents SDK", "not installed: " + _why(exc)
            )
        )
        return []
    loop = peers.loop
    tag = uuid.uuid4().hex[:6]
    holder: dict[str, Any] = {}

    async def make() -> None:
        holder["c"] = redis.asyncio.Redis(host=HOST, port=peers.server.port)

    loop.run(make())
    loop.closers.append(lambda: holder["c"].aclose())
    theirs = [
        RedisSession(f"t{tag}{i}", redis_client=holder["c"], key_prefix="oa")
        for i in range(APPEND_POOL)
    ]
    ours = [MemtierSession(f"t{tag}{i}", mem.astore) for i in range(APPEND_POOL)]
    one_by_one = mem.pool(APPEND_POOL)
    state = {"i": 0}

    def timed_calls(call: Any) -> Any:
        async def go(n: int) -> float:
            i = state["i"]
            state["i"] = i + n
            batches = [turn_items(text, f"c{tag}{j}") for j in range(i, i + n)]
            started = time.perf_counter()
            for j, items in enumerate(batches, start=i):
                await call(j % APPEND_POOL, items)
            return time.perf_counter() - started

        return lambda n: float(loop.run(go(n)))

    async def sdk(j: int, items: Any) -> None:  # the SDK types items as its TypedDicts
        await theirs[j].add_items(items)

    async def adapter(j: int, items: list[dict[str, Any]]) -> None:
        await ours[j].add_items(items)

    async def appends(j: int, items: list[dict[str, Any]]) -> None:
        key, tally = one_by_one.keys[j], ours[j].not_stored
        names: dict[str, str] = {}
        for item in items:
            turn = to_turn(item, tally, names)
            assert turn is not None
            await mem.astore.append(key, turn)

    label = f"{TURN_ITEMS} items of one agent turn per call"
    return [
        Measure(
            f"{PEER}.turn{TURN_ITEMS}.{SIZE}",
            f"OpenAI Agents SDK RedisSession add_items, {label}, asyncio [{SIZE}]",
            timed_calls(sdk),
        ),
        Measure(
            f"memtier.openai-agents.turn{TURN_ITEMS}.{SIZE}",
            f"memtier MemtierSession add_items (append_many), {label}, asyncio [{SIZE}]",
            timed_calls(adapter),
        ),
        Measure(
            f"memtier.append.turn{TURN_ITEMS}.one-by-one.{SIZE}",
            f"memtier append x{TURN_ITEMS}, one round trip each, {label}, asyncio [{SIZE}]",
            timed_calls(appends),
            note="what the adapter sent before append_many",
        ),
    ]
