"""The one sans-I/O engine of memtier: the request vocabulary and its driver pair.

Every public operation of conversation memory and of conversation threads is a *plan*:
a generator that yields requests and receives each reply back (or has the exception
thrown into it, so it can clean up or translate it).  Its return value is the result.
The plan never touches a socket, a file descriptor of Redis, or a clock of its own
beyond what its core was given; the shells only drive it:

* :func:`drive_sync` runs a plan with a synchronous ``execute``;
* :func:`drive_async` runs it with an awaitable ``execute``.  Plans that do blocking
  work between requests (snapshot files, a blocking summarizer hook) are driven with
  ``offload=True``, which advances the generator in a worker thread so the event loop
  never stalls; the hot paths (append, context) step inline.

:class:`~memtier.executor.SyncExecutor` and :class:`~memtier.executor.AsyncExecutor`
perform the requests (guard, retry, scripts); workers and the bench use them too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

if TYPE_CHECKING:
    from memtier.resppack import WirePlan
    from memtier.scripts import Durable

__all__ = [
    "Batch",
    "Command",
    "Handoff",
    "Overlap",
    "PlainHead",
    "Plan",
    "ReadCommand",
    "Request",
    "ScriptBatch",
    "ScriptCall",
    "Sleep",
    "Transaction",
    "drive_async",
    "drive_sync",
]

T = TypeVar("T")

_NO_KWARGS: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """Run one Lua script: its name, KEYS and ARGV (all encoded).

    ``attempts`` (if given) counts the tries the executor made (a plan that must know
    whether a lost reply may have applied reads it); ``durable`` asks the executor to
    ``WAIT`` for replicas after the script (``durability="replicated"``).
    """

    script: str
    keys: tuple[str, ...]
    args: tuple[str | int | bytes, ...]
    attempts: list[int] | None = field(default=None, compare=False)
    durable: Durable | None = None
    # The packed bytes' plan, set by BoundSpec.call: the lean paths pack with it where
    # they would pack with hiredis; a call whose fixed values are not the plan's (derived
    # with dataclasses.replace, say) is packed whole (memtier.resppack checks).
    wire: WirePlan | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Command:
    """One plain redis-py client call: ``getattr(client, method)(*args, **kwargs)``.

    Only commands that are safe to re-send after a lost reply are used (reads, XACK,
    XDEL, SET NX of a value that is the same on every attempt).
    """

    method: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=lambda: _NO_KWARGS)


@dataclass(frozen=True, slots=True)
class Batch:
    """Several :class:`Command` s in one non-transactional pipeline (keys on one slot)."""

    commands: tuple[Command, ...]


# One single-key read command, raw: (name, key, *args), e.g. ("LRANGE", key, -20, -1).
ReadCommand: TypeAlias = tuple[str | int | bytes, ...]


@dataclass(frozen=True, slots=True)
class PlainHead:
    """What a :class:`Transaction`'s script reads, as plain commands, and the pure
    function that turns their replies into the script's reply.

    Why: the script's own cost in Redis (``EVALSHA``, its ``redis.call``s, the reply
    table) is most of a short read's server time (``bench.readserver``: 15 -> 3.4 us
    per context read of 20 turns at 300 B).  A shell whose transaction is packed by hand
    sends these commands instead; one that goes through redis-py's pipelines sends the
    script (redis-py's cluster pipeline refuses keyless commands such as ``TIME``).
    ``fold`` sees only values read inside the one ``MULTI`` / ``EXEC``, so its verdict
    is as atomic as the script's; the same reply either way (tests pin it).
    """

    commands: tuple[ReadCommand, ...]
    fold: Callable[[Sequence[Any]], Any]


@dataclass(frozen=True, slots=True)
class Transaction:
    """``MULTI``, one read-only script, plain read commands, ``EXEC``: one round trip.

    The script decides what must be atomic (an expiry verdict); the reads return data
    the script never copies (a list of records).  All keys share one slot (one hash
    tag), so the transaction runs on one node of a Cluster.  The reply is
    ``[script reply, read reply, ...]``; a re-send after a lost reply is safe (nothing
    in it writes).  ``plain``: the script's reads as plain commands, for the shells
    that pack the transaction themselves (:class:`PlainHead`); the reply is the same.

    ``packed``: the bytes a shell that packs the transaction itself sent, kept for the
    next send of this same request (its retries, and every read of a core's kept
    context request: :meth:`memtier.memory.core.MemoryCore.context_call`).  Opaque to
    the core; a shell fills it whole in one assignment (``packed[:] = ...``), so two
    threads packing one request at once leave one copy of the same bytes.
    """

    script: ScriptCall
    reads: tuple[ReadCommand, ...]
    plain: PlainHead | None = None
    # Not an __init__ argument, so a request derived with dataclasses.replace starts
    # empty: its bytes differ.
    packed: list[Any] = field(default_factory=list, init=False, compare=False, repr=False)

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key the transaction touches (the script's, then each read's)."""
        return (*self.script.keys, *(str(read[1]) for read in self.reads))


@dataclass(frozen=True, slots=True)
class ScriptBatch:
    """Several independent :class:`ScriptCall` s in one round trip; the reply is the list
    of their replies, in order.

    Each script still runs alone and atomically (its keys on one slot; the calls may be
    on different slots), but the batch is not a transaction: other clients' commands
    may run between its calls, and the calls may run in another order (a lost reply
    re-sends the whole batch, a call the server did not have loaded, or on a cluster
    whose slot moved, is re-sent alone).  Only for calls that are safe to re-send and
    do not depend on each other (the restore's create-only ``restore_session`` calls).
    Sync clients send one pipeline (on a Redis Cluster one per primary); asyncio clients
    queue the calls at once in the auto-pipeline (on a cluster, each call's primary's);
    other clients (fakeredis, no auto-pipelining) run the calls one by one: the same
    replies, more round trips.  The
    plan bounds the batch (its calls and bytes).
    """

    calls: tuple[ScriptCall, ...]


@dataclass(frozen=True, slots=True)
class Overlap:
    """Perform ``request`` while ``work()`` runs: the reply is the request's.

    ``work`` is the plan's own CPU and file work that does not need this reply and
    touches no Redis (the flush writes the previous page while the next one is read; the
    restore reads the next batch while the last one is restored), so the server's time
    and the client's overlap.  The executor runs ``work`` once and returns only when
    both are done: nothing is left in flight.  The sync executor runs it between the
    write of a lean script call or script batch and its read (a batch sent call by call:
    beside its first call; else before the request), the asyncio one in a worker thread
    while the request is a task on the loop.  If ``work`` raises, its error is thrown
    into the plan (a request written has been read); otherwise the request's error, if
    any.
    """

    request: ScriptCall | ScriptBatch | Command
    work: Callable[[], None]


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait ``seconds`` (a bounded poll, e.g. while another worker restores)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Handoff:
    """Work only the host can do (run an agent turn); the shell's executor performs it."""

    work: Any


Request: TypeAlias = (
    ScriptCall | Transaction | ScriptBatch | Overlap | Command | Batch | Sleep | Handoff
)
Plan: TypeAlias = Generator[Request, Any, T]
# What a driver needs: perform one request that is not a Sleep.
SyncExecute: TypeAlias = Callable[[Request], Any]
AsyncExecute: TypeAlias = Callable[[Request], Awaitable[Any]]


def drive_sync(plan: Plan[T], execute: SyncExecute) -> T:
    """Run ``plan`` to completion; ``execute`` performs each request but :class:`Sleep`."""
    reply: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                request = plan.throw(error) if error is not None else plan.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            reply, error = None, None
            try:
                if isinstance(request, Sleep):
                    time.sleep(max(0.0, request.seconds))
                else:
                    reply = execute(request)
            except Exception as exc:  # handed to the plan, which re-raises after cleanup
                error = exc
    finally:
        plan.close()


async def drive_async(plan: Plan[T], execute: AsyncExecute, *, offload: bool = False) -> T:
    """Asyncio twin of :func:`drive_sync`.

    ``offload``: advance the generator in a worker thread (:func:`asyncio.to_thread`),
    for plans that do blocking file I/O or call a blocking hook between requests.
    """
    reply: Any = None
    error: BaseException | None = None

    def step(reply: Any, error: BaseException | None) -> tuple[bool, Any]:
        try:
            return False, (plan.throw(error) if error is not None else plan.send(reply))
        except StopIteration as stop:
            return True, stop.value

    try:
        while True:
            if offload:
                done, value = await asyncio.to_thread(step, reply, error)
            else:
                done, value = step(reply, error)
            if done:
                return value  # type: ignore[no-any-return]
            reply, error = None, None
            try:
                if isinstance(value, Sleep):
                    await asyncio.sleep(max(0.0, value.seconds))
                else:
                    reply = await execute(value)
            except Exception as exc:
                error = exc
    finally:
        _close(plan)


def _close(plan: Plan[Any]) -> None:
    # A cancelled drive_async may leave an offloaded step still running in its thread:
    # closing a running generator raises ValueError; that step ends the plan itself.
    try:
        plan.close()
    except ValueError:
        pass
