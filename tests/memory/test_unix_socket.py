"""memtier over a Unix domain socket (``unix://``): the promises of the TCP path.

A worker on the same host as its Redis can reach it over a Unix socket, where a round
trip costs about half of loopback TCP's on this machine (docs/performance.md, "The round
trip on this machine").  The configuration has accepted ``unix://`` from the start; these
tests run memtier over one, on a private ``redis-server`` that listens on both a loopback
port and a socket in a temporary directory of its own:

* the sync store takes the lean path over the socket (a redis-py ``UnixDomainSocketConnection``
  kept between calls, no command machinery) and the asyncio store auto-pipelines over it;
* a Hypothesis property runs generated appends and reads, each over either transport, against a
  model of the sessions: every receipt and every read is the model's, whichever transport wrote
  the turns and whichever reads them;
* the server dropping every client connection between two calls costs nothing: the next append
  reconnects over the socket and stores its turn once;
* the threads service continues a thread over the socket.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import example, given, settings
from hypothesis import strategies as st
from memhelpers import key
from servers import RedisServer, require_real_redis

from memtier import AsyncConversationStore, AvatarMessage, ConversationStore
from memtier.connection import LeanPool, lean_pool
from memtier.threads.models import Ownership
from memtier.threads.service import create_conversation_service


class UnixServer:
    """A private redis-server on a loopback port and on a Unix socket."""

    def __init__(self, server: RedisServer, socket_path: Path) -> None:
        self.server, self.socket_path = server, socket_path

    @property
    def unix_url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def tcp_url(self) -> str:
        return self.server.url


@pytest.fixture(scope="module")
def unix_server() -> Iterator[UnixServer]:
    require_real_redis("redis-server")
    # A directory of its own, short enough for a socket path (108 bytes on Linux).
    socket_dir = Path(tempfile.mkdtemp(prefix="mt-uds-"))
    socket_path = socket_dir / "redis.sock"
    try:
        with RedisServer({"unixsocket": str(socket_path), "unixsocketperm": "700"}) as server:
            yield UnixServer(server, socket_path)
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)


def _texts(store: ConversationStore, n: int) -> list[str]:
    return [turn.fields["text"] for turn in store.context(key(n)).turns]


def test_the_sync_store_takes_the_lean_path_over_the_socket(unix_server: UnixServer) -> None:
    namespace = f"uds-{uuid.uuid4().hex[:8]}"
    with ConversationStore.from_url(unix_server.unix_url, namespace=namespace) as store:
        pool = store.client.connection_pool
        assert pool.connection_class is redis.UnixDomainSocketConnection
        assert isinstance(lean_pool(store.client), LeanPool)
        before = store.executor.lean_calls
        receipts = [store.append(key(1), AvatarMessage(text=f"turn {i}")) for i in range(3)]
        assert [r.seq for r in receipts] == [1, 2, 3]
        assert _texts(store, 1) == ["turn 0", "turn 1", "turn 2"]
        # three appends and one context read, each one lean call over the socket
        assert store.executor.lean_calls - before == 4
    with ConversationStore.from_url(unix_server.tcp_url, namespace=namespace) as over_tcp:
        assert _texts(over_tcp, 1) == ["turn 0", "turn 1", "turn 2"]  # one store, two ways in


# (transport, session, text or None for a read)
OPS = st.lists(
    st.tuples(
        st.sampled_from(["unix", "tcp"]),
        st.integers(1, 3),
        st.one_of(st.none(), st.text(st.characters(codec="utf-8"), min_size=1, max_size=40)),
    ),
    min_size=1,
    max_size=24,
)


@settings(max_examples=30)
@example(ops=[("unix", 1, "a"), ("tcp", 1, "b"), ("unix", 1, None), ("tcp", 2, None)])
@given(ops=OPS)
def test_both_transports_keep_one_model_of_the_sessions(
    unix_server: UnixServer, ops: list[tuple[str, int, str | None]]
) -> None:
    namespace = f"uds-{uuid.uuid4().hex[:8]}"
    stores = {
        "unix": ConversationStore.from_url(unix_server.unix_url, namespace=namespace),
        "tcp": ConversationStore.from_url(unix_server.tcp_url, namespace=namespace),
    }
    model: dict[int, list[str]] = {1: [], 2: [], 3: []}
    try:
        for transport, n, text in ops:
            store = stores[transport]
            if text is None:
                assert _texts(store, n) == model[n]
                continue
            receipt = store.append(key(n), AvatarMessage(text=text))
            # the stored text is the redacted one; the model keeps what was stored
            stored = store.context(key(n)).turns[-1].fields["text"]
            model[n].append(stored)
            assert receipt.seq == len(model[n])
            assert receipt.duplicate is False
        for n, texts in model.items():  # and each transport reads every session alike
            assert _texts(stores["unix"], n) == texts == _texts(stores["tcp"], n)
    finally:
        for store in stores.values():
            store.close()


def test_a_dropped_socket_connection_is_replaced_before_the_next_append(
    unix_server: UnixServer,
) -> None:
    namespace = f"uds-{uuid.uuid4().hex[:8]}"
    with ConversationStore.from_url(unix_server.unix_url, namespace=namespace) as store:
        store.append(key(1), AvatarMessage(text="before"))
        lean = lean_pool(store.client)
        assert lean is not None and lean._idle  # the connection kept between calls
        with unix_server.server.client() as admin:  # over TCP: it survives its own kill
            killed = admin.client_kill_filter(_type="normal", skipme=True)
        assert killed >= 1
        receipt = store.append(key(1), AvatarMessage(text="after"))
        assert receipt.seq == 2 and receipt.duplicate is False
        assert _texts(store, 1) == ["before", "after"]


def test_the_asyncio_store_auto_pipelines_over_the_socket(unix_server: UnixServer) -> None:
    namespace = f"uds-{uuid.uuid4().hex[:8]}"

    async def scenario() -> tuple[Any, list[list[int]]]:
        async with AsyncConversationStore.from_url(
            unix_server.unix_url, namespace=namespace
        ) as store:
            await store.append(key(9), AvatarMessage(text="warm"))  # scripts loaded, connected
            sessions = (1, 2, 3, 4)
            appends = [
                store.append(key(n), AvatarMessage(text=f"{n}:{i}"))
                for i in range(8)
                for n in sessions
            ]
            receipts = await asyncio.gather(*appends)
            pipeline = store.executor._pipeline
            seqs = [[r.seq for r in receipts[n - 1 :: 4]] for n in sessions]
            reads = [
                [t.fields["text"] for t in (await store.context(key(n))).turns] for n in sessions
            ]
            assert reads == [[f"{n}:{i}" for i in range(8)] for n in sessions]
            return pipeline, seqs

    pipeline, seqs = asyncio.run(scenario())
    assert seqs == [list(range(1, 9))] * 4
    # the 32 concurrent appends were written in fewer writes than calls: they shared
    # round trips over the socket
    assert pipeline is not None and pipeline.calls >= 33 and pipeline.batches < pipeline.calls


def test_a_thread_continues_over_the_socket(unix_server: UnixServer) -> None:
    owner = Ownership("uds", f"user-{uuid.uuid4().hex[:8]}")
    with create_conversation_service(
        client=redis.Redis(unix_socket_path=str(unix_server.socket_path))
    ) as service:
        thread = service.create(owner, title="over a socket")
        first = service.continue_(owner, thread.id, "hello")
        second = service.continue_(owner, thread.id, "again")
        assert first.entries[0].content == "hello"  # the user's entry, then the reply
        assert second.entries[0].content == "again"
        assert service.get(owner, thread.id).version >= 1
        assert service.executor.lean_calls >= 6  # claim, emit and commit, twice, lean
