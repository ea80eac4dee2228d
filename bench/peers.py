"""Peer libraries doing the same job on the same server, with the same payloads.

Every peer is optional (``pip install 'memtier[bench]'``); a peer that is not
installed, or that cannot run on plain Redis 7 (it needs the RediSearch or
RedisJSON modules that Debian's ``redis-server`` does not ship), is reported
as *unavailable* with the actual reason -- never with a made-up figure.

Each peer runs in its default configuration (no TTL unless it has one by
default): that is the cheapest form of each peer, so the comparison is the
hardest one for memtier.  "Read last 20" uses each peer's public read call on a
session of 100 turns and keeps the newest 20 (the chat-history peers have no
"last N" call and read the whole list).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from bench.framework import Measure, timed
from bench.server import HOST, BenchRedis
from bench.workloads import APPEND_POOL, HISTORY_TURNS, READ_LAST, READ_POOL, AsyncLoop

__all__ = ["MODULE_PEERS", "PeerSet", "Unavailable"]


@dataclass
class Unavailable:
    key: str
    label: str
    why: str


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")[:240]


class PeerSet:
    """Builds the peers' measures; collects the ones that cannot run."""

    def __init__(self, server: BenchRedis, loop: AsyncLoop) -> None:
        self.server = server
        self.loop = loop
        self.unavailable: list[Unavailable] = []
        self.versions: dict[str, str] = {}

    def _version(self, dist: str) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            self.versions[dist] = version(dist)
        except PackageNotFoundError:
            pass

    # --- OpenAI Agents SDK ----------------------------------------------------------------------
    def openai_agents(self, size: str, text: str) -> list[Measure]:
        key, label = "peer.openai-agents", "OpenAI Agents SDK RedisSession"
        try:
            import redis.asyncio
            from agents.extensions.memory.redis_session import RedisSession
        except Exception as exc:  # ImportError, or a dependency failing at import
            self.unavailable.append(Unavailable(key, label, "not installed: " + _why(exc)))
            return []
        self._version("openai-agents")
        holder: dict[str, Any] = {}

        async def make() -> None:
            client = redis.asyncio.Redis(host=HOST, port=self.server.port)
            holder["c"] = client
            tag = uuid.uuid4().hex[:6]
            holder["append"] = [
                RedisSession(f"a{size}{tag}{i}", redis_client=client, key_prefix="oa")
                for i in range(APPEND_POOL)
            ]
            holder["read"] = [
                RedisSession(f"r{size}{tag}{i}", redis_client=client, key_prefix="oa")
                for i in range(READ_POOL)
            ]
            for session in holder["read"]:
                await session.add_items(
                    [{"role": "user", "content": text} for _ in range(HISTORY_TURNS)]
                )

        self.loop.run(make())
        self.loop.closers.append(lambda: holder["c"].aclose())
        state = {"a": 0, "r": 0}

        async def append(n: int) -> float:
            sessions = holder["append"]
            i = state["a"]
            started = time.perf_counter()
            for j in range(i, i + n):
                await sessions[j % APPEND_POOL].add_items([{"role": "user", "content": text}])
            state["a"] = i + n
            return time.perf_counter() - started

        async def read(n: int) -> float:
            sessions = holder["read"]
            i = state["r"]
            started = time.perf_counter()
            for j in range(i, i + n):
                items = await sessions[j % READ_POOL].get_items(limit=READ_LAST)
                assert len(items) == READ_LAST
            state["r"] = i + n
            return time.perf_counter() - started

        return [
            Measure(
                f"{key}.append.{size}",
                f"{label} add_items, asyncio [{size}]",
                lambda n: float(self.loop.run(append(n))),
            ),
            Measure(
                f"{key}.read20.{size}",
                f"{label} get_items(limit=20), asyncio [{size}]",
                lambda n: float(self.loop.run(read(n))),
            ),
        ]

    # --- langchain-community --------------------------------------------------------------------
    def langchain(self, size: str, text: str) -> list[Measure]:
        key, label = "peer.langchain", "langchain-community RedisChatMessageHistory"
        try:
            from langchain_community.chat_message_histories import RedisChatMessageHistory
            from langchain_core.messages import HumanMessage
        except Exception as exc:
            self.unavailable.append(Unavailable(key, label, "not installed: " + _why(exc)))
            return []
        self._version("langchain-community")
        tag = uuid.uuid4().hex[:6]
        writer = RedisChatMessageHistory("w", url=self.server.url, key_prefix=f"lc{size}{tag}:")
        reader = RedisChatMessageHistory("r", url=self.server.url, key_prefix=f"lc{size}{tag}:")
        for i in range(READ_POOL):
            reader.session_id = f"r{i}"
            reader.add_messages([HumanMessage(content=text) for _ in range(HISTORY_TURNS)])
        state = {"a": 0, "r": 0}

        def append(n: int) -> None:
            i = state["a"]
            for j in range(i, i + n):
                writer.session_id = f"a{j % APPEND_POOL}"  # one client, many sessions
                writer.add_message(HumanMessage(content=text))
            state["a"] = i + n

        def read(n: int) -> None:
            i = state["r"]
            for j in range(i, i + n):
                reader.session_id = f"r{j % READ_POOL}"
                items = reader.messages[-READ_LAST:]
                assert len(items) == READ_LAST
            state["r"] = i + n

        return [
            Measure(f"{key}.append.{size}", f"{label} add_message [{size}]", timed(append)),
            Measure(f"{key}.read20.{size}", f"{label} messages[-20:] [{size}]", timed(read)),
        ]

    # --- llama-index ----------------------------------------------------------------------------
    def llama_index(self, size: str, text: str) -> list[Measure]:
        key, label = "peer.llama-index", "llama-index RedisChatStore"
        try:
            from llama_index.core.llms import ChatMessage, MessageRole
            from llama_index.storage.chat_store.redis import RedisChatStore
        except Exception as exc:
            self.unavailable.append(Unavailable(key, label, "not installed: " + _why(exc)))
            return []
        self._version("llama-index-storage-chat-store-redis")
        self._version("llama-index-core")
        store = RedisChatStore(redis_url=self.server.url)
        tag = uuid.uuid4().hex[:6]
        for i in range(READ_POOL):
            for _ in range(HISTORY_TURNS):
                store.add_message(
                    f"li{size}{tag}:r{i}", ChatMessage(role=MessageRole.USER, content=text)
                )
        state = {"a": 0, "r": 0}

        def append(n: int) -> None:
            i = state["a"]
            for j in range(i, i + n):
                store.add_message(
                    f"li{size}{tag}:a{j % APPEND_POOL}",
                    ChatMessage(role=MessageRole.USER, content=text),
                )
            state["a"] = i + n

        def read(n: int) -> None:
            i = state["r"]
            for j in range(i, i + n):
                items = store.get_messages(f"li{size}{tag}:r{j % READ_POOL}")[-READ_LAST:]
                assert len(items) == READ_LAST
            state["r"] = i + n

        return [
            Measure(f"{key}.append.{size}", f"{label} add_message [{size}]", timed(append)),
            Measure(f"{key}.read20.{size}", f"{label} get_messages()[-20:] [{size}]", timed(read)),
        ]

    # --- peers that need Redis modules ----------------------------------------------------------
    def module_peers(self) -> None:
        """Try each module-dependent peer for real and record why it cannot run here."""
        for key, label, probe in MODULE_PEERS:
            try:
                probe(self.server.url)
            except ImportError as exc:
                self.unavailable.append(
                    Unavailable(
                        key,
                        label,
                        "not importable here (" + _why(exc) + "); it needs"
                        " RediSearch/RedisJSON, which Debian's redis-server lacks",
                    )
                )
            except Exception as exc:
                self.unavailable.append(
                    Unavailable(key, label, "cannot run on plain Redis 7: " + _why(exc))
                )
            else:  # pragma: no cover - would need a module-enabled Redis
                self.unavailable.append(
                    Unavailable(key, label, "ran its setup on this server; not benchmarked yet")
                )


def _langchain_redis(url: str) -> None:
    from langchain_redis import RedisChatMessageHistory

    history = RedisChatMessageHistory("probe", redis_url=url)
    history.add_message(_human("probe"))


def _human(text: str) -> Any:
    from langchain_core.messages import HumanMessage

    return HumanMessage(content=text)


def _langgraph_redis(url: str) -> None:
    from langgraph.checkpoint.redis import RedisSaver

    with RedisSaver.from_conn_string(url) as saver:
        saver.setup()


def _redisvl_history(url: str) -> None:
    from redisvl.extensions.message_history import MessageHistory

    history = MessageHistory(name="probe", redis_url=url)
    history.add_message({"role": "user", "content": "probe"})


MODULE_PEERS = (
    ("peer.langchain-redis", "langchain-redis RedisChatMessageHistory", _langchain_redis),
    ("peer.langgraph-checkpoint-redis", "langgraph-checkpoint-redis RedisSaver", _langgraph_redis),
    ("peer.redisvl", "redisvl MessageHistory", _redisvl_history),
)
