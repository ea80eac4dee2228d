"""Helpers of the snapshot-file fault rows: a traced flush process, judging a directory.

Syscall faults are injected with strace (``-e inject=<syscall>:error=<E>:when=<n>``)
attached to a long-lived child (``snapshot_child.py``) for exactly one command, so the
injected call is the n-th of that syscall *during that flush or recovery*.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from memtier import AgentResponse, AvatarMessage, ConversationKey, ConversationStore, ToolSummary
from memtier.config import MemtierConfig
from memtier.memory.persistence import snapshot_dir_for
from memtier.memory.snapshot import SnapshotDir, VerifiedGeneration, verify_generation

HERE = Path(__file__).resolve().parent
CHILD = HERE / "snapshot_child.py"
ATTACH_TIMEOUT_S = 10.0
REPLY_TIMEOUT_S = 60.0


def require_strace() -> str:
    """strace is a test dependency (tests/run.sh installs it): fail, never skip."""
    path = shutil.which("strace")
    assert path, "strace not found: install it (apt-get install strace; tests/run.sh does)"
    return path


def key(n: int, channel: str = "public") -> ConversationKey:
    return ConversationKey(uuid.UUID(int=n), channel)


def config_for(url: str | None, namespace: str, storage: Path, **conv: Any) -> MemtierConfig:
    return MemtierConfig.load(
        redis_url=url,
        namespace=namespace,
        conversation={"persistence_enabled": True, "storage_path": str(storage), **conv},
    )


def populate(store: ConversationStore, n: int, *, start: int = 0, turns: int = 3) -> None:
    for i in range(start, start + n):
        k = key(i + 1, "im" if i % 2 else "public")
        for j in range(turns):
            turn: Any
            if j % 3 == 2:
                turn = ToolSummary(tool="search", summary=f"result {i}.{j}", turn_id=f"t{i}-{j}")
            elif j % 2:
                turn = AgentResponse(text=f"reply {i}.{j}", turn_id=f"t{i}-{j}")
            else:
                turn = AvatarMessage(text=f"hello {i}.{j} ünï", turn_id=f"t{i}-{j}")
            store.append(k, turn)


def wipe(store: ConversationStore) -> None:
    """Redis lost this namespace (only keys of this test's own namespace on its own server)."""
    pattern = f"*{store.config.namespace}*"
    keys = list(store.client.scan_iter(match=pattern, count=1000))
    assert len(keys) < 100_000
    for i in range(0, len(keys), 500):
        store.client.delete(*keys[i : i + 500])


def judge_directory(directory: SnapshotDir, store: ConversationStore) -> list[int]:
    """No partial generation is visible: every published generation verifies.

    Returns the generation numbers, newest first.
    """
    gens = directory.generations()
    for gen in gens:
        result = verify_generation(gen, directory.namespace, store.core.conv, directory.max_bytes)
        assert isinstance(result, VerifiedGeneration), (gen.path.name, result)
    return [g.generation for g in gens]


def reset_directory(directory: SnapshotDir, keep: dict[str, bytes]) -> None:
    """Back to exactly ``keep`` (name -> bytes): later generations, temps, quarantine gone."""
    for entry in list(directory.path.iterdir()):
        if entry.name == "quarantine":
            for q in entry.iterdir():
                q.unlink()
        elif entry.name not in keep:
            entry.unlink()
    for name, data in keep.items():
        path = directory.path / name
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)
            os.chmod(path, 0o600)


_LINE_RE = re.compile(r"^(?:\[pid\s+\d+\]\s*|\d+\s+)?(?P<name>\w+)\(")


def occurrences(trace: str, needle: str) -> dict[str, list[int]]:
    """For each syscall name: the 1-based indices of its calls whose line mentions ``needle``."""
    counts: dict[str, int] = {}
    hits: dict[str, list[int]] = {}
    for line in trace.splitlines():
        m = _LINE_RE.match(line)
        if not m or "resumed>" in line:
            continue
        name = m.group("name")
        counts[name] = counts.get(name, 0) + 1
        if needle in line:
            hits.setdefault(name, []).append(counts[name])
    return hits


class TracedChild:
    """``snapshot_child.py`` with strace attached for one command at a time."""

    def __init__(self, url: str, namespace: str, storage: Path) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), url, namespace, str(storage)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        ready = self.proc.stdout.readline().strip()
        assert ready == "ready", f"child did not start: {ready!r}"

    def _tracer(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as fh:
            for line in fh:
                if line.startswith("TracerPid:"):
                    return int(line.split()[1])
        return 0

    def run(self, command: str, strace: list[str] | None = None, out: Path | None = None) -> Any:
        """Send one command (strace attached with ``strace`` args if given); its JSON reply."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        tracer: subprocess.Popen[bytes] | None = None
        if strace is not None:
            args = [require_strace(), "-f", "-qq", "-y", "-p", str(self.proc.pid), *strace]
            args += ["-o", str(out) if out else "/dev/null"]
            tracer = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + ATTACH_TIMEOUT_S
            while self._tracer() != tracer.pid:
                assert time.monotonic() < deadline, "strace did not attach"
                assert tracer.poll() is None, f"strace exited: {tracer.returncode}"
                time.sleep(0.01)
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
            reply = self.proc.stdout.readline()
        finally:
            if tracer is not None:
                tracer.send_signal(signal.SIGTERM)  # detaches cleanly
                tracer.wait(timeout=REPLY_TIMEOUT_S)
                deadline = time.monotonic() + ATTACH_TIMEOUT_S
                while self._tracer() != 0 and time.monotonic() < deadline:
                    time.sleep(0.01)
        assert reply, "the child died"
        return json.loads(reply)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write("exit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def parent_store(url: str, namespace: str, storage: Path) -> ConversationStore:
    config = config_for(url, namespace, storage)
    import redis

    return ConversationStore(redis.Redis.from_url(url), config, snapshots=snapshot_dir_for(config))
