"""Helpers of the concurrency-burst tests: a manual failover on the fixture cluster.

Only servers the fixtures started are touched (their ports come from the fixture), and
every wait is a bounded poll.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from redis.crc import key_slot
from servers import CLUSTER_NODE_TIMEOUT_MS, RedisClusterServers

FAILOVER_TIMEOUT_S = 60.0
POLL_S = 0.05
FAILOVER_ATTEMPTS = 4
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


def role_reply(cluster: RedisClusterServers, port: int) -> Any:
    """The node's ``ROLE`` reply: ``[b"master", offset, replicas]`` or
    ``[b"slave", host, primary port, state, offset]``."""
    with cluster.node_client(port, socket_timeout=5) as conn:
        return conn.execute_command("ROLE")


def replicas_of(cluster: RedisClusterServers, primary: int) -> list[int]:
    reply = role_reply(cluster, primary)
    if _text(reply[0]) != "master":
        return []
    return [int(_text(r[1])) for r in reply[2]]


def role(cluster: RedisClusterServers, port: int) -> str:
    return _text(role_reply(cluster, port)[0])


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


# When each node's shard last failed over, by (cluster, node port).  Redis refuses the
# election of a shard failed over less than twice the node timeout ago (30 s here; seen:
# refused at 0.1 s and at 27 s, granted at 50 s): it gives up after 5 s, and the test waits
# and asks again, or forces.  :func:`quiet_shard` steers each test to the quietest shard
# and waits out the rest of that window instead.
_LAST_FAILOVER: dict[tuple[int, int], float] = {}
VOTE_WINDOW_S = 2 * CLUSTER_NODE_TIMEOUT_MS / 1000 + 1.0


def quiet_shard(cluster: RedisClusterServers, keys: list[str]) -> int:
    """Index in ``keys`` of one whose shard failed over longest ago (never, best); returns
    once that shard may fail over again without an election being refused (as far as the
    window above is known)."""

    def last(index: int) -> float:
        primary, _ = slot_owner(cluster, keys[index])
        return _LAST_FAILOVER.get((cluster.port, primary), float("-inf"))

    times = [last(i) for i in range(len(keys))]
    chosen = times.index(min(times))
    time.sleep(max(0.0, times[chosen] + VOTE_WINDOW_S - time.monotonic()))
    return chosen


def failover_to(
    cluster: RedisClusterServers,
    replica: int,
    before_retry: Callable[[], None] | None = None,
    events: list[str] | None = None,
) -> None:
    """``CLUSTER FAILOVER`` on ``replica`` (coordinated, no data loss); wait until it leads.

    Leads means both sides agree: ``replica`` says it is a primary *and* its old primary
    says it is now ``replica``'s replica.  ``ROLE`` on the replica alone is not enough: a
    manual failover that timed out can leave it saying "master" for a moment, under its
    old epoch, before it goes back to replicating the same primary (seen here on Redis
    7.0.15, second try after a timed-out first one).

    A manual failover is given up by Redis after 5 s (say, while the replica is still
    syncing after the previous one, or on a loaded machine): wait for its replication
    link, then ask again, a bounded number of times (the later ones with FORCE, then
    TAKEOVER).  Only the first try runs under the callers' writes: before any later one,
    ``before_retry()`` stops the writers and this waits until the replica has everything
    its primary has.  FORCE and TAKEOVER skip the handshake that makes the replica catch
    up, so what it has not received is lost; and the transient "master" above followed a
    retry (whether it takes writes was not checked).  The promise under test is that of
    one coordinated failover.  ``events`` collects a timeline for failure messages.
    """

    def note(text: str) -> None:
        if events is not None:
            events.append(f"{time.monotonic():.2f} {text}")

    old_primary: int | None = None  # known once asked: a try may end past its wait
    for attempt in range(FAILOVER_ATTEMPTS):
        if old_primary is not None and _took_over(cluster, replica, old_primary):
            return
        wait_for(f"node {replica}'s replication link", lambda: _linked(cluster, replica))
        old_primary = _primary_of(cluster, replica)
        # After two coordinated tries, FORCE: no handshake with the (busy) primary, still an
        # election by the primaries.  The last try is TAKEOVER (no election):
        # elections of a shard failed over less than twice the node timeout ago are refused
        # (``_LAST_FAILOVER``), so they can all be denied (seen in CI: "never became
        # primary").
        last = attempt == FAILOVER_ATTEMPTS - 1
        options = ("TAKEOVER",) if last else ("FORCE",) if attempt >= 2 else ()
        if attempt > 0:
            if before_retry is not None:
                before_retry()
            wait_for(f"node {replica} to catch up", lambda: _caught_up(cluster, replica))
        note(f"CLUSTER FAILOVER {' '.join(options)} on {replica} (primary {old_primary})")
        with cluster.node_client(replica) as conn:
            conn.execute_command("CLUSTER", "FAILOVER", *options)
        try:
            wait_for(
                f"node {replica} to take over from {old_primary}",
                lambda primary=old_primary: _took_over(cluster, replica, primary),
                timeout_s=MANUAL_FAILOVER_S,
            )
        except AssertionError:
            note(
                f"not taken over: {replica} {role(cluster, replica)}, "
                f"{old_primary} {role(cluster, old_primary)}"
            )
            continue
        note(f"{replica} took over from {old_primary}")
        for node in (old_primary, replica):
            _LAST_FAILOVER[(cluster.port, node)] = time.monotonic()
        return
    raise AssertionError(f"node {replica} never became primary")


def _primary_of(cluster: RedisClusterServers, replica: int) -> int:
    reply = role_reply(cluster, replica)
    assert _text(reply[0]) == "slave", f"node {replica} is not a replica"
    return int(reply[2])


def _took_over(cluster: RedisClusterServers, replica: int, old_primary: int) -> bool:
    """``replica`` leads, and ``old_primary`` replicates from it (both say so)."""
    if role(cluster, replica) != "master":
        return False
    reply = role_reply(cluster, old_primary)
    return _text(reply[0]) == "slave" and int(reply[2]) == replica


def _caught_up(cluster: RedisClusterServers, replica: int) -> bool:
    """``replica`` has received everything its primary has written (no writer running)."""
    with cluster.node_client(replica, socket_timeout=5) as conn:
        mine = conn.info("replication")
    if mine.get("role") != "slave" or mine.get("master_link_status") != "up":
        return False
    with cluster.node_client(int(mine["master_port"]), socket_timeout=5) as conn:
        theirs = conn.info("replication")
    return int(mine["slave_repl_offset"]) >= int(theirs["master_repl_offset"])


def settled(cluster: RedisClusterServers) -> bool:
    """No failover under way: the primaries of a moment ago are healthy, with replicas."""
    primaries = {port for port in cluster.ports if role(cluster, port) == "master"}
    return len(primaries) == cluster.PRIMARIES and healthy(cluster, primaries)


@contextlib.contextmanager
def settled_topology(cluster: RedisClusterServers) -> Iterator[None]:
    """The body may fail a shard over: afterwards the cluster is healthy and settled (every
    node ``cluster_state:ok``, three primaries, each replica linked), which is what later
    tests need.

    The swapped roles stay; nothing fails back.  A fail-back is one more failover of the
    shard, and Redis refuses the next election of a shard failed over less than twice the
    node timeout ago (see ``_LAST_FAILOVER``): each test's failover after a fail-back was
    refused, timed out after 5 s and had to be asked again, or forced.
    """
    yield
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
        self.started = threading.Event()  # set as the failover thread starts
        self.quiet = threading.Event()  # set before a retried failover: send no more calls
        self.in_flight = 0  # calls between enter() and done()
        self.finished = threading.Event()
        self.events: list[str] = []  # the failover's timeline, for failure messages

    def enter(self) -> None:
        """A call is about to be sent (:meth:`done` when it has ended)."""
        with self._lock:
            self.in_flight += 1

    def enter_unless_quiet(self) -> bool:
        """:meth:`enter`, unless the writers were stopped (False: send nothing).  Checked
        and counted under the lock that :meth:`_stop_writers` sets ``quiet`` under, so no
        call slips in after it saw none in flight."""
        with self._lock:
            if self.quiet.is_set():
                return False
            self.in_flight += 1
            return True

    def _stop_writers(self) -> None:
        # Before a failover is asked again (see failover_to): no call sent from now on,
        # and every call sent has ended.
        with self._lock:
            self.quiet.set()
        wait_for("the calls in flight to end", lambda: self.in_flight == 0)

    def done(self) -> None:
        with self._lock:
            self.in_flight -= 1
            self._count += 1
            if self._count != self.after or self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="burst-failover")
            self.started.set()
        self._thread.start()

    def _run(self) -> None:
        try:
            failover_to(self.cluster, self.replica, self._stop_writers, self.events)
        except BaseException as exc:
            self._error = exc
        finally:
            self.finished.set()

    @contextlib.contextmanager
    def explained(self) -> Iterator[None]:
        """A failed check in the body says what the failover did, and when."""
        try:
            yield
        except AssertionError as exc:
            timeline = "\n".join(self.events) or "(no failover command sent)"
            raise AssertionError(f"{exc}\nfailover timeline:\n{timeline}") from exc

    def join(self) -> None:
        assert self._thread is not None, "the burst ended before the failover started"
        self._thread.join(FAILOVER_TIMEOUT_S * 2)
        assert not self._thread.is_alive(), "the failover thread hangs"
        if self._error is not None:
            raise self._error
