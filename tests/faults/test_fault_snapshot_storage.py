"""Fault rows "Snapshot files": full and read-only storage, zeroed sectors, symlinked dirs.

Real files and a real redis-server.  Verdict of every row: no partial generation is
visible, previous generations are intact, recovery restores from the newest valid one,
and every error is a typed memtier error (never a raw OSError at startup).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from snapfaults import HERE, judge_directory, parent_store, populate, wipe

from memtier import ConversationStore, SnapshotError
from memtier.memory.snapshot import Rejection, verify_generation

pytestmark = pytest.mark.real


def _contexts(store: ConversationStore) -> dict[str, Any]:
    return {
        m.avatar.hex + m.channel.value: store.context((m.avatar, m.channel)).messages
        for m in store.iter_metadata()
    }


@pytest.fixture
def namespace() -> str:
    return "ss" + os.urandom(4).hex()


# --------------------------------------------------------------------------- ENOSPC, EROFS


def test_full_then_read_only_tmpfs_during_flush_and_recovery(
    redis_server: Any, tmp_path: Path, namespace: str
) -> None:
    """A real 64 KiB tmpfs in a private mount namespace (root; unshare -m)."""
    assert os.geteuid() == 0 and shutil.which("unshare"), "needs root and unshare (util-linux)"
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    done = subprocess.run(
        [
            "unshare",
            "-m",
            sys.executable,
            str(HERE / "tmpfs_child.py"),
            redis_server.url,
            namespace,
            str(mountpoint),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["flush1"] == {"ok": True, "value": 1}
    # ENOSPC: a typed error, nothing half-written, the older generation intact.
    assert facts["flush_full"]["ok"] is False and facts["flush_full"]["memtier"]
    assert facts["flush_full"]["errno_name"] == "ENOSPC"
    assert facts["after_flush_full"] == {"generations": [1], "valid": [True], "temps": []}
    # A full disk and a bad newest generation: restored from the newest valid one.
    full = facts["recover_full"]
    assert full["outcome"] == "restored" and full["generation"] == 1 and full["restored"] == 3
    names = [n for n, _ in full["quarantined"]] + full["quarantine_failed"]
    assert [n.split(".")[1] for n in names] == ["00000000000000000002"]
    assert facts["after_recover_full"]["valid"][-1] is True
    # Read-only: flush typed (EROFS), recovery still restores, says modes are unverified.
    assert facts["flush_ro"]["ok"] is False and facts["flush_ro"]["memtier"]
    assert facts["flush_ro"]["errno_name"] == "EROFS"
    ro = facts["recover_ro"]
    assert ro["outcome"] == "restored" and ro["generation"] == 1 and ro["restored"] == 3
    assert ro["permissions_verified"] is False


# --------------------------------------------------------------------------- zeroed sectors


@pytest.fixture
def two_generations(
    redis_server: Any, tmp_path: Path, namespace: str
) -> Iterator[tuple[ConversationStore, Path, dict[str, Any]]]:
    store = parent_store(redis_server.url, namespace, tmp_path)
    populate(store, 3)
    store.flush()
    older = _contexts(store)
    populate(store, 4, start=3)
    newest = Path(store.flush().path)
    try:
        yield store, newest, older
    finally:
        wipe(store)
        store.close()


def test_every_zeroed_sector_is_rejected_and_recovery_uses_the_older(
    two_generations: tuple[ConversationStore, Path, dict[str, Any]],
) -> None:
    store, newest, older = two_generations
    assert store.snapshots is not None
    original = newest.read_bytes()
    sectors = (len(original) + 511) // 512
    assert 8 < sectors < 64, sectors
    for i in range(sectors):
        data = bytearray(original)
        end = min(len(data), (i + 1) * 512)
        data[i * 512 : end] = bytes(end - i * 512)
        newest.write_bytes(bytes(data))
        gen = store.snapshots.generations()[0]
        result = verify_generation(gen, store.config.namespace, store.core.conv, 1 << 30)
        assert isinstance(result, Rejection), i
        wipe(store)
        report = store.recover()
        assert report.outcome == "restored" and report.generation == 1, (i, report)
        assert [r for _, r in report.quarantined] == [result.reason], i
        assert _contexts(store) == older, i
        for q in store.snapshots.quarantined():
            q.unlink()
        newest.write_bytes(original)
        os.chmod(newest, 0o600)


# --------------------------------------------------------------------------- symlinks


def _moved_conversations(tmp_path: Path, elsewhere: Path) -> None:
    (tmp_path / "conversations").rename(elsewhere)
    (tmp_path / "conversations").symlink_to(elsewhere, target_is_directory=True)


def test_symlinked_conversations_dir_flushes_and_recovers(
    two_generations: tuple[ConversationStore, Path, dict[str, Any]], tmp_path: Path
) -> None:
    store, _newest, _ = two_generations
    assert store.snapshots is not None
    before = _contexts(store)
    _moved_conversations(tmp_path, tmp_path / "real-conversations")
    result = store.flush()
    assert (tmp_path / "real-conversations" / Path(result.path).name).exists()
    assert judge_directory(store.snapshots, store) == [3, 2, 1]
    wipe(store)
    report = store.recover()
    assert report.outcome == "restored" and report.generation == 3
    assert _contexts(store) == before


def test_symlinked_quarantine_same_and_other_filesystem(
    two_generations: tuple[ConversationStore, Path, dict[str, Any]], tmp_path: Path
) -> None:
    store, newest, older = two_generations
    assert store.snapshots is not None
    original = newest.read_bytes()
    quarantine = store.snapshots.quarantine_path
    targets = [tmp_path / "real-quarantine"]
    shm = Path("/dev/shm")
    if shm.is_dir() and os.stat(shm).st_dev != os.stat(tmp_path).st_dev:
        targets.append(shm / f"memtier-q-{os.urandom(4).hex()}")  # another filesystem
    for target in targets:
        if quarantine.is_symlink():
            quarantine.unlink()
        else:
            quarantine.rmdir()
        target.mkdir(mode=0o700)
        quarantine.symlink_to(target, target_is_directory=True)
        try:
            newest.write_bytes(original[:-7])  # truncated
            os.chmod(newest, 0o600)
            wipe(store)
            report = store.recover()  # never raises
            assert report.outcome == "restored" and report.generation == 1, (target, report)
            assert _contexts(store) == older
            moved = [p.name for p in target.iterdir()]
            if os.stat(target).st_dev == os.stat(tmp_path).st_dev:
                assert report.quarantined == [(newest.name, "truncated")]
                assert moved == [f"{newest.name}.truncated"] and not newest.exists()
            else:  # EXDEV on link and rename: rejected, left in place, reported
                assert [n for n, _ in report.quarantine_failed] == [newest.name]
                assert newest.exists() and moved == []
        finally:
            shutil.rmtree(target, ignore_errors=True)


def test_dangling_symlinks_are_typed_errors_and_startup_survives(
    two_generations: tuple[ConversationStore, Path, dict[str, Any]], tmp_path: Path
) -> None:
    store, _, _ = two_generations
    assert store.snapshots is not None
    quarantine = store.snapshots.quarantine_path
    quarantine.rmdir()
    quarantine.symlink_to(tmp_path / "nowhere", target_is_directory=True)
    with pytest.raises(SnapshotError):
        store.flush()
    assert judge_directory(store.snapshots, store) == [2, 1]
    shutil.move(str(tmp_path / "conversations"), str(tmp_path / "moved"))
    (tmp_path / "conversations").symlink_to(tmp_path / "gone", target_is_directory=True)
    with pytest.raises(SnapshotError):
        store.flush()
    wipe(store)
    report = store.recover()  # nothing readable: starts empty, never raises
    assert report.outcome in ("empty", "error")
