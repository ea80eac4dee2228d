"""``memtier worker``: consumer-group compaction, reclaiming a killed worker's jobs, CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from workhelpers import (
    Clock,
    append_raw,
    assert_exact_accounting,
    key,
    persistent_store,
    populate,
    session_hash,
    snaps,
    sync_store,
    turn_for,
)

from memtier import AvatarMessage, ConversationStore, ReasonCode
from memtier.config import MemtierConfig
from memtier.memory.summary import SummaryRequest
from memtier.workers import GROUP, Worker, WorkerOptions
from memtier.workers.cli import flush_main, inspect_main, restore_main, worker_main

REPO = Path(__file__).resolve().parents[2]
SMALL = {"max_turns_per_session": 10, "max_tool_results": 4}
FAST = WorkerOptions(block_ms=50, claim_idle_ms=200, sweep_interval_s=3600, flush_interval_s=None)


def _queue_jobs(store: Any, n: int) -> list[Any]:
    """``n`` sessions at 80 % of their turn bound: one compaction job each."""
    keys = [key(100 + i, "im" if i % 2 else "public") for i in range(n)]
    for k in keys:
        for j in range(8):
            append_raw(store, k, turn_for(j))
    return keys


def _streams(store: Any) -> tuple[int, int]:
    queued = claimed = 0
    for part in store.core.keyspace.all_partitions():
        queued += store.client.xlen(part.compact)
        try:
            claimed += int(store.client.xpending(part.compact, GROUP)["pending"])
        except Exception:
            pass
    return queued, claimed


def _compacted(store: Any) -> Counter[Any]:
    return Counter(
        (e.avatar, e.channel) for e in store.events(limit=1000) if e.reason is ReasonCode.COMPACTED
    )


@pytest.mark.parametrize("partitions", [1, 4])
def test_worker_processes_every_job_once(backend: Any, partitions: int) -> None:
    store = sync_store(backend, Clock(), conversation=SMALL, partitions=partitions)
    keys = _queue_jobs(store, 12)
    assert _streams(store)[0] == 12
    worker = Worker(sync_store(backend, Clock(), conversation=SMALL, partitions=partitions), FAST)
    stats = worker.run(drain=True, deadline_s=120)
    assert stats.outcomes == {"applied": 12} and stats.jobs == 12
    assert _streams(store) == (0, 0)
    for k in keys:
        h = session_hash(store, k)
        assert h["sv"] == "1" and h["turns"] == "5" and "cq" not in h
    assert _compacted(store) == Counter((k.avatar, k.channel) for k in keys)
    assert_exact_accounting(store)


def test_jobs_of_deleted_or_rotated_sessions_are_dropped(backend: Any) -> None:
    clock = Clock()
    store = sync_store(backend, clock, conversation={**SMALL, "public_ttl_seconds": 60})
    gone, _im, rotated = _queue_jobs(store, 3)  # two public sessions and one IM
    assert store.delete(gone)
    clock.advance(60_000)
    append_raw(store, rotated, AvatarMessage(text="new session"))
    worker = Worker(sync_store(backend, clock, conversation=SMALL), FAST)
    stats = worker.run(drain=True, deadline_s=60)
    assert stats.outcomes.get("not_found", 0) >= 1 and stats.outcomes.get("applied") == 1
    assert _streams(store) == (0, 0)
    assert session_hash(store, gone) == {}  # nothing resurrected
    assert "summary" not in session_hash(store, rotated)  # the new session is untouched
    assert_exact_accounting(store)


def test_a_job_that_keeps_failing_is_dropped_and_can_be_queued_again(backend: Any) -> None:
    store = sync_store(backend, Clock(), conversation=SMALL, inline_compaction=False)
    (k,) = _queue_jobs(store, 1)

    def broken(request: SummaryRequest) -> str:
        raise RuntimeError("the summarizer service is down")

    failing = sync_store(backend, Clock(), conversation=SMALL, summarizer=broken)
    options = WorkerOptions(
        block_ms=10,
        claim_idle_ms=0,
        max_deliveries=2,
        sweep_interval_s=3600,
        flush_interval_s=None,
    )
    stats = Worker(failing, options).run(drain=True, deadline_s=60)
    assert stats.failed == 2 and stats.dropped == 1
    assert _streams(store) == (0, 0) and "cq" not in session_hash(store, k)
    append_raw(store, k, AvatarMessage(text="one more"))  # the next append re-queues
    assert _streams(store)[0] == 1


def test_worker_sweeps_expired_sessions_and_flushes(backend: Any, tmp_path: Path) -> None:
    clock = Clock()
    store = persistent_store(backend, tmp_path, clock, public_ttl_seconds=60)
    populate(store, 4)
    clock.advance(60_000)  # the public sessions are past their TTL, the IM ones are not
    options = WorkerOptions(block_ms=10, sweep_interval_s=0, flush_interval_s=0.001)
    worker = Worker(store, options)
    time.sleep(0.01)  # let the first flush come due (the interval is 1 ms)
    stats = worker.run(drain=True, deadline_s=60)
    assert stats.swept == 2 and stats.flushes >= 1
    expired = [e for e in store.events(limit=100) if e.reason is ReasonCode.EXPIRED]
    assert len(expired) == 2
    gen = snaps(store).generations()[0]
    assert gen.path.exists() and store.stats()["sessions"] == 2


# --------------------------------------------------------------------------- processes


_HANGING_WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from memtier import ConversationStore
    from memtier.config import MemtierConfig
    from memtier.workers import Worker, WorkerOptions
    url, ns, marker = sys.argv[1:4]
    config = MemtierConfig.load(redis_url=url, namespace=ns,
                                conversation={"max_turns_per_session": 10, "max_tool_results": 4})
    store = ConversationStore.from_config(config)

    def hang(job):
        Path(marker).write_text(job.entry_id)
        time.sleep(3600)  # killed here, mid-job, holding its claimed batch

    Worker(store, WorkerOptions(batch=5, consumer="doomed"), on_claimed=hang).run()
    """
)


@pytest.mark.slow
def test_worker_killed_mid_job_its_jobs_are_reclaimed_and_done_once(
    redis_server: Any, tmp_path: Path
) -> None:
    namespace = "wk" + os.urandom(4).hex()
    config = MemtierConfig.load(redis_url=redis_server.url, namespace=namespace, conversation=SMALL)
    store = ConversationStore.from_config(config, recover=False, inline_compaction=False)
    try:
        keys = _queue_jobs(store, 20)
        marker = tmp_path / "claimed"
        doomed = subprocess.Popen(
            [sys.executable, "-c", _HANGING_WORKER, redis_server.url, namespace, str(marker)],
            cwd=REPO,
        )
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert doomed.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
        assert _streams(store)[1] == 5  # its claimed batch is stuck in the group
        cmd = [
            sys.executable,
            "-m",
            "memtier",
            "worker",
            "--redis-url",
            redis_server.url,
            "--namespace",
            namespace,
            "--drain",
            "--deadline",
            "120",
            "--claim-idle-ms",
            "300",
            "--block-ms",
            "50",
            "--sweep-interval",
            "3600",
            "--flush-interval",
            "0",
        ]
        env = {
            **os.environ,
            "MEMTIER_CONVERSATION__MAX_TURNS_PER_SESSION": "10",
            "MEMTIER_CONVERSATION__MAX_TOOL_RESULTS": "4",
        }
        survivors = [
            subprocess.Popen(
                [*cmd, "--consumer", f"survivor{i}"], cwd=REPO, env=env, stdout=subprocess.PIPE
            )
            for i in range(2)
        ]
        stats = []
        for proc in survivors:
            out, _ = proc.communicate(timeout=240)
            assert proc.returncode == 0
            stats.append(json.loads(out.splitlines()[-1]))
        assert sum(s["reclaimed"] for s in stats) >= 5
        assert sum(s["outcomes"].get("applied", 0) for s in stats) == 20
        assert _streams(store) == (0, 0)
        # Every session compacted exactly once: one event each, summary version 1.
        assert _compacted(store) == Counter((k.avatar, k.channel) for k in keys)
        assert all(session_hash(store, k)["sv"] == "1" for k in keys)
        assert_exact_accounting(store)
    finally:
        leftover = store.client.keys("*" + namespace + "*")
        if leftover:
            store.client.delete(*leftover)
        store.close()


# --------------------------------------------------------------------------- CLI


def _cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MEMTIER_CONVERSATION__PERSISTENCE_ENABLED", "true")
    monkeypatch.setenv("MEMTIER_CONVERSATION__STORAGE_PATH", str(tmp_path))
    monkeypatch.setenv("MEMTIER_CONVERSATION__MAX_TURNS_PER_SESSION", "10")


def _lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]


def test_cli_flush_inspect_restore_worker(
    redis_server: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _cli_env(monkeypatch, tmp_path)
    namespace = "cli" + os.urandom(4).hex()
    common = ["--redis-url", redis_server.url, "--namespace", namespace]
    config = MemtierConfig.load(redis_url=redis_server.url, namespace=namespace)
    store = ConversationStore.from_config(config, recover=False, inline_compaction=False)
    try:
        secret_content = "the-content-must-never-show-up-in-inspect"
        store.append(key(1), AvatarMessage(text=secret_content))
        _queue_jobs(store, 2)
        capsys.readouterr()

        assert inspect_main([*common, "sessions"]) == 0
        out = capsys.readouterr().out
        assert secret_content not in out
        rows = [json.loads(x) for x in out.splitlines()]
        assert {r["avatar"] for r in rows} >= {str(key(1).avatar)} and len(rows) == 3
        assert set(rows[0]) == {
            "session_id",
            "avatar",
            "channel",
            "created_at",
            "last_active_at",
            "turn_count",
            "bytes",
        }

        assert inspect_main([*common, "jobs"]) == 0
        assert _lines(capsys) == [{"partition": 0, "queued": 2, "claimed": 0}]

        assert (
            worker_main(
                [
                    *common,
                    "--drain",
                    "--deadline",
                    "60",
                    "--flush-interval",
                    "0",
                    "--block-ms",
                    "50",
                ]
            )
            == 0
        )
        worker_stats = _lines(capsys)[-1]
        assert worker_stats["outcomes"] == {"applied": 2}
        assert worker_stats["flushes"] == 1  # the final flush of a drain (generation 1)

        assert flush_main(common) == 0
        flushed = _lines(capsys)[-1]
        assert flushed["generation"] == 2 and flushed["sessions"] == 3

        assert inspect_main([*common, "snapshots", "--verify"]) == 0
        snap = _lines(capsys)
        assert snap[0]["generation"] == 2 and snap[0]["valid"] is True and snap[0]["sessions"] == 3

        assert restore_main([*common, "--verify"]) == 0
        assert _lines(capsys)[0]["valid"] is True

        before = store.context(key(1))
        store.client.delete(*store.client.keys("*" + namespace + "*"))
        assert restore_main(common) == 0
        report = _lines(capsys)[-1]
        assert report["outcome"] == "restored" and report["restored"] == 3
        assert store.context(key(1)).messages == before.messages
        assert restore_main(common) == 0
        assert _lines(capsys)[-1]["outcome"] == "done_already"

        assert inspect_main([*common, "stats"]) == 0
        assert _lines(capsys)[-1]["sessions"] == 3
        assert inspect_main([*common, "events", "--limit", "1000"]) == 0
        reasons = [e["reason"] for e in _lines(capsys)]
        assert reasons == ["restored"] * 3  # the wipe took the older events with it
    finally:
        leftover = store.client.keys("*" + namespace + "*")
        if leftover:
            store.client.delete(*leftover)
        store.close()


def test_cli_usage_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MEMTIER_CONVERSATION__PERSISTENCE_ENABLED", raising=False)
    assert flush_main(["--namespace", "x" + os.urandom(3).hex()]) == 2
    assert "persistence is off" in capsys.readouterr().err
    assert inspect_main(["--redis-url", "ftp://nowhere", "stats"]) == 2
    assert "unknown Redis URL scheme" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        inspect_main(["nonsense"])
