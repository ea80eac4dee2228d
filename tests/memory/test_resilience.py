"""Lost replies, transient errors, NOSCRIPT, metrics by scraping, Lua contract codes."""

from __future__ import annotations

from typing import Any

import memfixtures
import pytest
from memhelpers import Clock, StoreMaker, key, sync_store
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from redis import exceptions as rexc

from memtier import (
    AvatarMessage,
    BackendError,
    BackendRefusedError,
    OutcomeUnknownError,
    ScriptError,
    retry,
)
from memtier.memory.scriptspecs import DROP_SESSION, MEMORY_SPECS
from memtier.memory.turncodec import record_flags
from memtier.scripts import load_registry

# The store tests run on the sync and on the asyncio store (issue 13): ids [sync-fake], ...
make_store = memfixtures.make_store


class FlakyClient:
    """Wraps a sync redis-py client: the chosen EVALSHA calls fail as configured.

    ``lose_reply``: the command runs on Redis, then the reply is "lost" (ConnectionError),
    which is exactly what a retry after a dropped connection looks like.
    ``fail_before``: the command never reaches Redis.
    """

    def __init__(
        self,
        inner: Any,
        *,
        lose_reply: int = 0,
        fail_before: int = 0,
        error: Exception | None = None,
    ) -> None:
        self.inner = inner
        self.lose_reply = lose_reply
        self.fail_before = fail_before
        self.error = error or rexc.ConnectionError("connection reset by peer")
        self.calls = 0

    def before_send(self) -> None:
        self.calls += 1
        if self.fail_before > 0:
            self.fail_before -= 1
            raise self.error

    def after_reply(self, result: Any) -> Any:
        if self.lose_reply > 0:
            self.lose_reply -= 1
            raise rexc.ConnectionError("reply lost")
        return result

    def evalsha(self, *args: Any) -> Any:
        self.before_send()
        return self.after_reply(self.inner.evalsha(*args))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class AsyncFlakyClient(FlakyClient):
    """The same faults on an asyncio redis-py client."""

    async def evalsha(self, *args: Any) -> Any:  # type: ignore[override]
        self.before_send()
        return self.after_reply(await self.inner.evalsha(*args))


def flaky_store(
    make_store: StoreMaker, backend: Any, config: Any = None, **faults: Any
) -> tuple[Any, FlakyClient]:
    """A store of ``make_store``'s API on a flaky client (scripts preloaded, calls at 0)."""
    made: list[FlakyClient] = []

    def wrap(inner: Any) -> FlakyClient:
        flaky = (FlakyClient if make_store.api == "sync" else AsyncFlakyClient)(inner, **faults)
        made.append(flaky)
        return flaky

    store = make_store(backend, Clock(), wrap_client=wrap, **(config or {}))
    store.load_scripts()  # so NOSCRIPT does not add calls
    return store, made[0]


def scrape() -> dict[str, float]:
    """Scrape the default registry the way Prometheus would, as {sample-with-labels: value}."""
    out = {}
    for family in text_string_to_metric_families(generate_latest(REGISTRY).decode()):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def test_retry_after_lost_reply_stores_one_turn(make_store: StoreMaker, backend: Any) -> None:
    store, flaky = flaky_store(make_store, backend, lose_reply=1)
    receipt = store.append(key(1), AvatarMessage(text="exactly once"))
    assert flaky.calls == 2  # first attempt ran but its reply was lost; the retry deduped
    assert receipt.duplicate and receipt.seq == 1
    assert [t.seq for t in store.context(key(1)).turns] == [1]
    assert store.stats()["bytes"] == len("exactly once")


@pytest.mark.parametrize(
    "error",
    [
        rexc.ConnectionError("reset"),
        rexc.TimeoutError("timeout"),
        rexc.BusyLoadingError("LOADING Redis is loading the dataset in memory"),
        rexc.ResponseError("BUSY Redis is busy running a script"),
        rexc.TryAgainError("TRYAGAIN"),
        rexc.ClusterDownError("CLUSTERDOWN The cluster is down"),
    ],
    ids=["reset", "timeout", "loading", "busy", "tryagain", "clusterdown"],
)
def test_transient_errors_are_retried_and_counted(
    make_store: StoreMaker, backend: Any, error: Exception
) -> None:
    store, flaky = flaky_store(make_store, backend, fail_before=2, error=error)
    before = scrape()
    label = f"memtier_retries_total{{error_type={type(error).__name__},operation=append}}"
    receipt = store.append(key(1), AvatarMessage(text="hi"))
    assert receipt.seq == 1 and not receipt.duplicate
    assert flaky.calls == 3
    assert scrape()[label] - before.get(label, 0.0) == 2


def test_persistent_failure_is_bounded_and_raises_backend_error(
    make_store: StoreMaker, backend: Any
) -> None:
    """Connects refused every time: nothing can have been applied -> backend_unavailable."""
    refused = rexc.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
    store, flaky = flaky_store(make_store, backend, fail_before=10_000, error=refused)
    with pytest.raises(BackendError) as info:
        store.append(key(1), AvatarMessage(text="hi"))
    assert info.value.code == "backend_unavailable" and not info.value.retryable
    assert flaky.calls == retry.TESTING_MAX_ATTEMPTS  # bounded attempts
    assert isinstance(info.value.__cause__, rexc.ConnectionError)


def test_lost_replies_until_the_end_raise_retryable_outcome_unknown(
    make_store: StoreMaker, backend: Any
) -> None:
    """D11: an append stored on attempt 1 whose replies are all lost is outcome_unknown
    (retryable), and retrying it with the same turn id returns the first receipt."""
    store, flaky = flaky_store(make_store, backend, lose_reply=10_000)
    with pytest.raises(OutcomeUnknownError) as info:
        store.append(key(1), AvatarMessage(text="stored", turn_id="t-1"))
    assert info.value.code == "outcome_unknown" and info.value.retryable
    flaky.lose_reply = 0
    again = store.append(key(1), AvatarMessage(text="stored", turn_id="t-1"))
    assert again.duplicate and again.seq == 1
    assert [t.seq for t in store.context(key(1)).turns] == [1]


def test_reset_before_sending_then_refused_is_still_outcome_unknown(
    make_store: StoreMaker, backend: Any
) -> None:
    """Once an attempt may have been applied, later refused connects cannot make it 'not
    applied': the outcome stays unknown."""
    store, _ = flaky_store(make_store, backend, fail_before=10_000)
    with pytest.raises(OutcomeUnknownError):
        store.append(key(1), AvatarMessage(text="hi"))


@pytest.mark.parametrize(
    "error",
    [
        rexc.OutOfMemoryError("OOM command not allowed when used memory > 'maxmemory'."),
        rexc.ResponseError("MISCONF Redis is configured to save RDB snapshots"),
        rexc.NoPermissionError("NOPERM User app has no permissions to run the 'evalsha' command"),
        rexc.ResponseError("ERR Error running script (call to f_x): @user_script:1: OOM ..."),
    ],
    ids=["oom", "misconf", "noperm", "oom-in-script"],
)
def test_refusals_are_backend_refused_and_not_retried(
    make_store: StoreMaker, backend: Any, error: Exception
) -> None:
    store, flaky = flaky_store(make_store, backend, fail_before=10_000, error=error)
    with pytest.raises(BackendRefusedError) as info:
        store.append(key(1), AvatarMessage(text="hi"))
    assert info.value.code == "backend_refused" and not info.value.retryable
    assert flaky.calls == 1
    assert info.value.__cause__ is error


def test_noscript_after_script_flush_is_recovered(make_store: StoreMaker, backend: Any) -> None:
    store = make_store(backend, Clock())
    store.append(key(1), AvatarMessage(text="one"))
    client = backend.sync_client()
    if backend.is_cluster:
        for node in client.get_nodes():  # every primary and replica forgets every script
            client.execute_command("SCRIPT", "FLUSH", target_nodes=node)
    else:
        client.script_flush()
    assert store.append(key(1), AvatarMessage(text="two")).seq == 2
    assert store.context(key(1)).turns[-1].fields["text"] == "two"


def test_metrics_are_exposed_by_scraping(make_store: StoreMaker, backend: Any) -> None:
    store = make_store(backend, Clock())
    before = scrape()
    store.append(key(1), AvatarMessage(text="abc"))
    store.context(key(1))
    store.stats()
    after = scrape()
    appended = "memtier_appends_total{outcome=stored,role=avatar}"
    assert after[appended] - before.get(appended, 0.0) == 1
    assert after["memtier_stored_bytes{}"] == 3
    assert after["memtier_active_sessions{}"] == 1
    count = "memtier_script_duration_seconds_count{script=append_turn}"
    assert after[count] > before.get(count, 0.0)
    assert not any("avatar=" in name or "00000000-" in name for name in after)


def test_every_append_status_code_of_the_lua_contract(backend: Any) -> None:
    """append_turn-9.lua called directly with hand-built KEYS/ARGV: every Output code.

    Sync only: the script is called directly, the store only builds the calls."""
    store = sync_store(backend, Clock(), conversation={"max_tool_results": 1})
    script = load_registry("memory")["append_turn"]
    client = backend.sync_client()
    k = key(1)

    def call(**overrides: Any) -> Any:
        prepared = store.core.prepare_turn(k, AvatarMessage(text="x", turn_id="fixed"))
        base = store.core.append_call(prepared)
        args = list(base.args)
        for index, value in overrides.items():
            args[int(index[1:])] = value
        return script(client, base.keys, args)

    assert call()[0] == 0  # stored
    assert call()[0] == 1  # duplicate
    tool = record_flags(True)  # the flags ARGV of a tool turn
    assert call(a2="tool-1", a5=tool)[0] == 0  # a tool turn
    full = call(a2="tool-2", a5=tool)
    assert full[0] == -1 and full[1] in (b"tools", "tools")  # SESSION_FULL
    assert call(a2="big", a4=10**9)[0] == -3  # TURN_TOO_LARGE
    assert call(a2="agg", a12=0)[0] == -2  # AGGREGATE_FULL (nothing evictable)
    with pytest.raises(ScriptError):
        call(a4="not-a-number")  # caller bug -> error reply -> ScriptError
    for flags in ("1", "2v1", "0v0", "0v", "0rv1"):  # only "<0/1>v<version>" is sent
        with pytest.raises(ScriptError):
            call(a2="bad-flags", a5=flags)


def test_every_lua_script_keeps_its_keys_in_one_slot(backend: Any) -> None:
    # Sync only: no store I/O, only the I/O-free core's key layout.
    from redis.crc import key_slot

    store = sync_store(backend, Clock(), partitions=7)
    core = store.core
    calls = []
    for n in range(20):
        k = key(n, "im" if n % 2 else "public")
        prepared = core.prepare_turn(k, AvatarMessage(text="x"))
        calls += [core.append_call(prepared), core.context_call(k)]
        calls.append(core.drop_call(k, __import__("memtier").ReasonCode.OPERATOR_DELETED))
    for part in core.keyspace.all_partitions():
        calls += [core.sweep_call(part), core.stats_call(part), core.metadata_call(part, "0", 10)]
    for call in calls:
        slots = {key_slot(k.encode()) for k in call.keys}
        assert len(slots) == 1, call
        prefix_slot = (
            key_slot(str(MEMORY_SPECS[call.script].arg(call, "prefix")).encode() + b"x")
            if call.script in ("append_turn", "drop_session", "sweep_expired", "list_metadata")
            else None
        )
        if prefix_slot is not None:  # derived victim keys land in the same slot
            assert prefix_slot in slots
    # partitions spread over slots
    assert len({key_slot(p.meta.encode()) for p in core.keyspace.all_partitions()}) == 7


def test_eviction_and_expiry_metrics_carry_reason_codes(
    make_store: StoreMaker, backend: Any
) -> None:
    clock = Clock()
    conv = {"max_active_sessions": 2, "public_ttl_seconds": 5, "im_ttl_seconds": 3600}
    store = make_store(backend, clock, conversation=conv)
    sess = "memtier_evictions_total{reason=evicted_session_pressure}"
    expired = "memtier_expiries_total{reason=expired}"
    before = scrape()
    store.append(key(1, "im"), AvatarMessage(text="a"))
    store.append(key(2, "im"), AvatarMessage(text="b"))
    store.append(key(3, "im"), AvatarMessage(text="c"))  # evicts key 1 for session pressure
    store.append(key(4), AvatarMessage(text="d"))  # evicts key 2
    clock.advance(5_000)
    store.append(key(5, "im"), AvatarMessage(text="e"))  # sweeps the expired public key 4
    after = scrape()
    assert after[sess] - before.get(sess, 0.0) == 2
    assert after[expired] - before.get(expired, 0.0) == 1
    assert store.stats()["sessions"] == 2


@pytest.mark.parametrize("operation", ["delete", "expire"])
def test_operator_drop_after_a_lost_reply_reports_what_it_did(
    make_store: StoreMaker, backend: Any, operation: str
) -> None:
    """D11: the first attempt deleted the session and its reply was lost; the retry must
    report True (it did delete), not False (nothing left to delete).  One event only."""
    store = make_store(backend, Clock())
    store.append(key(1), AvatarMessage(text="doomed"))
    operator, flaky = flaky_store(make_store, backend, lose_reply=1)
    assert getattr(operator, operation)(key(1)) is True
    assert flaky.calls == 2  # the retry ran, and found the first attempt's receipt
    assert store.context(key(1)).session_id is None
    events = [e.reason.value for e in store.events(limit=100)]
    assert events.count(f"operator_{operation}d") == 1
    # a fresh call on the now absent key: False (its own operation id, no receipt)
    assert getattr(operator, operation)(key(1)) is False


def test_operator_drop_never_sent_then_retried_reports_absent_key(
    make_store: StoreMaker, backend: Any
) -> None:
    """The retry of a drop whose first attempt never reached Redis reports the truth."""
    store, flaky = flaky_store(make_store, backend, fail_before=1)
    assert store.delete(key(9)) is False
    store.append(key(9), AvatarMessage(text="x"))
    flaky.fail_before = 1
    assert store.delete(key(9)) is True


def test_drop_receipt_is_bounded_in_time(backend: Any) -> None:
    # Sync only: it reaches into the store's plumbing (_drop_call, _retrying).
    store = sync_store(backend, Clock())
    store.append(key(1), AvatarMessage(text="x"))
    client = backend.sync_client()
    call = store.core.drop_call(key(1), __import__("memtier").ReasonCode.OPERATOR_DELETED)
    receipt = DROP_SESSION.arg(call, "receipt_key")
    assert isinstance(receipt, str) and receipt.startswith(store.core.partition_for(key(1)).prefix)
    assert int(store.executor.execute(call, "delete")[0]) == 1
    assert 0 < client.pttl(receipt) <= retry.limits.DROP_RECEIPT_MS
    assert int(store.executor.execute(call, "delete")[0]) == 1  # the same call again: same answer
