"""One call's client CPU split into memtier's own work and its round trips, and what the
two cost together beyond their sum.

``python -m bench.clientsplit [--rounds K] [--ops N] [--out FILE|DIR] [--quick]``

On a private ``redis-server`` (free loopback port, temp dir, stopped by pid), rows in an
order that rotates each round, ``N`` operations each, this process's CPU time per
operation (user + system; the load of other processes cannot inflate it):

* ``append.real``: ``store.append`` (300 B) to existing sessions; ``append.pure``: the
  same with the lean transport answering from a reply recorded from a real call: every
  line of memtier's own work runs (model, redaction, ids, ARGV, the pool's checks of the
  connection, packing, retry, guard, metrics, decoding), no byte goes to the socket;
* ``context.real`` / ``context.pure``: ``store.context(limit=20)`` over 32 sessions of 100
  turns, the pure row answering its transaction from a recorded reply;
* ``continue.real`` / ``continue.pure``: ``ConversationService.continue_`` with the echo
  runner (200 threads; the pure row one thread, its history cache put back to what it
  held before the recorded turn, outside the timed call);
* ``trip``: the minimal script, pre-packed, sent and read on one connection: a round trip
  with no client work; ``append.trip`` / ``context.trip``: the same for memtier's own
  request (``append_turn`` with its ARGV prepared, every call storing a turn; the context
  read's transaction, its six replies read, not decoded); ``raw.real`` / ``raw.pure``:
  redis-py's ``client.evalsha`` of the minimal script (the baseline of the append
  targets), the pure row with the connection's send a no-op and its read the recorded
  reply.

Then, per operation: ``penalty = real - pure - trips * trip``, where ``trips`` is the
operation's round trips (append 1, context 1, continue 3, raw 1) and ``trip`` the
operation's own pre-packed request where there is one (append, context), else the
minimal script's (the continue's three scripts are counted as three of those).  When client CPU were
additive, the penalty would be about 0.  It is not: on this shared 2-core VM, the
process sleeps on every reply, and whatever runs on the core meanwhile leaves its caches
cold, so each microsecond of Python after a reply costs more than it does in a loop
(docs/performance.md, "Client CPU is not additive").  The pure rows are also the
low-noise way to compare two trees' client work: no server, no sleep.

To compare two trees, run this file from each tree's own directory (``cd <tree> &&
PYTHONPATH=<tree> python -m bench.clientsplit``): ``-m`` puts the current directory ahead
of ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable, Iterator
from itertools import pairwise
from typing import Any

from bench.probe import exit_on_sigterm, machine_meta, parse_round_args, spread, write_json
from bench.server import BenchRedis
from bench.workloads import (
    MINIMAL_SCRIPT,
    Baselines,
    KeyPool,
    RecordedCall,
    bench_config,
    chat_text,
    lean_calls_recorded,
    populate,
)
from memtier import AvatarMessage, ConversationStore
from memtier import connection as memtier_connection
from memtier.threads.models import Ownership
from memtier.threads.service import ConversationService
from memtier.threads.validation import thread_keys

__all__ = ["main"]

THREADS = 200
TRIPS = {"append": 1, "context": 1, "continue": 3}
Row = Callable[[int], float]  # ops -> CPU seconds spent in them


class _Canned:
    """Replies recorded from real calls of the lean transport, served back in order."""

    def __init__(self) -> None:
        self.replies: list[Any] = []
        self.queue: list[Any] = []

    def load(self) -> None:
        self.queue = list(self.replies)

    def next(self) -> Any:
        return self.queue.pop(0) if len(self.queue) > 1 else self.queue[0]


@contextlib.contextmanager
def _recording(canned: _Canned) -> Iterator[None]:
    """The lean transport as it is, its replies appended to ``canned``."""
    calls: list[RecordedCall] = []
    try:
        with lean_calls_recorded(calls):
            yield
    finally:
        canned.replies.extend(call.reply for call in calls)


@contextlib.contextmanager
def _answering(canned: _Canned) -> Iterator[None]:
    """The lean transport with everything but the socket I/O: a connection taken from
    the pool (and checked, as before every call), the request packed, the connection
    given back, and the next recorded reply returned."""
    lean = memtier_connection.LeanPool
    execute, transaction = lean.execute, lean.transaction

    def pure_execute(self: Any, args: Any, packed: Any, during: Any = None) -> Any:
        conn = self._get()
        try:
            if not packed:
                packed.extend(self._pack(conn, args))
            if during is not None:
                during()
            return canned.next()
        finally:
            self._release(conn)

    def pure_transaction(self: Any, commands: Any, count: int, packed: Any) -> Any:
        conn = self._get()
        try:
            if not packed:
                packed.extend(self._pack_all(conn, commands))
            return canned.next()
        finally:
            self._release(conn)

    lean.execute, lean.transaction = pure_execute, pure_transaction  # type: ignore[method-assign]
    try:
        yield
    finally:
        lean.execute, lean.transaction = execute, transaction  # type: ignore[method-assign]


def _cpu_loop(n: int, one: Callable[[], Any]) -> float:
    c0 = time.process_time()
    for _ in range(n):
        one()
    return time.process_time() - c0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.clientsplit")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--ops", type=int, default=600)
    args = parse_round_args(p, argv, "clientsplit")
    exit_on_sigterm()

    text = chat_text(300)
    owner = Ownership("bench", "user1")
    with BenchRedis() as server:
        client = server.client()
        meta = machine_meta(client) | {"server_pid": server.pid()}
        store = ConversationStore(client, bench_config("csplit"))
        service = ConversationService(client, bench_config("csplitt"))
        appends, reads = KeyPool(71, 1000), KeyPool(72, 32)
        populate(store, reads.keys, text, turns=100)
        for key in appends.keys:  # every append below goes to an existing session
            store.append(key, AvatarMessage(text=text))
        threads = [service.create(owner, title=f"t{i}").id for i in range(THREADS)]
        for tid in threads:
            service.continue_(owner, tid, text)

        # --- the recorded replies of the pure rows -----------------------------------
        canned = {name: _Canned() for name in TRIPS}
        with _recording(canned["append"]):
            store.append(appends.next(), AvatarMessage(text=text))
        with _recording(canned["context"]):
            store.context(reads.keys[0], limit=20)
        solo = service.create(owner, title="solo").id
        for _ in range(5):
            service.continue_(owner, solo, text)
        solo_key = thread_keys(service.core.keyspace, owner, solo).entries
        held = service.core.history_cache.known(solo_key)
        assert held is not None
        with _recording(canned["continue"]):
            service.continue_(owner, solo, text)
        assert [len(c.replies) for c in canned.values()] == [1, 1, 3]

        def put_back() -> None:  # the cache as the recorded claim found it
            sizes = [held.sizes[0], *(b - a for a, b in pairwise(held.sizes))]
            service.core.history_cache.keep(
                solo_key, held.inc, [e.id for e in held.entries], held.entries, sizes
            )

        sha = str(client.script_load(MINIMAL_SCRIPT.read_text(encoding="utf-8")))
        conn: Any = client.connection_pool.get_connection()
        state = {"raw": 0, "continue": 0}

        def raw(n: int) -> float:
            i = state["raw"]
            state["raw"] = i + n
            calls = [
                (sha, 4, *Baselines.append_args("cs", j % 1000), text, "m") for j in range(i, i + n)
            ]
            c0 = time.process_time()
            for call in calls:
                client.evalsha(*call)
            return time.process_time() - c0

        reply = client.evalsha(sha, 4, *Baselines.append_args("cs", 0), text, "m")

        def raw_pure(n: int) -> float:
            # redis-py's whole path (pool, checks, packing, response callbacks) with the
            # connection's send a no-op and its read the reply recorded above
            cls = type(conn)
            send, read = cls.send_packed_command, cls.read_response
            cls.send_packed_command = lambda self, *a, **k: None
            cls.read_response = lambda self, *a, **k: reply
            try:
                return raw(n)
            finally:
                cls.send_packed_command, cls.read_response = send, read

        def trip(n: int) -> float:
            i = state["raw"]
            state["raw"] = i + n
            keys = [Baselines.append_args("cs", j % 1000) for j in range(i, i + n)]
            # packed before the clock starts: the trip alone is timed
            packed = [conn.pack_command("EVALSHA", sha, 4, *k, text, "m") for k in keys]
            c0 = time.process_time()
            for request in packed:
                conn.send_packed_command(request)
                conn.read_response()
            return time.process_time() - c0

        append_script = store.scripts["append_turn"]
        core = store.core

        def append_trip(n: int) -> float:
            # memtier's own append_turn request, ARGV prepared and packed before the clock
            # starts (fresh turn ids: every call stores a turn), sent and read alone
            sha_keys = (append_script.sha, append_script.num_keys)
            turns = [core.prepare_turn(appends.next(), AvatarMessage(text=text)) for _ in range(n)]
            calls = [core.append_call(turn) for turn in turns]
            packed = [conn.pack_command("EVALSHA", *sha_keys, *c.keys, *c.args) for c in calls]
            c0 = time.process_time()
            for request in packed:
                conn.send_packed_command(request)
                conn.read_response()
            return time.process_time() - c0

        def context_trip(n: int) -> float:
            # the context read's transaction (MULTI, the session check's plain commands,
            # LRANGE, EXEC) packed before the clock starts; every reply read, none decoded
            requests = []
            for _ in range(n):
                tx = core.context_call(reads.next(), 20)
                assert tx.plain is not None
                commands = [("MULTI",), *tx.plain.commands, *tx.reads, ("EXEC",)]
                requests.append((conn.pack_commands(commands), len(commands)))
            c0 = time.process_time()
            for request, count in requests:
                conn.send_packed_command(request)
                for _ in range(count):
                    conn.read_response()
            return time.process_time() - c0

        def append_real(n: int) -> float:
            return _cpu_loop(n, lambda: store.append(appends.next(), AvatarMessage(text=text)))

        def append_pure(n: int) -> float:
            canned["append"].load()
            with _answering(canned["append"]):
                return append_real(n)

        def context_real(n: int) -> float:
            return _cpu_loop(n, lambda: store.context(reads.next(), limit=20))

        def context_pure(n: int) -> float:
            canned["context"].load()
            with _answering(canned["context"]):
                return _cpu_loop(n, lambda: store.context(reads.keys[0], limit=20))

        def continue_real(n: int) -> float:
            i = state["continue"]
            state["continue"] = i + n
            c0 = time.process_time()
            for j in range(i, i + n):
                service.continue_(owner, threads[j % THREADS], text)
            return time.process_time() - c0

        def continue_pure(n: int) -> float:
            spent = 0.0
            with _answering(canned["continue"]):
                for _ in range(n):
                    put_back()
                    canned["continue"].load()
                    c0 = time.process_time()
                    service.continue_(owner, solo, text)
                    spent += time.process_time() - c0
            return spent

        rows: dict[str, Row] = {
            "raw.real": raw,
            "raw.pure": raw_pure,
            "trip": trip,
            "append.trip": append_trip,
            "context.trip": context_trip,
            "append.real": append_real,
            "append.pure": append_pure,
            "context.real": context_real,
            "context.pure": context_pure,
            "continue.real": continue_real,
            "continue.pure": continue_pure,
        }
        for fn in rows.values():  # warm: first calls load scripts, fill caches
            fn(20)
        cpu: dict[str, list[float]] = {name: [] for name in rows}
        order = list(rows)
        for r in range(args.rounds):
            for name in order[r % len(order) :] + order[: r % len(order)]:
                ops = args.ops // 3 if name.startswith("continue") else args.ops
                cpu[name].append(rows[name](ops) / ops * 1e6)
        client.connection_pool.release(conn)

    per_round: dict[str, list[float]] = {}
    for op, trips in (TRIPS | {"raw": 1}).items():
        own = cpu.get(f"{op}.trip", cpu["trip"])  # the op's own request, where it has one
        per_round[f"{op}.penalty"] = [
            real - pure - trips * t
            for real, pure, t in zip(cpu[f"{op}.real"], cpu[f"{op}.pure"], own, strict=True)
        ]

    result = {
        "meta": meta,
        "args": vars(args) | {"out": str(args.out)},
        "trips": TRIPS,
        "cpu_us_per_op": {name: spread(v) for name, v in (cpu | per_round).items()},
        "rounds_cpu_us_per_op": cpu | per_round,
    }
    write_json(args.out, result)
    med = {name: spread(v)["median"] for name, v in (cpu | per_round).items()}
    print(f"client CPU us per op, median of {args.rounds} rounds (tree {meta['memtier_commit']}):")
    print(f"  trip (pre-packed minimal script)  {med['trip']:7.1f}")
    for op, trips in (TRIPS | {"raw": 1}).items():
        trip_us = med.get(f"{op}.trip", med["trip"])
        print(
            f"  {op:9s} real {med[f'{op}.real']:7.1f}  pure {med[f'{op}.pure']:7.1f}"
            f"  trips {trips} x {trip_us:5.1f}  penalty {med[f'{op}.penalty']:7.1f}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
