"""Faults of the Redis process, judged by a ledger of acknowledged appends.

Each row starts its own redis-server (``faultservers.FaultRedis``: our pid, our
temp dir), runs writer processes (``ledger_writer.py``) that record every
attempt, injects one fault, lets the system settle, retries the unknown
outcomes with the same turn ids, and judges the ledger against Redis
(``ledger.judge``).  Bounded: every loop has a count and a deadline.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from faultservers import AOF_ALWAYS, FaultRedis, fault_redis
from ledger import (
    judge,
    ledger_key,
    read_ledgers,
    settle_unknowns,
    start_writers,
    turn_text,
    wait_writers,
)
from servers import require_real_redis, unavailable

from memtier import AvatarMessage, ConversationStore, MemtierConfig, MemtierError
from memtier.keys import MemoryKeyspace

pytestmark = pytest.mark.real

SETTLE_S = 60.0  # the longest a settled server may take to answer again


@pytest.fixture(autouse=True)
def _needs_redis() -> None:
    require_real_redis("redis-server")


def _namespace() -> str:
    return "f" + uuid.uuid4().hex[:8]


def _store(url: str, namespace: str) -> ConversationStore:
    return ConversationStore.from_config(
        MemtierConfig.load(redis_url=url, namespace=namespace), recover=False
    )


def _wait_answering(server: FaultRedis) -> None:
    deadline = time.monotonic() + SETTLE_S
    while True:
        try:
            with server.client(socket_timeout=2) as conn:
                if conn.ping():
                    return
        except Exception:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def _settle_and_judge(
    server: FaultRedis, namespace: str, ledgers: list[Path], **judge_options: Any
) -> None:
    _wait_answering(server)
    attempts = read_ledgers(ledgers)
    with _store(server.url, namespace) as store:
        settle_unknowns(store, attempts)
    with server.client() as conn:
        verdict = judge(conn, namespace, attempts, **judge_options)
    verdict.check()


def _wait_first_acks(ledgers: list[Path], count: int = 20, timeout_s: float = 60.0) -> None:
    """Inject the fault only once every writer has connected and is writing."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        acks = [p.read_text().count('"s":"ack"') if p.exists() else 0 for p in ledgers]
        if min(acks) >= 1 and sum(acks) >= count:
            return
        time.sleep(0.05)
    raise AssertionError("the writers acknowledged nothing before the fault")


def test_sigkill_and_restart_with_aof_always_loses_no_acknowledged_turn(tmp_path: Path) -> None:
    namespace = _namespace()
    with fault_redis(AOF_ALWAYS) as server:
        with start_writers(
            server.url, namespace, tmp_path, writers=3, turns=250, seconds=60, pause_ms=2
        ) as writers:
            _wait_first_acks(writers.ledgers)
            server.kill9()
            time.sleep(0.5)  # writers meet a dead server: their retries run out or ride it
            server.restart()
            wait_writers(writers)
        _settle_and_judge(server, namespace, writers.ledgers)


def test_stall_past_the_client_timeout(tmp_path: Path) -> None:
    """``DEBUG SLEEP`` past the socket timeout: replies are lost, retries must dedupe."""
    namespace = _namespace()
    with fault_redis() as server:
        url = server.url + "?socket_timeout=0.3"
        with start_writers(url, namespace, tmp_path, writers=3, turns=200, seconds=60) as writers:
            _wait_first_acks(writers.ledgers)
            for _ in range(3):
                with server.admin() as conn:
                    conn.execute_command("DEBUG", "SLEEP", "0.8")
                time.sleep(0.3)
            wait_writers(writers)
        _settle_and_judge(server, namespace, writers.ledgers)


def test_connections_killed_every_200ms(tmp_path: Path) -> None:
    namespace = _namespace()
    with fault_redis() as server:
        with start_writers(
            server.url, namespace, tmp_path, writers=3, turns=300, seconds=60, pause_ms=1
        ) as writers:
            _wait_first_acks(writers.ledgers)
            killed = 0
            deadline = time.monotonic() + 3.0
            with server.admin() as conn:
                while time.monotonic() < deadline:
                    killed += int(
                        conn.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
                    )
                    time.sleep(0.2)
            wait_writers(writers)
        assert killed > 0, "no connection was killed: the fault did not happen"
        _settle_and_judge(server, namespace, writers.ledgers)


def test_client_pause_write_keeps_reads_working(tmp_path: Path) -> None:
    """D9: the read scripts are ``no-writes``, so reads run during ``CLIENT PAUSE WRITE``."""
    namespace = _namespace()
    pause_s = 4.0
    with fault_redis() as server:
        with start_writers(
            server.url, namespace, tmp_path, writers=2, turns=200, seconds=60
        ) as writers:
            _wait_first_acks(writers.ledgers)
            with _store(server.url, namespace) as reader, server.admin() as conn:
                conn.execute_command("CLIENT", "PAUSE", str(int(pause_s * 1000)), "WRITE")
                paused_until = time.monotonic() + pause_s
                context = reader.context(ledger_key(0))
                page = reader.list_metadata()
                stats = reader.stats()
                read_done = time.monotonic()
                # The pause was still in force when every read had returned: they were not
                # held back by it (a stalled read returns only after the pause ends).
                assert read_done < paused_until - 0.5, "reads waited for CLIENT PAUSE WRITE"
                assert context.turns, "the read returned no turns"
                assert page.sessions
                assert stats["sessions"] >= 1
            wait_writers(writers)
        _settle_and_judge(server, namespace, writers.ledgers)


def _dump_namespace(conn: Any, namespace: str) -> dict[bytes, bytes | None]:
    pattern = MemoryKeyspace(namespace).pattern()
    return {key: conn.dump(key) for key in sorted(conn.scan_iter(match=pattern, count=1000))}


def test_out_of_memory_refuses_with_a_typed_error_and_changes_nothing() -> None:
    namespace = _namespace()
    with (
        fault_redis({"maxmemory-policy": "noeviction"}) as server,
        _store(server.url, namespace) as store,
    ):
        for n in range(12):
            store.append(ledger_key(n % 3), AvatarMessage(text=f"before {n}", turn_id=f"b{n}"))
        with server.admin() as conn:
            before = _dump_namespace(conn, namespace)
            conn.config_set("maxmemory", "1")
            try:
                errors = []
                for n in range(6):  # existing sessions, and a new one (eviction/sweep paths)
                    key = ledger_key(n % 4) if n < 5 else ledger_key(99)
                    with pytest.raises(MemtierError) as caught:
                        store.append(key, AvatarMessage(text=f"oom {n}", turn_id=f"o{n}"))
                    errors.append(caught.value)
                with pytest.raises(MemtierError) as dropped:
                    store.delete(ledger_key(0))
                errors.append(dropped.value)
                after = _dump_namespace(conn, namespace)
            finally:
                conn.config_set("maxmemory", "0")
        assert after == before, "a refused write changed stored data"
        for exc in errors:
            assert exc.code == "backend_refused", (exc.code, str(exc))
            assert not exc.retryable
        # Once memory is back, the same turn id stores exactly once, after the others.
        receipt = store.append(ledger_key(0), AvatarMessage(text="oom 0", turn_id="o0"))
        assert receipt.seq == 5


def test_aof_disk_full_refuses_writes_and_loses_no_acknowledged_turn(tmp_path: Path) -> None:
    """The AOF's disk fills up (a 1 MiB tmpfs): writes are refused, reads go on."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        # CI runs as root with util-linux (tests/run.sh installs it): there it must run.
        unavailable("a private tmpfs needs root and unshare (util-linux)")
    namespace = _namespace()
    config = {**AOF_ALWAYS, "appendfsync": "everysec"}  # `always` makes Redis exit instead
    with fault_redis(config, tmpfs_bytes=1 << 20) as server:
        with start_writers(
            server.url,
            namespace,
            tmp_path,
            writers=2,
            turns=2000,
            seconds=90,
            keys=24,
            together=True,
        ) as writers:
            _wait_first_acks(writers.ledgers)
            wait_writers(writers)
        attempts = read_ledgers(writers.ledgers)
        refused = [a for a in attempts.values() if a.outcome == "failed"]
        outcomes = Counter((a.outcome, a.code) for a in attempts.values())
        assert refused, f"the disk never filled: the fault did not happen: {outcomes}"
        assert {a.code for a in refused} == {"backend_refused"}
        with server.client() as conn:
            info = conn.info("persistence")
            assert info["aof_last_write_status"] == "err"
            verdict = judge(conn, namespace, {k: a for k, a in attempts.items()})
        verdict.check()
        with _store(server.url, namespace) as reader:  # reads still work on a full disk
            assert reader.context(ledger_key(0)).turns


def test_aof_tail_cut_inside_the_last_script_keeps_every_invariant(tmp_path: Path) -> None:
    """A cut inside the last MULTI/EXEC: Redis drops that transaction whole on load."""
    namespace = _namespace()
    config = {**AOF_ALWAYS, "aof-load-truncated": "yes"}
    turns = 12
    with fault_redis(config) as server:
        with _store(server.url, namespace) as store:
            acked = {}
            for n in range(turns):
                tid = f"w0-{n}"
                receipt = store.append(
                    ledger_key(n % 3), AvatarMessage(text=turn_text(tid), turn_id=tid)
                )
                acked[tid] = receipt
        server.kill9()
        (incr,) = sorted(server.aof_dir().glob("*.incr.aof"))
        pristine = incr.read_bytes()
        start = pristine.rindex(b"*1\r\n$5\r\nMULTI\r\n")
        end = len(pristine)
        assert pristine.endswith(b"*1\r\n$4\r\nEXEC\r\n"), "the last entry is not a script's"
        offsets = sorted({start + 1, start + (end - start) // 3, start + (end - start) // 2,
                          end - 20, end - 1})  # fmt: skip
        last_tid = f"w0-{turns - 1}"
        from ledger import Attempt

        for offset in offsets:
            incr.write_bytes(pristine[:offset])
            server.restart()
            attempts = {
                tid: Attempt(tid, f"{ledger_key(int(tid[3:]) % 3).avatar}:im", "ack",
                             session_id=r.session_id, seq=r.seq)
                for tid, r in acked.items()
            }  # fmt: skip
            with server.client() as conn:
                verdict = judge(conn, namespace, attempts, may_be_lost=frozenset({last_tid}))
                verdict.check()
                assert verdict.stored == turns - 1, f"cut at {offset}: {verdict}"
            server.kill9()


def test_worker_recreates_its_group_when_redis_comes_back_empty(tmp_path: Path) -> None:
    """D6: a restart without persistence drops the consumer group; the worker goes on."""
    import subprocess
    import sys

    namespace = _namespace()
    small = {"max_turns_per_session": "10", "max_tool_results": "4"}
    env = {**os.environ, **{f"MEMTIER_CONVERSATION__{k.upper()}": v for k, v in small.items()}}
    with fault_redis() as server, (tmp_path / "worker.log").open("wb") as log:
        command = [sys.executable, "-m", "memtier", "worker", "--redis-url", server.url]
        command += ["--namespace", namespace, "--block-ms", "50", "--claim-idle-ms", "300"]
        command += ["--sweep-interval", "3600", "--flush-interval", "0"]
        worker = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            config = MemtierConfig.load(
                redis_url=server.url,
                namespace=namespace,
                conversation={k: int(v) for k, v in small.items()},
            )

            def compacted_after(key_index: int) -> None:
                with ConversationStore.from_config(
                    config, recover=False, inline_compaction=False
                ) as store:
                    key = ledger_key(key_index)
                    for n in range(8):  # 80 % of the turn bound: one compaction job
                        store.append(key, AvatarMessage(text=f"turn {n}"))
                    deadline = time.monotonic() + 60
                    while store.context(key).summary is None:
                        assert worker.poll() is None, (tmp_path / "worker.log").read_text()
                        assert time.monotonic() < deadline, "the worker never compacted"
                        time.sleep(0.05)

            compacted_after(0)
            server.restart()  # persistence off: Redis comes back empty, group and all
            compacted_after(1)
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()
        finally:
            worker.terminate()
            worker.wait(timeout=60)
