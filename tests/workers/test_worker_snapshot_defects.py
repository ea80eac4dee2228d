"""Regression tests of issue 8 (snapshots and recovery) and issue 10 (D1-D5, D7).

Each test fails on the commit before the fix (3761a9c) and passes after it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from workhelpers import Clock, key, persistent_store, populate, resign, snaps

from memtier import (
    ActionResult,
    AgentResponse,
    AvatarMessage,
    ConversationStore,
    ReasonCode,
    SnapshotError,
    ToolSummary,
    ValidationError,
    metrics,
)
from memtier.config import MemtierConfig
from memtier.memory import persistence, snapshot
from memtier.memory.core import MemoryCore
from memtier.memory.recordcheck import RecordInvalid, check_record
from memtier.memory.snapshot import Rejection, VerifiedGeneration, verify_generation
from memtier.redaction import contains_secret


def wipe(backend: Any) -> None:
    if backend.is_fake:
        backend.sync_client().flushall()
    else:
        backend.delete_namespace()


def _verify(store: Any, path: Path) -> VerifiedGeneration | Rejection:
    gen = next(g for g in snaps(store).generations() if g.path == path)
    return verify_generation(gen, store.config.namespace, store.core.conv, snaps(store).max_bytes)


def _events(store: Any, reason: ReasonCode) -> list[Any]:
    return [e for e in store.events(limit=1000) if e.reason is reason]


# --------------------------------------------------------------------------- one validator


def test_a_name_that_sanitises_to_empty_is_refused_at_append(backend: Any, tmp_path: Path) -> None:
    store = persistent_store(backend, tmp_path)
    # The name grammar refuses such names when the turn is built (before any I/O), and
    # append's shared record check refuses one that slipped past the model.
    with pytest.raises(ValidationError) as info:
        ToolSummary(tool="\x00", summary="x")
    assert info.value.code == "invalid_name"
    with pytest.raises(ValidationError) as info:
        ActionResult(action="\x01\x02", outcome="y")
    assert info.value.code == "invalid_name"
    forged = ToolSummary.model_construct(tool="\x00", summary="x", turn_id=None)
    with pytest.raises(ValidationError):
        store.append(key(1), forged)
    # A caller's turn id is stored as given: one that looks like a key is refused.
    with pytest.raises(ValidationError):
        store.append(key(1), AvatarMessage(text="hi", turn_id="AKIAIOSFODNN7EXAMPLE"))
    # What sanitising leaves storable is stored, and every stored session flushes.
    store.append(key(1), ToolSummary(tool="search", summary="ok\x07"))
    result = store.flush()
    assert result.sessions == 1 and result.skipped == {}


_TEXT = st.text(
    alphabet=st.sampled_from(["a", "Z", " ", "\x00", "\x07", "\x1b", "\x85", "é", "<", "=", ":"]),
    max_size=12,
) | st.sampled_from(["password=hunter2hunter2", "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"])


_TURN_IDS = st.none() | st.sampled_from(
    ["req-17", "AKIAIOSFODNN7EXAMPLE", "glpat-" + "a" * 20, "a:b.c-d", "x" * 128]
)


@settings(max_examples=150, deadline=None)
@example(kind="tool", name="\x00", body="x", turn_id=None)
@example(kind="avatar", name="", body="hi", turn_id="AKIAIOSFODNN7EXAMPLE")
@given(
    kind=st.sampled_from(["avatar", "agent", "tool", "action"]),
    name=_TEXT,
    body=_TEXT,
    turn_id=_TURN_IDS,
)
def test_whatever_append_accepts_the_snapshot_validator_accepts(
    kind: str, name: str, body: str, turn_id: str | None
) -> None:
    """The live path and the recovery validator accept exactly the same records."""
    core = MemoryCore(MemtierConfig.load())
    make = {
        "avatar": lambda: AvatarMessage(text=body, turn_id=turn_id),
        "agent": lambda: AgentResponse(text=body, turn_id=turn_id),
        "tool": lambda: ToolSummary(tool=name or "t", summary=body, turn_id=turn_id),
        "action": lambda: ActionResult(action=name or "a", outcome=body, turn_id=turn_id),
    }[kind]
    try:
        prepared = core.prepare_turn(key(1), make())
    except ValidationError:
        return  # refused up front: nothing is stored
    from memtier.memory.turncodec import StoredTurn, record_flags

    # the record append_turn stores from this payload (head as the script writes it)
    head = f"1|1||{prepared.turn_bytes}|{record_flags(kind == 'tool')}|".encode()
    doc = StoredTurn.parse(head + prepared.payload)
    fields = dict(doc.fields)
    check_record(doc.kind, fields, doc.turn_id)  # raises RecordInvalid if not restorable
    assert not any(contains_secret(v) for v in (*fields.values(), doc.turn_id))


def test_flush_that_cannot_write_a_session_reports_result_event_and_metric(
    backend: Any, tmp_path: Path
) -> None:
    store = persistent_store(backend, tmp_path)
    populate(store, 2, turns=2)
    bad = key(1, "public")
    part = store.core.partition_for(bad)
    turns_key = part.session(bad.member).turns
    first = store.client.lindex(turns_key, 0).decode()
    # Data written by an older memtier (no control-character removal): same byte count.
    store.client.lset(turns_key, 0, first.replace(" says", "\\u0001says"))
    before = metrics.SNAPSHOT_SESSIONS_SKIPPED.labels("flush", "invalid_record")._value.get()
    result = store.flush()
    assert result.sessions == 1 and result.skipped == {"invalid_record": 1}
    after = metrics.SNAPSHOT_SESSIONS_SKIPPED.labels("flush", "invalid_record")._value.get()
    assert after == before + 1
    events = _events(store, ReasonCode.SNAPSHOT_SKIPPED)
    assert [(e.avatar, e.channel.value if e.channel else None) for e in events] == [
        (bad.avatar, "public")
    ]
    assert events[0].session_id == store.context(bad).session_id


# --------------------------------------------------------------------------- bounds per session


def test_session_over_lowered_turn_bound_is_trimmed_not_the_file_quarantined(
    backend: Any, tmp_path: Path
) -> None:
    clock = Clock()
    store = persistent_store(backend, tmp_path, clock, max_turns_per_session=40)
    small = populate(store, 3, turns=3)
    big = key(50, "im")
    for i in range(50):  # inline compaction at 40 keeps 20: 30 turns and a summary
        store.append(big, AvatarMessage(text=f"turn {i}", turn_id=f"big-{i}"))
    assert len(store.context(big).turns) > 10
    summary = store.context(big).summary
    assert summary is not None
    before = store.context(big)
    store.flush()
    wipe(backend)
    lowered = persistent_store(backend, tmp_path, clock, max_turns_per_session=10)
    report = lowered.recover()
    assert report.outcome == "restored" and report.quarantined == []
    assert (report.restored, report.trimmed, report.skipped) == (4, 1, 0)
    after = lowered.context(big)
    assert after.summary == summary  # summary kept
    assert [t.seq for t in after.turns] == [t.seq for t in before.turns][-10:]  # newest kept
    for k, ctx in small.items():
        assert lowered.context(k).messages == ctx.messages
    restored = [e for e in _events(lowered, ReasonCode.RESTORED) if e.avatar == big.avatar]
    assert restored[0].detail is not None
    assert f"trimmed={len(before.turns) - 10}" in restored[0].detail
    # The next append continues the restored session within today's bound.
    receipt = lowered.append(big, AvatarMessage(text="after restore"))
    assert receipt.seq == before.turns[-1].seq + 1 and receipt.turn_count <= 10


def test_session_whose_summary_no_longer_fits_is_skipped_alone(
    backend: Any, tmp_path: Path
) -> None:
    clock = Clock()
    store = persistent_store(backend, tmp_path, clock, max_turns_per_session=20)
    small = populate(store, 2, turns=2)
    big = key(60, "public")
    for i in range(30):
        store.append(big, AvatarMessage(text=f"a longer turn number {i} " * 4))
    summary = store.context(big).summary
    assert summary is not None and len(summary) > 300
    store.flush()
    wipe(backend)
    lowered = persistent_store(backend, tmp_path, clock, max_summary_bytes=256)
    report = lowered.recover()
    assert report.outcome == "restored" and report.quarantined == []
    assert (report.restored, report.skipped) == (2, 1)
    assert lowered.context(big).session_id is None
    for k, ctx in small.items():
        assert lowered.context(k).messages == ctx.messages
    skipped = _events(lowered, ReasonCode.RESTORE_SKIPPED)
    assert [e.avatar for e in skipped] == [big.avatar]


def test_lowered_max_snapshot_bytes_still_restores(backend: Any, tmp_path: Path) -> None:
    clock = Clock()
    store = persistent_store(backend, tmp_path, clock)
    contexts = populate(store, 24, turns=4)
    result = store.flush()
    assert result.bytes > 8192
    wipe(backend)
    lowered = persistent_store(backend, tmp_path, clock, max_snapshot_bytes=8192)
    report = lowered.recover()
    assert report.outcome == "restored" and report.restored == 24 and report.quarantined == []
    for k, ctx in contexts.items():
        assert lowered.context(k).messages == ctx.messages


# --------------------------------------------------------------------------- vanished files


def _embedded_config(tmp_path: Path) -> MemtierConfig:
    return MemtierConfig.load(
        namespace="van" + os.urandom(3).hex(),
        conversation={"persistence_enabled": True, "storage_path": str(tmp_path)},
    )


def test_generation_removed_between_verification_and_restore_goes_to_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _embedded_config(tmp_path)
    store = ConversationStore.from_config(config)
    older = populate(store, 2, turns=2)
    first = store.flush()
    populate(store, 2, turns=2, start=10)
    newest = store.flush()
    store.client.flushall()
    real = persistence.restorebatch.iter_generation_sized

    def remove_first(verified: Any) -> Any:
        if verified.file.generation == newest.generation:
            os.unlink(verified.file.path)  # retention in another process, an operator
        return real(verified)

    monkeypatch.setattr(persistence.restorebatch, "iter_generation_sized", remove_first)
    again = ConversationStore.from_config(config, summarizer=None)  # must not raise
    report = again.last_recovery
    assert report is not None and report.outcome == "restored"
    assert report.generation == first.generation
    assert [name for name, _ in report.unreadable] == [Path(newest.path).name]
    for k, ctx in older.items():
        assert again.context(k).messages == ctx.messages
    again.close()
    store.close()


# --------------------------------------------------------------------------- sanitiser invariants


def _restorable(tmp_path: Path, backend: Any) -> tuple[Any, Path]:
    store = persistent_store(backend, tmp_path, Clock())
    populate(store, 2, turns=6)
    return store, Path(store.flush().path)


def _mutate_first_record(path: Path, text: str) -> None:
    def change(i: int, obj: dict[str, Any]) -> dict[str, Any]:
        if i:
            return obj
        rec = dict(obj["records"][0])
        body = next(k for k in rec["f"] if k in ("text", "summary", "outcome"))
        rec["f"] = {**rec["f"], body: text}
        delta = sum(len(v.encode()) for v in rec["f"].values()) - rec["bytes"]
        rec["bytes"] += delta
        return {**obj, "records": [rec, *obj["records"][1:]], "bytes": obj["bytes"] + delta}

    resign(path, line=change)


@pytest.mark.parametrize("text", ["bell\x07here", "nul\x00", "esc\x1b[31m", "c1\x85"])
def test_recovery_refuses_control_characters(backend: Any, tmp_path: Path, text: str) -> None:
    store, path = _restorable(tmp_path, backend)
    _mutate_first_record(path, text)
    result = _verify(store, path)
    assert isinstance(result, Rejection) and result.reason == "invalid_record"


def test_recovery_refuses_a_summary_of_avatar_turns_marked_trusted(
    backend: Any, tmp_path: Path
) -> None:
    import orjson

    store = persistent_store(backend, tmp_path, Clock(), max_turns_per_session=8)
    k = key(7)
    for i in range(12):  # long enough that the summary keeps its facts (counts)
        store.append(k, AvatarMessage(text=f"hi {i} " + "words " * 20))
    path = Path(store.flush().path)

    def trusted(i: int, obj: dict[str, Any]) -> dict[str, Any]:
        doc = orjson.loads(obj["summary"])
        assert doc["untrusted"] is True and doc["counts"]["avatar"] > 0
        doc["untrusted"] = False
        text = orjson.dumps(doc).decode()
        delta = len(text.encode()) - obj["summary_bytes"]
        return {
            **obj,
            "summary": text,
            "summary_bytes": len(text.encode()),
            "bytes": obj["bytes"] + delta,
        }

    resign(path, line=trusted)
    result = _verify(store, path)
    assert isinstance(result, Rejection) and result.reason == "invalid_summary"


# --------------------------------------------------------------------------- D1 .. D5, D7


@pytest.mark.parametrize("kind", [["tool"], {"k": 1}, 3, None, 1.5])
def test_d1_a_non_string_kind_is_a_rejection_not_a_type_error(
    backend: Any, tmp_path: Path, kind: Any
) -> None:
    store, path = _restorable(tmp_path, backend)

    def change(i: int, obj: dict[str, Any]) -> dict[str, Any]:
        recs = [dict(r) for r in obj["records"]]
        recs[0]["kind"] = kind
        return {**obj, "records": recs}

    resign(path, line=change)
    result = _verify(store, path)
    assert isinstance(result, Rejection) and result.reason == "invalid_record"
    with pytest.raises(RecordInvalid):
        check_record(kind, {"text": "x"}, "t1")


def test_d2_quarantine_failing_with_enospc_does_not_abort_startup(
    backend: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = persistent_store(backend, tmp_path, Clock())
    older = populate(store, 2, turns=2)
    first = store.flush()
    populate(store, 2, turns=2, start=10)
    newest = Path(store.flush().path)
    resign(newest, header=lambda h: h.update(schema_version=9))  # rejected: unsupported
    wipe(backend)

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "link", full)
    monkeypatch.setattr(os, "rename", full)
    report = store.recover()
    assert report.outcome == "restored" and report.generation == first.generation
    assert [name for name, _ in report.quarantine_failed] == [newest.name]
    assert newest.exists()  # left where it was; rejected again on the next start
    for k, ctx in older.items():
        assert store.context(k).messages == ctx.messages
    details = [e.detail or "" for e in _events(store, ReasonCode.QUARANTINED)]
    assert len(details) == 1 and "not moved" in details[0]


def test_d3_read_only_storage_still_restores(
    backend: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = persistent_store(backend, tmp_path, Clock())
    populate(store, 4, turns=2)
    store.flush()
    contexts = populate(store, 6, turns=2, start=4)
    store.flush()
    wipe(backend)

    def erofs(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    for name in ("chmod", "mkdir", "link", "rename", "unlink"):
        monkeypatch.setattr(os, name, erofs)
    monkeypatch.setattr(Path, "mkdir", erofs)
    report = store.recover()
    assert report.outcome == "restored" and report.restored == 10
    assert report.permissions_verified is False
    for k, ctx in contexts.items():
        assert store.context(k).messages == ctx.messages
    assert _events(store, ReasonCode.PERMISSIONS_NOT_VERIFIED)


def test_d4_directory_fsync_failure_after_publish_is_reported_truthfully(
    backend: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = persistent_store(backend, tmp_path, Clock(), max_snapshot_bytes=16 * 1024)
    populate(store, 3, turns=3)
    older = [store.flush() for _ in range(3)]

    def eio(path: Path) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(snapshot.directory, "fsync_dir", eio)
    result = store.flush()
    assert result.durable is False and any("fsync" in w for w in result.warnings)
    published = snaps(store).generations()
    assert published[0].generation == result.generation  # it is published: said so
    assert isinstance(_verify(store, Path(result.path)), VerifiedGeneration)
    # Retention applied exactly as for a durable flush: the newest that fit are kept.
    total = sum(g.size for g in published)
    assert total <= 16 * 1024 and result.removed
    assert all(not Path(r).exists() for r in result.removed)
    assert {g.generation for g in published} == {result.generation, older[-1].generation}
    assert not [p for p in snaps(store).path.iterdir() if p.name.startswith(".tmp")]


def test_d5_fchmod_failure_is_a_snapshot_error_and_keeps_older(
    backend: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = persistent_store(backend, tmp_path, Clock())
    populate(store, 2, turns=2)
    first = store.flush()

    def eperm(fd: int, mode: int) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "fchmod", eperm)
    with pytest.raises(SnapshotError) as info:
        store.flush()
    assert info.value.details.get("errno_name") == "EPERM"
    assert [g.generation for g in snaps(store).generations()] == [first.generation]
    assert not [p for p in snaps(store).path.iterdir() if p.name.startswith(".tmp")]


def test_d5_worker_keeps_going_after_a_fchmod_failure(
    backend: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memtier.workers.worker import Worker, WorkerOptions

    store = persistent_store(backend, tmp_path, Clock())
    populate(store, 1, turns=1)
    worker = Worker(store, WorkerOptions(flush_interval_s=None))

    def eperm(fd: int, mode: int) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "fchmod", eperm)
    worker.flush()  # logged and counted, never raised
    assert worker.stats.flush_errors == 1
    monkeypatch.undo()
    worker.flush()
    assert worker.stats.flushes == 1


def test_d7_a_restored_session_never_reuses_an_acknowledged_session_seq(
    backend: Any, tmp_path: Path
) -> None:
    clock = Clock()
    store = persistent_store(backend, tmp_path, clock)
    k = key(3)
    acked = {
        (r.session_id, r.seq)
        for r in (store.append(k, AvatarMessage(text=f"before {i}")) for i in range(3))
    }
    store.flush()
    # Acknowledged after the flush, then lost with Redis.
    acked |= {
        (r.session_id, r.seq)
        for r in (store.append(k, AvatarMessage(text=f"after {i}")) for i in range(2))
    }
    wipe(backend)
    assert store.recover().restored == 1
    for i in range(4):
        receipt = store.append(k, AvatarMessage(text=f"new {i}"))
        assert (receipt.session_id, receipt.seq) not in acked
    ctx = store.context(k)
    assert [t.seq for t in ctx.turns] == list(range(1, 8))  # gapless in the new id
    # The restored session (its receipts name the old id) flushes again, whole.
    again = store.flush()
    assert again.sessions == 1 and again.skipped == {}
