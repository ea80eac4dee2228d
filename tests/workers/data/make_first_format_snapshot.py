"""Writes ``first-format.snapshot``: run it with main at 8418d70 on ``PYTHONPATH`` (the
first record format, a receipt per turn), ``python make_first_format_snapshot.py OUTDIR``;
the file is ``OUTDIR/conversations/oldgen.00000000000000000001.snapshot``."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import fakeredis

from memtier import AvatarMessage, ConversationKey, ConversationStore, MemtierConfig, ToolSummary
from memtier.memory.persistence import snapshot_dir_for

T0 = 1_800_000_000_000


def clock() -> int:
    return T0


def main(out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    conv = {"persistence_enabled": True, "storage_path": str(out), "max_turns_per_session": 5}
    cfg = MemtierConfig.load(namespace="oldgen", conversation=conv)
    store = ConversationStore(
        fakeredis.FakeRedis(), cfg, clock=clock, snapshots=snapshot_dir_for(cfg)
    )
    a = ConversationKey("00000000-0000-4000-8000-000000000001", "public")
    b = ConversationKey("00000000-0000-4000-8000-000000000002", "im")
    for i in range(7):  # past max_turns: an inline compaction folds the oldest
        store.append(a, AvatarMessage(text=f"turn {i} of a", turn_id=f"a-{i}"))
    store.append(b, ToolSummary(tool="search", summary="found it", turn_id="b-0"))
    store.append(b, AvatarMessage(text="thanks"))  # a generated (32 hex) turn id
    print(store.flush())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
