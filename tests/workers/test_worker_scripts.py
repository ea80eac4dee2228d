"""Contract tests of the worker Lua scripts: the output codes and rejections of each header."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from workhelpers import Clock, key, persistent_store, populate, snaps, sync_store, turn_for

from memtier import AvatarMessage, ReasonCode
from memtier.errors import ScriptError
from memtier.memory.core import ScriptCall
from memtier.memory.persistence import (
    emit_event_call,
    restore_gate_call,
    restore_session_call,
    snapshot_page_call,
)
from memtier.memory.restorestatus import GateStatus, RestoreStatus
from memtier.memory.scriptspecs import EMIT_EVENT, RESTORE_SESSION
from memtier.memory.snapshot import Rejection, iter_generation, verify_generation


def _run(store: Any, call: ScriptCall) -> Any:
    return store.executor.execute(call)


def test_restore_session_codes(backend: Any, tmp_path: Path) -> None:
    clock = Clock()
    store = persistent_store(backend, tmp_path, clock)
    populate(store, 3)
    store.flush()
    gen = snaps(store).generations()[0]
    verified = verify_generation(gen, backend.namespace, store.core.conv, 10**9)
    assert not isinstance(verified, Rejection)
    sessions = list(iter_generation(verified, store.core.conv))
    flush_wall = verified.header["flush_wall_ms"]

    def call(store: Any, session: Any) -> ScriptCall:
        built = restore_session_call(store.core, session, "generation=1")
        return RESTORE_SESSION.replace(built, flush_wall_ms=flush_wall)

    # EXISTS: every session is live.
    assert [int(_run(store, call(store, s))[0]) for s in sessions] == [RestoreStatus.EXISTS] * 3
    if backend.is_fake:  # Redis lost the namespace
        backend.sync_client().flushall()
    else:
        backend.delete_namespace()
    # NO_ROOM: a configuration lowered to one session per partition.
    small = persistent_store(backend, tmp_path, clock, max_active_sessions=1)
    codes = [_run(small, call(small, s)) for s in sessions]
    assert [int(c[0]) for c in codes] == [
        RestoreStatus.RESTORED, RestoreStatus.NO_ROOM, RestoreStatus.NO_ROOM,
    ]  # fmt: skip
    assert codes[1][1] == b"sessions"
    events = [e.reason for e in small.events(limit=100)]
    assert events.count(ReasonCode.EVICTED_SESSION_PRESSURE) == 2
    # RESTORED returns the bytes and the new last activity.
    assert int(codes[0][1]) == sessions[0].nbytes
    # Malformed: a record count that does not match the arguments.
    with pytest.raises(ScriptError):
        _run(small, RESTORE_SESSION.replace(call(small, sessions[1]), n_records=99))


def test_restore_gate_codes(backend: Any) -> None:
    store = sync_store(backend, Clock())
    core = store.core
    assert [
        int(x) if i == 0 else x
        for i, x in enumerate(_run(store, restore_gate_call(core, "acquire", "a")))
    ] == [GateStatus.OK, b"", b""]
    assert _run(store, restore_gate_call(core, "acquire", "b")) == [GateStatus.BUSY]
    assert _run(store, restore_gate_call(core, "extend", "b")) == [GateStatus.LOST]  # not b's
    assert _run(store, restore_gate_call(core, "begin", "b", generation="1")) == [GateStatus.LOST]
    assert _run(store, restore_gate_call(core, "finish", "b")) == [GateStatus.LOST]
    assert _run(store, restore_gate_call(core, "extend", "a")) == [GateStatus.OK]
    assert _run(store, restore_gate_call(core, "begin", "a", generation="4", epoch="e1")) == [
        GateStatus.OK
    ]
    # The epoch is written once, when the state is created: a later one never replaces it.
    assert _run(
        store,
        restore_gate_call(core, "finish", "a", generation="4", outcome="restored", epoch="e2"),
    ) == [GateStatus.OK, b"e1"]
    assert _run(store, restore_gate_call(core, "acquire", "c")) == [
        GateStatus.INITIALISED, b"4", b"restored", b"e1",
    ]  # fmt: skip
    # Only a "live" outcome under the named epoch may be taken again as an unhandled loss.
    assert _run(store, restore_gate_call(core, "acquire", "c", unhandled="e1")) == [
        GateStatus.INITIALISED, b"4", b"restored", b"e1",
    ]  # fmt: skip
    forced = _run(store, restore_gate_call(core, "acquire", "c", force=True))
    assert int(forced[0]) == GateStatus.OK  # an operator restore may take the gate again
    assert _run(store, restore_gate_call(core, "finish", "c", outcome="live")) == [
        GateStatus.OK,
        b"e1",
    ]
    assert (
        int(_run(store, restore_gate_call(core, "acquire", "d", unhandled="e0"))[0])
        == GateStatus.INITIALISED
    )
    assert (
        int(_run(store, restore_gate_call(core, "acquire", "d", unhandled="e1"))[0])
        == GateStatus.OK
    )
    with pytest.raises(ScriptError):
        _run(store, restore_gate_call(core, "nonsense", "d"))
    with pytest.raises(ScriptError):
        _run(store, restore_gate_call(core, "acquire", ""))


def test_emit_event_and_snapshot_page_reject_bad_arguments(backend: Any) -> None:
    store = sync_store(backend, Clock())
    ok = emit_event_call(store.core, ReasonCode.QUARANTINED, "x.snapshot: checksum")
    assert _run(store, ok)
    with pytest.raises(ScriptError):
        _run(
            store, EMIT_EVENT.replace(ok, reason="restored")
        )  # only the reasons no other script emits
    part = store.core.keyspace.partition(0)
    with pytest.raises(ScriptError):
        _run(store, snapshot_page_call(store.core, part, [f"m{i}" for i in range(257)]))
    store.append(key(1), AvatarMessage(text="hello"))
    reply = _run(store, snapshot_page_call(store.core, part, [key(1).member, key(2).member]))
    assert int(reply[2]) == 1  # only the live, indexed one


def test_read_session_returns_the_whole_session(backend: Any) -> None:
    from memtier.memory.compaction import read_session_call
    from memtier.memory.state import iter_sessions

    clock = Clock()
    store = sync_store(backend, clock, conversation={"public_ttl_seconds": 60})
    for i in range(5):
        store.append(key(1), turn_for(i))
    (state,) = iter_sessions(_run(store, read_session_call(store.core, key(1))))
    assert [r.seq for r in state.records] == [1, 2, 3, 4, 5] and state.turns == 5
    assert state.nbytes == sum(r.nbytes for r in state.records)
    assert state.read_clock_ms == clock.now
    clock.advance(60_000)
    assert list(iter_sessions(_run(store, read_session_call(store.core, key(1))))) == []
