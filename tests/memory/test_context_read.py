"""The context read as one transaction (issue 12: "read without passing turns through Lua").

``context()`` sends ``MULTI``, ``context_head`` (the expiry verdict and the session's
fields), a plain ``LRANGE`` of the newest records and ``EXEC`` -- one round trip, atomic,
on the session's slot -- and decodes the records client-side.  Here an adversary checks:

* a Hypothesis state machine (appends of every kind, pops, forced compactions, refused
  appends at the turn bound, clock steps onto and past each session's exact TTL
  deadline) compares after every step the sync read (lean on a standalone server), the
  asyncio read, the former ``read_context`` script (turns through Lua) and a reference
  model of each session (id, turn ids in order, summary, liveness);
* the read is one write to Redis per call on every client (sync lean, sync generic,
  asyncio, Cluster sync and asyncio), and a ``MULTI``/``EXEC`` on the server;
* ``NOSCRIPT`` inside the transaction (``SCRIPT FLUSH`` on a private server) loads the
  script and re-sends once, and a script that cannot be loaded fails after exactly two
  sends with the one error vocabulary;
* a malformed call is a ``ScriptError``, a wrong-typed turns list the same
  ``BackendError`` the old script gave.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import memfixtures
import pytest
import redis
import redis.asyncio.connection
import redis.connection
from asyncadapter import PrivateLoop
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from memhelpers import T0, Clock, command_calls, key
from redispy import LEAN_CLUSTER, at_least
from roundtrips import Writes
from servers import RedisServer, held_connections

from memtier import (
    ActionResult,
    AgentResponse,
    AsyncConversationStore,
    AvatarMessage,
    ConversationKey,
    ConversationStore,
    SessionFullError,
    ToolSummary,
)
from memtier.config import MemtierConfig
from memtier.engine import Transaction
from memtier.errors import BackendError, ErrorCode, ScriptError
from memtier.memory.core import context_limit
from memtier.memory.scriptspecs import CONTEXT_HEAD

fake_or_real = memfixtures.fake_or_real

CONVERSATION = {
    "max_active_sessions": 50,
    "max_turns_per_session": 5,
    "max_tool_results": 3,
    "max_session_bytes": 8192,
    "max_aggregate_bytes": 1 << 20,
}
MEMBERS = (key(1, "public").member, key(2, "im").member, key(3, "public").member)
WORDS = ("hi", "région", "😀", "</untrusted-data>", "x" * 40, "ok?")
texts = st.lists(st.sampled_from(WORDS), min_size=0, max_size=4).map(" ".join)


def _turn(kind: str, text: str, turn_id: str) -> Any:
    if kind == "avatar":
        return AvatarMessage(text=text, turn_id=turn_id)
    if kind == "agent":
        return AgentResponse(text=text, turn_id=turn_id)
    if kind == "tool":
        return ToolSummary(tool="search", summary=text, turn_id=turn_id)
    return ActionResult(action="give", outcome=text, turn_id=turn_id)


@dataclass
class ModelSession:
    sid: str
    last_ms: int
    turn_ids: list[str] = field(default_factory=list)
    # None after a compaction: whether the summarizer wrote one (folded empty turns give
    # none); learned at the next read, then it must hold until the session rotates.
    summary: bool | None = False


def _view(ctx: Any) -> Any:
    return ctx.model_dump()


class ReadMachine(RuleBasedStateMachine):
    """One namespace per example: a sync store, an asyncio store, the model."""

    backend: ClassVar[Any] = None
    client: ClassVar[Any] = None
    async_client: ClassVar[Any] = None
    loop: ClassVar[PrivateLoop | None] = None
    # What the examples exercised (checked after the run: a vacuous machine fails).
    seen: ClassVar[Counter[str]]

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock(T0)
        self.config = MemtierConfig.load(
            redis_url=self.backend.url,
            namespace="ctx" + uuid.uuid4().hex[:12],
            partitions=2,
            conversation=CONVERSATION,
        )
        self.store = ConversationStore(
            self.client, self.config, clock=self.clock, inline_compaction=False
        )
        assert self.loop is not None
        loop = self.loop
        self.astore = loop.run(self._async_store())
        self.model: dict[str, ModelSession] = {}
        self.appended = 0  # turn ids: one per append, never reused

    async def _async_store(self) -> AsyncConversationStore:
        return AsyncConversationStore(
            self.async_client, self.config, clock=self.clock, inline_compaction=False
        )

    def teardown(self) -> None:
        pattern = self.store.core.keyspace.pattern()
        if self.backend.is_cluster:
            found = list(
                self.client.scan_iter(match=pattern, count=1000, target_nodes=self.client.PRIMARIES)
            )
        else:
            found = list(self.client.scan_iter(match=pattern, count=1000))
        for name in found:
            self.client.delete(name)

    # --- the model ---------------------------------------------------------------------------
    def _ttl(self, member: str) -> int:
        return self.store.core.ttl_ms(ConversationKey.from_member(member).channel)

    def _live(self, member: str) -> ModelSession | None:
        session = self.model.get(member)
        if session is None or self.clock.now >= session.last_ms + self._ttl(member):
            return None
        return session

    # --- rules ---------------------------------------------------------------------------
    @rule(
        member=st.sampled_from(MEMBERS),
        kind=st.sampled_from(("avatar", "agent", "tool", "action")),
        text=texts,
    )
    def append(self, member: str, kind: str, text: str) -> None:
        self._append(member, kind, text)

    @rule(
        member=st.sampled_from(MEMBERS),
        kinds=st.lists(st.sampled_from(("avatar", "agent", "tool")), min_size=2, max_size=4),
    )
    def fill(self, member: str, kinds: list[str]) -> None:
        """Several appends in a row: sessions reach their turn bound (refusals, and
        compactions that fold something)."""
        for n, kind in enumerate(kinds):
            self._append(member, kind, f"fill {n}")

    def _append(self, member: str, kind: str, text: str) -> None:
        session = self._live(member)
        self.appended += 1
        turn_id = f"turn-{self.appended}"
        try:
            receipt = self.store.append(
                ConversationKey.from_member(member), _turn(kind, text, turn_id)
            )
        except SessionFullError:
            assert session is not None, f"{member}: refused, but the model has no live session"
            self.seen["refused"] += 1
            return
        if session is None:
            session = self.model[member] = ModelSession(str(receipt.session_id), self.clock.now)
        assert receipt.session_id == session.sid
        session.turn_ids.append(turn_id)
        session.last_ms = self.clock.now

    @rule(member=st.sampled_from(MEMBERS))
    def pop(self, member: str) -> None:
        session = self._live(member)
        popped = self.store.pop(ConversationKey.from_member(member))
        if session is None or not session.turn_ids:
            assert popped is None
            return
        assert popped is not None and popped.turn_id == session.turn_ids.pop()
        self.seen["popped"] += 1

    @rule(member=st.sampled_from(MEMBERS))
    def compact(self, member: str) -> None:
        session = self._live(member)
        outcome = self.store.compact(ConversationKey.from_member(member), force=True)
        if outcome.folded:
            assert session is not None
            del session.turn_ids[: outcome.folded]
            session.summary = None
            self.seen["compacted"] += 1

    @rule(ms=st.sampled_from((1, 999, 60_000)))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @precondition(lambda self: bool(self.model))
    @rule(pick=st.integers(0, 3), offset=st.sampled_from((-1, 0, 1)))
    def to_deadline(self, pick: int, offset: int) -> None:
        """The clock onto a session's exact expiry (1 ms before, at, 1 ms after)."""
        member = sorted(self.model)[pick % len(self.model)]
        deadline = self.model[member].last_ms + self._ttl(member) + offset
        self.clock.now = max(self.clock.now, deadline)

    # --- what every read must say ------------------------------------------------------------
    @invariant()
    def reads_agree(self) -> None:
        for member in MEMBERS:
            k = ConversationKey.from_member(member)
            for limit in (0, 2):
                new = self.store.context(k, limit=limit)
                assert self.loop is not None
                via_async = self.loop.run(self.astore.context(k, limit=limit))
                core = self.store.core
                old = core.decode_script_context(
                    k, self.store.executor.execute(core.script_context_call(k, limit))
                )
                assert _view(new) == _view(old), f"{member} limit={limit}: new read vs read_context"
                assert _view(via_async) == _view(new), f"{member} limit={limit}: asyncio vs sync"
                session = self._live(member)
                if session is None:
                    assert new.session_id is None and new.turns == () and new.messages == ()
                    self.seen["expired read" if member in self.model else "absent read"] += 1
                    continue
                want = session.turn_ids[-limit:] if limit else session.turn_ids
                assert new.session_id == session.sid
                assert [t.turn_id for t in new.turns] == want
                if session.summary is None:
                    session.summary = new.summary is not None
                assert (new.summary is not None) == session.summary
                self.seen[
                    "live read, limited" if 0 < limit < len(session.turn_ids) else "live read"
                ] += 1
                if session.summary:
                    self.seen["read with summary"] += 1


def _run_machine(backend: Any, examples: int, steps: int) -> None:
    loop = PrivateLoop()

    class Machine(ReadMachine):
        pass

    async def make_async_client() -> Any:
        return backend.async_client()

    Machine.backend = backend
    Machine.client = backend.sync_client()
    Machine.loop = loop
    Machine.seen = Counter()
    Machine.async_client = loop.run(make_async_client())
    try:
        run_state_machine_as_test(
            Machine, settings=settings(max_examples=examples, stateful_step_count=steps)
        )
    finally:
        loop.run(Machine.async_client.aclose())
        loop.stop()
    wanted = (
        "refused",
        "popped",
        "compacted",
        "expired read",
        "absent read",
        "live read",
        "live read, limited",
        "read with summary",
    )
    assert {name: Machine.seen[name] > 0 for name in wanted} == dict.fromkeys(wanted, True), (
        Machine.seen
    )


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("fake", marks=pytest.mark.fake),
        pytest.param("real", marks=pytest.mark.real),
        pytest.param("cluster", marks=pytest.mark.cluster),
    ],
    indirect=True,
)
@pytest.mark.timeout(900)
def test_transactional_read_matches_the_model_and_the_old_script(backend: Any) -> None:
    _run_machine(backend, examples=15, steps=25)


# --- one round trip ---------------------------------------------------------------------------
READS = 5


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "generic"])
def test_sync_context_is_one_round_trip(
    backend_no_fake: Any, monkeypatch: pytest.MonkeyPatch, lean: bool
) -> None:
    clock = Clock()
    store = ConversationStore(backend_no_fake.sync_client(), backend_no_fake.config(), clock=clock)
    store.executor.lean = lean
    k = key(7)
    for n in range(4):
        store.append(k, AvatarMessage(text=f"turn {n}"))
    store.context(k, limit=3)  # a health check or a first connect is not the read's
    writes = Writes(monkeypatch)
    lean_before = store.executor.lean_calls
    for _ in range(READS):
        assert [t.seq for t in store.context(k, limit=3).turns] == [2, 3, 4]
    assert writes.count == READS
    # The lean path covers the cluster too (the slot's primary, memtier.leancluster) on
    # redis-py >= LEAN_CLUSTER; on an older one the cluster read goes through redis-py's
    # transaction, still one write (the floor run in tests/run.sh checks that).
    lean_here = backend_no_fake.kind != "cluster" or at_least(LEAN_CLUSTER)
    assert store.executor.lean_calls - lean_before == (READS if lean and lean_here else 0)


def test_async_context_is_one_round_trip(
    backend_no_fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = PrivateLoop()
    try:

        async def scenario() -> int:
            store = AsyncConversationStore(
                backend_no_fake.async_client(), backend_no_fake.config(), clock=Clock()
            )
            k = key(8)
            for n in range(4):
                await store.append(k, AvatarMessage(text=f"turn {n}"))
            await store.context(k, limit=2)
            writes = Writes(monkeypatch)
            for _ in range(READS):
                assert [t.seq for t in (await store.context(k, limit=2)).turns] == [3, 4]
            count = writes.count
            monkeypatch.undo()
            await store.close()
            return count

        assert loop.run(scenario()) == READS
    finally:
        loop.stop()


@pytest.mark.parametrize(
    ("lean", "test_clock"),
    [(True, True), (True, False), (False, True)],
    ids=["lean", "lean-server-clock", "generic"],
)
def test_the_read_is_a_transaction_with_no_lua_copy_of_the_turns(
    redis_server: Any, lean: bool, test_clock: bool
) -> None:
    """On the server, per read: one MULTI, one EXEC, one LRANGE; the session check is
    ``context_head`` by EVALSHA on the generic path, and on the lean path no script at
    all -- its HMGET, HGET and (with the server's clock) TIME as plain commands -- and
    ``read_context`` (the turns through Lua) is never run."""
    admin = redis.Redis.from_url(redis_server.url)
    config = MemtierConfig.load(redis_url=redis_server.url, namespace="tx" + uuid.uuid4().hex[:8])
    client = redis.Redis.from_url(redis_server.url)
    store = ConversationStore(client, config, clock=Clock() if test_clock else None)
    store.executor.lean = lean
    k = key(9)
    store.append(k, AvatarMessage(text="hello"))
    store.context(k)
    before = command_calls(admin)
    for _ in range(READS):
        assert len(store.context(k).turns) == 1
    after = command_calls(admin)
    delta = {name: after.get(name, 0) - before.get(name, 0) for name in after}
    if lean:
        once = ["multi", "exec", "hmget", "hget", "lrange"] + ([] if test_clock else ["time"])
        never = ["evalsha", "eval"] + (["time"] if test_clock else [])
    else:
        once, never = ["multi", "exec", "evalsha", "lrange"], []
    for command in once:
        assert delta.get(f"cmdstat_{command}", 0) == READS, (command, delta)
    for command in never:
        assert delta.get(f"cmdstat_{command}", 0) == 0, (command, delta)
    admin.close()
    client.close()


def _script_form_context(store: ConversationStore, k: Any) -> Any:
    """A context read whose session check is the ``context_head`` script on every path
    (no plain form): the transaction machinery's own NOSCRIPT handling, lean or not."""
    tx = dataclasses.replace(store.core.context_call(k), plain=None)
    return store.core.decode_context(k, store.executor.execute(tx, "context"))


# --- NOSCRIPT inside MULTI --------------------------------------------------------------------
@pytest.fixture
def private_server() -> Iterator[RedisServer]:
    """A redis-server of this test only: SCRIPT FLUSH touches nobody else's scripts."""
    with RedisServer() as server:
        yield server


def _flush_scripts(server: RedisServer) -> None:
    admin = redis.Redis.from_url(server.url)
    try:
        assert int(admin.info("server")["process_id"]) == server.pid  # ours, and only ours
        admin.script_flush()
    finally:
        admin.close()


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "generic"])
def test_noscript_inside_the_transaction_loads_and_resends_once(
    private_server: RedisServer, monkeypatch: pytest.MonkeyPatch, lean: bool
) -> None:
    client = redis.Redis.from_url(private_server.url)
    store = ConversationStore(client, MemtierConfig.load(redis_url=private_server.url))
    store.executor.lean = lean
    k = key(3)
    store.append(k, AvatarMessage(text="one"))
    store.append(k, AgentResponse(text="two"))
    want = _view(store.context(k))
    _flush_scripts(private_server)
    writes = Writes(monkeypatch)
    assert _view(_script_form_context(store, k)) == want
    assert writes.count == 3  # the transaction (NOSCRIPT at EXEC), SCRIPT LOAD, the re-send
    assert client.script_exists(store.scripts["context_head"].sha) == [True]
    client.close()


def test_the_lean_read_needs_no_script(
    private_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every script flushed, a lean context read is still one write and loads
    nothing: its session check is plain commands (memtier.memory.contexthead)."""
    client = redis.Redis.from_url(private_server.url)
    store = ConversationStore(client, MemtierConfig.load(redis_url=private_server.url))
    k = key(3)
    store.append(k, AvatarMessage(text="one"))
    want = _view(store.context(k))
    _flush_scripts(private_server)
    writes = Writes(monkeypatch)
    lean_before = store.executor.lean_calls
    assert _view(store.context(k)) == want
    assert writes.count == 1
    assert store.executor.lean_calls == lean_before + 1
    assert client.script_exists(store.scripts["context_head"].sha) == [False]
    client.close()


def test_noscript_inside_the_transaction_asyncio(private_server: RedisServer) -> None:
    loop = PrivateLoop()
    try:

        async def scenario() -> None:
            store = AsyncConversationStore(
                redis.asyncio.Redis.from_url(private_server.url),
                MemtierConfig.load(redis_url=private_server.url),
            )
            k = key(4)
            await store.append(k, AvatarMessage(text="one"))
            want = _view(await store.context(k, limit=1))
            _flush_scripts(private_server)
            assert _view(await store.context(k, limit=1)) == want
            await store.close()

        loop.run(scenario())
    finally:
        loop.stop()


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "generic"])
def test_a_script_that_will_not_load_fails_after_two_sends(
    private_server: RedisServer, monkeypatch: pytest.MonkeyPatch, lean: bool
) -> None:
    """Bounded: NOSCRIPT, a load that does not take (a server flushing its scripts all the
    time), NOSCRIPT again -- then the one error vocabulary, not a loop."""
    client = redis.Redis.from_url(private_server.url)
    store = ConversationStore(client, MemtierConfig.load(redis_url=private_server.url))
    store.executor.lean = lean
    k = key(5)
    store.append(k, AvatarMessage(text="one"))
    _flush_scripts(private_server)
    loads: list[str] = []
    monkeypatch.setattr(client, "script_load", lambda source: loads.append(source))
    writes = Writes(monkeypatch)
    with pytest.raises(BackendError) as caught:
        _script_form_context(store, k)
    assert type(caught.value) is BackendError
    assert caught.value.code == ErrorCode.BACKEND_UNAVAILABLE
    assert "NoScriptError" in caught.value.message
    assert writes.count == 2 and len(loads) == 1
    client.close()


# --- errors -----------------------------------------------------------------------------------
def test_a_malformed_session_check_is_a_script_error(backend: Any) -> None:
    store = ConversationStore(backend.sync_client(), backend.config(), clock=Clock())
    tx = store.core.context_call(key(1))
    bad = Transaction(CONTEXT_HEAD.replace(tx.script, ttl_ms="not-a-number"), tx.reads)
    with pytest.raises(ScriptError):
        store.executor.execute(bad)


def test_a_wrong_typed_turns_list_is_the_same_error_as_before(backend: Any) -> None:
    client = backend.sync_client()
    store = ConversationStore(client, backend.config(), clock=Clock())
    k = key(6)
    store.append(k, AvatarMessage(text="x"))
    turns = store.core.partition_for(k).session(k.member).turns
    client.delete(turns)
    client.set(turns, "not a list")
    with pytest.raises(BackendError) as new:
        store.context(k)
    core = store.core
    with pytest.raises(BackendError) as old:
        core.decode_script_context(k, store.executor.execute(core.script_context_call(k)))
    assert type(new.value) is type(old.value) is BackendError
    assert new.value.code == old.value.code == ErrorCode.BACKEND_UNAVAILABLE
    assert "WRONGTYPE" in new.value.message and "WRONGTYPE" in old.value.message


# --- the limit --------------------------------------------------------------------------------
@given(st.integers(min_value=-(10**30), max_value=10**30))
@example(0)
@example(-1)
@example(2_000)
@example(2_001)
@example(2**63)
def test_context_limit_is_all_or_a_count_within_the_ceiling(limit: int) -> None:
    newest = context_limit(limit)
    assert 0 <= newest <= 2_000
    assert newest == (limit if 0 < limit <= 2_000 else 0)


def test_huge_limits_read_everything(fake_or_real: Any) -> None:
    store = ConversationStore(fake_or_real.sync_client(), fake_or_real.config(), clock=Clock())
    k = key(2)
    for n in range(3):
        store.append(k, AvatarMessage(text=str(n)))
    for limit in (0, -5, 3, 2_000, 2**70):
        assert [t.seq for t in store.context(k, limit=limit).turns] == [1, 2, 3]
    assert [t.seq for t in store.context(k, limit=1).turns] == [3]


# --- a timed-out transaction ---------------------------------------------------------------------
SHORT_DEADLINES = {
    "max_connections": 2,
    "socket_timeout_seconds": 0.5,
    "connect_timeout_seconds": 0.5,
    "pool_timeout_seconds": 5.0,
}


def test_a_timed_out_transaction_does_not_poison_its_connection(
    private_server: RedisServer,
) -> None:
    """The replies of a transaction that arrive after the socket timeout (the server was
    paused) must never be read by the next call: each later read gets its own session."""
    from memtier.connection import connect_sync

    config = MemtierConfig.load(redis_url=private_server.url, redis=SHORT_DEADLINES)
    client, _ = connect_sync(config)
    store = ConversationStore(client, config)
    try:
        keys = [key(20 + n) for n in range(4)]
        for n, k in enumerate(keys):
            store.append(k, AvatarMessage(text=f"session {n}"))
        lean_before = store.executor.lean_calls
        store.context(keys[0])
        assert store.executor.lean_calls == lean_before + 1  # the lean transaction path
        admin = redis.Redis.from_url(private_server.url)
        assert int(admin.info("server")["process_id"]) == private_server.pid  # ours
        assert admin.execute_command("CLIENT", "PAUSE", 1200, "ALL")
        try:
            late = store.context(keys[0])
            assert [t.fields["text"] for t in late.turns] == ["session 0"]
        except BackendError:
            pass  # every attempt timed out: the retry layer's typed error, nothing half-read
        admin.execute_command("CLIENT", "UNPAUSE")
        admin.close()
        for round_ in range(3):
            for n, k in enumerate(keys):
                texts_read = [t.fields["text"] for t in store.context(k).turns]
                assert texts_read == [f"session {n}"], (round_, n)
        assert held_connections(client) == []
    finally:
        client.close()


# --- the expiry verdict at the exact deadline -----------------------------------------------------
def test_the_verdict_at_the_exact_deadline_and_no_ttl_touch(backend: Any) -> None:
    """Live 1 ms before ``last + ttl``, absent at it (the records are still in Redis: the
    LRANGE reply is ignored); reading never extends the session's life."""
    clock = Clock()
    client = backend.sync_client()
    store = ConversationStore(client, backend.config(), clock=clock)
    k = key(11)
    store.append(k, AvatarMessage(text="a"))
    ttl = store.core.ttl_ms(k.channel)
    for _ in range(3):  # reads at the same instant never touch the TTL
        clock.now = T0 + ttl - 1
        assert [t.fields["text"] for t in store.context(k).turns] == ["a"]
    clock.now = T0 + ttl
    gone = store.context(k)
    assert gone.session_id is None and gone.turns == () and gone.messages == ()
    turns = store.core.partition_for(k).session(k.member).turns
    assert client.llen(turns) == 1  # still stored: the verdict, not the data, decided
    core = store.core
    old = core.decode_script_context(k, store.executor.execute(core.script_context_call(k)))
    assert old.model_dump() == gone.model_dump()


# --- NOSCRIPT refused while queueing (a server that checks the SHA before EXEC) ----------------
class _QueueTimeRefusal:
    """A lean pool / pipeline double whose first transaction is refused while queueing
    (``EXECABORT`` after ``NOSCRIPT``), as a server that checks the SHA early would."""

    def __init__(self) -> None:
        self.sent = 0
        self.loaded: list[str] = []

    def transaction(self, commands: Any, count: int, packed: list[Any]) -> list[Any]:
        return self.execute()

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        self.sent += 1
        if self.sent == 1:
            raise redis.exceptions.NoScriptError("No matching script. Please use EVAL.")
        return [[-1], []]

    def pipeline(self, transaction: bool = False) -> _QueueTimeRefusal:
        assert transaction
        return self

    def execute_command(self, *args: Any) -> None:
        pass

    def script_load(self, source: str) -> None:
        self.loaded.append(source)


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "generic"])
def test_noscript_refused_while_queueing_loads_and_resends_once(lean: bool) -> None:
    from memtier.scripts import load_registry

    script = load_registry("memory")["context_head"]
    double = _QueueTimeRefusal()
    keys, args, reads = ("{p}:s:m", "{p}:meta"), (1000, ""), (("LRANGE", "{p}:t:m", 0, -1),)
    if lean:
        replies = script.call_transaction_lean(double, double, keys, args, reads, [])  # type: ignore[arg-type]
    else:
        replies = script.call_transaction(double, keys, args, reads)
    assert replies == [[-1], []]
    assert double.sent == 2 and double.loaded == [script.source]
