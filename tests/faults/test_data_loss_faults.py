"""Redis restarts empty under running memtier processes: the flushed sessions come back.

Our own redis-server (``faultservers.FaultRedis``) with persistence off: a restart
comes back with nothing, gate state and consumer groups included.  Before this row,
0 of 20 flushed sessions came back once one new append had landed.  Now a running
``memtier worker`` process, or a running in-process store, notices the restore gate
state is gone and restores the absent sessions of the newest generation, create-only:
an old key re-created by an append after the loss keeps exactly that append.

Standalone only: the restart-empty fault needs one server we own; the same detection
and restore run on the real cluster fixture in
``tests/workers/test_worker_data_loss.py`` (the namespace deleted under the process).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from faultservers import FaultRedis, fault_redis
from servers import require_real_redis

# The worker tests' helpers (exact accounting, keys, a populated namespace) judge here too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workers"))
from workhelpers import assert_exact_accounting, key, populate

from memtier import AgentResponse, AvatarMessage, ConversationStore, MemtierConfig, ReasonCode

pytestmark = pytest.mark.real

SESSIONS = 20
SETTLE_S = 60.0  # bound on every wait below
NEW_KEY = key(900, "public")


@pytest.fixture(autouse=True)
def _needs_redis() -> None:
    require_real_redis("redis-server")


def _config(server: FaultRedis, namespace: str, storage: Path) -> MemtierConfig:
    return MemtierConfig.load(
        redis_url=server.url,
        namespace=namespace,
        conversation={"persistence_enabled": True, "storage_path": str(storage)},
    )


def _writer(config: MemtierConfig) -> ConversationStore:
    """An application process that does not check (recover=False: no watch)."""
    return ConversationStore.from_config(config, recover=False)


def _restored_events(store: ConversationStore) -> list[Any]:
    return [e for e in store.events(limit=1000) if e.reason is ReasonCode.RESTORED]


def _gate_done(server: FaultRedis, config: MemtierConfig) -> bool:
    """The restore gate state says the namespace is initialised (a recovery finished)."""
    from memtier.keys import MemoryKeyspace

    state = MemoryKeyspace(config.namespace, config.partitions).restore_state
    with server.client() as conn:
        return bool(conn.hget(state, "status") == b"done")


def _appends_after_the_loss(config: MemtierConfig, old: Any) -> tuple[Any, Any]:
    with _writer(config) as writer:
        new = writer.append(NEW_KEY, AvatarMessage(text="first words after the loss"))
        again = writer.append(old, AgentResponse(text="old key, written after the loss"))
    assert again.seq == 1  # Redis came back empty: a fresh session at the old key
    return new, again


def _judge(config: MemtierConfig, before: dict[Any, Any], old: Any, again: Any, new: Any) -> None:
    with _writer(config) as store:
        for k, ctx in before.items():
            now = store.context(k)
            if k == old:  # re-created before the restore: it stays as it is
                assert now.session_id == again.session_id
                assert [t.seq for t in now.turns] == [1]
                assert "old key, written after the loss" in str(now.messages)
            else:
                assert now.session_id is not None and now.session_id != ctx.session_id
                assert now.messages == ctx.messages and now.turns == ctx.turns
        assert store.context(NEW_KEY).session_id == new.session_id
        assert store.stats()["sessions"] == SESSIONS + 1
        assert_exact_accounting(store)
        restored = _restored_events(store)
        assert len(restored) == SESSIONS - 1
        assert {(e.avatar, e.channel) for e in restored} == {
            (k.avatar, k.channel.value) for k in before if k != old
        }


def test_a_running_worker_process_restores_after_redis_restarts_empty(tmp_path: Path) -> None:
    namespace = "dl" + uuid.uuid4().hex[:8]
    storage = tmp_path / "storage"
    env = {
        **os.environ,
        "MEMTIER_CONVERSATION__PERSISTENCE_ENABLED": "true",
        "MEMTIER_CONVERSATION__STORAGE_PATH": str(storage),
    }
    with fault_redis() as server, (tmp_path / "worker.log").open("wb") as log:
        config = _config(server, namespace, storage)
        with _writer(config) as store:
            before = populate(store, SESSIONS)
            assert store.flush().sessions == SESSIONS
        command = [sys.executable, "-m", "memtier", "worker", "--redis-url", server.url]
        command += ["--namespace", namespace, "--block-ms", "50", "--sweep-interval", "3600"]
        command += ["--flush-interval", "0", "--no-flush-on-stop"]
        worker = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log)

        def worker_log() -> str:
            return (tmp_path / "worker.log").read_text(errors="replace")[-4000:]

        try:
            deadline = time.monotonic() + SETTLE_S
            while not _gate_done(server, config):  # its start-up recovery: "live"
                assert worker.poll() is None, worker_log()
                assert time.monotonic() < deadline, "the worker never started"
                time.sleep(0.05)
            # Hold the worker still while Redis restarts and the appends land, so they
            # certainly come first (the harder case: an old key re-created before restore).
            os.kill(worker.pid, signal.SIGSTOP)
            try:
                server.restart()  # persistence off: Redis comes back empty
                old = next(iter(before))
                new, again = _appends_after_the_loss(config, old)
            finally:
                os.kill(worker.pid, signal.SIGCONT)
            deadline = time.monotonic() + SETTLE_S
            with _writer(config) as store:
                while len(_restored_events(store)) < SESSIONS - 1:
                    assert worker.poll() is None, worker_log()
                    assert time.monotonic() < deadline, "not restored: " + worker_log()
                    time.sleep(0.1)
            _judge(config, before, old, again, new)
            assert worker.poll() is None, worker_log()
            assert "recovery after a data loss: restored" in worker_log()
        finally:
            worker.terminate()
            worker.wait(timeout=60)


def test_a_running_in_process_store_restores_after_redis_restarts_empty(tmp_path: Path) -> None:
    namespace = "dl" + uuid.uuid4().hex[:8]
    storage = tmp_path / "storage"
    with fault_redis() as server:
        config = _config(server, namespace, storage)
        with ConversationStore.from_config(config) as store:  # persistence on: it watches
            assert store.last_recovery is not None and store.last_recovery.outcome == "empty"
            before = populate(store, SESSIONS)
            assert store.flush().sessions == SESSIONS
            server.restart()
            old, later = list(before)[:2]
            new, again = _appends_after_the_loss(config, old)
            # The store checks on its own schedule, from its appends and reads: no
            # worker, nobody calls anything else.  Bounded: a deadline and a count.
            deadline = time.monotonic() + SETTLE_S
            for _ in range(int(SETTLE_S / 0.1)):
                if store.context(later).session_id is not None:
                    break
                assert time.monotonic() < deadline, "the store never restored"
                time.sleep(0.1)
            assert store.loss_watch is not None and store.loss_watch.losses == 1
            report = store.last_recovery
            assert report is not None and report.after_loss and report.outcome == "restored"
            assert (report.restored, report.existing) == (SESSIONS - 1, 1)
            _judge(config, before, old, again, new)
            # Life goes on in the restored session: next seq, the restored session id.
            receipt = store.append(later, AvatarMessage(text="after the restore"))
            assert receipt.seq == before[later].turns[-1].seq + 1
            assert receipt.session_id == store.context(later).session_id
            assert_exact_accounting(store)
