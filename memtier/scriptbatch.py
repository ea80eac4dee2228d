"""Several script calls in one round trip (:class:`~memtier.engine.ScriptBatch`).

:func:`run_script_batch` sends a batch on a sync client's lean path: one pipeline on a
standalone server, one per primary on a Redis Cluster.  :func:`run_script_batch_pipelined`
is its asyncio twin: every call queued at once in the auto-pipeline (on a cluster, its
primary's), awaited by the one coroutine that sent the batch.  Both give the replies
in the calls' order, re-send a call the server answered NOSCRIPT (or, on a cluster,
``MOVED`` / ``ASK``) alone in its place, and raise the first failed call's error only
after every reply of the batch was read, so nothing of it is left in flight.

Why a batch path of its own on asyncio: sent as one task per call (each with its own
retries, guard and future), a restore's batches of 16 ``restore_session`` calls cost
the restoring process about 1.6 times the client CPU of the sync restore
(docs/performance.md, "The asyncio restore's batches in one coroutine").
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError
from redis.exceptions import ResponseError as RedisResponseError

from memtier.aioleancluster import AsyncClusterLean
from memtier.leancluster import ClusterLean
from memtier.scripts import LuaScript, _is_moved, _raise_script_error

if TYPE_CHECKING:
    from memtier.autopipeline import AutoPipeline
    from memtier.connection import DuringWork, LeanPool

__all__ = ["run_script_batch", "run_script_batch_pipelined"]


def run_script_batch(
    lean: LeanPool | ClusterLean,
    client: Any,
    items: Sequence[tuple[LuaScript, Sequence[str], Sequence[Any]]],
    during: DuringWork | None = None,
) -> list[Any]:
    """Run several scripts in one non-transactional pipeline on a sync client, packed and
    sent by its lean path ``lean``: on a standalone server one write on one connection
    (:class:`~memtier.connection.LeanPool`), on a Redis Cluster one write to each primary
    (:meth:`ClusterLean.pipeline`).  Their replies, in order.

    A call the server answers NOSCRIPT, ``MOVED`` or ``ASK`` is re-sent alone through
    :meth:`LuaScript.__call__` on ``client`` (which loads the script, or follows the
    redirect and patches the slot map), in its place in the batch's order (the calls
    after it already ran).  Errors as :meth:`LuaScript.__call__` (the first failed call
    raises); each script's duration metric gets its share of the round trip (less
    ``during``'s time: it runs between the write and the first read, as in
    :meth:`LeanPool.pipeline`).
    """
    started = time.perf_counter()
    commands = tuple(
        ("EVALSHA", *script._args(script.sha, keys, args)) for script, keys, args in items
    )
    cluster: ClusterLean | None = None
    if isinstance(lean, ClusterLean):  # (every memtier script has keys, all on one slot)
        cluster = lean
        slots = [lean.slot(keys[0]) for _, keys, _ in items]
        replies = lean.pipeline(slots, commands, during)
    else:
        replies = lean.pipeline(commands, during)
    elapsed = time.perf_counter() - started - (during.seconds if during is not None else 0.0)
    share = max(0.0, elapsed) / max(1, len(items))
    out: list[Any] = []
    for (script, keys, args), reply in zip(items, replies, strict=True):
        moved = cluster is not None and _is_moved(reply)
        if moved or isinstance(reply, NoScriptError):
            if moved and cluster is not None:
                cluster.redirects += 1
            reply = script(client, keys, args)
        else:
            script._duration.observe(share)
            _raise_failed(script, reply)
        out.append(reply)
    return out


async def run_script_batch_pipelined(
    router: AutoPipeline | AsyncClusterLean,
    client: Any,
    items: Sequence[tuple[LuaScript, Sequence[str], Sequence[Any]]],
    packed: list[list[bytes]],
) -> list[Any]:
    """:func:`run_script_batch` on an asyncio client: every call queued at once, by the
    one coroutine that sent the batch, in the auto-pipeline of a standalone client
    (:meth:`AutoPipeline.submit`) or of each call's primary on a Redis Cluster
    (:meth:`AsyncClusterLean.submit`): one write per pipeline while the calls fit its
    bounds, one future per call and no task, the futures awaited together.

    Each call is packed once into ``packed`` (empty on the first attempt; the caller keeps
    it across its retries, which re-queue the same bytes, as a single pipelined call
    does), whole with hiredis, as :func:`run_script_batch` packs (a bound call's wire
    plan packs the restore's counted tail of records slower than that).  A call answered
    NOSCRIPT is sent again alone on its lean path, which loads the script; on a cluster a
    call answered ``MOVED`` / ``ASK`` goes once through redis-py's generic path (which
    follows the redirect and patches the slot map) under a guard slot; both in the
    call's place in the order.  The first failed call raises, after every reply arrived;
    each script's duration metric gets its share of the round trip.
    """
    pack = router.pack
    if not packed:
        packed.extend(pack(("EVALSHA", *s._args(s.sha, k, a))) for s, k, a in items)
    started = time.perf_counter()
    slots: list[int] = []
    # (gather, not a loop of awaits: a cancelled caller cancels every call not yet sent)
    if isinstance(router, AsyncClusterLean):
        slots = [router.slot(keys[0]) for _, keys, _ in items]
        futures = list(map(router.submit, slots, packed))
    else:
        futures = list(map(router.submit, packed))
    replies = await asyncio.gather(*futures, return_exceptions=True)
    share = (time.perf_counter() - started) / max(1, len(items))
    out: list[Any] = []
    for n, ((script, keys, args), one, reply) in enumerate(
        zip(items, packed, replies, strict=True)
    ):
        if isinstance(router, AsyncClusterLean) and _is_moved(reply):
            router.redirects += 1
            reply = await router.generic(functools.partial(script.call_async, client, keys, args))
        elif isinstance(reply, NoScriptError):  # the call's own lean path loads the script
            if isinstance(router, AsyncClusterLean):
                reply = await script.call_lean_cluster_async(
                    router, slots[n], client, keys, args, one
                )
            else:
                reply = await script.call_pipelined(router, client, keys, args, one)
        else:
            script._duration.observe(share)
            _raise_failed(script, reply)
        out.append(reply)
    return out


def _raise_failed(script: LuaScript, reply: Any) -> None:
    """Raise ``reply`` if it is an error, as a single call of ``script`` would."""
    if isinstance(reply, RedisResponseError):
        _raise_script_error(script.name, reply)
        raise reply
    if isinstance(reply, BaseException):
        raise reply
