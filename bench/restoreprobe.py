"""A full restore of one generation, with and without reading ahead.

``python -m bench.restoreprobe [--cluster] [--rounds K] [--ops N] [--out FILE|DIR] [--quick]``

On a private ``redis-server`` (free loopback port, temp dir, stopped by pid), ``N``
sessions of 2 turns of 300 B (as ``bench.run``'s workers section), one flush, then per
round one restore per mode, in an order that rotates each round: the namespace's keys
deleted, then ``ConversationStore.recover(force=True)`` (both passes, every
``restore_session``).  Each restore is timed in wall time, in this process's CPU time
(user + system, every thread) and in the server's CPU time (``INFO cpu``); its rate is
the generation's bytes over its wall time.

Modes of the sync executor's ``Overlap`` (pass 2 reads the next batch of sessions while
the last one is restored):

* ``read_ahead``: what the executor does: the batch's pipeline is written, the next
  batch is read from the file and built while Redis runs it, then the replies are read;
* ``sequential``: the next batch is read, then the batch is sent: what the restore did
  before the twenty-seventh round (one batch at a time, the client waiting on Redis).

and of an asyncio store on a plain ``redis.asyncio.Redis`` (auto-pipelined):

* ``async_batched``: what the asyncio executor does: each batch queued at once by one
  coroutine and retried whole (``memtier.scriptbatch.run_script_batch_pipelined``);
* ``async_tasks``: what it did before the twenty-ninth round: each call of a batch a
  task of its own (its own retries and guard), all queued in the same tick.

With ``--cluster`` (file ``restoreprobe-cluster.json``) the same on a private 3-primary
Redis Cluster (no replicas; every node stopped by pid), in five modes: how a batch of
``restore_session`` calls goes out there,

* ``pipelined``: what the sync executor does: one pipeline per primary, every node
  written, then every node read (``ClusterLean.pipeline``);
* ``call_by_call``: what it did before the twenty-eighth round: one round trip per call;
* ``async_batched``: an asyncio store now: each batch queued at once by one coroutine
  in each call's primary's auto-pipeline;
* ``async_tasks``: the asyncio store of the twenty-eighth round: a task per call, all
  queued in their nodes' pipelines in the same tick (called ``async_queued`` in that
  round's files);
* ``async_one_by_one``: the asyncio store before: one call after the other.

The old asyncio paths are reproduced here, not kept in the library: a pipeline marked
busy (its ``_direct`` flag, as while a caller writes its own call) queues every call,
which is what the library's ``queue_only`` did until the twenty-ninth round.

Redis CPU is the sum over the primaries.

Why: docs/performance.md, "The restore reads its next batch while Redis restores the
last one", "A restore on Redis Cluster: one pipeline per primary" and "The asyncio
restore's batches in one coroutine".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.probe import (
    exit_on_sigterm,
    machine_meta,
    parse_round_args,
    redis_cpu_seconds,
    spread,
    write_json,
)
from bench.server import BenchRedis
from bench.workerbench import delete_namespace, populate_sessions
from bench.workloads import bench_config
from memtier import AsyncConversationStore, ConversationStore
from memtier.engine import Overlap, ScriptBatch
from memtier.executor import AsyncExecutor, SyncExecutor
from memtier.leancluster import ClusterLean
from memtier.memory.persistence.shared import snapshot_dir_for

__all__ = ["main"]

TURNS = 2
NAMESPACE = "restoreprobe"


def _sequential(self: SyncExecutor, overlap: Overlap, operation: str | None) -> Any:
    overlap.work()
    return self.execute(overlap.request, operation)


def _call_by_call(self: SyncExecutor, batch: ScriptBatch, during: Any) -> Any:
    if isinstance(self._lean_for(self.client), ClusterLean):
        return None  # no pipeline on a cluster: the batch goes call by call
    return _LEAN_BATCH(self, batch, during)


async def _one_by_one(self: AsyncExecutor, batch: ScriptBatch, operation: str | None) -> Any:
    return [await self.execute(call, operation) for call in batch.calls]


async def _task_per_call(self: AsyncExecutor, batch: ScriptBatch, operation: str | None) -> Any:
    """The asyncio batch before the twenty-ninth round: a task per call, each with its own
    retries, all queued in the tick's batch of their pipeline (standalone, or each
    call's primary's)."""
    calls = batch.calls
    pipelines = _pipelines_of(self, calls)
    if not pipelines or len(calls) < 2:
        return await _one_by_one(self, batch, operation)
    tasks = [asyncio.ensure_future(self.execute(call, operation)) for call in calls]
    busy = [p for p in pipelines if not p._direct]
    try:
        for pipeline in busy:  # (queue_only, as it was: no call writes its own)
            pipeline._direct = True
        await asyncio.sleep(0)  # one iteration: each call queues, in order
    finally:
        for pipeline in busy:
            pipeline._direct = False
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes


def _pipelines_of(executor: AsyncExecutor, calls: tuple[Any, ...]) -> list[Any]:
    """The auto-pipelines ``calls`` go to (empty: none, the generic path)."""
    client = executor.client
    pipeline = executor.pipeline_for(client)
    if pipeline is not None:
        return [pipeline]
    lean = executor.lean_cluster_for(client)
    if lean is None or not lean.pipelined:
        return []
    manager = client.nodes_manager
    nodes = {n.name: n for n in (manager.get_node_from_slot(lean.slot(c.keys[0])) for c in calls)}
    return [p for p in map(lean.pipeline_for, nodes.values()) if p is not None]


_LEAN_BATCH = SyncExecutor._lean_batch_attempt
# mode -> (asyncio store?, the executor method it replaces and with what, or None)
Patch = tuple[type, str, Callable[..., Any]] | None
MODES: dict[str, tuple[bool, Patch]] = {
    "read_ahead": (False, None),
    "sequential": (False, (SyncExecutor, "_overlap", _sequential)),
    "async_batched": (True, None),
    "async_tasks": (True, (AsyncExecutor, "_script_batch", _task_per_call)),
}
CLUSTER_MODES: dict[str, tuple[bool, Patch]] = {
    "pipelined": (False, None),
    "call_by_call": (False, (SyncExecutor, "_lean_batch_attempt", _call_by_call)),
    "async_batched": (True, None),
    "async_tasks": (True, (AsyncExecutor, "_script_batch", _task_per_call)),
    "async_one_by_one": (True, (AsyncExecutor, "_script_batch", _one_by_one)),
}


@contextlib.contextmanager
def _patched(patch: Patch) -> Iterator[None]:
    if patch is None:
        yield
        return
    owner, name, replacement = patch
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextlib.contextmanager
def _server(cluster: bool) -> Iterator[tuple[Any, list[Any], dict[str, Any]]]:
    """(a sync client, the primaries' own clients for INFO, pid meta): a private
    standalone server, or a 3-primary cluster without replicas; stopped by pid."""
    if not cluster:
        with BenchRedis() as server:
            plain = server.client()
            yield plain, [plain], {"server_pid": server.pid(), "url": server.url}
        return
    from redis.cluster import RedisCluster

    from bench.clusterlean import BenchCluster
    from tests.servers import HOST

    nodes = BenchCluster()
    nodes.start()
    try:
        client: Any = RedisCluster(host=HOST, port=nodes.port)
        primaries = [client.get_redis_connection(n) for n in client.get_primaries()]
        pids = nodes.pids
        url = f"redis://{HOST}:{nodes.port}"
        yield client, primaries, {"server_pid": pids[0], "server_pids": pids, "url": url}
        client.close()
    finally:
        nodes.stop()


def _restore(store: ConversationStore, config: Any, url: str | None, cluster: bool) -> Any:
    """A full restore by ``store`` (``url``: by an asyncio store on a plain asyncio client
    of that server or cluster instead)."""
    if url is None:
        return store.recover(force=True)

    async def restore() -> Any:
        from redis.asyncio import Redis
        from redis.asyncio.cluster import RedisCluster

        client = RedisCluster.from_url(url) if cluster else Redis.from_url(url)
        astore = AsyncConversationStore(client, config, snapshots=snapshot_dir_for(config))
        try:
            return await astore.recover(force=True)
        finally:
            await astore.aclose()

    return asyncio.run(restore())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.restoreprobe")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ops", type=int, default=10_000, help="sessions in the generation")
    p.add_argument("--cluster", action="store_true", help="a 3-primary Redis Cluster")
    cluster = "--cluster" in (sys.argv[1:] if argv is None else argv)
    args = parse_round_args(p, argv, "restoreprobe-cluster" if cluster else "restoreprobe")
    exit_on_sigterm()
    modes = CLUSTER_MODES if cluster else MODES

    series: dict[str, dict[str, list[float]]] = {
        what: {} for what in ("mib_per_s", "wall_s", "cpu_s", "redis_cpu_s")
    }

    def redis_cpu(primaries: list[Any]) -> float:
        return sum(redis_cpu_seconds(node) for node in primaries)

    with (
        _server(cluster) as (client, primaries, pid_meta),
        tempfile.TemporaryDirectory(prefix="memtier-restoreprobe-") as storage,
    ):
        meta = machine_meta(primaries[0]) | pid_meta
        url = pid_meta.get("url")
        config = bench_config(NAMESPACE, persistence_enabled=True, storage_path=storage)
        store = ConversationStore(client, config, snapshots=snapshot_dir_for(config))
        try:
            populate_sessions(store, args.ops, turns=TURNS, text_bytes=300)
            flushed = store.flush()
            names = list(modes)
            for rnd in range(args.rounds):
                shift = rnd % len(names)
                for mode in names[shift:] + names[:shift]:
                    use_asyncio, patch = modes[mode]
                    for node in primaries:
                        delete_namespace(node, NAMESPACE)
                    with _patched(patch):
                        s0 = redis_cpu(primaries)
                        c0, w0 = time.process_time(), time.perf_counter()
                        report = _restore(store, config, url if use_asyncio else None, cluster)
                        seconds = time.perf_counter() - w0
                        cpu = time.process_time() - c0
                    if report.outcome != "restored" or report.restored != args.ops:
                        raise RuntimeError(f"{mode}: {report.outcome}, {report.restored} restored")
                    for what, value in (
                        ("mib_per_s", flushed.bytes / 2**20 / seconds),
                        ("wall_s", seconds),
                        ("cpu_s", cpu),
                        ("redis_cpu_s", redis_cpu(primaries) - s0),
                    ):
                        series[what].setdefault(mode, []).append(value)
        finally:
            for node in primaries:
                delete_namespace(node, NAMESPACE)
            store.close()

    result_json: dict[str, Any] = {
        "meta": meta,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "generation_bytes": flushed.bytes,
        # per measure: {mode: median/min/max}
        **{
            what: {mode: spread(v) for mode, v in by_mode.items()}
            for what, by_mode in series.items()
        },
        "rounds": series,
    }
    write_json(args.out, result_json)
    where = "a 3-primary cluster" if cluster else "one server"
    print(f"restore of {args.ops} sessions x {TURNS} turns on {where}, median [min-max]:")
    for mode in modes:
        r, c, s = (spread(series[w][mode]) for w in ("mib_per_s", "cpu_s", "redis_cpu_s"))
        print(
            f"  {mode:16s} {r['median']:6.2f} MiB/s [{r['min']:.2f}-{r['max']:.2f}]"
            f"  client CPU {c['median']:.2f} s  Redis CPU {s['median']:.2f} s"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
