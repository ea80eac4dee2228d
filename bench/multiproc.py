"""Several worker processes appending at once: on their own keys, and on one shared key.

The worker processes are started once (``spawn``: clean interpreters, no
inherited sockets or event loops) and reused for every round; each round, all
workers wait on one barrier and then append ``n`` turns each.  Throughput is
the total number of appends divided by the span from the first worker's start
to the last worker's end (``time.perf_counter`` is the system-wide monotonic
clock on Linux, so the timestamps of different processes compare).

After each shared-key round the parent checks that the shared session holds
one gapless sequence of exactly ``procs * n`` turns (a sanity check of the run,
not a test: the test suite proves it).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench.framework import Measure
from bench.server import HOST, BenchRedis

__all__ = ["ProcPool"]

_TIMEOUT_S = 600.0  # one round of one worker; a hang fails the measure instead of the run


def _worker(
    index: int, port: int, tasks: Any, results: Any, barrier: Any
) -> None:  # pragma: no cover - runs in a child process
    import redis

    from bench.workloads import (
        APPEND_POOL,
        MINIMAL_SCRIPT,
        KeyPool,
        RawSocket,
        _resp,
        bench_config,
        chat_text,
    )
    from memtier import AvatarMessage, ConversationKey, ConversationStore

    client = redis.Redis(host=HOST, port=port)
    sha = client.script_load(MINIMAL_SCRIPT.read_text(encoding="utf-8"))
    store = ConversationStore(client, bench_config("bench"))
    append_turn = store.scripts["append_turn"]
    client.script_load(append_turn.source)
    raw = RawSocket(port)
    text = chat_text(300)
    pool = KeyPool(5000 + index, APPEND_POOL)
    own = [
        (
            f"{{bp{index}}}:q:{i}",
            f"{{bp{index}}}:t:{i}",
            f"{{bp{index}}}:meta",
            f"{{bp{index}}}:lru",
            text,
            f"m{i}",
        )
        for i in range(APPEND_POOL)
    ]
    shared = ("{bps}:q:0", "{bps}:t:0", "{bps}:meta", "{bps}:lru", text, "m0")
    counter = 0
    while True:
        task = tasks.get()
        if task is None:
            break
        kind, n, shared_key = task
        try:
            packed: list[bytes] = []
            if kind == "script-own":  # prepared and packed before the barrier: untimed
                for _ in range(n):
                    call = store.core.append_call(
                        store.core.prepare_turn(pool.next(), AvatarMessage(text=text))
                    )
                    head = ("EVALSHA", append_turn.sha, append_turn.num_keys)
                    packed.append(_resp(*head, *call.keys, *call.args))
            barrier.wait(timeout=_TIMEOUT_S)
            started = time.perf_counter()
            if kind == "script-own":
                raw.timed_calls(packed, "append_turn")
            elif kind == "base-own":
                for j in range(counter, counter + n):
                    client.evalsha(sha, 4, *own[j % APPEND_POOL])
            elif kind == "base-shared":
                for _ in range(n):
                    client.evalsha(sha, 4, *shared)
            elif kind == "memtier-own":
                for _ in range(n):
                    store.append(pool.next(), AvatarMessage(text=text))
            elif kind == "memtier-shared":
                key = ConversationKey(shared_key, "public")
                for _ in range(n):
                    store.append(key, AvatarMessage(text=text))
            else:
                raise ValueError(kind)
            ended = time.perf_counter()
            counter += n
            results.put((index, started, ended, None))
        except Exception as exc:
            results.put((index, 0.0, 0.0, f"{type(exc).__name__}: {exc}"))
    raw.sock.close()
    client.close()


class ProcPool:
    """``procs`` persistent worker processes (ours; always stopped in :meth:`close`)."""

    def __init__(self, server: BenchRedis, procs: int) -> None:
        ctx = mp.get_context("spawn")
        self.procs_n = procs
        self.server = server
        self.results: Any = ctx.Queue()
        self.barrier: Any = ctx.Barrier(procs)
        self.tasks: list[Any] = [ctx.Queue() for _ in range(procs)]
        self.procs = [
            ctx.Process(
                target=_worker,
                args=(i, server.port, self.tasks[i], self.results, self.barrier),
                daemon=True,
                name=f"memtier-bench-worker-{i}",
            )
            for i in range(procs)
        ]
        for proc in self.procs:
            proc.start()
        self.check_notes: list[str] = []

    def run(self, kind: str, n: int) -> float:
        shared_key = str(uuid.uuid4())
        for q in self.tasks:
            q.put((kind, n, shared_key))
        spans = []
        for _ in range(self.procs_n):
            try:
                _index, started, ended, error = self.results.get(timeout=_TIMEOUT_S)
            except queue.Empty:
                raise RuntimeError(f"{kind}: a worker did not report in time") from None
            if error:
                raise RuntimeError(f"{kind}: worker failed: {error}")
            spans.append((started, ended))
        if kind == "memtier-shared":
            self._check_shared(shared_key, n * self.procs_n)
        return float(max(e for _, e in spans) - min(s for s, _ in spans))

    def _check_shared(self, avatar: str, expected: int) -> None:
        from bench.workloads import bench_config
        from memtier import ConversationKey, ConversationStore

        with self.server.client() as client:
            store = ConversationStore(client, bench_config("bench"))
            ctx = store.context(ConversationKey(avatar, "public"))
            seqs = [t.seq for t in ctx.turns]
        if seqs != list(range(1, expected + 1)):
            raise RuntimeError(
                f"shared key: expected one gapless sequence 1..{expected}, got {len(seqs)} turns"
            )

    def _runner(self, kind: str) -> Callable[[int], float]:
        return lambda ops: self.run(kind, ops)

    def measures(self, n: int) -> list[Measure]:
        p = self.procs_n
        rows = [
            ("base-own", f"raw EVALSHA minimal script, {p} processes, own keys"),
            ("base-shared", f"raw EVALSHA minimal script, {p} processes, one shared key"),
            ("memtier-own", f"memtier append, {p} processes, own keys [300B]"),
            ("memtier-shared", f"memtier append, {p} processes, one shared key [300B]"),
            (
                "script-own",
                f"memtier's append_turn script, {p} processes, pre-encoded socket, own keys [300B]",
            ),
        ]
        return [
            Measure(
                f"procs.{kind}",
                label,
                self._runner(kind),
                items_per_op=p,
                fixed_ops=n,
                note="aggregate op/s of all processes"
                + (
                    "; gapless sequence checked after every round"
                    if kind == "memtier-shared"
                    else "; not the public API: the Python floor, ARGV prepared untimed"
                    if kind == "script-own"
                    else ""
                ),
            )
            for kind, label in rows
        ]

    def close(self) -> None:
        for q in self.tasks:
            try:
                q.put(None)
            except Exception:
                pass
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=10)
