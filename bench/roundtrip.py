"""What one round trip costs a client on this machine: the sleep on the reply, the work
after it, and the transport.

``python -m bench.roundtrip [--rounds K] [--ops N] [--spin-us S] [--out FILE|DIR] [--quick]``

On a private ``redis-server`` listening on a loopback port and on a Unix socket (free
port, temp dirs, stopped by pid), rows in an order that rotates each round, ``N`` calls
each, this process's wall and CPU time (user + system) per call.

**The sleep.**  Each of these rows runs twice: as it is (``.sleep``: the reading thread
blocks in the kernel until the reply arrives, as every client here does), and with each
reply waited for by polling the socket with a zero timeout (``.spin``: the thread never
sleeps; after ``S`` us without a reply it falls back to the blocking read, so no row can
hang):

* ``trip``: the minimal script (the append targets' baseline), packed before the row, sent
  and read on one redis-py connection (``send_packed_command``, ``read_response``, hiredis
  parser; as ``bench.clientsplit``'s trip): a round trip with no client work;
* ``append.trip``: memtier's own ``append_turn`` the same way (ARGV prepared and packed
  before the row; every call stores a turn in one of 1,000 sessions);
* ``raw``: redis-py's ``client.evalsha`` of the minimal script (the append targets'
  baseline as the benchmark runs it);
* ``append``: ``store.append`` (300 B) as it is;
* ``ping``: ``PING`` on a redis-py connection: a round trip in which Redis does nothing;
* ``pure+ping``: ``store.append`` with the lean transport answering from a reply recorded
  from a real call (no byte on its socket), then one ``PING`` round trip.

And ``append.pure``: the first half of ``pure+ping`` alone (``bench.clientsplit``'s pure
row: every line of memtier's client work, no socket I/O), CPU per call.

**The transport.**  ``trip.unix``, ``raw.unix``, ``append.unix``, ``context.unix`` and
``ping.unix``: the same over the Unix socket (``unix://``), against ``trip.sleep``,
``raw.sleep``, ``append.sleep``, ``context`` (``store.context(limit=20)`` over TCP) and
``ping.sleep``.

Derived per round: ``wake_us`` (``trip.sleep - trip.spin``: what sleeping on a reply adds
to one round trip), ``excess_cpu.sleep`` / ``.spin`` (``pure+ping - append.pure - ping``:
what a bare round trip adds to the CPU of the work after it), and the append targets'
ratio (the baseline's wall per call over memtier's) each way.

Why: ``bench.clientsplit`` showed that a call's client CPU is not its parts' sum on this
VM -- the work after each reply costs about twice its loop cost -- and left the cause
open (docs/performance.md, "Client CPU is not additive").  The spin rows say what the
sleep costs; ``pure+ping`` says whether the work after any round trip costs more, with
no memtier reply and no script in it.  The spin is a diagnostic only: memtier's clients
block on their replies, because CPU per call is what a fleet of agent workers pays, and
a spinning client burns its core for the whole wait.  The result's ``meta`` records the
kernel's idle driver and command line: on a KVM guest an idle vCPU halts (a VM exit)
unless the guest polls first (``cpuidle-haltpoll``, ``haltpoll.guest_halt_poll_ns``).
"""

from __future__ import annotations

import argparse
import contextlib
import select
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from bench.clientsplit import _answering, _Canned, _recording
from bench.probe import exit_on_sigterm, machine_meta, parse_round_args, spread, write_json
from bench.server import BenchRedis
from bench.workloads import (
    MINIMAL_SCRIPT,
    Baselines,
    KeyPool,
    _resp,
    bench_config,
    chat_text,
    low_level_connection,
    populate,
    prepared_appends,
)
from memtier import AvatarMessage, ConversationStore

__all__ = ["SpinningSocket", "main", "spin_wait"]

SESSIONS = 1000
READ_SESSIONS = 32
SPIN_US_CEILING = 100_000  # --spin-us is bounded: a spin row never holds a core longer
SPUN = ("trip", "append.trip", "raw", "append", "ping", "pure+ping")
UNIX = ("trip.unix", "raw.unix", "append.unix", "context", "context.unix", "ping.unix")


class SpinCount:
    """Replies waited for by spinning: found while spinning, or after the fallback."""

    def __init__(self) -> None:
        self.found = 0
        self.fell_back = 0


def spin_wait(fileno: int, budget_s: float, count: SpinCount) -> None:
    """Return once ``fileno`` is readable, polling with a zero timeout (the thread never
    sleeps), or after ``budget_s`` (the caller's blocking read then waits as usual)."""
    poller = select.poll()
    poller.register(fileno, select.POLLIN)
    end = time.perf_counter() + budget_s
    while not poller.poll(0):
        if time.perf_counter() > end:
            count.fell_back += 1
            return
    count.found += 1


class SpinningSocket:
    """A socket whose ``recv_into`` spins for its data first (see :func:`spin_wait`);
    every other attribute is the socket's own.  Put in place of redis-py's parser socket."""

    def __init__(self, sock: Any, budget_s: float, count: SpinCount) -> None:
        self.sock, self.budget_s, self.count = sock, budget_s, count

    def recv_into(self, buffer: Any, *args: Any) -> Any:
        spin_wait(self.sock.fileno(), self.budget_s, self.count)
        return self.sock.recv_into(buffer, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


def _spinning(connections: list[Any], on: bool, budget_s: float, count: SpinCount) -> None:
    """Put (or take back) a spinning socket under each redis-py connection's parser."""
    for conn in connections:
        parser: Any = getattr(conn, "_parser", None)
        sock = getattr(parser, "_sock", None)
        if sock is None:
            continue
        if on and not isinstance(sock, SpinningSocket):
            parser._sock = SpinningSocket(sock, budget_s, count)
        elif not on and isinstance(sock, SpinningSocket):
            parser._sock = sock.sock


def _timed(n: int, one: Callable[[int], Any]) -> tuple[float, float]:
    """(wall us, CPU us) per call of ``one(i)`` for i in range(n)."""
    w0, c0 = time.perf_counter(), time.process_time()
    for i in range(n):
        one(i)
    return (time.perf_counter() - w0) / n * 1e6, (time.process_time() - c0) / n * 1e6


def _kernel_idle() -> dict[str, str]:
    """The idle driver and the kernel command line (what decides whether an idle vCPU
    halts at once), where this machine exposes them."""
    found: dict[str, str] = {}
    for name, path in (
        ("cpuidle_driver", "/sys/devices/system/cpu/cpuidle/current_driver"),
        ("cpuidle_governor", "/sys/devices/system/cpu/cpuidle/current_governor"),
        ("kernel_cmdline", "/proc/cmdline"),
    ):
        try:
            found[name] = Path(path).read_text(encoding="utf-8").strip()[:2000]
        except OSError:
            found[name] = ""
    return found


def _unix_connection(path: str) -> Any:
    """redis-py's low-level connection over the Unix socket at ``path``, connected."""
    conn: Any = redis.UnixDomainSocketConnection(path=path)  # type: ignore[no-untyped-call,abstract]
    conn.connect()
    return conn


def _pairs(a: list[float], b: list[float], op: Callable[[float, float], float]) -> list[float]:
    return [op(x, y) for x, y in zip(a, b, strict=True)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.roundtrip")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--ops", type=int, default=1000)
    p.add_argument("--spin-us", type=int, default=5000, help="longest spin per reply")
    args = parse_round_args(p, argv, "roundtrip")
    if not 0 < args.spin_us <= SPIN_US_CEILING:
        raise SystemExit(f"--spin-us: between 1 and {SPIN_US_CEILING:,}")
    budget_s = args.spin_us / 1e6
    exit_on_sigterm()

    text = chat_text(300)
    count = SpinCount()
    socket_dir = Path(tempfile.mkdtemp(prefix="mt-rt-"))  # short: a socket path's limit
    socket_path = str(socket_dir / "redis.sock")
    try:
        with BenchRedis({"unixsocket": socket_path, "unixsocketperm": "700"}) as server:
            client = server.client()
            unix_client = redis.Redis(unix_socket_path=socket_path)
            meta = machine_meta(client) | {"server_pid": server.pid()} | _kernel_idle()
            config = bench_config("roundtrip")
            stores = {
                "tcp": ConversationStore(client, config),
                "unix": ConversationStore(unix_client, config),
            }
            store = stores["tcp"]
            pool, reads = KeyPool(91, SESSIONS), KeyPool(92, READ_SESSIONS)
            for k in pool.keys:  # every append below goes to an existing session
                store.append(k, AvatarMessage(text=text))
            populate(store, reads.keys, text, turns=100)
            client.script_load(store.scripts["append_turn"].source)
            sha = str(client.script_load(MINIMAL_SCRIPT.read_text(encoding="utf-8")))
            conns = {"tcp": low_level_connection(server.port)}
            conns["unix"] = _unix_connection(socket_path)
            canned = _Canned()
            with _recording(canned):
                store.append(pool.next(), AvatarMessage(text=text))
            ping = _resp("PING")
            seq = {"minimal": 0}

            def minimal_args(n: int) -> list[tuple[Any, ...]]:
                i = seq["minimal"]
                seq["minimal"] = i + n
                return [
                    (sha, 4, *Baselines.append_args("rt", j % SESSIONS), text, "m")
                    for j in range(i, i + n)
                ]

            def store_conns(which: str) -> list[Any]:
                """The redis-py connections a store's row reads from: its kept ones and its
                client pool's idle ones (every row runs on one thread)."""
                s = stores[which]
                lean = s.executor._lean_for(s.executor.client)
                idle = s.client.connection_pool._available_connections
                return [*getattr(lean, "_idle", ()), *idle]

            def one_trip(conn: Any, packed: list[bytes]) -> Callable[[int], None]:
                def trip(i: int) -> None:  # an error reply (a refused call) raises
                    conn.send_packed_command([packed[i]])
                    conn.read_response()

                return trip

            def row(name: str, n: int) -> tuple[float, float]:
                # "<base>.<mode>": sleep / spin over TCP, or unix; "context" is over TCP
                base, _, mode = name.rpartition(".") if name != "context" else ("context", "", "")
                spin, via = mode == "spin", ("unix" if mode == "unix" else "tcp")
                conn = conns[via]
                work: Callable[[int], Any]
                if base == "trip":
                    work = one_trip(conn, [_resp("EVALSHA", *c) for c in minimal_args(n)])
                    watched = [conn]
                elif base == "append.trip":
                    work = one_trip(conn, prepared_appends(store, pool, text, n))
                    watched = [conn]
                elif base == "ping":
                    work = one_trip(conn, [ping] * n)
                    watched = [conn]
                elif base == "pure+ping":
                    canned.load()
                    trip = one_trip(conn, [ping] * n)

                    def work(i: int) -> None:  # the store answered as in pure() below
                        store.append(pool.next(), AvatarMessage(text=text))
                        trip(i)

                    watched = [conn]
                elif base == "raw":
                    calls, c = minimal_args(n), (unix_client if via == "unix" else client)
                    work = lambda i: c.evalsha(*calls[i])  # noqa: E731
                    watched = [*c.connection_pool._available_connections]
                elif base == "append":
                    s = stores[via]
                    work = lambda i: s.append(pool.next(), AvatarMessage(text=text))  # noqa: E731
                    watched = store_conns(via)
                elif base == "context":
                    s = stores[via]
                    work = lambda i: s.context(reads.next(), limit=20)  # noqa: E731
                    watched = store_conns(via)
                else:  # pragma: no cover - the row table below names only these
                    raise ValueError(name)
                # pure+ping: the lean transport answers from the recorded reply for the
                # whole row (the PING's connection is not the store's: it still goes out)
                answered = _answering(canned) if base == "pure+ping" else contextlib.nullcontext()
                _spinning(watched, spin, budget_s, count)
                try:
                    with answered:
                        return _timed(n, work)
                finally:
                    _spinning(watched, False, budget_s, count)

            def pure(n: int) -> float:
                canned.load()
                with _answering(canned):
                    _, cpu_us = _timed(
                        n, lambda i: store.append(pool.next(), AvatarMessage(text=text))
                    )
                return cpu_us

            names = [f"{b}.{m}" for b in SPUN for m in ("sleep", "spin")] + list(UNIX)
            wall: dict[str, list[float]] = {name: [] for name in names}
            cpu: dict[str, list[float]] = {name: [] for name in [*names, "append.pure"]}
            spun: dict[str, list[int]] = {name: [] for name in names if name.endswith(".spin")}
            for name in names:  # warm: scripts loaded, caches filled, connections made
                row(name, 20)
            pure(50)
            order = [*names, "append.pure"]
            for rnd in range(args.rounds):
                shift = rnd % len(order)
                for name in order[shift:] + order[:shift]:
                    if name == "append.pure":
                        cpu[name].append(pure(args.ops))
                        continue
                    before = count.found + count.fell_back
                    w, c = row(name, args.ops)
                    wall[name].append(w)
                    cpu[name].append(c)
                    if name in spun:
                        spun[name].append(count.found + count.fell_back - before)
            for conn in conns.values():
                conn.disconnect()
            for s in stores.values():
                s.close()  # and the client each was given
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)

    def minus(a: float, b: float) -> float:
        return a - b

    def over(a: float, b: float) -> float:
        return a / b

    derived: dict[str, list[float]] = {
        "wake_us": _pairs(wall["trip.sleep"], wall["trip.spin"], minus),
        "excess_cpu.sleep": _pairs(
            _pairs(cpu["pure+ping.sleep"], cpu["append.pure"], minus), cpu["ping.sleep"], minus
        ),
        "excess_cpu.spin": _pairs(
            _pairs(cpu["pure+ping.spin"], cpu["append.pure"], minus), cpu["ping.spin"], minus
        ),
        "append_vs_raw.sleep": _pairs(wall["raw.sleep"], wall["append.sleep"], over),
        "append_vs_raw.spin": _pairs(wall["raw.spin"], wall["append.spin"], over),
        "append_vs_raw.unix": _pairs(wall["raw.unix"], wall["append.unix"], over),
        # op/s over the Unix socket against the same over loopback TCP
        "unix_vs_tcp.trip": _pairs(wall["trip.sleep"], wall["trip.unix"], over),
        "unix_vs_tcp.append": _pairs(wall["append.sleep"], wall["append.unix"], over),
        "unix_vs_tcp.context": _pairs(wall["context"], wall["context.unix"], over),
        "unix_vs_tcp.raw": _pairs(wall["raw.sleep"], wall["raw.unix"], over),
    }
    result = {
        "meta": meta,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "wall_us_per_call": {name: spread(v) for name, v in wall.items()},
        "cpu_us_per_call": {name: spread(v) for name, v in cpu.items()},
        "derived": {name: spread(v) for name, v in derived.items()},
        "spin_reads": {"found": count.found, "fell_back": count.fell_back},
        "rounds": {"wall_us_per_call": wall, "cpu_us_per_call": cpu, "derived": derived}
        | {"spun": spun},
    }
    write_json(args.out, result)
    tree = meta["memtier_commit"]
    print(f"us per call, median of {args.rounds} rounds of {args.ops} (tree {tree}):")
    for name in names:
        print(
            f"  {name:18s} wall {spread(wall[name])['median']:7.1f}"
            f"  cpu {spread(cpu[name])['median']:7.1f}"
        )
    print(f"  {'append.pure':18s} {'':12s}  cpu {spread(cpu['append.pure'])['median']:7.1f}")
    for name, v in derived.items():
        print(f"  {name:22s} {spread(v)['median']:7.2f}")
    print(f"spin reads: {count.found} found, {count.fell_back} fell back; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
