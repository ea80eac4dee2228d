"""Loads ``lua/`` and calls scripts by SHA, recovering NOSCRIPT transparently.

File names carry the number of KEYS a script takes (``append_turn-9.lua``);
the loader parses it and every call asserts ``len(keys) == N``.  Files
without ``-N`` are includes, pulled in by a line ``--- @include "name"``
(missing, circular or duplicate includes are errors).  The SHA is over the
expanded text, which is also what ``SCRIPT LOAD`` receives.

NOSCRIPT (a Redis restart, ``SCRIPT FLUSH``, or a failover to a Cluster
replica whose script cache is empty) reloads the script once and re-sends.

Every script starts with a shebang line, so Redis 7 knows before running it whether
it may write.  A write script (``#!lua``) is refused whole, before any effect, while the
server is out of memory or cannot persist (OOM, MISCONF): without a shebang Redis would
run it and fail only the first memory-growing command, after a ``DEL`` had already run.
A read-only script (``#!lua flags=no-writes``) runs during ``CLIENT PAUSE WRITE`` and on
replicas, instead of stalling reads for the whole pause.
fakeredis (the embedded backend) cannot parse a shebang in ``EVAL``, so it gets the
same text with that first line turned into a Lua comment (:attr:`LuaScript.embedded`),
under that text's own SHA.
"""

from __future__ import annotations

import hashlib
import re
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redis.exceptions import AskError, MovedError, NoScriptError
from redis.exceptions import ResponseError as RedisResponseError

from memtier import metrics
from memtier.errors import OutcomeUnknownError, ScriptError, TransientBackendError
from memtier.leancluster import ClusterLean

if TYPE_CHECKING:
    from memtier.aioleancluster import AsyncClusterLean
    from memtier.autopipeline import AutoPipeline
    from memtier.connection import DuringWork, LeanPool
    from memtier.engine import PlainHead, ReadCommand
    from memtier.resppack import WirePlan

__all__ = [
    "Durable",
    "LuaScript",
    "ScriptRegistry",
    "ScriptText",
    "is_embedded_client",
    "load_registry",
    "lua_root",
]

_NAME_RE = re.compile(r"^(?P<name>[a-z_]+)-(?P<keys>\d+)\.lua$")
_INCLUDE_RE = re.compile(r'^\s*---\s*@include\s+"(?P<name>[A-Za-z0-9_/]+)"\s*$', re.MULTILINE)
_MAX_INCLUDE_DEPTH = 8  # includes of includes; the tree is shallow by design
_SHEBANG_RE = re.compile(r"^#!lua(?: flags=(?P<flags>[a-z,-]*))?\r?\n")
_KNOWN_FLAGS = frozenset({"no-writes", "allow-oom", "allow-stale", "no-cluster"})
_EMBEDDED_CLIENTS: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _probe_embedded(client: Any) -> bool:
    if type(client).__module__.split(".", 1)[0] == "fakeredis":
        return True
    # A wrapper (a tracing proxy, a test double) that forwards to a fakeredis client.
    pool = getattr(client, "connection_pool", None)
    connection_class = getattr(pool, "connection_class", None)
    return connection_class is not None and str(connection_class.__module__).startswith("fakeredis")


def is_embedded_client(client: Any) -> bool:
    """True for a fakeredis client (the embedded backend), decided once per client."""
    try:
        return _EMBEDDED_CLIENTS[client]
    except KeyError:
        found = _EMBEDDED_CLIENTS[client] = _probe_embedded(client)
        return found
    except TypeError:  # a client that cannot be weakly referenced: ask every time
        return _probe_embedded(client)


def lua_root() -> Path:
    """Where the Lua sources are: ``memtier/_lua`` in a wheel, ``lua/`` in a checkout."""
    packaged = resources.files("memtier") / "_lua"
    if packaged.is_dir():
        return Path(str(packaged))
    checkout = Path(__file__).resolve().parent.parent / "lua"
    if checkout.is_dir():
        return checkout
    raise ScriptError("memtier's Lua scripts are missing from this installation")


def expand_includes(
    text: str,
    root: Path,
    *,
    _stack: tuple[str, ...] = (),
    _included: set[str] | None = None,
) -> str:
    """Inline ``--- @include "name"`` lines from ``root/includes/name.lua``.

    An include reached a second time through another include is inlined once only
    (its ``local function``s are already in scope); naming it twice in one file is
    an error, and so is a cycle.
    """
    included: set[str] = set() if _included is None else _included
    seen: set[str] = set()

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name in _stack:
            raise ScriptError(f"circular Lua include: {' -> '.join((*_stack, name))}")
        if name in seen:
            raise ScriptError(f"duplicate Lua include {name!r}")
        if len(_stack) >= _MAX_INCLUDE_DEPTH:
            raise ScriptError("Lua includes nested too deeply")
        seen.add(name)
        path = root / "includes" / f"{name}.lua"
        if not path.is_file():
            raise ScriptError(f"missing Lua include {name!r} ({path})")
        if name in included:
            return f"-- (include {name!r} already inlined above)"
        included.add(name)
        return expand_includes(
            path.read_text(encoding="utf-8"), root, _stack=(*_stack, name), _included=included
        )

    return _INCLUDE_RE.sub(replace, text)


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8"), usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class ScriptText:
    """One text of a script as sent to a server, with its SHA1."""

    source: str
    sha: str

    @classmethod
    def of(cls, source: str) -> ScriptText:
        return cls(source, _sha1(source))


@dataclass(frozen=True)
class LuaScript:
    """One atomic operation: expanded source, its SHA1, its KEYS count and shebang flags."""

    name: str
    num_keys: int
    source: str
    sha: str
    flags: frozenset[str] = frozenset()
    embedded: ScriptText | None = None  # the fakeredis text, when it differs

    @classmethod
    def from_file(cls, path: Path, root: Path) -> LuaScript:
        match = _NAME_RE.match(path.name)
        if match is None:
            raise ScriptError(f"Lua script name {path.name!r} lacks its -<numkeys> suffix")
        source = expand_includes(path.read_text(encoding="utf-8"), root)
        flags: frozenset[str] = frozenset()
        embedded = None
        shebang = _SHEBANG_RE.match(source)
        if shebang is not None:
            flags = frozenset(filter(None, (shebang.group("flags") or "").split(",")))
            unknown = flags - _KNOWN_FLAGS
            if unknown:
                raise ScriptError(f"{path.name}: unknown script flags {sorted(unknown)}")
            # Same line count (error line numbers match); lupa reads it as a comment.
            embedded = ScriptText.of("--" + source[2:])
        elif source.startswith("#!"):
            raise ScriptError(f"{path.name}: malformed shebang line (want '#!lua flags=...')")
        return cls(
            match.group("name"), int(match.group("keys")), source, _sha1(source), flags, embedded
        )

    @property
    def read_only(self) -> bool:
        return "no-writes" in self.flags

    def text_for(self, client: Any) -> ScriptText:
        """The text (and SHA) that ``client``'s server runs: fakeredis gets no shebang."""
        if self.embedded is not None and is_embedded_client(client):
            return self.embedded
        return ScriptText(self.source, self.sha)

    @cached_property
    def _duration(self) -> Any:
        """This script's ``SCRIPT_DURATION`` child, looked up once (not per call)."""
        return metrics.SCRIPT_DURATION.labels(self.name)

    def _args(self, sha: str, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
        if len(keys) != self.num_keys:
            raise ScriptError(f"{self.name} takes {self.num_keys} keys, got {len(keys)}")
        return (sha, self.num_keys, *keys, *args)

    def _pack_wire(
        self,
        packed: list[Any],
        wire: WirePlan | None,
        alike: bool,
        keys: Sequence[str],
        args: Sequence[Any],
    ) -> None:
        """Fill ``packed`` (empty: the first attempt) from a bound call's ``wire`` plan
        where the path would pack with hiredis (``alike``: UTF-8, strict); the same bytes
        as packing the whole call (memtier.resppack)."""
        if wire is not None and alike and not packed and len(keys) == self.num_keys:
            wired = wire.pack(self.sha, tuple(keys) + tuple(args))
            if wired is not None:
                packed.append(wired)

    # --- one shape for every call: the duration metric, memtier's error mapping, and
    # NOSCRIPT answered by loading the text and re-sending the same call once -----------
    def _call(
        self, send: Callable[[], Any], load: Callable[[], Any], during: DuringWork | None = None
    ) -> Any:
        started = time.perf_counter()
        try:
            return _resent_once(send, load)
        except RedisResponseError as exc:
            _raise_script_error(self.name, exc)
            raise
        finally:
            # The round trip's latency: not the caller's work run while it was in flight.
            spent = 0.0 if during is None else during.seconds
            self._duration.observe(time.perf_counter() - started - spent)

    async def _call_async(
        self, send: Callable[[], Awaitable[Any]], load: Callable[[], Awaitable[Any]]
    ) -> Any:
        started = time.perf_counter()
        try:
            try:
                return await send()
            except NoScriptError:
                await load()
                return await send()
        except RedisResponseError as exc:
            _raise_script_error(self.name, exc)
            raise
        finally:
            self._duration.observe(time.perf_counter() - started)

    def __call__(self, client: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run on a sync redis-py client (standalone or cluster)."""
        text = self.text_for(client)
        call = self._args(text.sha, keys, args)
        return self._call(lambda: client.evalsha(*call), lambda: client.script_load(text.source))

    def _evalsha(self, client: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """``EVALSHA`` through ``client``'s own command machinery, NOSCRIPT reloaded once
        (inside a call already timed: the lean paths' fallback)."""
        text = self.text_for(client)
        call = self._args(text.sha, keys, args)
        return _resent_once(lambda: client.evalsha(*call), lambda: client.script_load(text.source))

    def call_lean_cluster(
        self,
        lean: ClusterLean,
        slot: int,
        client: Any,
        keys: Sequence[str],
        args: Sequence[Any],
        packed: list[Any],
        wire: WirePlan | None = None,
        during: DuringWork | None = None,
    ) -> Any:
        """:meth:`call_lean` on a Redis Cluster client: sent to ``slot``'s primary by
        ``lean`` (:func:`memtier.leancluster.lean_cluster`).  NOSCRIPT loads the script on
        every primary and re-sends the same bytes.  A ``MOVED`` / ``ASK`` reply means that
        node ran nothing: the call goes once through redis-py's generic cluster path,
        which follows the redirect (``ASKING`` on the importing node) and patches the
        slot map the next lean call reads."""
        self._pack_wire(packed, wire, lean.packs_alike, keys, args)
        call = ("EVALSHA", *self._args(self.sha, keys, args)) if not packed else ("EVALSHA",)

        def send() -> Any:
            try:
                return lean.execute(slot, call, packed, during)
            except (MovedError, AskError):
                lean.redirects += 1
                return self._evalsha(client, keys, args)

        return self._call(send, lambda: client.script_load(self.source), during)

    def call_lean(
        self,
        lean: LeanPool,
        client: Any,
        keys: Sequence[str],
        args: Sequence[Any],
        packed: list[Any],
        wire: WirePlan | None = None,
        during: DuringWork | None = None,
    ) -> Any:
        """:meth:`__call__` on the lean path: the EVALSHA packed once into ``packed``
        (kept by the caller across its retries) and sent with ``lean``, a standalone
        client's pool (:func:`memtier.connection.lean_pool`; never fakeredis, so the
        text is :attr:`source`).  NOSCRIPT reloads through ``client`` and re-sends the same
        bytes; errors, the duration metric and ``memtier:`` rejections as :meth:`__call__`.
        ``during``: run between the send and the read (:class:`DuringWork`)."""
        self._pack_wire(packed, wire, lean.packs_alike, keys, args)
        call = ("EVALSHA", *self._args(self.sha, keys, args)) if not packed else ("EVALSHA",)
        return self._call(
            lambda: lean.execute(call, packed, during),
            lambda: client.script_load(self.source),
            during,
        )

    async def call_pipelined(
        self,
        pipeline: AutoPipeline,
        client: Any,
        keys: Sequence[str],
        args: Sequence[Any],
        packed: list[bytes],
        wire: WirePlan | None = None,
    ) -> Any:
        """:meth:`call_async` auto-pipelined: the EVALSHA packed once into ``packed`` (kept
        by the caller across its retries) and queued on ``pipeline`` (a standalone asyncio
        client's pool, :func:`memtier.connection.lean_async_pool`; never fakeredis, so the
        text is :attr:`source`).  NOSCRIPT reloads through ``client`` and re-queues the same
        bytes; errors, the duration metric and ``memtier:`` rejections as :meth:`__call__`."""
        self._pack_wire(packed, wire, pipeline.pack.packs_alike, keys, args)
        if not packed:
            packed.extend(pipeline.pack(("EVALSHA", *self._args(self.sha, keys, args))))
        return await self._call_async(
            lambda: pipeline.call(packed), lambda: client.script_load(self.source)
        )

    async def call_lean_cluster_async(
        self,
        lean: AsyncClusterLean,
        slot: int,
        client: Any,
        keys: Sequence[str],
        args: Sequence[Any],
        packed: list[bytes],
        wire: WirePlan | None = None,
    ) -> Any:
        """:meth:`call_async` on an asyncio Redis Cluster client's lean path: the EVALSHA
        packed once into ``packed`` and written to ``slot``'s primary by ``lean``
        (:func:`memtier.aioleancluster.lean_cluster_async`).  NOSCRIPT loads the script on
        every primary (under one of the guard's slots: :meth:`AsyncClusterLean.generic`)
        and re-sends the same bytes.  A ``MOVED`` / ``ASK`` reply means that
        node ran nothing: the call goes once through redis-py's generic cluster path,
        which follows the redirect and patches the slot map the next lean call reads."""
        self._pack_wire(packed, wire, lean.pack.packs_alike, keys, args)
        if not packed:
            packed.extend(lean.pack(("EVALSHA", *self._args(self.sha, keys, args))))

        async def send() -> Any:
            try:
                return await lean.execute(slot, packed)
            except (MovedError, AskError):
                lean.redirects += 1
                return await lean.generic(lambda: client.evalsha(*self._args(self.sha, keys, args)))

        # The load under a guard slot too: the calls of one batch meet NOSCRIPT together,
        # and each load takes a connection on every primary (redis-py's cluster nodes
        # raise, never wait, past max_connections).
        return await self._call_async(
            send, lambda: lean.generic(lambda: client.script_load(self.source))
        )

    async def call_async(self, client: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run on an asyncio redis-py client (standalone or cluster)."""
        text = self.text_for(client)
        call = self._args(text.sha, keys, args)
        return await self._call_async(
            lambda: client.evalsha(*call), lambda: client.script_load(text.source)
        )

    # --- in a transaction: MULTI, this script, plain reads, EXEC (one round trip) --------
    # NOSCRIPT is an element of the EXEC reply (Redis 7 queues an unknown SHA and fails
    # it when EXEC runs it; the reads after it still run), or -- on a server that checks
    # the SHA while queueing -- the refusal that aborted the EXEC: either way load the
    # text and re-send the whole transaction once.  A second NOSCRIPT is raised as
    # __call__ raises it.
    def _exec_replies(self, replies: Any, last: bool) -> list[Any] | None:
        """The EXEC reply, checked: None means "not loaded, load and re-send"."""
        if not isinstance(replies, list) or not replies:  # None: a WATCH failed (none here)
            raise ScriptError(f"{self.name}: malformed EXEC reply {type(replies).__name__}")
        first = replies[0]
        if isinstance(first, NoScriptError) and not last:
            return None
        if isinstance(first, RedisResponseError):
            _raise_script_error(self.name, first)
        for reply in replies:
            if isinstance(reply, MovedError | AskError):
                raise _slot_moved(reply)
            if isinstance(reply, Exception):
                raise reply
        return replies

    def _transaction_commands(
        self, keys: Sequence[str], args: Sequence[Any], reads: Sequence[ReadCommand]
    ) -> tuple[tuple[Any, ...], ...]:
        """``MULTI``, this script by SHA, ``reads``, ``EXEC``: the packed transactions."""
        return (("MULTI",), ("EVALSHA", *self._args(self.sha, keys, args)), *reads, ("EXEC",))

    def _transaction(self, send: Callable[[], Any], load: Callable[[], Any]) -> list[Any]:
        """Send a transaction (``send`` returns EXEC's reply), re-sent once after NOSCRIPT;
        timed and mapped as :meth:`_call`."""
        started = time.perf_counter()
        try:
            for attempt in range(2):
                try:
                    replies = send()
                except NoScriptError:  # refused while queueing (EXECABORT): nothing ran
                    if attempt == 1:
                        raise
                    replies = None
                checked = None if replies is None else self._exec_replies(replies, attempt == 1)
                if checked is not None:
                    return checked
                load()
            raise AssertionError("unreachable")  # pragma: no cover
        except RedisResponseError as exc:
            _raise_script_error(self.name, exc)
            raise
        finally:
            self._duration.observe(time.perf_counter() - started)

    async def _transaction_async(
        self, send: Callable[[], Awaitable[Any]], load: Callable[[], Awaitable[Any]]
    ) -> list[Any]:
        """The asyncio twin of :meth:`_transaction`."""
        started = time.perf_counter()
        try:
            for attempt in range(2):
                try:
                    replies = await send()
                except NoScriptError:  # refused while queueing (EXECABORT): nothing ran
                    if attempt == 1:
                        raise
                    replies = None
                checked = None if replies is None else self._exec_replies(replies, attempt == 1)
                if checked is not None:
                    return checked
                await load()
            raise AssertionError("unreachable")  # pragma: no cover
        except RedisResponseError as exc:
            _raise_script_error(self.name, exc)
            raise
        finally:
            self._duration.observe(time.perf_counter() - started)

    # --- the same transaction with the script's reads as plain commands (PlainHead) -------
    # No script is sent, so there is no NOSCRIPT to handle; the reply handed back is the
    # script's (folded from the plain replies), the metric the script's duration.
    def _lean_transaction_commands(
        self,
        keys: Sequence[str],
        args: Sequence[Any],
        reads: Sequence[ReadCommand],
        plain: PlainHead | None,
    ) -> tuple[tuple[Any, ...], ...]:
        """What a lean path packs: the script's transaction, or with ``plain`` the same
        with the script's reads as plain commands.  One reply per command, EXEC's last."""
        if plain is None:
            return self._transaction_commands(keys, args, reads)
        return (("MULTI",), *plain.commands, *reads, ("EXEC",))

    def _folded(self, replies: Any, plain: PlainHead, reads: int) -> list[Any]:
        """EXEC's reply to a plain transaction, checked, as ``[script reply, *reads]``
        (a :class:`_Checked` reply of the script's path is that already)."""
        if isinstance(replies, _Checked):
            return replies.replies
        head = len(plain.commands)
        if not isinstance(replies, list) or len(replies) != head + reads:
            raise ScriptError(f"{self.name}: malformed EXEC reply {type(replies).__name__}")
        for reply in replies:
            if isinstance(reply, MovedError | AskError):
                raise _slot_moved(reply)
            if isinstance(reply, Exception):
                raise reply
        return [plain.fold(replies[:head]), *replies[head:]]

    def _plain_transaction(
        self, send: Callable[[], Any], plain: PlainHead, reads: int
    ) -> list[Any]:
        """Send a plain transaction (``send`` returns EXEC's reply, or a
        :class:`_Checked` reply of the script's path); timed and mapped as :meth:`_call`."""
        started = time.perf_counter()
        try:
            return self._folded(send(), plain, reads)
        except RedisResponseError as exc:
            _raise_script_error(self.name, exc)
            raise
        finally:
            self._duration.observe(time.perf_counter() - started)

    async def _plain_transaction_async(
        self, send: Callable[[], Awaitable[Any]], plain: PlainHead, reads: int
    ) -> list[Any]:
        """The asyncio twin of :meth:`_plain_transaction`."""
        started = time.perf_counter()
        try:
            return self._folded(await send(), plain, reads)
        except RedisResponseError as exc:
            _raise_script_error(self.name, exc)
            raise
        finally:
            self._duration.observe(time.perf_counter() - started)

    def _queued(self, pipe: Any, call: tuple[Any, ...], reads: Sequence[ReadCommand]) -> Any:
        # execute_command: redis-py's ClusterPipeline blocks its evalsha() method
        pipe.execute_command("EVALSHA", *call)
        for read in reads:
            pipe.execute_command(*read)
        return pipe

    def call_transaction(
        self, client: Any, keys: Sequence[str], args: Sequence[Any], reads: Sequence[ReadCommand]
    ) -> list[Any]:
        """``MULTI`` + ``EVALSHA`` + ``reads`` + ``EXEC`` on a sync redis-py client
        (standalone: its transactional pipeline; Cluster: redis-py's ``ClusterPipeline``
        transaction, every key on one slot).  Returns ``[script reply, *read replies]``."""
        text = self.text_for(client)
        call = self._args(text.sha, keys, args)

        def send() -> Any:
            pipe = self._queued(client.pipeline(transaction=True), call, reads)
            try:
                return pipe.execute(raise_on_error=False)
            except (MovedError, AskError) as exc:  # Cluster: nothing ran; retried
                raise _slot_moved(exc) from exc

        return self._transaction(send, lambda: client.script_load(text.source))

    def call_transaction_lean(
        self,
        lean: LeanPool | ClusterLean,
        client: Any,
        keys: Sequence[str],
        args: Sequence[Any],
        reads: Sequence[ReadCommand],
        packed: list[Any],
        slot: int = -1,
        plain: PlainHead | None = None,
    ) -> list[Any]:
        """:meth:`call_transaction` on the lean path: the whole transaction packed once
        into ``packed`` (kept by the caller across its retries and the NOSCRIPT re-send)
        and sent with ``lean`` -- a standalone client's pool, or on a Redis Cluster the
        primary of ``slot`` (every key of the transaction is on it).  A ``MOVED`` /
        ``ASK`` there means nothing ran (the EXEC aborted): the transaction goes once
        through redis-py's ``ClusterPipeline``, which raises it as a retryable fault.
        With ``plain``, the script's reads go as plain commands (:class:`PlainHead`)."""
        commands = self._lean_transaction_commands(keys, args, reads, plain)
        count = len(commands)

        def send() -> Any:
            if not isinstance(lean, ClusterLean):
                return lean.transaction(commands, count, packed)
            try:
                return lean.transaction(slot, commands, count, packed)
            except (MovedError, AskError):
                lean.redirects += 1
                # Checked already (so checked again unchanged): nothing of it is an error.
                checked = self.call_transaction(client, keys, args, reads)
                return checked if plain is None else _Checked(checked)

        if plain is not None:
            return self._plain_transaction(send, plain, len(reads))
        return self._transaction(send, lambda: client.script_load(self.source))

    async def call_transaction_pipelined(
        self,
        pipeline: AutoPipeline,
        client: Any,
        keys: Sequence[str],
        args: Sequence[Any],
        reads: Sequence[ReadCommand],
        packed: list[bytes],
        plain: PlainHead | None = None,
    ) -> list[Any]:
        """:meth:`call_transaction` auto-pipelined: the whole ``MULTI`` ... ``EXEC`` packed
        once into ``packed`` and queued on ``pipeline`` as one entry (its commands stay
        contiguous on the connection, so the transaction is intact inside the batch).
        With ``plain``, the script's reads go as plain commands (:class:`PlainHead`)."""
        commands = self._lean_transaction_commands(keys, args, reads, plain)
        count = len(commands)
        if not packed:  # one assignment: a racing sender writes the same bytes
            packed[:] = [chunk for command in commands for chunk in pipeline.pack(command)]
        if plain is not None:
            return await self._plain_transaction_async(
                lambda: pipeline.call(packed, count), plain, len(reads)
            )
        return await self._transaction_async(
            lambda: pipeline.call(packed, count), lambda: client.script_load(self.source)
        )

    async def call_transaction_lean_cluster_async(
        self,
        lean: AsyncClusterLean,
        slot: int,
        client: Any,
        keys: Sequence[str],
        args: Sequence[Any],
        reads: Sequence[ReadCommand],
        packed: list[bytes],
        plain: PlainHead | None = None,
    ) -> list[Any]:
        """:meth:`call_transaction_async` on an asyncio Redis Cluster client's lean path:
        the whole ``MULTI`` ... ``EXEC`` packed once into ``packed`` and written to
        ``slot``'s primary (every key of the transaction is on it).  A ``MOVED`` / ``ASK``
        there means nothing ran (the EXEC aborted): the transaction goes once through
        redis-py's ``ClusterPipeline``, which raises it as a retryable fault.  With
        ``plain``, the script's reads go as plain commands (:class:`PlainHead`)."""
        commands = self._lean_transaction_commands(keys, args, reads, plain)
        count = len(commands)
        if not packed:  # one assignment: a racing sender writes the same bytes
            packed[:] = [chunk for command in commands for chunk in lean.pack(command)]

        async def send() -> Any:
            try:
                return await lean.execute(slot, packed, count)
            except (MovedError, AskError):
                lean.redirects += 1
                # Checked already (so checked again unchanged): nothing of it is an error.
                checked = await lean.generic(
                    lambda: self.call_transaction_async(client, keys, args, reads)
                )
                return checked if plain is None else _Checked(checked)

        if plain is not None:
            return await self._plain_transaction_async(send, plain, len(reads))
        return await self._transaction_async(send, lambda: client.script_load(self.source))

    async def call_transaction_async(
        self, client: Any, keys: Sequence[str], args: Sequence[Any], reads: Sequence[ReadCommand]
    ) -> list[Any]:
        """The asyncio twin of :meth:`call_transaction` (redis-py 8's asyncio
        ``ClusterPipeline`` runs transactions on one slot too)."""
        text = self.text_for(client)
        call = self._args(text.sha, keys, args)

        async def send() -> Any:
            pipe = self._queued(client.pipeline(transaction=True), call, reads)
            try:
                return await pipe.execute(raise_on_error=False)
            except (MovedError, AskError) as exc:
                raise _slot_moved(exc) from exc

        return await self._transaction_async(send, lambda: client.script_load(text.source))

    # --- durability="replicated": the script, then WAIT, on one connection ----------------
    def _replicated_reply(self, name: str, replies: list[Any], replicas: int) -> Any:
        reply, _touch, acked = replies
        if isinstance(reply, RedisResponseError):
            _raise_script_error(name, reply)
            raise reply
        if isinstance(reply, Exception):
            raise reply
        if isinstance(acked, Exception):
            raise acked
        if int(acked) < replicas:
            raise OutcomeUnknownError(
                f"{name} ran on the primary, but only {int(acked)} of {replicas} replicas"
                " confirmed it in time; retry with the same turn id",
                error_type="WaitTimeout",
            )
        return reply

    def call_replicated(
        self, client: Any, keys: Sequence[str], args: Sequence[Any], durable: Durable
    ) -> Any:
        """Run on the primary, then ``WAIT`` for ``durable.replicas`` on the same connection.

        WAIT counts the writes of *its own connection*, so the script, a one-field touch of
        ``durable.touch_key`` (a write of ours even when the script wrote nothing -- a
        duplicate reply to a retry -- so WAIT also covers that earlier attempt's write:
        replication is ordered) and WAIT go as one pipeline to the node owning the keys.
        """
        text = self.text_for(client)
        node = _node_client(client, keys[0])
        for attempt in range(2):
            pipe = node.pipeline(transaction=False)
            pipe.evalsha(*self._args(text.sha, keys, args))
            pipe.hset(durable.touch_key, "w", "1")
            pipe.execute_command("WAIT", durable.replicas, durable.timeout_ms)
            replies = pipe.execute(raise_on_error=False)
            if isinstance(replies[0], NoScriptError) and attempt == 0:
                node.script_load(text.source)
                continue
            if _is_moved(replies[0]):
                client.nodes_manager.initialize()  # re-read the slot map, then retry
                raise _slot_moved(replies[0])
            return self._replicated_reply(self.name, replies, durable.replicas)
        raise AssertionError("unreachable")  # pragma: no cover

    async def call_replicated_async(
        self, client: Any, keys: Sequence[str], args: Sequence[Any], durable: Durable
    ) -> Any:
        """The asyncio twin of :meth:`call_replicated`.  redis-py's asyncio cluster client
        has no per-node client to pipeline on (and its pipeline would send the keyless
        ``WAIT`` to any node): on a Cluster the three commands go on one connection of
        the primary that owns the keys (:func:`_on_one_connection`)."""
        text = self.text_for(client)
        get_node = getattr(client, "get_node_from_key", None)
        for attempt in range(2):
            commands = (
                ("EVALSHA", *self._args(text.sha, keys, args)),
                ("HSET", durable.touch_key, "w", "1"),
                ("WAIT", durable.replicas, durable.timeout_ms),
            )
            if get_node is None:
                pipe = client.pipeline(transaction=False)
                for command in commands:
                    pipe.execute_command(*command)
                replies = await pipe.execute(raise_on_error=False)
            else:
                replies = await _on_one_connection(get_node(keys[0]), commands)
            if isinstance(replies[0], NoScriptError) and attempt == 0:
                await client.script_load(text.source)  # a Cluster client: every primary
                continue
            if _is_moved(replies[0]):
                await client.nodes_manager.initialize()
                raise _slot_moved(replies[0])
            return self._replicated_reply(self.name, replies, durable.replicas)
        raise AssertionError("unreachable")  # pragma: no cover


@dataclass(frozen=True)
class Durable:
    """``durability="replicated"``: how many replicas must confirm, and how long to wait."""

    replicas: int
    timeout_ms: int
    touch_key: str  # a key of the script's slot that one HSET may touch (its meta hash)


def _node_client(client: Any, key: str) -> Any:
    """The client of the one node that owns ``key`` (the client itself when standalone)."""
    get_node = getattr(client, "get_node_from_key", None)
    if get_node is None:
        return client
    return client.get_redis_connection(get_node(key))


async def _on_one_connection(node: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """``commands`` in one write on one connection of an asyncio cluster ``node``, every
    reply read (an error reply as its exception instance, as a pipeline's
    ``raise_on_error=False`` gives it); on any other failure the connection is dropped."""
    if node is None:  # the slot map has no primary for the slot (yet)
        raise TransientBackendError("no primary known for the keys' slot; retrying")
    conn = node.acquire_connection()
    try:
        await conn.send_packed_command(conn.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(await conn.read_response())
            except RedisResponseError as exc:
                replies.append(exc)
        return replies
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        node.release(conn)


def _is_moved(reply: Any) -> bool:
    """A MOVED/ASK from the node: the slot moved and nothing ran there.  (redis-py's
    parser strips the code from the message of its MovedError/AskError.)"""
    if isinstance(reply, MovedError | AskError):
        return True
    return isinstance(reply, RedisResponseError) and str(reply).startswith(("MOVED", "ASK"))


@dataclass(frozen=True, slots=True)
class _Checked:
    """Replies of a plain transaction's fallback through redis-py's pipeline: the
    script's path, already checked, in the script's shape (not to be folded)."""

    replies: list[Any]


def _resent_once(send: Callable[[], Any], load: Callable[[], Any]) -> Any:
    """``send()``; after NOSCRIPT, ``load()`` the text and send the same call once more."""
    try:
        return send()
    except NoScriptError:
        load()
        return send()


def _slot_moved(reply: Any) -> TransientBackendError:
    return TransientBackendError(f"slot moved ({reply}); retrying on its new owner")


def _raise_script_error(name: str, exc: RedisResponseError) -> None:
    # Scripts reject bad ARGV with error replies prefixed "memtier:" -- a bug, not a
    # transient fault; everything else (BUSY, TRYAGAIN, ...) is left for the retry layer.
    if "memtier:" in str(exc):
        raise ScriptError(f"script {name} rejected its arguments: {exc}", script=name) from exc


class ScriptRegistry:
    """Name -> :class:`LuaScript` for one subfolder of ``lua/`` (``memory``, ``threads``)."""

    def __init__(self, scripts: dict[str, LuaScript]) -> None:
        self._scripts = scripts

    def __getitem__(self, name: str) -> LuaScript:
        return self._scripts[name]

    def __iter__(self) -> Iterator[LuaScript]:
        return iter(self._scripts.values())

    def names(self) -> list[str]:
        return sorted(self._scripts)

    def sources_for(self, client: Any) -> list[str]:
        """The text of every script as ``client``'s server runs it (what ``SCRIPT LOAD``
        gets: the stores load them with :func:`memtier.memory.operations.load_scripts`)."""
        return [script.text_for(client).source for script in self._scripts.values()]

    def load_all(self, client: Any) -> None:
        """``SCRIPT LOAD`` every script (a Cluster client sends it to every primary)."""
        for source in self.sources_for(client):
            client.script_load(source)

    async def load_all_async(self, client: Any) -> None:
        for source in self.sources_for(client):
            await client.script_load(source)

    def shas_for(self, client: Any) -> list[str]:
        """The SHA of every script as ``client``'s server knows it (``SCRIPT EXISTS``)."""
        return [script.text_for(client).sha for script in self._scripts.values()]


_REGISTRIES: dict[str, ScriptRegistry] = {}


def load_registry(folder: str, root: Path | None = None) -> ScriptRegistry:
    """Parse ``lua/<folder>/*-N.lua`` once per process.

    ``root`` replaces :func:`lua_root` (another Lua tree, e.g. in the loader's
    tests); such a registry is parsed on every call, never cached.
    """
    if root is not None:
        return _parse_folder(root, folder)
    found = _REGISTRIES.get(folder)
    if found is None:
        found = _REGISTRIES[folder] = _parse_folder(lua_root(), folder)
    return found


def _parse_folder(root: Path, folder: str) -> ScriptRegistry:
    scripts = {}
    for path in sorted((root / folder).glob("*.lua")):
        script = LuaScript.from_file(path, root)
        if script.name in scripts:
            raise ScriptError(f"two Lua scripts named {script.name!r} under {root / folder}")
        scripts[script.name] = script
    if not scripts:
        raise ScriptError(f"no Lua scripts under {root / folder}")
    return ScriptRegistry(scripts)
