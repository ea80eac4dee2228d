"""The lean script call on a sync Redis Cluster client (standalone: :class:`LeanPool`).

Every memtier script keeps its keys on one slot (hash tags), so a call's slot is known
from its first key: :meth:`ClusterLean.slot` computes it once per key (a bounded
cache).  Each attempt reads the slot's primary from the cluster client's own slot map
(redis-py's ``NodesManager``: the map it keeps current, under its lock) and sends the
pre-packed command on that node's connection pool with :class:`LeanPool` (hiredis
parsing, the same connection hygiene as the standalone lean path).  A script batch (the
restore's) goes out as one pipeline per primary: every node written, then every node
read (:meth:`ClusterLean.pipeline`), not one round trip per call.

Faults keep redis-py's meaning, and memtier's retry layer stays the one that retries:

* ``MOVED`` / ``ASK`` -- the node ran nothing; the caller re-sends through redis-py's
  generic cluster path, which follows the redirect and patches its slot map
  (:meth:`memtier.scripts.LuaScript.call_lean_cluster`).
* a connection error or timeout -- the node goes last in the cached list and a slot-map
  refresh is asked for, as redis-py's own command loop does: from redis-py 8.2 on the
  requests merge and the refresh runs before the next call once
  ``topology_refresh_min_interval`` has passed since the last one (each call first runs
  a refresh that is due, as redis-py does before every attempt), so a dead primary
  during a failover does not make every failed call of every thread re-read the map;
  before 8.2 the map is re-read at once, as redis-py did then.  The error is raised
  unchanged, so :func:`memtier.retry.classify` decides as on the generic path (a lost
  reply is ``outcome unknown``: retried because every memtier script is replay-safe).
* ``CLUSTERDOWN``, a slot no node covers -- the slot map is re-read at once (redis-py
  does not pace these either) and the error is raised.
* ``TRYAGAIN`` (keys of one slot split across a migration) -- raised to the retry layer
  (not applied, retried with backoff), as on the standalone lean path; redis-py's
  generic path would instead re-send it up to 16 times inside one attempt.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import (
    ClusterDownError,
    SlotNotCoveredError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from memtier.connection import DuringWork, LeanPool
from memtier.resppack import packs_alike

__all__ = ["SLOT_CACHE_CEILING", "ClusterLean", "SlotCache", "lean_cluster"]

log = logging.getLogger("memtier")

# Keys whose slot is remembered per client (a dict entry ~100 B over the key string, which
# memtier keeps anyway: at most ~2 MB).  Past it the cache starts over: a miss is one CRC16.
SLOT_CACHE_CEILING = 16_384

# The parts of redis-py's (>= 8.2) NodesManager through which an error asks for a paced
# slot-map refresh and a later call runs it once due.
_PACED_PARTS = ("_refresh_requested", "_request_refresh", "_run_requested_refresh")

# What redis-py's ``RedisCluster.execute_command`` is when memtier is imported: a client
# whose class (or instance) replaced it -- a tracing wrapper, a test double -- keeps it.
_GENERIC_CLUSTER_EXECUTE = RedisCluster.execute_command


class SlotCache:
    """Keys -> their hash slot on a cluster client, remembered (one CRC16 per new key;
    at most SLOT_CACHE_CEILING keys, then it starts over).  Shared by the sync and the
    asyncio lean paths."""

    __slots__ = ("_slots", "client")

    def __init__(self, client: Any) -> None:
        self.client = client
        self._slots: dict[Any, int] = {}

    def slot(self, key: Any) -> int:
        """The hash slot of ``key``."""
        slot = self._slots.get(key)
        if slot is None:
            if len(self._slots) >= SLOT_CACHE_CEILING:
                self._slots.clear()
            slot = self._slots[key] = int(self.client.keyslot(key))
        return slot


class ClusterLean(SlotCache):
    """Route one packed script call to its slot's primary and send it there."""

    __slots__ = ("_paced", "packs_alike", "redirects")

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.redirects = 0  # calls re-sent through redis-py after MOVED/ASK (tests, approximate)
        # The nodes' connections encode as the client does (a bound call's wire plan).
        encoder = client.get_encoder()
        self.packs_alike = packs_alike(encoder.encoding, encoder.encoding_errors)
        manager = client.nodes_manager
        # redis-py >= 8.2: error-triggered refreshes are requested, merged and paced.
        self._paced = all(hasattr(manager, name) for name in _PACED_PARTS)

    def execute(
        self,
        slot: int,
        args: tuple[Any, ...],
        packed: list[Any],
        during: DuringWork | None = None,
    ) -> Any:
        """Send ``args`` (packed into ``packed`` once) to ``slot``'s primary; read the reply
        (``during``: as :meth:`LeanPool.execute`)."""
        return self._on_primary(slot, lambda lean: lean.execute(args, packed, during))

    def transaction(
        self, slot: int, commands: tuple[tuple[Any, ...], ...], count: int, packed: list[Any]
    ) -> Any:
        """:meth:`LeanPool.transaction` on ``slot``'s primary (every key on that slot)."""
        return self._on_primary(slot, lambda lean: lean.transaction(commands, count, packed))

    def pipeline(
        self,
        slots: Sequence[int],
        commands: tuple[tuple[Any, ...], ...],
        during: DuringWork | None = None,
    ) -> list[Any]:
        """Send ``commands`` (``slots[i]`` the slot of ``commands[i]``'s keys), not as a
        transaction: one write to each primary of their calls in their order, ``during``
        (if given) once every node is written, then every node's replies read.  The
        replies come in ``commands``' order, an error reply as its exception instance --
        a ``MOVED`` / ``ASK`` too: that call ran nothing, the caller re-sends it.  Calls
        on different nodes touch different slots, so only each node's own order is
        kept.  A fault raises as :meth:`execute`'s does, after every written connection
        was read or dropped (none goes back with a reply unread)."""
        self._run_due_refresh()
        by_node: dict[str, tuple[Any, list[int]]] = {}
        owners: dict[int, Any] = {}  # slot -> primary, looked up once per batch
        for at, slot in enumerate(slots):
            node = owners.get(slot)
            if node is None:
                node = owners[slot] = self._primary(slot)
            by_node.setdefault(node.name, (node, []))[1].append(at)
        written: list[tuple[Any, LeanPool, Any, list[int]]] = []
        replies: list[Any] = [None] * len(commands)
        talking_to: Any = None  # the node being written or read: a connection error's
        try:
            for node, ats in by_node.values():
                talking_to = node
                lean = LeanPool(self.client.get_redis_connection(node).connection_pool)
                conn = lean.send_pipeline(tuple(commands[at] for at in ats))
                written.append((node, lean, conn, ats))
            talking_to = None
            if during is not None:
                during()
            while written:
                talking_to, lean, conn, ats = written.pop(0)  # read_pipeline gives it back
                for at, reply in zip(ats, lean.read_pipeline(conn, len(ats)), strict=True):
                    replies[at] = reply
        except BaseException as exc:
            for _, lean, conn, _ in written:
                lean.drop(conn)
            if isinstance(exc, RedisConnectionError | RedisTimeoutError) and talking_to is not None:
                # The connection is already dropped (LeanPool); the node may be gone.
                self._node_failed(talking_to.name)
            raise
        if any(isinstance(reply, ClusterDownError) for reply in replies):
            self._refresh(None)
        return replies

    def _run_due_refresh(self) -> None:
        manager = self.client.nodes_manager
        if self._paced and manager._refresh_requested:
            # A refresh an error asked for (on this path or redis-py's), run once due: as
            # redis-py's command loop does before every attempt (the flag read inline).
            manager._run_requested_refresh(getattr(self.client, "retry", None))

    def _primary(self, slot: int) -> Any:
        try:
            return self.client.nodes_manager.get_node_from_slot(slot)
        except SlotNotCoveredError:
            self._refresh(None)  # redis-py re-reads the map for this too
            raise

    def _on_primary(self, slot: int, send: Callable[[LeanPool], Any]) -> Any:
        self._run_due_refresh()
        node = self._primary(slot)
        pool = self.client.get_redis_connection(node).connection_pool
        try:
            return send(LeanPool(pool))
        except (RedisConnectionError, RedisTimeoutError):
            self._node_failed(node.name)  # (the connection is dropped already: LeanPool)
            raise
        except ClusterDownError:
            self._refresh(None)
            raise

    def _node_failed(self, name: str) -> None:
        """After a connection error on node ``name``: a paced refresh asked for (redis-py
        >= 8.2), else the map re-read at once."""
        if self._paced:
            self._request_refresh(name)
        else:
            self._refresh(name)

    def _request_refresh(self, failed_node: str) -> None:
        """Ask for a paced refresh after a connection error on ``failed_node`` (redis-py
        >= 8.2), exactly as redis-py's cluster client asks for one after the same error."""
        manager = self.client.nodes_manager
        try:
            manager.move_node_to_end_of_cached_nodes(failed_node)
            manager._request_refresh(last_failed_node_name=failed_node)
        except Exception as exc:  # the caller raises the fault that started this
            log.debug(
                "memtier: cluster slot map refresh request failed: %s: %s", type(exc).__name__, exc
            )

    def _refresh(self, failed_node: str | None) -> None:
        """Re-read the slot map as redis-py does after the same fault (failed node last)."""
        manager = self.client.nodes_manager
        try:
            if failed_node is not None:
                manager.move_node_to_end_of_cached_nodes(failed_node)
                manager.initialize(last_failed_node_name=failed_node)
            else:
                manager.initialize()
        except Exception as exc:  # every node unreachable: the retry's next attempt re-reads
            # The caller raises the fault that started this; its class decides the retry.
            log.debug("memtier: cluster slot map refresh failed: %s: %s", type(exc).__name__, exc)


def lean_cluster(client: Any) -> ClusterLean | None:
    """A :class:`ClusterLean` for ``client`` if its script calls may bypass redis-py's
    command machinery: a plain sync ``redis.cluster.RedisCluster`` (not a subclass, no
    replaced ``execute_command``, no EVALSHA response callback, no client-side cache on
    its node pools, redis-py's ``NodesManager`` API present).  None keeps the generic path."""
    kind: type[Any] = type(client)  # (not ``type(client) is``: mypy would narrow ``client``)
    if kind is not RedisCluster or "execute_command" in vars(client):
        return None
    if RedisCluster.execute_command is not _GENERIC_CLUSTER_EXECUTE:
        return None
    if "EVALSHA" in getattr(client, "cluster_response_callbacks", {}):
        return None
    manager = getattr(client, "nodes_manager", None)
    needed = ("get_node_from_slot", "initialize", "move_node_to_end_of_cached_nodes")
    if manager is None or not all(hasattr(manager, name) for name in needed):
        return None  # another redis-py's internals: keep its own routing
    if "last_failed_node_name" not in inspect.signature(manager.initialize).parameters:
        return None
    nodes = client.get_nodes()
    if not nodes:
        return None
    for node in nodes:
        redis_node = client.get_redis_connection(node)
        if "EVALSHA" in getattr(redis_node, "response_callbacks", {}):
            return None
        pool = redis_node.connection_pool
        if getattr(pool, "cache", None) is not None:  # client-side caching wraps connections
            return None
    return ClusterLean(client)
