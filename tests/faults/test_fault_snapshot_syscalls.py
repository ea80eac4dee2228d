"""Fault rows "Snapshot files": a failure injected at each syscall of a flush and a recovery.

Real files, a real redis-server, a real flushing process: strace attaches to it for one
flush and makes the n-th call of one syscall fail (``-e inject=<syscall>:error=<E>:
when=<n>``), for every n at which that syscall touches the snapshot directory during
the flush (found by a traced dry run of the same flush).  Syscalls: open (``openat``),
``fchmod``, chmod (``chmod``/``fchmodat``), each ``write``, ``fsync`` (the file's and the
directory's), ``link``/``linkat``, ``unlink``/``unlinkat``, ``mkdir``.

Verdict of every row: the flush either succeeds or fails with a typed memtier error;
no partial generation is visible (every published generation verifies); the previous
generation is byte-for-byte intact; recovery (wipe Redis, restore) restores from the
newest valid generation.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from snapfaults import (
    TracedChild,
    judge_directory,
    occurrences,
    parent_store,
    populate,
    require_strace,
    reset_directory,
    wipe,
)

from memtier import ConversationStore

pytestmark = pytest.mark.real

FLUSH_SYSCALLS = (
    "openat",
    "fchmod",
    "fchmodat",
    "chmod",
    "write",
    "fsync",
    "link",
    "linkat",
    "unlink",
    "unlinkat",
    "mkdir",
)
SESSIONS = 6


class Rig:
    """A namespace with a baseline generation, a parent store and a traced child."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        self.namespace = "sf" + os.urandom(4).hex()
        self.store: ConversationStore = parent_store(url, self.namespace, tmp_path)
        populate(self.store, SESSIONS)
        baseline = self.store.flush()
        assert self.store.snapshots is not None
        self.dir = self.store.snapshots
        self.baseline = {Path(baseline.path).name: Path(baseline.path).read_bytes()}
        self.messages = self.contexts()
        self.child = TracedChild(url, self.namespace, tmp_path)

    def contexts(self) -> dict[str, Any]:
        return {
            m.avatar.hex + m.channel.value: self.store.context((m.avatar, m.channel)).messages
            for m in self.store.iter_metadata()
        }

    def judge_recovery(self) -> None:
        newest = judge_directory(self.dir, self.store)[0]
        wipe(self.store)
        report = self.store.recover()
        assert report.outcome == "restored" and report.generation == newest, report
        assert report.restored == SESSIONS
        assert self.contexts() == self.messages

    def close(self) -> None:
        self.child.close()
        wipe(self.store)
        self.store.close()


@pytest.fixture
def rig(redis_server: Any, tmp_path: Path) -> Iterator[Rig]:
    require_strace()
    made = Rig(redis_server.url, tmp_path)
    try:
        yield made
    finally:
        made.close()


def _judge_flush(rig: Rig, reply: dict[str, Any], what: str) -> None:
    gens = judge_directory(rig.dir, rig.store)
    name = next(iter(rig.baseline))
    assert (rig.dir.path / name).read_bytes() == rig.baseline[name], what  # intact
    if reply["ok"]:
        assert gens[0] == reply["generation"] and len(gens) == 2, (what, gens)
    else:
        assert reply["memtier"] and reply["code"] == "snapshot_error", (what, reply)
        assert len(gens) == 1, (what, gens)
    rig.judge_recovery()


def _flush_points(rig: Rig, tmp_path: Path) -> dict[str, list[int]]:
    trace = tmp_path / "dry-run.trace"
    reply = rig.child.run("flush", ["-e", "trace=" + ",".join(FLUSH_SYSCALLS)], trace)
    assert reply["ok"], reply
    points = occurrences(trace.read_text(), str(rig.dir.path))
    reset_directory(rig.dir, rig.baseline)
    # The protocol's own calls must all be there (else the dry run traced nothing useful).
    for name in ("openat", "fchmod", "write", "fsync"):
        assert points.get(name), (name, points)
    assert points.get("link") or points.get("linkat"), points
    assert points.get("unlink") or points.get("unlinkat"), points
    return points


def test_eio_at_every_syscall_of_a_flush(rig: Rig, tmp_path: Path) -> None:
    points = _flush_points(rig, tmp_path)
    rows = [(name, n) for name, ns in sorted(points.items()) for n in ns]
    assert len(rows) < 60, rows  # bounded
    outcomes: dict[str, list[str]] = {}
    for name, n in rows:
        what = f"{name} #{n}: EIO"
        reply = rig.child.run(
            "flush", ["-e", f"trace={name}", "-e", f"inject={name}:error=EIO:when={n}"]
        )
        _judge_flush(rig, reply, what)
        outcomes.setdefault(name, []).append(
            "ok"
            if reply["ok"] and reply["durable"]
            else ("not durable" if reply["ok"] else reply["errno_name"] or "error")
        )
        reset_directory(rig.dir, rig.baseline)
    # The syscalls before publication fail the flush; a failed directory fsync after it
    # is reported as published but not durable (D4).
    assert "EIO" in outcomes["fchmod"] and "EIO" in outcomes["write"]
    assert "not durable" in outcomes["fsync"] and "EIO" in outcomes["fsync"]


@pytest.mark.parametrize(
    ("syscall", "error"),
    [
        ("write", "ENOSPC"),
        ("fsync", "ENOSPC"),
        ("openat", "EROFS"),
        ("fchmod", "EROFS"),
        ("linkat", "ENOSPC"),
        ("link", "EROFS"),
    ],
)
def test_enospc_and_erofs_at_each_syscall_of_a_flush(
    rig: Rig, tmp_path: Path, syscall: str, error: str
) -> None:
    points = _flush_points(rig, tmp_path)
    for n in points.get(syscall, []):
        reply = rig.child.run(
            "flush", ["-e", f"trace={syscall}", "-e", f"inject={syscall}:error={error}:when={n}"]
        )
        _judge_flush(rig, reply, f"{syscall} #{n}: {error}")
        reset_directory(rig.dir, rig.baseline)


def test_eio_at_every_read_of_a_recovery(rig: Rig, tmp_path: Path) -> None:
    """The newest generation unreadable at any point: recovery restores, never raises."""
    populate(rig.store, 2, start=SESSIONS)
    newest = Path(rig.store.flush().path)
    state = {**rig.baseline, newest.name: newest.read_bytes()}
    older = rig.contexts()
    wipe(rig.store)
    trace = tmp_path / "recover.trace"
    reply = rig.child.run("recover", ["-e", "trace=openat,read,pread64"], trace)
    assert reply["ok"] and reply["outcome"] == "restored", reply
    points = occurrences(trace.read_text(), newest.name)
    rows = [(name, n) for name, ns in sorted(points.items()) for n in ns]
    assert rows and len(rows) < 60, rows
    for name, n in rows:
        wipe(rig.store)
        reset_directory(rig.dir, state)
        reply = rig.child.run(
            "recover", ["-e", f"trace={name}", "-e", f"inject={name}:error=EIO:when={n}"]
        )
        assert reply["ok"], (name, n, reply)
        assert reply["outcome"] == "restored", (name, n, reply)
        assert reply["generation"] in (1, 2) and not reply["quarantined"], (name, n, reply)
        # Whatever was read: every session of the newest valid data is back.
        now = rig.contexts()
        assert set(rig.messages) <= set(now) <= set(older), (name, n)
        if reply["generation"] == 2 and not reply["unreadable"]:
            assert now == older
    wipe(rig.store)
