"""The status contract of ``restore_gate`` and ``restore_session``.

One convention (negative = refused, zero = done, positive = a documented variant), held
in three places that this module keeps in step: the values the Lua body returns, the
``Output`` lines of its header, and the Python enums in
:mod:`memtier.memory.restorestatus` the plans and metrics read.  Every status a script
can return maps to exactly one constant, and every constant is a status the script
returns.  The headers' input lines name each KEYS/ARGV with a unique identifier, in the
order the Python call builders send them.
"""

from __future__ import annotations

import re
from enum import IntEnum
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from memtier import metrics
from memtier.config import MemtierConfig
from memtier.memory.core import MemoryCore
from memtier.memory.persistence import restore_gate_call, restore_session_call
from memtier.memory.restorestatus import GateStatus, RestoreStatus
from memtier.memory.snapshot import ValidatedSession
from memtier.memory.state import StoredTurn
from memtier.scriptspec import header_inputs

LUA = Path(__file__).resolve().parents[2] / "lua" / "memory"
SCRIPTS: dict[str, tuple[str, type[IntEnum]]] = {
    "restore_gate": ("restore_gate-2.lua", GateStatus),
    "restore_session": ("restore_session-8.lua", RestoreStatus),
}
# `return { <status>` in the body: every reply of these scripts is a table led by its status.
_RETURN = re.compile(r"\breturn\s*\{\s*(-?\d+)")
_ANY_RETURN = re.compile(r"\breturn\b(?!\s*redis\.error_reply)")
# Local helper functions (their returns are values, not replies of the script).
_LOCAL_FUNCTION = re.compile(r"^local function .*?^end$", re.MULTILINE | re.DOTALL)
# `    NAME  <status>  ...` in the header's Output section.
_OUTPUT_LINE = re.compile(r"^\s{4}([A-Z][A-Z_]*)\s+(-?\d+)\s")


def _source(script: str) -> str:
    return (LUA / SCRIPTS[script][0]).read_text(encoding="utf-8")


def _header_and_body(script: str) -> tuple[str, str]:
    header, body = _source(script).split("]]", 1)
    return header, _LOCAL_FUNCTION.sub("", body)


def _header_statuses(header: str) -> dict[str, int]:
    section = header.split("Output", 1)[1].split("Side effects", 1)[0]
    found: dict[str, int] = {}
    for line in section.splitlines():
        match = _OUTPUT_LINE.match(line)
        if match:
            assert match.group(1) not in found, f"{match.group(1)} listed twice"
            found[match.group(1)] = int(match.group(2))
    return found


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_returned_status_is_exactly_one_constant_and_back(script: str) -> None:
    _, enum = SCRIPTS[script]
    header, body = _header_and_body(script)
    returned = {int(v) for v in _RETURN.findall(body)}
    # Every non-error return of the body is a status-led table (nothing escapes the scan).
    assert len(_ANY_RETURN.findall(body)) == len(_RETURN.findall(body)), script
    values = [member.value for member in enum]
    assert len(values) == len(set(values)), f"{enum.__name__} has aliases"
    assert returned == set(values), (script, sorted(returned), sorted(values))
    assert _header_statuses(header) == {member.name: member.value for member in enum}
    # The convention: zero is the plain "done" and the only zero.
    assert enum(0).name in ("OK", "RESTORED")


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_header_inputs_are_unique_identifiers(script: str) -> None:
    keys, argv = header_inputs(_source(script))
    assert len(set(keys)) == len(keys) and len(set(argv)) == len(argv)
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", name) for name in (*keys, *argv))


def _session() -> ValidatedSession:
    record = StoredTurn(1, 1_800_000_000_000, 1_800_000_000_000, 2, False, "avatar", "t-1", {})
    return ValidatedSession(
        member="00000000-0000-4000-8000-000000000001:public",
        session_id="ses_" + "a" * 22,
        created_ms=1_800_000_000_000,
        created_wall_ms=1_800_000_000_000,
        last_ms=1_800_000_000_000,
        last_wall_ms=1_800_000_000_000,
        age_ms=0,
        read_wall_ms=1_800_000_000_000,
        seq=1,
        summary=None,
        summary_version=0,
        nbytes=2,
        records=(record,),
        receipts=(("t-1", "ses_x|1|1|1|2|0"),),
    )


def test_call_builders_send_what_the_headers_declare() -> None:
    core = MemoryCore(MemtierConfig.load())
    gate = restore_gate_call(core, "acquire", "token")
    keys, argv = header_inputs(_source("restore_gate"))
    assert (len(gate.keys), len(gate.args)) == (len(keys), len(argv))
    session = _session()
    call = restore_session_call(core, session, "generation=1")
    keys, argv = header_inputs(_source("restore_session"))
    # The fixed ARGV, then n records and the receipts as pairs (the header's variadic tail).
    assert len(call.keys) == len(keys)
    assert len(call.args) == len(argv) + len(session.records) + 2 * len(session.receipts)
    assert call.args[argv.index("n_records")] == len(session.records)
    assert call.args[argv.index("member")] == session.member


def _events(reason: str) -> float:
    return REGISTRY.get_sample_value("memtier_events_total", {"reason": reason}) or 0.0


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ([RestoreStatus.RESTORED, 10, 5], "restored"),
        ([RestoreStatus.EXPIRED, 99], "expired"),
        ([RestoreStatus.NO_ROOM, b"sessions"], "evicted_session_pressure"),
        ([RestoreStatus.NO_ROOM, b"bytes"], "evicted_aggregate_pressure"),
    ],
)
def test_metrics_count_restore_session_statuses(reply: list[Any], reason: str) -> None:
    before = {r: _events(r) for r in ("restored", "expired", *_PRESSURE)}
    metrics.count_script_events("restore_session", (), [int(reply[0]), *reply[1:]])
    after = {r: _events(r) for r in before}
    assert {r: after[r] - before[r] for r in before if after[r] != before[r]} == {reason: 1.0}


def test_metrics_count_nothing_for_an_existing_session() -> None:
    before = {r: _events(r) for r in ("restored", "expired", *_PRESSURE)}
    metrics.count_script_events("restore_session", (), [int(RestoreStatus.EXISTS)])
    assert {r: _events(r) for r in before} == before


_PRESSURE = ("evicted_session_pressure", "evicted_aggregate_pressure")
