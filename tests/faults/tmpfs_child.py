"""Snapshot storage that fills up and turns read-only, for real (run by the fault rows).

    unshare -m python tmpfs_child.py <redis_url> <namespace> <mountpoint>

Inside its own mount namespace (as root) it mounts a 64 KiB tmpfs on ``mountpoint``,
then flushes until the disk is full (ENOSPC), recovers with a full disk and a bad newest
generation, remounts read-only (EROFS), flushes and recovers again.  It prints one JSON
object of what happened; the test judges it (tests/faults/test_fault_snapshot_storage.py).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from snapfaults import config_for, populate, wipe

from memtier import AvatarMessage, ConversationStore, MemtierError
from memtier.memory.persistence import snapshot_dir_for
from memtier.memory.snapshot import SnapshotDir, VerifiedGeneration, verify_generation

FILL_CHUNK = 4096
MAX_FILL_CHUNKS = 64  # 256 KiB > the 64 KiB tmpfs: the loop always ends on ENOSPC


def _state(directory: SnapshotDir, store: ConversationStore) -> dict[str, Any]:
    gens = directory.generations()
    verdicts = [
        isinstance(
            verify_generation(g, directory.namespace, store.core.conv, directory.max_bytes),
            VerifiedGeneration,
        )
        for g in gens
    ]
    temps = [p.name for p in directory.path.iterdir() if p.name.startswith(".tmp")]
    return {"generations": [g.generation for g in gens], "valid": verdicts, "temps": temps}


def _try(action: Any) -> dict[str, Any]:
    try:
        return {"ok": True, "value": action()}
    except MemtierError as exc:
        return {
            "ok": False,
            "memtier": True,
            "code": exc.code,
            "errno_name": exc.details.get("errno_name"),
        }
    except Exception as exc:
        return {"ok": False, "memtier": False, "type": type(exc).__name__, "message": str(exc)}


def _report(store: ConversationStore) -> dict[str, Any]:
    r = store.recover()
    return {
        "outcome": r.outcome,
        "generation": r.generation,
        "restored": r.restored,
        "quarantined": r.quarantined,
        "quarantine_failed": [name for name, _ in r.quarantine_failed],
        "permissions_verified": r.permissions_verified,
    }


def main() -> None:
    url, namespace, mountpoint = sys.argv[1:4]
    mount = Path(mountpoint)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mount)], check=True
    )
    facts: dict[str, Any] = {}
    config = config_for(url, namespace, mount)
    import redis

    store = ConversationStore(redis.Redis.from_url(url), config, snapshots=snapshot_dir_for(config))
    directory = snapshot_dir_for(config)
    populate(store, 3)
    facts["flush1"] = _try(lambda: store.flush().generation)
    # ENOSPC during a flush: far more than 64 KiB of sessions.
    for i in range(40):
        store.append(
            (f"00000000-0000-0000-0000-0000000001{i:02d}", "public"),
            AvatarMessage(text=f"{i} " + "x" * 3000),
        )
    facts["flush_full"] = _try(lambda: store.flush().generation)
    facts["after_flush_full"] = _state(directory, store)
    # Recovery on a full disk with a bad newest generation (one payload byte flipped).
    good = directory.generations()[0].path
    data = bytearray(good.read_bytes())
    data[-10] ^= 0x01
    bad = directory.path / directory.name_of(2)
    bad.write_bytes(bytes(data))
    os.chmod(bad, 0o600)
    filler = mount / "filler"
    try:
        with open(filler, "wb", buffering=0) as fh:
            for _ in range(MAX_FILL_CHUNKS):
                fh.write(b"\0" * FILL_CHUNK)
    except OSError as exc:  # the disk is full now (perhaps already was)
        assert exc.errno == errno.ENOSPC, exc
    facts["disk_full"] = True
    wipe(store)
    facts["recover_full"] = _report(store)
    facts["after_recover_full"] = _state(directory, store)
    # Read-only storage: a flush fails typed, recovery still restores (D3).
    subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
    facts["flush_ro"] = _try(lambda: store.flush().generation)
    wipe(store)
    facts["recover_ro"] = _report(store)
    facts["after_recover_ro"] = _state(directory, store)
    wipe(store)
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
