"""The lean script call on an asyncio Redis Cluster client (sync: :mod:`memtier.leancluster`).

redis-py's asyncio ``RedisCluster`` sends a script call through its generic command
machinery, and a read transaction through its ``ClusterPipeline`` (a WATCH-capable
transaction object per call): about 2x the client CPU of a standalone append and 7x of a
standalone context read here.  Every memtier script keeps its keys on one slot (hash
tags), so a call's slot is known from its first key; :class:`AsyncClusterLean` computes
it once per key (a bounded cache), reads the slot's primary from the client's own slot
map (redis-py's ``NodesManager``, the map it keeps current) and writes the pre-packed
call -- one ``EVALSHA``, or a whole ``MULTI`` ... ``EXEC`` -- on one connection of that
node, reading the reply with the same hiredis reader as the auto-pipeline
(:func:`memtier.autopipeline.call_on`).  With auto-pipelining on (the default), each
primary has an :class:`~memtier.autopipeline.AutoPipeline` of its own: calls for that
node issued in one event-loop tick share one write, and a caller alone writes its own
call, exactly as on a standalone server.

Faults keep redis-py's meaning, and memtier's retry layer stays the one that retries:

* ``MOVED`` / ``ASK`` -- the node ran nothing; the caller re-sends once through redis-py's
  generic cluster path, which follows the redirect and patches its slot map
  (:meth:`memtier.scripts.LuaScript.call_lean_cluster_async`).
* a connection error or timeout -- as redis-py's own cluster client does for it: the
  node's connections are marked for reconnect, the node goes last in the cached list,
  and a slot-map refresh is asked for (:func:`request_refresh`: the store's guard runs
  it before the next attempt, once redis-py's pacing lets it); the error is raised unchanged, so
  :func:`memtier.retry.classify` decides as on the generic path (a lost reply is
  ``outcome unknown``: retried because every memtier script is replay-safe).
* ``CLUSTERDOWN``, a slot no node covers -- a refresh is asked for and the error raised
  to the retry layer.
* ``TRYAGAIN`` -- raised to the retry layer, as on the sync lean path.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import Connection
from redis.exceptions import ClusterDownError, SlotNotCoveredError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from memtier.autopipeline import AutoPipeline, Packer, PipelineBounds, Slots, call_on
from memtier.errors import TransientBackendError
from memtier.leancluster import SlotCache

__all__ = ["PIPELINES_CEILING", "AsyncClusterLean", "lean_cluster_async", "request_refresh"]

log = logging.getLogger("memtier")

T = TypeVar("T")

# What redis-py's asyncio ``RedisCluster.execute_command`` is when memtier is imported: a
# client whose class (or instance) replaced it -- a tracing wrapper -- keeps it.
_GENERIC_EXECUTE = RedisCluster.execute_command

# The parts of redis-py's asyncio cluster internals this path reads (checked once).
_MANAGER_PARTS = (
    "get_node_from_slot",
    "move_node_to_end_of_cached_nodes",
    "nodes_cache",
    "startup_nodes",
)
_NODE_PARTS = ("acquire_connection", "release")
# How a node's connections are marked after a connection error: redis-py >= 8.2 marks its
# free ones (lazily reconnected when taken), earlier releases its in-use ones.
_MARK_ON_ERROR = "_mark_free_connections_for_reconnect_on_error"
_MARK_ACTIVE = "update_active_connections_for_reconnect"


def request_refresh(client: Any, failed_node: str | None = None) -> None:
    """Ask ``client`` to re-read its slot map, as redis-py's own error paths do: from
    redis-py 8.2 on through its request (requests merge, the refresh runs in the next
    call's ``initialize()`` once ``topology_refresh_min_interval`` has passed since the
    last one: a failover does not start a refresh storm), before it by setting the flag
    that makes the next ``initialize()`` refresh."""
    request = getattr(client, "_request_refresh", None)
    if request is None:
        client._initialize = True
    elif failed_node is None:
        request()
    else:
        request(last_failed_node_name=failed_node)


# Node pipelines kept per client: one per primary; past it (a cluster of thousands of
# nodes, or nodes replaced again and again) the map starts over.
PIPELINES_CEILING = 1024


class _NodePool:
    """What :class:`~memtier.autopipeline.AutoPipeline` needs of a pool, over one asyncio
    cluster node's own connection list (redis-py's ``ClusterNode``)."""

    __slots__ = ("_memtier_kept", "connection_class", "connection_kwargs", "manager", "node")

    def __init__(self, node: Any, manager: Any) -> None:
        self.node = node
        self.manager = manager  # redis-py's NodesManager: which node objects it still closes
        self.connection_class = node.connection_class
        self.connection_kwargs = node.connection_kwargs

    async def get_connection(self) -> Any:
        return self.node.acquire_connection()

    async def release(self, conn: Any) -> None:
        if not self._known():
            # redis-py dropped this node object from its map (a failover's slot map may
            # omit a node for a moment) after this connection was taken -- by a batch
            # queued before the drop and sent after it.  redis-py closed the node's
            # connections it held then and never closes this object again (its aclose
            # walks the current map), so a connection given back open would stay open.
            await conn.disconnect(nowait=True)
        self.node.release(conn)

    def _known(self) -> bool:
        """This pool's node is the object redis-py's map (or its startup list) holds:
        closed by the client's ``aclose``."""
        node, name = self.node, self.node.name
        return (
            self.manager.nodes_cache.get(name) is node
            or self.manager.startup_nodes.get(name) is node
        )


class AsyncClusterLean(SlotCache):
    """Route one packed script call (or read transaction) to its slot's primary."""

    __slots__ = (
        "_bounds",
        "_pipelines",
        "calls",
        "guard",
        "pack",
        "redirects",
    )

    def __init__(
        self,
        client: Any,
        bounds: PipelineBounds | None = None,
        guard: Slots | None = None,
    ) -> None:
        super().__init__(client)
        self._bounds = bounds  # None: one call per connection, no batches
        self.guard = guard  # the slots a node's batch takes (one per batch)
        self._pipelines: dict[str, AutoPipeline] = {}
        self.calls = 0  # attempts sent on this path (tests read it)
        self.redirects = 0  # calls re-sent through redis-py after MOVED/ASK (tests)
        # ``args`` as the bytes the nodes' connections would send (the client's encoder).
        encoder = client.get_encoder()
        self.pack = Packer(
            Connection,
            {
                "encoding": encoder.encoding,
                "encoding_errors": encoder.encoding_errors,
                "decode_responses": encoder.decode_responses,
            },
        )

    @property
    def pipelined(self) -> bool:
        """Calls ride node batches, which take the guard's slots (not each caller)."""
        return self._bounds is not None

    async def generic(self, send: Callable[[], Awaitable[T]]) -> T:
        """``send()`` through redis-py's generic path (after MOVED / ASK) under one of the
        guard's slots when callers hold none of their own (node batches take them)."""
        guard = self.guard
        if not self.pipelined or guard is None:
            return await send()
        await guard.acquire()
        try:
            return await send()
        finally:
            guard.release()

    async def execute(self, slot: int, packed: Sequence[bytes], replies: int = 1) -> Any:
        """Write ``packed`` (one command, or a whole transaction of ``replies`` replies)
        on a connection of ``slot``'s primary and read its (the ``EXEC``'s) reply."""
        node = self._primary(slot)
        self.calls += 1
        pipeline = self.pipeline_for(node)
        try:
            if pipeline is not None:
                return await pipeline.call(packed, replies)
            conn = node.acquire_connection()
            try:
                return await call_on(conn, packed, replies)
            finally:
                node.release(conn)
        except (ClusterDownError, RedisConnectionError, RedisTimeoutError) as exc:
            self._note_failure(node, exc)
            raise

    def submit(self, slot: int, packed: Sequence[bytes]) -> asyncio.Future[Any]:
        """:meth:`execute` for a ``ScriptBatch``: ``packed`` queued in the batch of
        ``slot``'s primary (:meth:`AutoPipeline.submit`), its reply as a future, so a
        batch's calls go out as one write per node with no task per call.  A failure is
        the future's, with :meth:`execute`'s bookkeeping done when the future fails.
        With node pipelines only (:attr:`pipelined`)."""
        try:
            node = self._primary(slot)
        except (SlotNotCoveredError, TransientBackendError) as exc:
            failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed
        pipeline = self.pipeline_for(node)
        if pipeline is None:
            raise RuntimeError("AsyncClusterLean.submit needs node pipelines")
        self.calls += 1
        future = pipeline.submit(packed)
        future.add_done_callback(functools.partial(self._settled, node))
        return future

    def _primary(self, slot: int) -> Any:
        """``slot``'s primary, or the error after asking for a new slot map."""
        try:
            node = self.client.nodes_manager.get_node_from_slot(slot)
        except SlotNotCoveredError:
            request_refresh(self.client)  # redis-py re-reads the map for this too
            raise
        if node is None:  # pragma: no cover - a map being rebuilt
            request_refresh(self.client)
            raise TransientBackendError("no primary known for the keys' slot; retrying")
        return node

    def _note_failure(self, node: Any, exc: BaseException) -> None:
        """What redis-py does after ``exc`` from ``node``: a new slot map after
        ``CLUSTERDOWN``; after a lost connection (dropped already) the node marked, as it
        may be gone."""
        if isinstance(exc, ClusterDownError):
            request_refresh(self.client)
        elif isinstance(exc, RedisConnectionError | RedisTimeoutError):
            self._failed(node, exc)

    def _settled(self, node: Any, future: asyncio.Future[Any]) -> None:
        """:meth:`_note_failure` for a submitted call whose future failed."""
        if not future.cancelled():
            exc = future.exception()
            if exc is not None:
                self._note_failure(node, exc)

    def pipeline_for(self, node: Any) -> AutoPipeline | None:
        """``node``'s auto-pipeline (None with auto-pipelining off); a node object the
        slot map replaced gets a new one."""
        if self._bounds is None:
            return None
        pipeline = self._pipelines.get(node.name)
        if pipeline is None or pipeline.pool.node is not node:
            if len(self._pipelines) >= PIPELINES_CEILING:
                self._pipelines.clear()
            pipeline = AutoPipeline(
                _NodePool(node, self.client.nodes_manager), self._bounds, self.guard
            )
            self._pipelines[node.name] = pipeline
        return pipeline

    def _failed(self, node: Any, exc: Exception) -> None:
        """What redis-py's cluster client does after a connection error on ``node``."""
        try:
            mark = getattr(node, _MARK_ON_ERROR, None)
            if mark is not None:
                mark(exc)
            else:
                getattr(node, _MARK_ACTIVE)()
            self.client.nodes_manager.move_node_to_end_of_cached_nodes(node.name)
        except Exception as err:  # another layout: the re-initialisation still happens
            log.debug("memtier: cluster node bookkeeping failed: %s: %s", type(err).__name__, err)
        request_refresh(self.client, node.name)


def lean_cluster_async(
    client: Any, bounds: PipelineBounds | None = None, guard: Slots | None = None
) -> AsyncClusterLean | None:
    """An :class:`AsyncClusterLean` for ``client`` if its script calls may bypass redis-py's
    command machinery: a plain asyncio ``RedisCluster`` (not a subclass, no replaced
    ``execute_command``, no EVALSHA response callback, redis-py's ``NodesManager`` and
    ``ClusterNode`` API present).  None keeps the generic path."""
    kind: type[Any] = type(client)  # (not ``type(client) is``: mypy would narrow ``client``)
    if kind is not RedisCluster or "execute_command" in vars(client):
        return None
    if RedisCluster.execute_command is not _GENERIC_EXECUTE:
        return None
    if "EVALSHA" in getattr(client, "response_callbacks", {}):
        return None
    manager = getattr(client, "nodes_manager", None)
    if manager is None or not all(hasattr(manager, name) for name in _MANAGER_PARTS):
        return None  # another redis-py's internals: keep its own routing
    from redis.asyncio.cluster import ClusterNode

    if not all(inspect.isfunction(getattr(ClusterNode, name, None)) for name in _NODE_PARTS):
        return None
    marks = (_MARK_ON_ERROR, _MARK_ACTIVE)
    if not any(inspect.isfunction(getattr(ClusterNode, name, None)) for name in marks):
        return None
    if not hasattr(client, "_initialize") or not hasattr(client, "keyslot"):
        return None
    return AsyncClusterLean(client, bounds, guard)
