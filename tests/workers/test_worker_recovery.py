"""Restart recovery: newest valid generation, quarantine, time rules, exactly one restorer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from workhelpers import (
    Clock,
    assert_exact_accounting,
    key,
    persistent_store,
    populate,
    resign,
    snaps,
)

from memtier import (
    AgentResponse,
    AsyncConversationStore,
    AvatarMessage,
    ConversationStore,
    ReasonCode,
)
from memtier.config import MemtierConfig
from memtier.limits import EXPIRY_GRACE_MS
from memtier.memory import snapshot
from memtier.memory.persistence import (
    restore_gate_call,
    restore_session_call,
    snapshot_dir_for,
)
from memtier.memory.restorestatus import GateStatus
from memtier.memory.snapshot import HEADER_BLOCK, iter_generation, verify_generation

REPO = Path(__file__).resolve().parents[2]


def wipe(backend: Any) -> None:
    """Redis lost this namespace's data (a restart without its own persistence)."""
    if backend.is_fake:
        backend.sync_client().flushall()
    else:
        backend.delete_namespace()


def _state(store: ConversationStore) -> dict[str, Any]:
    """Everything recovery must reproduce exactly (besides content): index, totals, LRU."""
    out: dict[str, Any] = {}
    for part in store.core.keyspace.all_partitions():
        out[part.tag] = {
            "index": store.client.hgetall(part.index),
            "bytes": store.client.hget(part.meta, "bytes"),
            "public": store.client.zrange(part.lru_public, 0, -1, withscores=True),
            "im": store.client.zrange(part.lru_im, 0, -1, withscores=True),
        }
    return out


def test_restore_reproduces_context_accounting_and_lru(backend: Any, tmp_path: Path) -> None:
    clock = Clock()
    store = persistent_store(backend, tmp_path, clock, max_turns_per_session=10)
    contexts = populate(store, 12, turns=14)  # compacted summaries included
    assert any(ctx.summary for ctx in contexts.values())
    metadata = sorted(store.iter_metadata(), key=lambda m: (str(m.avatar), m.channel))
    before = _state(store)
    assert store.flush().sessions == 12
    wipe(backend)
    assert store.context(key(1)).session_id is None
    report = store.recover()
    assert report.outcome == "restored" and report.restorer and report.restored == 12
    new_ids = {}
    for k, ctx in contexts.items():
        again = store.context(k)
        # D7: a restored session gets a new id (its old one may have handed out seqs
        # after the flush that were lost with Redis); content and seqs are the same.
        assert again.session_id is not None and again.session_id != ctx.session_id
        new_ids[ctx.session_id] = again.session_id
        assert again.messages == ctx.messages
        assert again.turns == ctx.turns
    assert _state(store) == before  # same clock: same LRU scores, index bytes, totals
    renamed = [m.model_copy(update={"session_id": new_ids[m.session_id]}) for m in metadata]
    assert sorted(store.iter_metadata(), key=lambda m: (str(m.avatar), m.channel)) == renamed
    assert_exact_accounting(store)
    restored = [e for e in store.events(limit=1000) if e.reason is ReasonCode.RESTORED]
    assert len(restored) == 12
    assert {e.detail for e in restored} == {f"generation=1 from={old}" for old in new_ids}
    assert {e.session_id for e in restored} == set(new_ids.values())
    # Receipts came back: a retry of a turn that was stored before the restart is a
    # duplicate, and returns the first receipt (the id it was acknowledged under).
    k0 = key(1, "public")
    retry = store.append(k0, AvatarMessage(text="ignored", turn_id="k0-t13"))
    assert retry.duplicate and retry.session_id == contexts[k0].session_id
    # Key TTLs: remaining inactivity TTL + grace.
    part = store.core.partition_for(k0)
    ttl = store.client.pttl(part.session(k0.member).session)
    assert 0 < ttl <= store.core.conv.public_ttl_ms + EXPIRY_GRACE_MS


def _three_sessions(store: ConversationStore, clock: Clock) -> None:
    store.append(key(1, "public"), AvatarMessage(text="old public"))  # age 40 s at the flush
    store.append(key(3, "im"), AvatarMessage(text="old im"))  # age 40 s at the flush
    clock.advance(30_000)
    store.append(key(2, "public"), AvatarMessage(text="fresh public"))  # age 10 s
    clock.advance(10_000)


def test_clock_forward_applies_elapsed_time_to_each_channel_ttl(
    backend: Any, tmp_path: Path
) -> None:
    clock = Clock()
    store = persistent_store(backend, tmp_path, clock, public_ttl_seconds=60, im_ttl_seconds=120)
    _three_sessions(store, clock)
    store.flush()
    wipe(backend)
    clock.advance(30_000)  # 30 s pass while Redis is down
    report = store.recover()
    assert (report.restored, report.expired) == (2, 1)
    assert store.context(key(1, "public")).session_id is None  # 40 + 30 >= 60: expired
    assert store.context(key(2, "public")).session_id is not None  # 10 + 30 < 60
    assert store.context(key(3, "im")).session_id is not None  # 40 + 30 < 120
    expired = [e for e in store.events(limit=100) if e.reason is ReasonCode.EXPIRED]
    assert [(e.avatar, e.detail) for e in expired] == [(key(1).avatar, "recovery")]
    part = store.core.partition_for(key(2))
    assert store.client.zscore(part.lru_public, key(2).member) == clock.now - 40_000
    assert store.client.zscore(part.lru_im, key(3, "im").member) == clock.now - 70_000
    ttl = store.client.pttl(part.session(key(2).member).session)
    assert 0 < ttl <= 60_000 - 40_000 + EXPIRY_GRACE_MS
    # The restored session still expires on its original schedule: 20 s left.
    clock.advance(20_000)
    assert store.context(key(2, "public")).session_id is None
    assert_exact_accounting(store)


def test_clock_backwards_counts_as_zero_elapsed(backend: Any, tmp_path: Path) -> None:
    clock = Clock()
    store = persistent_store(backend, tmp_path, clock, public_ttl_seconds=60, im_ttl_seconds=120)
    _three_sessions(store, clock)
    store.flush()
    wipe(backend)
    clock.advance(-3_600_000)  # the wall clock is an hour behind the flush now
    report = store.recover()
    assert (report.restored, report.expired) == (3, 0)
    part = store.core.partition_for(key(1))
    # Recovered age is exactly the age at the flush: nothing expires, nothing is extended.
    assert store.client.zscore(part.lru_public, key(1).member) == clock.now - 40_000
    assert store.client.zscore(part.lru_public, key(2).member) == clock.now - 10_000
    ttl = store.client.pttl(part.session(key(1).member).session)
    assert 0 < ttl <= 20_000 + EXPIRY_GRACE_MS
    clock.advance(20_000)
    assert store.context(key(1, "public")).session_id is None
    assert store.context(key(2, "public")).session_id is not None
    assert_exact_accounting(store)


def _corrupt_truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 50])


def _corrupt_flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[HEADER_BLOCK + 20] ^= 0x04
    path.write_bytes(bytes(data))


def _corrupt_oversize(path: Path) -> None:
    with open(path, "ab") as fh:
        fh.write(b"\0" * 300_000)


def _corrupt_schema(path: Path) -> None:
    resign(path, header=lambda h: h.update(schema_version=7))


def _corrupt_duplicate_seq(path: Path) -> None:
    def dup(i: int, obj: dict[str, Any]) -> dict[str, Any]:
        recs = obj["records"]
        return {**obj, "records": [recs[0], {**recs[1], "seq": recs[0]["seq"]}, *recs[2:]]}

    resign(path, line=dup)


def _corrupt_secret(path: Path) -> None:
    def secret(i: int, obj: dict[str, Any]) -> dict[str, Any]:
        if i:
            return obj
        rec = obj["records"][-1]
        body = next(k for k in rec["f"] if k in ("text", "summary", "outcome"))
        text = "key sk-ant-api03-" + "Ab1" * 30 + "AA"
        delta = len(text.encode()) - len(rec["f"][body].encode())
        new = {**rec, "f": {**rec["f"], body: text}, "bytes": rec["bytes"] + delta}
        return {**obj, "records": [*obj["records"][:-1], new], "bytes": obj["bytes"] + delta}

    resign(path, line=secret)


CORRUPTIONS = {
    "truncated": (_corrupt_truncate, "truncated"),
    "bit flip": (_corrupt_flip, "checksum"),
    "trailing bytes": (_corrupt_oversize, "corrupt"),
    "unknown schema": (_corrupt_schema, "unsupported"),
    "duplicate sequence": (_corrupt_duplicate_seq, "duplicate_sequence"),
    "secret": (_corrupt_secret, "secret"),
}


@pytest.mark.parametrize("damage", sorted(CORRUPTIONS))
def test_bad_newest_generation_is_quarantined_and_older_recovers(
    backend: Any, tmp_path: Path, damage: str
) -> None:
    corrupt, reason = CORRUPTIONS[damage]
    store = persistent_store(backend, tmp_path, Clock(), max_snapshot_bytes=256 * 1024)
    older = populate(store, 3, turns=3)
    first = store.flush()
    populate(store, 3, turns=3, start=10)
    newest = store.flush()
    corrupt(Path(newest.path))
    wipe(backend)
    report = store.recover()
    assert report.outcome == "restored" and report.generation == first.generation
    assert report.quarantined == [(Path(newest.path).name, reason)]
    assert not Path(newest.path).exists()
    moved = snaps(store).quarantined()
    assert [p.name for p in moved] == [f"{Path(newest.path).name}.{reason}"]
    assert oct(moved[0].stat().st_mode & 0o777) == "0o600"
    events = [e for e in store.events(limit=100) if e.reason is ReasonCode.QUARANTINED]
    assert [e.detail for e in events] == [f"{Path(newest.path).name}: {reason}"]
    for k, ctx in older.items():
        assert store.context(k).messages == ctx.messages
    assert store.context(key(11, "public")).session_id is None  # only in the bad generation
    assert_exact_accounting(store)


def test_sampled_truncations_each_quarantined_older_recovers(tmp_path: Path) -> None:
    """Truncations across the whole file (header, padding, payload, last byte) in recovery."""
    config = MemtierConfig.load(
        namespace="trunc",
        conversation={"persistence_enabled": True, "storage_path": str(tmp_path)},
    )
    clock = Clock()
    server = fakeredis.FakeServer()
    store = ConversationStore(
        fakeredis.FakeRedis(server=server), config, clock=clock, snapshots=snapshot_dir_for(config)
    )
    older = populate(store, 2, turns=2)
    store.flush()
    populate(store, 1, turns=2, start=5)
    newest = Path(store.flush().path)
    data = newest.read_bytes()
    offsets = sorted(
        {0, 1, 16, 17, 200, HEADER_BLOCK - 1, HEADER_BLOCK, len(data) - 1}
        | set(range(0, len(data), max(1, len(data) // 25)))
    )
    for cut in offsets:
        for path in snaps(store).quarantined():
            path.unlink()
        newest.write_bytes(data[:cut])
        store.client.flushall()
        report = store.recover()
        assert report.outcome == "restored" and report.generation == 1, cut
        assert len(report.quarantined) == 1, cut
        for k, ctx in older.items():
            assert store.context(k).messages == ctx.messages


def test_no_valid_generation_starts_empty_and_says_so(backend: Any, tmp_path: Path) -> None:
    store = persistent_store(backend, tmp_path)
    populate(store, 2)
    only = Path(store.flush().path)
    _corrupt_flip(only)
    wipe(backend)
    report = store.recover()
    assert report.outcome == "empty" and report.started_empty
    assert "no valid snapshot generation" in report.message
    assert report.quarantined == [(only.name, "checksum")]
    assert store.stats() == {"sessions": 0, "bytes": 0}
    assert store.append(key(1), AvatarMessage(text="life goes on")).seq == 1


def test_no_generation_at_all_starts_empty(backend: Any, tmp_path: Path) -> None:
    store = persistent_store(backend, tmp_path)
    report = store.recover()
    assert report.outcome == "empty" and report.quarantined == []


def test_live_data_is_never_overwritten_by_a_snapshot(backend: Any, tmp_path: Path) -> None:
    store = persistent_store(backend, tmp_path, Clock())
    old = populate(store, 3, turns=3)
    store.flush()
    wipe(backend)
    live_key = next(iter(old))
    live = store.append(live_key, AgentResponse(text="written after the restart"))
    report = store.recover()
    assert report.outcome == "live" and report.restored == 0  # not empty: live data wins
    forced = store.recover(force=True)  # an operator restore is create-only too
    assert forced.outcome == "restored" and forced.existing == 1 and forced.restored == 2
    ctx = store.context(live_key)
    assert ctx.session_id == live.session_id and [t.seq for t in ctx.turns] == [1]
    for k, before in old.items():
        if k != live_key:
            assert store.context(k).messages == before.messages
    assert_exact_accounting(store)


def test_a_second_start_does_not_restore_again(backend: Any, tmp_path: Path) -> None:
    store = persistent_store(backend, tmp_path, Clock())
    contexts = populate(store, 3)
    store.flush()
    wipe(backend)
    assert store.recover().outcome == "restored"
    gone = next(iter(contexts))
    assert store.delete(gone)
    again = persistent_store(backend, tmp_path, Clock()).recover()
    assert again.outcome == "done_already" and not again.restorer
    assert store.context(gone).session_id is None  # deleted data is not resurrected


def test_a_restorer_that_died_midway_is_continued(backend: Any, tmp_path: Path) -> None:
    store = persistent_store(backend, tmp_path, Clock())
    contexts = populate(store, 6)
    store.flush()
    wipe(backend)
    # A restorer took the gate, restored two sessions, then died (its lock expired).
    run = store.executor.execute
    assert int(run(restore_gate_call(store.core, "acquire", "dead"))[0]) == GateStatus.OK
    assert (
        int(run(restore_gate_call(store.core, "begin", "dead", generation="1"))[0]) == GateStatus.OK
    )
    gen = snaps(store).generations()[0]
    verified = verify_generation(gen, backend.namespace, store.core.conv, 10**9)
    assert not isinstance(verified, snapshot.Rejection)
    for n, session in enumerate(iter_generation(verified, store.core.conv)):
        if n == 2:
            break
        call = restore_session_call(store.core, session, "generation=1")
        args = list(call.args)  # by position: restore_session has no ScriptSpec yet
        args[11] = verified.header["flush_wall_ms"]
        assert int(store.executor.execute(type(call)(call.script, call.keys, tuple(args)))[0]) == 0
    store.client.delete(store.core.keyspace.restore_lock)
    report = store.recover()  # not empty any more, but the gate says "restoring": continue
    assert report.outcome == "restored" and (report.existing, report.restored) == (2, 4)
    for k, ctx in contexts.items():
        assert store.context(k).messages == ctx.messages
    assert_exact_accounting(store)


def test_a_waiting_worker_does_not_restore_while_another_holds_the_gate(
    backend: Any, tmp_path: Path
) -> None:
    store = persistent_store(backend, tmp_path, Clock())
    populate(store, 2)
    store.flush()
    wipe(backend)
    acquired = store.executor.execute(restore_gate_call(store.core, "acquire", "other"))
    assert int(acquired[0]) == GateStatus.OK
    report = store.recover(wait_s=0.3)
    assert report.outcome == "timeout" and not report.restorer
    assert store.stats()["sessions"] == 0
    store.executor.execute(
        restore_gate_call(store.core, "finish", "other", generation="1", outcome="restored")
    )
    assert store.recover().outcome == "done_already"


def test_startup_never_fails_on_an_unusable_snapshot_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the storage directory should be")
    config = MemtierConfig.load(
        namespace="bad" + os.urandom(3).hex(),
        conversation={"persistence_enabled": True, "storage_path": str(blocker)},
    )
    store = ConversationStore.from_config(config)  # embedded Redis, recovery on start
    try:
        assert store.last_recovery is not None and store.last_recovery.outcome == "error"
        assert store.append(key(1), AvatarMessage(text="still serving")).seq == 1
    finally:
        store.close()


def test_recovery_on_windows_publishes_permissions_not_verified(
    backend: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = persistent_store(backend, tmp_path)
    monkeypatch.setattr(snapshot.directory, "is_windows", lambda: True)
    report = store.recover()
    assert report.permissions_verified is False
    assert [e.reason for e in store.events(limit=10)] == [ReasonCode.PERMISSIONS_NOT_VERIFIED]


async def test_async_store_flushes_and_recovers_on_open(backend: Any, tmp_path: Path) -> None:
    config = backend.config(
        conversation={"persistence_enabled": True, "storage_path": str(tmp_path)}
    )
    store = AsyncConversationStore(
        backend.async_client(), config, snapshots=snapshot_dir_for(config)
    )
    await store.append(key(1), AvatarMessage(text="before"))
    before = await store.context(key(1))
    result = await store.flush()
    assert result.sessions == 1
    wipe(backend)
    report = await store.recover()
    assert report.outcome == "restored"
    assert (await store.context(key(1))).messages == before.messages


# --------------------------------------------------------------------------- real servers


def test_end_to_end_real_server_restart(redis_server: Any, tmp_path: Path) -> None:
    """Append on a real server, flush, stop and wipe Redis, start again, recover."""
    namespace = "e2e" + os.urandom(4).hex()
    config = MemtierConfig.load(
        redis_url=redis_server.url,
        namespace=namespace,
        conversation={
            "persistence_enabled": True,
            "storage_path": str(tmp_path),
            "max_turns_per_session": 8,
        },
    )
    store = ConversationStore.from_config(config)
    assert store.last_recovery is not None and store.last_recovery.outcome == "empty"
    contexts = populate(store, 5, turns=11)
    store.flush()
    store.close()
    redis_server.restart()  # no Redis persistence: comes back empty, script cache empty
    with redis_server.client() as raw:
        assert raw.dbsize() == 0
    again = ConversationStore.from_config(config)
    try:
        assert again.last_recovery is not None
        assert again.last_recovery.outcome == "restored" and again.last_recovery.restored == 5
        for k, ctx in contexts.items():
            now = again.context(k)
            assert now.session_id != ctx.session_id and now.messages == ctx.messages
        assert_exact_accounting(again)
    finally:
        again.client.delete(*again.client.keys("*" + namespace + "*"))
        again.close()


_START_CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    from memtier import ConversationStore
    from memtier.config import MemtierConfig
    url, ns, path, go = sys.argv[1:5]
    while not os.path.exists(go):
        time.sleep(0.005)
    config = MemtierConfig.load(redis_url=url, namespace=ns, conversation={
        "persistence_enabled": True, "storage_path": path})
    store = ConversationStore.from_config(config)
    r = store.last_recovery
    print(json.dumps({"outcome": r.outcome, "restorer": r.restorer, "restored": r.restored}))
    """
)


@pytest.mark.slow
def test_workers_starting_at_once_exactly_one_restores(redis_server: Any, tmp_path: Path) -> None:
    namespace = "herd" + os.urandom(4).hex()
    config = MemtierConfig.load(
        redis_url=redis_server.url,
        namespace=namespace,
        conversation={"persistence_enabled": True, "storage_path": str(tmp_path)},
    )
    store = ConversationStore.from_config(config, recover=False)
    try:
        contexts = populate(store, 400, turns=2)
        store.flush()
        store.client.delete(*store.client.keys("*" + namespace + "*"))
        go = tmp_path / "go"
        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _START_CHILD,
                    redis_server.url,
                    namespace,
                    str(tmp_path),
                    str(go),
                ],
                stdout=subprocess.PIPE,
                cwd=REPO,
            )
            for _ in range(4)
        ]
        time.sleep(0.5)  # let them import and spin on the start flag (not an assertion)
        go.write_text("go")
        reports = []
        for child in children:
            out, _ = child.communicate(timeout=240)
            assert child.returncode == 0
            reports.append(json.loads(out))
        restorers = [r for r in reports if r["restorer"]]
        assert len(restorers) == 1 and restorers[0]["outcome"] == "restored"
        assert restorers[0]["restored"] == 400
        assert all(r["outcome"] in ("waited", "done_already") for r in reports if not r["restorer"])
        restored_events = [e for e in _all_events(store) if e.reason is ReasonCode.RESTORED]
        assert len(restored_events) == 400  # each session restored exactly once
        for k, ctx in contexts.items():
            assert store.context(k).messages == ctx.messages
    finally:
        leftover = store.client.keys("*" + namespace + "*")
        if leftover:
            store.client.delete(*leftover)
        store.close()


def _all_events(store: ConversationStore) -> list[Any]:
    events: list[Any] = []
    after = None
    for _ in range(100):
        page = store.events(after=after, limit=1000)
        if not page:
            return events
        events += page
        after = page[-1].cursor
    raise AssertionError("too many events")


async def test_async_open_and_async_with_recover_on_start(
    redis_server: Any, tmp_path: Path
) -> None:
    namespace = "aopen" + os.urandom(4).hex()
    config = MemtierConfig.load(
        redis_url=redis_server.url,
        namespace=namespace,
        conversation={"persistence_enabled": True, "storage_path": str(tmp_path)},
    )
    store = await AsyncConversationStore.open(config)
    try:
        assert store.last_recovery is not None and store.last_recovery.outcome == "empty"
        await store.append(key(1), AvatarMessage(text="kept across the restart"))
        before = await store.context(key(1))
        await store.flush()
        await store.client.delete(*await store.client.keys("*" + namespace + "*"))
    finally:
        await store.close()
    async with AsyncConversationStore.from_config(config) as again:
        try:
            assert again.last_recovery is not None
            assert again.last_recovery.outcome == "restored"
            assert (await again.context(key(1))).messages == before.messages
        finally:
            await again.client.delete(*await again.client.keys("*" + namespace + "*"))
