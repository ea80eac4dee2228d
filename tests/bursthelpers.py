"""Helpers of the concurrency-burst tests: a manual failover on the fixture cluster, and back.

Only servers the fixtures started are touched (their ports come from the fixture), and
every wait is a bounded poll.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from redis.crc import key_slot
from servers import RedisClusterServers

FAILOVER_TIMEOUT_S = 60.0
POLL_S = 0.05
FAILOVER_ATTEMPTS = 4
FAILBACK_ROUNDS = 2
MANUAL_FAILOVER_S = 12.0  # Redis gives a manual failover 5 s; a loaded box needs more


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def slot_owner(cluster: RedisClusterServers, key: str) -> tuple[int, int]:
    """(primary port, one replica port) of the shard that holds ``key``'s slot.

    Polled until the slot map of one node agrees with the primary's own ``ROLE`` (right
    after a failover, a node's ``CLUSTER NODES`` may still show the old primary).
    """
    found: list[tuple[int, int]] = []

    def agreed() -> bool:
        found[:] = [_slot_owner_now(cluster, key)]
        return True

    wait_for(f"the owner of {key!r}", agreed)
    return found[0]


def _slot_owner_now(cluster: RedisClusterServers, key: str) -> tuple[int, int]:
    slot = key_slot(key.encode())
    with cluster.node_client(cluster.port) as conn:
        lines = _text(conn.execute_command("CLUSTER", "NODES")).splitlines()
    ids: dict[str, int] = {}
    primary_id = None
    rows = [line.split() for line in lines if line.strip()]
    for row in rows:
        ids[row[0]] = int(row[1].split("@")[0].rsplit(":", 1)[1])
        if "master" not in row[2]:
            continue
        for spec in row[8:]:
            if spec.startswith("["):
                continue  # a slot being migrated
            low, _, high = spec.partition("-")
            if int(low) <= slot <= int(high or low):
                primary_id = row[0]
    assert primary_id is not None, f"no primary owns slot {slot}"
    primary = ids[primary_id]
    replicas = replicas_of(cluster, primary)  # ROLE on the primary itself: never stale
    assert replicas, f"the primary of slot {slot} has no replica"
    return primary, replicas[0]


def replicas_of(cluster: RedisClusterServers, primary: int) -> list[int]:
    with cluster.node_client(primary, socket_timeout=5) as conn:
        reply = conn.execute_command("ROLE")
    if _text(reply[0]) != "master":
        return []
    return [int(_text(r[1])) for r in reply[2]]


def role(cluster: RedisClusterServers, port: int) -> str:
    with cluster.node_client(port, socket_timeout=5) as conn:
        return _text(conn.execute_command("ROLE")[0])


def healthy(cluster: RedisClusterServers, primaries: set[int]) -> bool:
    """Every node says cluster_state:ok, ``primaries`` are the primaries, replicas linked."""
    for port in cluster.ports:
        with cluster.node_client(port, socket_timeout=5) as conn:
            info = _text(conn.execute_command("CLUSTER", "INFO"))
            if "cluster_state:ok" not in info:
                return False
            replication = conn.info("replication")
        is_primary = replication.get("role") == "master"
        if is_primary != (port in primaries):
            return False
        if not is_primary and replication.get("master_link_status") != "up":
            return False
        if is_primary and not replicas_of(cluster, port):
            return False
    return True


def wait_for(what: str, check: Any, timeout_s: float = FAILOVER_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as exc:  # a node busy with the failover: poll again
            last = exc
        time.sleep(POLL_S)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r})")


def _linked(cluster: RedisClusterServers, replica: int) -> bool:
    with cluster.node_client(replica, socket_timeout=5) as conn:
        replication = conn.info("replication")
    return bool(
        replication.get("role") == "slave" and replication.get("master_link_status") == "up"
    )


def failover_to(cluster: RedisClusterServers, replica: int) -> None:
    """``CLUSTER FAILOVER`` on ``replica`` (coordinated, no data loss); wait until it leads.

    A manual failover is given up by Redis after 5 s (say, while the replica is still
    syncing after the previous one, or on a loaded machine): wait for its replication
    link, then ask again, a bounded number of times (the later ones with FORCE).
    """
    for attempt in range(FAILOVER_ATTEMPTS):
        if role(cluster, replica) == "master":
            return
        wait_for(f"node {replica}'s replication link", lambda: _linked(cluster, replica))
        # After two coordinated tries, FORCE: no handshake with the (busy) primary, still an
        # election by the primaries; nothing is writing by then, so the replica is in sync.
        # The last try is TAKEOVER (no election): a primary that voted for a replica of
        # the same primary refuses to vote again for twice the node timeout (30 s here),
        # so repeated elections can all be denied (seen in CI: "never became primary").
        last = attempt == FAILOVER_ATTEMPTS - 1
        options = ("TAKEOVER",) if last else ("FORCE",) if attempt >= 2 else ()
        with cluster.node_client(replica) as conn:
            conn.execute_command("CLUSTER", "FAILOVER", *options)
        with contextlib.suppress(AssertionError):
            wait_for(
                f"node {replica} to become primary",
                lambda: role(cluster, replica) == "master",
                timeout_s=MANUAL_FAILOVER_S,
            )
    if role(cluster, replica) != "master":
        raise AssertionError(f"node {replica} never became primary")


def settled(cluster: RedisClusterServers) -> bool:
    """No failover under way: the primaries of a moment ago are healthy, with replicas."""
    primaries = {port for port in cluster.ports if role(cluster, port) == "master"}
    return len(primaries) == cluster.PRIMARIES and healthy(cluster, primaries)


@contextlib.contextmanager
def restored_topology(cluster: RedisClusterServers) -> Iterator[None]:
    """The body may fail a shard over: afterwards the cluster is healthy and settled (every
    node ``cluster_state:ok``, three primaries, each replica linked), which is what later
    tests need.  The original primaries are asked to take over again; Redis may decline a
    fail-back so soon (its vote rules), and then the swapped, healthy roles stay."""
    primaries = set(cluster.primaries())
    try:
        yield
    finally:
        for _ in range(FAILBACK_ROUNDS):
            # A node just demoted still says "master" for a moment: settle first.
            wait_for("the cluster to settle", lambda: settled(cluster))
            demoted = [port for port in sorted(primaries) if role(cluster, port) != "master"]
            if not demoted:
                break
            for port in demoted:
                with contextlib.suppress(AssertionError):
                    failover_to(cluster, port)
        wait_for("a healthy, settled cluster", lambda: settled(cluster))


class FailoverAfter:
    """Fails the shard of ``key`` over to its replica once ``after`` calls have finished.

    Call :meth:`done` after each call (from any thread); the failover runs in its own
    thread so the burst goes on meanwhile.  :meth:`join` waits for it (and re-raises).
    """

    def __init__(self, cluster: RedisClusterServers, key: str, after: int) -> None:
        self.cluster = cluster
        self.primary, self.replica = slot_owner(cluster, key)
        self.after = after
        self._count = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.finished = threading.Event()

    def done(self) -> None:
        with self._lock:
            self._count += 1
            if self._count != self.after or self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="burst-failover")
        self._thread.start()

    def _run(self) -> None:
        try:
            failover_to(self.cluster, self.replica)
        except BaseException as exc:
            self._error = exc
        finally:
            self.finished.set()

    def join(self) -> None:
        assert self._thread is not None, "the burst ended before the failover started"
        self._thread.join(FAILOVER_TIMEOUT_S * 2)
        assert not self._thread.is_alive(), "the failover thread hangs"
        if self._error is not None:
            raise self._error
