"""A long-lived flush/recovery process for the snapshot fault rows (driven over stdin).

    python snapshot_child.py <redis_url> <namespace> <storage_path>

Prints ``ready`` once imports, the connection and a warm-up flush (into a scratch
directory, so lazy imports and first-call allocations happen before any tracing) are
done.  Then, one command per stdin line, one JSON line of result on stdout:

* ``flush``   -> {"ok": true, "generation", "durable", "warnings"} or an error object
* ``recover`` -> {"ok": true, "outcome", "generation", "restored", ...} or an error object

An error object says whether the exception was a typed memtier error (``memtier``),
its class, code and errno: the fault rows judge "every error is a typed memtier error".
"""

from __future__ import annotations

import json
import sys
import tempfile
import traceback
from typing import Any

from memtier import ConversationStore, MemtierError
from memtier.config import MemtierConfig
from memtier.memory.persistence import snapshot_dir_for
from memtier.memory.snapshot import SnapshotDir


def _error(exc: BaseException) -> dict[str, Any]:
    details = getattr(exc, "details", {}) or {}
    return {
        "ok": False,
        "memtier": isinstance(exc, MemtierError),
        "type": type(exc).__name__,
        "code": getattr(exc, "code", None),
        "errno_name": details.get("errno_name"),
        "message": str(exc)[:300],
        "traceback": "" if isinstance(exc, MemtierError) else traceback.format_exc()[-2000:],
    }


def main() -> None:
    url, namespace, storage = sys.argv[1:4]
    config = MemtierConfig.load(
        redis_url=url,
        namespace=namespace,
        conversation={"persistence_enabled": True, "storage_path": storage},
    )
    store = ConversationStore.from_config(config, recover=False)
    real_dir = snapshot_dir_for(config)
    with tempfile.TemporaryDirectory() as scratch:
        store.snapshots = SnapshotDir(scratch, namespace, max_bytes=real_dir.max_bytes)
        store.flush()
        store.snapshots = real_dir
    print("ready", flush=True)
    for line in sys.stdin:
        command = line.strip()
        out: dict[str, Any]
        try:
            if command == "flush":
                r = store.flush()
                out = {
                    "ok": True,
                    "generation": r.generation,
                    "durable": r.durable,
                    "warnings": list(r.warnings),
                }
            elif command == "recover":
                rep = store.recover()
                out = {
                    "ok": True,
                    "outcome": rep.outcome,
                    "generation": rep.generation,
                    "restored": rep.restored,
                    "quarantined": rep.quarantined,
                    "quarantine_failed": rep.quarantine_failed,
                    "unreadable": rep.unreadable,
                    "permissions_verified": rep.permissions_verified,
                }
            elif command == "exit":
                return
            else:
                out = {"ok": False, "memtier": False, "type": "usage", "message": command}
        except Exception as exc:  # reported, judged by the parent
            out = _error(exc)
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
