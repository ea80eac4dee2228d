"""Redis loses its data under running processes: detected, and the absent sessions restored.

Each test flushes 20 sessions, then Redis loses the namespace (``wipe``: on a real
server every key of it, gate state included) while the process keeps running; appends
land after the loss (one new session, one old key re-created) before the check.  The
check restores the other 19 sessions of the newest generation, create-only: the old
key re-created by an append keeps exactly what it holds now.

The real restarts (a worker process, an in-process store) are in
``tests/faults/test_data_loss_faults.py``; these run on every backend, the real
cluster included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_worker_recovery import wipe
from workhelpers import (
    Clock,
    assert_exact_accounting,
    key,
    persistent_store,
    populate,
    snaps,
)

from memtier import AgentResponse, AvatarMessage, ConversationStore, ReasonCode
from memtier.memory.persistence import LossWatch, restore_gate_call
from memtier.memory.restorestatus import GateStatus
from memtier.workers.worker import Worker, WorkerOptions

SESSIONS = 20
NEW_KEY = key(500, "public")


def _started(backend: Any, tmp_path: Path, clock: Clock) -> tuple[ConversationStore, Worker]:
    """A worker over a store that ran its start-up recovery (it saw the gate epoch)."""
    store = persistent_store(backend, tmp_path, clock)
    assert store.recover().outcome == "empty"  # first start: nothing on disk yet
    worker = Worker(store, WorkerOptions(loss_check_interval_s=3600, flush_on_stop=False))
    assert worker.loss_watch is not None and worker.loss_watch.epoch
    return store, worker


def _writer(backend: Any, tmp_path: Path, clock: Clock) -> ConversationStore:
    """Another process's store that never checks (an application without persistence)."""
    return persistent_store(backend, tmp_path, clock)


def _appends_after_the_loss(writer: ConversationStore, old: Any) -> tuple[Any, Any]:
    new = writer.append(NEW_KEY, AvatarMessage(text="first words after the loss"))
    again = writer.append(old, AgentResponse(text="old key, written after the loss"))
    assert again.seq == 1  # the loss: a fresh session at an old key
    return new, again


def _check_restored(
    store: ConversationStore, before: dict[Any, Any], old: Any, again: Any, new: Any
) -> None:
    for k, ctx in before.items():
        now = store.context(k)
        if k == old:
            # Re-created by an append before the restore: it stays as it is.
            assert now.session_id == again.session_id
            assert [t.seq for t in now.turns] == [1]
            assert "old key, written after the loss" in str(now.messages)
            assert "old key" not in str(ctx.messages)
        else:
            assert now.session_id is not None and now.session_id != ctx.session_id  # D7
            assert now.messages == ctx.messages and now.turns == ctx.turns
    assert store.context(NEW_KEY).session_id == new.session_id
    assert store.stats()["sessions"] == SESSIONS + 1
    assert_exact_accounting(store)
    restored = [e for e in store.events(limit=1000) if e.reason is ReasonCode.RESTORED]
    assert len(restored) == SESSIONS - 1
    assert {(e.avatar, e.channel) for e in restored} == {
        (k.avatar, k.channel.value) for k in before if k != old
    }


def test_worker_restores_the_absent_sessions_after_redis_lost_its_data(
    backend: Any, tmp_path: Path
) -> None:
    clock = Clock()
    store, worker = _started(backend, tmp_path, clock)
    before = populate(store, SESSIONS)
    worker.flush()
    assert worker.stats.flushes == 1
    worker.check_data_loss(force=True)
    assert worker.stats.data_losses == 0  # nothing lost: no false alarm
    wipe(backend)
    old = next(iter(before))
    new, again = _appends_after_the_loss(_writer(backend, tmp_path, clock), old)
    worker.check_data_loss(force=True)
    assert worker.stats.data_losses == 1 and worker.stats.restored == SESSIONS - 1
    report = store.last_recovery
    assert report is not None and report.after_loss and report.outcome == "restored"
    assert (report.restored, report.existing) == (SESSIONS - 1, 1)
    _check_restored(store, before, old, again, new)
    # The new epoch is adopted: the next check finds nothing, and restores nothing again.
    deleted = next(k for k in before if k != old)
    assert store.delete(deleted)
    worker.check_data_loss(force=True)
    assert worker.stats.data_losses == 1
    assert store.context(deleted).session_id is None  # a delete is not undone


def test_a_start_after_the_loss_that_found_live_data_does_not_hide_it(
    backend: Any, tmp_path: Path
) -> None:
    """Before: the new process's recovery said ``live`` and 0 of 20 sessions came back."""
    clock = Clock()
    store, worker = _started(backend, tmp_path, clock)
    before = populate(store, SESSIONS)
    worker.flush()
    wipe(backend)
    old = next(iter(before))
    writer = _writer(backend, tmp_path, clock)
    new, again = _appends_after_the_loss(writer, old)
    fresh = writer.recover()  # a process (re)started after the loss: Redis is not empty
    assert fresh.outcome == "live" and fresh.restored == 0 and fresh.epoch
    worker.check_data_loss(force=True)  # the running worker saw another epoch before
    assert worker.stats.data_losses == 1
    report = store.last_recovery
    assert report is not None and report.outcome == "restored" and report.epoch == fresh.epoch
    _check_restored(store, before, old, again, new)
    # Handled now: a second worker that saw the old epoch too adopts it, restores nothing.
    late = LossWatch(3600, epoch="an-epoch-before-the-loss")
    other = persistent_store(backend, tmp_path, clock)
    other.loss_watch = late
    assert other.check_data_loss(force=True) is None and late.epoch == fresh.epoch


def test_flushes_are_held_while_a_loss_is_not_restored(backend: Any, tmp_path: Path) -> None:
    clock = Clock()
    store, worker = _started(backend, tmp_path, clock)
    before = populate(store, SESSIONS)
    worker.flush()
    first = snaps(store).generations()
    wipe(backend)
    writer = _writer(backend, tmp_path, clock)
    writer.append(NEW_KEY, AvatarMessage(text="after the loss"))
    # Another process is restoring (it holds the gate): this worker must not flush a
    # generation with one session, which would become the newest.
    acquired = store.executor.execute(restore_gate_call(store.core, "acquire", "other"))
    assert int(acquired[0]) == GateStatus.OK
    worker.flush()
    assert worker.stats.flushes_held == 1 and worker.stats.flushes == 1
    assert snaps(store).generations() == first
    assert worker.loss_watch is not None and worker.loss_watch.pending
    store.client.delete(store.core.keyspace.restore_lock)  # that restorer died
    worker.flush()  # checks first: restores, then flushes the whole namespace
    assert worker.stats.flushes == 2 and not worker.loss_watch.pending
    assert store.stats()["sessions"] == SESSIONS + 1
    assert all(store.context(k).messages == ctx.messages for k, ctx in before.items())
    assert_exact_accounting(store)


def test_a_store_that_never_saw_the_gate_does_not_restore(backend: Any, tmp_path: Path) -> None:
    """No evidence, no restore: a namespace never initialised is not a data loss."""
    clock = Clock()
    store = persistent_store(backend, tmp_path, clock)
    populate(store, 3)
    store.flush()
    store.loss_watch = LossWatch(3600)
    wipe(backend)
    store.append(NEW_KEY, AvatarMessage(text="hello"))
    assert store.check_data_loss(force=True) is None
    assert store.stats()["sessions"] == 1


def test_the_in_process_store_checks_on_its_schedule_and_restores(
    backend: Any, tmp_path: Path
) -> None:
    clock = Clock()
    store = persistent_store(backend, tmp_path, clock)
    store.loss_watch = LossWatch(3600)
    store.recover()
    before = populate(store, SESSIONS)
    store.flush()
    wipe(backend)
    old, later = list(before)[:2]
    new, again = _appends_after_the_loss(_writer(backend, tmp_path, clock), old)
    store.loss_watch.next_check = 0.0  # the schedule's period has passed
    # The due check runs before the append: the restore comes first, so this append
    # continues its restored session (seq after the snapshot's, under the new id).
    receipt = store.append(later, AvatarMessage(text="after the restore"))
    assert receipt.seq == before[later].turns[-1].seq + 1
    assert receipt.session_id != before[later].session_id
    report = store.last_recovery
    assert report is not None and report.after_loss and report.restored == SESSIONS - 1
    assert store.context(later).turns[:-1] == before[later].turns
    assert store.context(old).session_id == again.session_id
    assert store.context(NEW_KEY).session_id == new.session_id
    assert_exact_accounting(store)


async def test_the_async_store_checks_and_restores(backend: Any, tmp_path: Path) -> None:
    from memtier import AsyncConversationStore
    from memtier.memory.persistence import snapshot_dir_for

    clock = Clock()
    sync = persistent_store(backend, tmp_path, clock)
    config = sync.config
    store = AsyncConversationStore(
        backend.async_client(), config, clock=clock, snapshots=snapshot_dir_for(config)
    )
    store.loss_watch = LossWatch(3600)
    assert (await store.recover()).epoch
    before = populate(sync, SESSIONS)
    await store.flush()
    wipe(backend)
    old = next(iter(before))
    new, again = _appends_after_the_loss(_writer(backend, tmp_path, clock), old)
    report = await store.check_data_loss(force=True)
    assert report is not None and report.after_loss and report.outcome == "restored"
    _check_restored(sync, before, old, again, new)
    assert await store.check_data_loss(force=True) is None


# --------------------------------------------------------------------------- adversary

# What happens after the loss, in order: an append to old key i / to new key i, a process
# (re)starting (its start-up recovery), or the running worker's check.
Step = tuple[str, int]
steps = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["old", "new"]), st.integers(0, 3)),
        st.tuples(st.sampled_from(["start", "check"]), st.just(0)),
    ),
    max_size=10,
)
OLD_KEYS = 4


@settings(max_examples=40)
@example(ops=[("old", 0), ("start", 0), ("old", 0), ("check", 0)])  # "live" hid the loss
@example(ops=[("start", 0), ("old", 1), ("check", 0)])  # the start restored everything
@example(ops=[("check", 0), ("old", 2), ("new", 2)])  # restored first, then appended to
@example(ops=[])
@given(ops=steps)
def test_model_no_flushed_session_or_acknowledged_turn_lost_after_a_loss(
    ops: list[Step],
) -> None:
    """An adversary interleaves appends, fresh starts and checks after Redis lost its data;
    at the end (one more check) the model must hold for every key."""
    import tempfile

    import fakeredis

    from memtier.config import MemtierConfig
    from memtier.memory.persistence import snapshot_dir_for

    server = fakeredis.FakeServer()
    with tempfile.TemporaryDirectory() as tmp:
        config = MemtierConfig.load(
            namespace="loss",
            conversation={"persistence_enabled": True, "storage_path": tmp},
        )
        clock = Clock()

        def store() -> ConversationStore:
            client = fakeredis.FakeRedis(server=server)
            return ConversationStore(
                client, config, clock=clock, snapshots=snapshot_dir_for(config)
            )

        running = store()
        running.recover()
        worker = Worker(running, WorkerOptions(loss_check_interval_s=3600, flush_on_stop=False))
        before = populate(running, OLD_KEYS)
        old_keys = list(before)
        worker.flush()
        running.client.flushall()  # Redis lost everything, under the running worker
        restored_yet = False
        recreated: set[Any] = set()  # old keys an append re-created before the restore
        after: dict[Any, list[str]] = {}  # every key -> turn ids acknowledged after the loss
        for n, (op, i) in enumerate(ops):
            if op in ("old", "new"):
                k = old_keys[i] if op == "old" else key(100 + i)
                if op == "old" and not restored_yet and not after.get(k):
                    recreated.add(k)
                running_writer = store()
                running_writer.append(k, AvatarMessage(text=f"after {n}", turn_id=f"after-{n}"))
                after.setdefault(k, []).append(f"after-{n}")
            elif op == "start":
                report = store().recover()
                if not after and not restored_yet:
                    assert report.outcome == "restored"  # an empty namespace: all of it
                restored_yet = True if not after else restored_yet
            else:
                worker.check_data_loss(force=True)
                restored_yet = True
        worker.check_data_loss(force=True)
        judge = store()
        for k in old_keys + [key(100 + i) for i in range(4)]:
            ctx = judge.context(k)
            # Every turn acknowledged after the loss is there, once, in order.
            late = [t.turn_id for t in ctx.turns if (t.turn_id or "").startswith("after-")]
            assert late == after.get(k, []), (k, ops)
            if k in before:
                if k in recreated:  # stays as it is: only what was appended after the loss
                    assert [t.seq for t in ctx.turns] == list(range(1, len(after[k]) + 1))
                else:  # back, with anything appended after the restore on top
                    assert ctx.turns[: len(before[k].turns)] == before[k].turns, (k, ops)
                    assert ctx.session_id != before[k].session_id
            elif k not in after:
                assert ctx.session_id is None
        assert_exact_accounting(judge)
        restored = [e for e in judge.events(limit=1000) if e.reason is ReasonCode.RESTORED]
        assert len(restored) == OLD_KEYS - len(recreated), ops
