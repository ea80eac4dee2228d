"""A snapshot file written by the previous version restores, and its retries keep their answers.

``data/first-format.snapshot`` was written by main at ``8418d70`` (the first record format,
a receipt per turn in Redis) with ``data/make_first_format_snapshot.py``: session
``...0001:public`` appended 7 turns ``a-0``..``a-6`` at max 5 turns (an inline compaction
folded the oldest), ``...0002:im`` a tool turn ``b-0`` and a turn with a generated 32-hex
id.  Its header is re-signed for each test's namespace; the session lines are untouched.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
from workhelpers import Clock, persistent_store, resign

from memtier import AvatarMessage, ConversationKey
from memtier.memory.turncodec import StoredTurn

DATA = Path(__file__).parent / "data" / "first-format.snapshot"
A = ConversationKey("00000000-0000-4000-8000-000000000001", "public")
B = ConversationKey("00000000-0000-4000-8000-000000000002", "im")


def _plant(backend: Any, tmp_path: Path) -> Any:
    store = persistent_store(backend, tmp_path, Clock(), max_turns_per_session=5)
    target = tmp_path / "conversations" / f"{backend.namespace}.00000000000000000001.snapshot"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(DATA, target)
    target.chmod(0o600)
    target.parent.chmod(0o700)

    def rename(head: dict[str, Any]) -> None:
        head["namespace"] = backend.namespace

    resign(target, header=rename)
    return store


def _old_lines() -> dict[str, dict[str, Any]]:
    from memtier.memory import snapshot

    payload = DATA.read_bytes()[snapshot.HEADER_BLOCK :]
    return {obj["member"]: obj for obj in map(orjson.loads, payload.splitlines())}


def test_a_first_format_generation_restores_with_its_receipts(backend: Any, tmp_path: Path) -> None:
    store = _plant(backend, tmp_path)
    report = store.recover()
    assert report.outcome == "restored" and report.restored == 2, report
    lines = _old_lines()
    for k in (A, B):
        line = lines[k.member]
        ctx = store.context(k)
        assert [(t.seq, t.turn_id, t.fields) for t in ctx.turns] == [
            (r["seq"], r["id"], r["f"]) for r in line["records"]
        ]
        # every receipt of the file answers its retry: the first answer, under the
        # session id the turn was acknowledged with (the file's, not the restored one)
        for turn_id, receipt in line["receipts"]:
            sid, seq, _clock, _wall, size, rotated = receipt.split("|")
            before = store.client.llen(store.core.partition_for(k).session(k.member).turns)
            got = store.append(k, AvatarMessage(text="retried", turn_id=turn_id))
            assert got.duplicate, turn_id
            assert (got.session_id, got.seq, got.bytes, got.rotated) == (
                sid,
                int(seq),
                int(size),
                rotated == "1",
            )
            assert store.client.llen(store.core.partition_for(k).session(k.member).turns) == before
    # Folded turns of the file (a-0.. before the compaction) are retried too.
    assert {t for t, _ in lines[A.member]["receipts"]} >= {"a-0", "a-1"}
    # A new turn is stored in the current format next to the restored first-format ones.
    store.append(A, AvatarMessage(text="new", turn_id="a-new"))
    raw = store.client.lrange(store.core.partition_for(A).session(A.member).turns, 0, -1)
    versions = [StoredTurn.parse(r).redactor_version for r in raw]
    assert versions[-1] is not None and set(versions[:-1]) == {None}
    # ...and the mixed session flushes again (its receipts made from both formats).
    assert store.flush().sessions == 2
