"""MemtierCheckpointSaver beyond the conformance suite: bounds, accounting, TTLs, slots."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.base import empty_checkpoint
from redis.crc import key_slot

from memtier.errors import CapacityError, ConfigurationError, ValidationError
from memtier.integrations.langgraph import MemtierCheckpointSaver
from memtier.limits import CHECKPOINT_THREAD_BYTES, CHECKPOINT_THREAD_TTL_SECONDS
from memtier.metrics import render


def saver(backend: Any, **options: Any) -> MemtierCheckpointSaver:
    return MemtierCheckpointSaver(
        backend.sync_client(),
        aclient=backend.async_client(),
        namespace=backend.namespace,
        **options,
    )


def config(thread: str, ns: str = "", checkpoint_id: str | None = None) -> Any:
    c: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if checkpoint_id:
        c["checkpoint_id"] = checkpoint_id
    return {"configurable": c}


def put(
    s: MemtierCheckpointSaver,
    thread: str,
    values: dict[str, Any],
    parent: Any = None,
    run_id: str | None = None,
) -> Any:
    cp = empty_checkpoint()
    versions = {k: s.get_next_version(None, None) for k in values}
    cp["channel_values"] = dict(values)
    cp["channel_versions"] = dict(versions)
    md: dict[str, Any] = {"source": "loop", "step": 0}
    if run_id:
        md["run_id"] = run_id
    return s.put(parent or config(thread), cp, md, versions)  # type: ignore[arg-type]


def stored_value_bytes(backend: Any, s: MemtierCheckpointSaver, thread: str) -> int:
    """The sum the scripts account for: value bytes of the four hashes of the thread."""
    keys = s.keyspace.thread(thread)
    client = backend.sync_client()
    total = 0
    for key in (keys.checkpoints, keys.versions, keys.blobs, keys.writes):
        for field in client.hkeys(key):
            total += int(client.hstrlen(key, field))
    return total


def test_every_key_of_a_thread_shares_one_slot(backend: Any) -> None:
    s = saver(backend)
    for n in range(50):
        keys = s.keyspace.thread(f"thread {n} {{odd}} ünïcode")
        assert len({key_slot(k.encode()) for k in keys.all()}) == 1
    assert key_slot(s.keyspace.threads.encode()) == key_slot(s.keyspace.run("r1").encode())


def test_ttl_is_set_and_refreshed_on_write(backend_no_fake: Any) -> None:
    s = saver(backend_no_fake, ttl_s=100)
    first = put(s, "t-ttl", {"a": 1})
    keys = s.keyspace.thread("t-ttl")
    client = backend_no_fake.sync_client()
    for key in (keys.state, keys.index, keys.checkpoints, keys.versions, keys.blobs):
        assert 0 < client.pttl(key) <= 100_000
    client.pexpire(keys.checkpoints, 5_000)  # as if time had passed
    s.put_writes(first, [("ch", "v")], "task-1")
    assert client.pttl(keys.checkpoints) > 90_000  # refreshed by the write
    assert 0 < client.pttl(keys.writes) <= 100_000


def test_bounds_have_hard_ceilings(backend: Any) -> None:
    with pytest.raises(ConfigurationError):
        saver(backend, ttl_s=CHECKPOINT_THREAD_TTL_SECONDS.ceiling + 1)
    with pytest.raises(ConfigurationError):
        saver(backend, max_thread_bytes=int(CHECKPOINT_THREAD_BYTES.ceiling) + 1)
    with pytest.raises(ConfigurationError):
        MemtierCheckpointSaver(namespace="x")


def test_byte_ceiling_refuses_whole_writes_and_counts_exactly(backend: Any) -> None:
    s = saver(backend, max_thread_bytes=4096)
    first = put(s, "t-full", {"a": "x" * 100})
    used = s.thread_bytes("t-full")
    assert used == stored_value_bytes(backend, s, "t-full") > 100
    before = list(s.list(config("t-full")))
    with pytest.raises(CapacityError) as err:
        put(s, "t-full", {"a": "y" * 5000}, parent=first)
    assert err.value.code == "capacity_exceeded" and err.value.details["limit_bytes"] == 4096
    with pytest.raises(CapacityError):
        s.put_writes(first, [("ch", "z" * 5000)], "task")
    assert s.thread_bytes("t-full") == used  # nothing half-written
    assert [t.checkpoint["id"] for t in s.list(config("t-full"))] == [
        t.checkpoint["id"] for t in before
    ]
    assert s.get_tuple(first).pending_writes == []  # type: ignore[union-attr]
    text = render().decode()
    assert (
        'memtier_checkpoint_operations_total{operation="put",outcome="capacity_exceeded"}' in text
    )


def test_bad_names_are_validation_errors(backend: Any) -> None:
    s = saver(backend)
    for bad in (config("t", ns="a\0b"), config(""), {"configurable": {}}):
        with pytest.raises(ValidationError) as err:
            put(s, "ignored", {"a": 1}, parent=bad)
        assert err.value.code == "invalid_input"
    with pytest.raises(ValidationError):
        s.prune(["t"], strategy="sometimes")
    with pytest.raises(ValidationError):
        s.put_writes(config("t"), [("c", 1)], "task")  # no checkpoint id


_values = st.dictionaries(
    st.sampled_from(["a", "b", "c", "messages"]),
    st.one_of(
        st.integers(-(2**63), 2**64 - 1),  # msgpack's range; outside it: the test below
        st.text(max_size=50),
        st.lists(st.text(max_size=8), max_size=4),
    ),
    max_size=3,
)
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("put"), _values),
        st.tuples(st.just("writes"), _values),
        st.tuples(st.just("prune"), st.just({})),
        st.tuples(st.just("runs"), st.just({})),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=_steps)
def test_accounting_is_exact_under_any_sequence(backend: Any, steps: list[Any]) -> None:
    """After any mix of puts, writes, prunes and run deletions the byte total is exact."""
    s = saver(backend)
    s.delete_thread("acct")
    last: Any = None
    for n, (kind, values) in enumerate(steps):
        if kind == "put":
            last = put(s, "acct", values, parent=last, run_id=f"run-{n % 2}")
        elif kind == "writes" and last is not None:
            s.put_writes(last, list(values.items()), f"task-{n}")
        elif kind == "prune":
            s.prune(["acct"])
        elif kind == "runs":
            s.delete_for_runs(["run-0"])
            last = None
        assert s.thread_bytes("acct") == stored_value_bytes(backend, s, "acct")
        latest = s.get_tuple(config("acct"))
        if latest is not None:
            assert set(latest.checkpoint["channel_values"]) <= {"a", "b", "c", "messages"}
    s.delete_thread("acct")
    assert s.thread_bytes("acct") == 0
    assert stored_value_bytes(backend, s, "acct") == 0


def test_a_value_the_serializer_cannot_encode_is_a_validation_error(backend: Any) -> None:
    s = saver(backend)
    first = put(s, "t-enc", {"a": 1})
    before = s.thread_bytes("t-enc")
    for bad in (2**64, -(2**63) - 1):  # past msgpack's integers (found by Hypothesis)
        with pytest.raises(ValidationError) as err:
            put(s, "t-enc", {"a": bad}, parent=first)
        assert err.value.code == "invalid_input"
        with pytest.raises(ValidationError):
            s.put_writes(first, [("ch", bad)], "task")
    assert s.thread_bytes("t-enc") == before  # nothing half-written
    assert len(list(s.list(config("t-enc")))) == 1


def test_prune_keeps_the_latest_blobs_and_drops_the_rest(backend: Any) -> None:
    s = saver(backend)
    c1 = put(s, "t-prune", {"a": "old", "b": "kept"})
    cp = empty_checkpoint()
    first = s.get_tuple(c1)
    assert first is not None
    cp["channel_versions"] = dict(first.checkpoint["channel_versions"])
    new_a = s.get_next_version(cp["channel_versions"]["a"], None)
    cp["channel_versions"]["a"] = new_a
    cp["channel_values"] = {"a": "new"}
    c2 = s.put(c1, cp, {"source": "loop", "step": 1}, {"a": new_a})
    s.prune(["t-prune"])
    (only,) = list(s.list(config("t-prune")))
    assert only.config == c2
    assert only.checkpoint["channel_values"] == {"a": "new", "b": "kept"}
    blobs = backend.sync_client().hkeys(s.keyspace.thread("t-prune").blobs)
    assert len(blobs) == 2  # the old "a" blob is gone
    assert s.thread_bytes("t-prune") == stored_value_bytes(backend, s, "t-prune")


async def test_async_and_sync_forms_see_the_same_data(backend: Any) -> None:
    s = saver(backend)
    c1 = put(s, "t-both", {"a": 1})
    await s.aput_writes(c1, [("ch", {"x": 1})], "task-a")
    got = await s.aget_tuple(config("t-both"))
    assert got is not None and got.pending_writes == [("task-a", "ch", {"x": 1})]
    assert [t.config async for t in s.alist(None)] == [t.config for t in s.list(None)]
    await s.adelete_thread("t-both")
    assert s.get_tuple(config("t-both")) is None
    assert list(s.list(None)) == []


def test_script_contracts_every_output(backend: Any) -> None:
    """lua/langgraph called with hand-built KEYS/ARGV: each status and error reply."""
    from memtier.errors import ScriptError

    s = saver(backend)
    client = backend.sync_client()
    keys = s.keyspace.thread("contract").all()
    write, read, drop = (
        s.scripts[n] for n in ("checkpoint_write", "checkpoint_read", "checkpoint_drop")
    )
    ok = write(client, keys, ["contract", 1000, 10, "set", 3, "m", "12345"])
    assert [int(x) for x in ok] == [0, 5, 5]
    again = write(client, keys, ["contract", 1000, 10, "nx", 3, "m", "1234567"])
    assert [int(x) for x in again] == [0, 5, 0]  # nx on an existing field: skipped
    full = write(client, keys, ["contract", 1000, 10, "set", 5, "b", "x" * 6])
    assert [int(x) for x in full] == [-1, 11, 10]  # THREAD_FULL, nothing written
    assert client.hlen(s.keyspace.thread("contract").blobs) == 0
    for bad in (
        ["contract", 1000, 10, "set", 3, "m"],  # ops not in fours
        ["contract", "x", 10],
        ["contract", 1000, 10, "del", 3, "m", "v"],
        ["contract", 1000, 10, "set", 2, "m", "v"],  # a hash op on the index zset
    ):
        with pytest.raises(ScriptError):
            write(client, keys, bad)
    assert list(read(client, s.keyspace.thread("contract").reads(), ["ids", "nothing"])) == [0]
    with pytest.raises(ScriptError):
        read(client, s.keyspace.thread("contract").reads(), ["sideways"])
    with pytest.raises(ScriptError):
        drop(client, keys, ["sometimes"])
    assert [int(x) for x in drop(client, keys, ["thread"])] == [0, 5, 0]
    assert client.exists(*keys) == 0


def test_thread_index_drops_threads_past_their_ttl(backend: Any) -> None:
    s = saver(backend, ttl_s=60)
    client = backend.sync_client()
    client.zadd(s.keyspace.threads, {"long-gone": 1})  # written in 1970: expired long ago
    put(s, "fresh", {"a": 1})
    assert [m.decode() for m in client.zrange(s.keyspace.threads, 0, -1)] == ["fresh"]
    assert [t.config["configurable"]["thread_id"] for t in s.list(None)] == ["fresh"]
