"""One error vocabulary: every status a Lua script refuses with, and every reason code a
script emits, maps to exactly one Python enum value -- and back.

The checker is pure (``*_mismatches`` below); its own unit tests plant a mismatch of each
kind and show it is reported.  The real tests feed it the Lua sources (headers, the
thread status table, the event calls) and what the Python code does with each status.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, cast

import pytest
from redis.exceptions import ResponseError

from memtier import errors, retry
from memtier.config import MemtierConfig
from memtier.errors import (
    ERRORS,
    THREADS_API_CODES,
    BackendBusyError,
    ConversationError,
    ErrorCode,
    MemtierError,
    ThreadBusyError,
    TransientBackendError,
    ValidationError,
)
from memtier.memory.models import ReasonCode

REPO = Path(__file__).resolve().parents[1]
LUA = REPO / "lua"
CANONICAL_CODES = [member.value for member in ErrorCode]  # aliases are not iterated

# Scripts whose refusal statuses are outcomes the Python side handles, not error codes.
OUTCOME_STATUSES: Mapping[str, str] = {
    "memory/apply_compaction": "compaction outcomes (memtier.memory.compaction): job states",
    "memory/context_head": "NOT_FOUND is an empty context",
    "memory/read_context": "NOT_FOUND is an empty context",
    "memory/restore_gate": "LOST: the lock is no longer ours (the restorer stops); BUSY: wait",
    "memory/restore_session": "NO_ROOM: that session is skipped and reported; recovery goes on",
}
# Reason codes the Python side publishes without a script emitting them (none today).
PYTHON_ONLY_REASONS: frozenset[str] = frozenset()


# --- the checker -----------------------------------------------------------------------------

_HEADER_RE = re.compile(r"--\[\[(.*?)\]\]", re.DOTALL)
_REFUSAL_RE = re.compile(r"\{\s*(-\d+)\b[^}]*\}\s*([A-Z][A-Z_]+)")
_STATUS_ROW_RE = re.compile(r"(-?\d+) ([A-Z][A-Z_]+)")
_TABLE_ROW_RE = re.compile(r"^\s*([A-Z][A-Z_]+)\s+(-\d+)\s", re.MULTILINE)


def header_refusals(source: str) -> dict[str, int]:
    """``NAME -> status`` of the negative statuses a script's header documents: as
    ``{ -2, ... }  NAME: ...`` rows, or as ``NAME  -2  ...`` table rows."""
    match = _HEADER_RE.search(source)
    header = match.group(1) if match else ""
    found = {name: int(status) for status, name in _REFUSAL_RE.findall(header)}
    found.update((name, int(status)) for name, status in _TABLE_ROW_RE.findall(header))
    return found


def status_table(source: str) -> dict[str, int]:
    """The ``Status convention`` block of a Lua include: ``NAME -> value``."""
    block = source.split("Status convention", 1)[1].split("\n\n", 1)[0]
    return {name: int(value) for value, name in _STATUS_ROW_RE.findall(block)}


def status_mismatches(what: str, lua: Mapping[str, int], python: Mapping[str, int]) -> list[str]:
    """Names and values of one status table, Lua against Python, both ways."""
    problems = [
        f"{what}: {n}={v} in Lua, {python.get(n)} in Python"
        for n, v in lua.items()
        if python.get(n) != v
    ]
    problems += [f"{what}: {n}={v} only in Python" for n, v in python.items() if n not in lua]
    return problems


def code_mismatches(
    lua_to_code: Mapping[str, str], enum_values: Iterable[str], from_script: set[str]
) -> list[str]:
    """Each Lua refusal maps to exactly one enum value; each value marked ``from_script``
    in the table is reached from some refusal, and only those are."""
    values = list(enum_values)
    problems = [
        f"{refusal} -> {code!r}: {values.count(code)} enum values"
        for refusal, code in lua_to_code.items()
        if values.count(code) != 1
    ]
    mapped = set(lua_to_code.values())
    problems += [
        f"{c}: from_script, but no Lua status maps to it" for c in sorted(from_script - mapped)
    ]
    problems += [
        f"{c}: a Lua status maps to it, but it is not from_script"
        for c in sorted(mapped - from_script)
        if c in values
    ]
    return problems


def unclassified_scripts(
    refusals: Mapping[str, Mapping[str, int]], mapped: Iterable[str], outcomes: Iterable[str]
) -> list[str]:
    """Scripts with refusal statuses that are neither mapped to codes nor documented outcomes."""
    known = set(mapped) | set(outcomes)
    return sorted(
        f"{s}: refuses with {sorted(r)}; classify it"
        for s, r in refusals.items()
        if r and s not in known
    )


def reason_mismatches(
    emitted: set[str], enum_values: Iterable[str], python_only: set[str] | frozenset[str]
) -> list[str]:
    """Each emitted reason is exactly one enum value; each value is emitted or Python-only."""
    values = list(enum_values)
    problems = [
        f"{r!r}: {values.count(r)} ReasonCode values"
        for r in sorted(emitted)
        if values.count(r) != 1
    ]
    problems += [
        f"{v!r}: no script emits it and it is not documented as Python-side only"
        for v in values
        if v not in emitted and v not in python_only
    ]
    problems += [
        f"{v!r}: documented Python-side only, but a script emits it"
        for v in sorted(python_only & emitted)
    ]
    return problems


_EMIT_RE = re.compile(r"memtier_emit\(\s*[^,()]+,\s*[^,()]+,\s*'([a-z_]+)'")
_DROP_RE = re.compile(r"memtier_drop\(((?:[^()]|\([^()]*\))*)\)")
_REASON_VAR_RE = re.compile(r"\b(?:reason|why)\s*=\s*'([a-z_]+)'")
_REASON_CMP_RE = re.compile(r"\breason\s*[~=]=\s*'([a-z_]+)'")
_ALLOWED_RE = re.compile(r"\ballowed\s*=\s*\{([^}]*)\}")


def reasons_emitted(sources: Iterable[str]) -> set[str]:
    """Reason literals the memory scripts publish: passed to memtier_emit / memtier_drop,
    assigned to the reason variable, or accepted from ARGV (comparisons, allowed tables)."""
    found: set[str] = set()
    for source in sources:
        code = re.sub(r"--[^\n]*", "", _HEADER_RE.sub("", source))  # no comments
        found.update(_EMIT_RE.findall(code))
        for args in _DROP_RE.findall(code):
            parts = [p.strip() for p in args.split(",")]
            if len(parts) >= 8 and re.fullmatch(r"'[a-z_]+'", parts[7]):
                found.add(parts[7].strip("'"))
        found.update(_REASON_VAR_RE.findall(code))
        found.update(_REASON_CMP_RE.findall(code))
        for table in _ALLOWED_RE.findall(code):
            found.update(re.findall(r"([a-z_]+)\s*=\s*true", table))
    return found


# --- unit tests of the checker: a planted mismatch of each kind is reported ---------------------


def test_the_checker_reports_a_refusal_mapped_to_no_or_a_misspelt_code() -> None:
    assert code_mismatches({"x/a:-1": "session_full"}, CANONICAL_CODES, {"session_full"}) == []
    planted = code_mismatches({"x/a:-1": "sesion_full"}, CANONICAL_CODES, set())
    assert planted == ["x/a:-1 -> 'sesion_full': 0 enum values"]
    twice = code_mismatches({"x/a:-1": "dup"}, ["dup", "dup"], {"dup"})
    assert twice == ["x/a:-1 -> 'dup': 2 enum values"]


def test_the_checker_reports_the_from_script_marks_both_ways() -> None:
    unreached = code_mismatches({}, CANONICAL_CODES, {"thread_busy"})
    assert unreached == ["thread_busy: from_script, but no Lua status maps to it"]
    unmarked = code_mismatches({"x/a:-1": "thread_busy"}, CANONICAL_CODES, set())
    assert unmarked == ["thread_busy: a Lua status maps to it, but it is not from_script"]


def test_the_checker_reports_status_tables_that_disagree() -> None:
    assert status_mismatches("t", {"A": -1}, {"A": -1}) == []
    assert status_mismatches("t", {"A": -1}, {"A": -2}) == ["t: A=-1 in Lua, -2 in Python"]
    assert status_mismatches("t", {}, {"B": 3}) == ["t: B=3 only in Python"]


def test_the_checker_reports_an_unclassified_refusing_script() -> None:
    planted = unclassified_scripts({"memory/new": {"FULL": -1}, "memory/ok": {}}, (), ())
    assert planted == ["memory/new: refuses with ['FULL']; classify it"]
    assert unclassified_scripts({"memory/new": {"FULL": -1}}, ["memory/new"], ()) == []


def test_the_checker_reports_reason_codes_both_ways() -> None:
    values = [r.value for r in ReasonCode]
    assert reason_mismatches(set(values), values, frozenset()) == []
    extra = reason_mismatches({*values, "evicted_by_magic"}, values, frozenset())
    assert extra == ["'evicted_by_magic': 0 ReasonCode values"]
    missing = reason_mismatches(set(values) - {"popped"}, values, frozenset())
    assert missing == ["'popped': no script emits it and it is not documented as Python-side only"]
    assert reason_mismatches(set(values) - {"popped"}, values, frozenset({"popped"})) == []


def test_the_parsers_read_headers_tables_and_event_calls() -> None:
    header = "--[[\n  Output:\n    { 0, x }  stored\n    { -2, a, b }  AGGREGATE_FULL: no\n]]\n"
    assert header_refusals(header + "return { -9 } -- NOT_A_HEADER") == {"AGGREGATE_FULL": -2}
    table_rows = "--[[\n  Output:\n    OK      0   done\n    LOST   -1   { -1 } not ours\n]]\n"
    assert header_refusals(table_rows) == {"LOST": -1}
    table = (
        "Status convention (x):\n     0 OK     1 EXISTED / NOOP\n    -1 NOT_FOUND\n\nlater -5 NOPE"
    )
    assert status_table(table) == {"OK": 0, "EXISTED": 1, "NOT_FOUND": -1}
    lua = (
        "memtier_emit(events_key, max_events, 'popped', member)\n"
        "memtier_drop(prefix, member, lru, ix, meta, ev, max_events,\n  'expired', now, wall)\n"
        "local why = 'evicted_session_pressure'\n"
        "if reason ~= 'operator_deleted' then end\n"
        "local allowed = { quarantined = true, restored = true }\n"
        "-- memtier_emit(a, b, 'commented_out')\n"
    )
    assert reasons_emitted([lua]) == {
        "popped",
        "expired",
        "evicted_session_pressure",
        "operator_deleted",
        "quarantined",
        "restored",
    }


# --- the real vocabulary ---------------------------------------------------------------------


def _scripts() -> dict[str, str]:
    """``family/name -> source`` of every script (the ``-<nkeys>`` suffix dropped)."""
    return {
        f"{path.parent.name}/{path.stem.rsplit('-', 1)[0]}": path.read_text()
        for path in sorted(LUA.glob("*/*.lua"))
        if path.parent.name != "includes"
    }


def _thread_statuses() -> tuple[dict[str, int], Any, Mapping[int, Any]]:
    from memtier.threads import status

    table = status_table((LUA / "includes" / "thread_common.lua").read_text())
    # memtier.threads.status's status -> (code, message) table (its one mapping)
    return table, status.ThreadStatus, status.STATUS_ERRORS


def _code_of(call: Callable[[], object]) -> str:
    with pytest.raises(MemtierError) as info:
        call()
    return info.value.code.value


def _append_code(status: int) -> str:
    from memtier.memory.core import MemoryCore

    core = MemoryCore(MemtierConfig.load())
    reply = [status, *(str(n).encode() for n in range(1, 12))]
    return _code_of(lambda: core.decode_append(cast(Any, None), reply))


def _checkpoint_write_code(status: int) -> str:
    from memtier.integrations._checkpoint_core import CheckpointSteps

    # the refusal branch reads only the reply (the unbound method, no saver needed)
    return _code_of(lambda: CheckpointSteps._written(cast(Any, None), "put", [status, 5, 4]))


def _lua_refusal_codes() -> dict[str, str]:
    """Every refusal a script can return -> the code the Python side raises for it."""
    table, thread_status, thread_errors = _thread_statuses()
    mapped: dict[str, str] = {}
    for name, value in table.items():
        if value < 0:
            mapped[f"threads:{name}"] = thread_errors[thread_status(value)][0].value
    for name, value in header_refusals(_scripts()["memory/append_turn"]).items():
        mapped[f"memory/append_turn:{name}"] = _append_code(value)
    for name, value in header_refusals(_scripts()["langgraph/checkpoint_write"]).items():
        mapped[f"langgraph/checkpoint_write:{name}"] = _checkpoint_write_code(value)
    # redis.error_reply('memtier: ...') in any script: memtier.scripts maps it to ScriptError
    from memtier.scripts import _raise_script_error

    error = ResponseError("memtier: any: malformed ARGV")
    mapped["error_reply"] = _code_of(lambda: _raise_script_error("any", error))
    return mapped


def test_the_thread_status_table_is_the_lua_one() -> None:
    table, thread_status, _ = _thread_statuses()
    assert status_mismatches("thread_common", table, {s.name: s.value for s in thread_status}) == []
    # every refusal a thread script documents is a row of that table
    for script, source in _scripts().items():
        if script.startswith("threads/"):
            for name, value in header_refusals(source).items():
                assert table.get(name) == value, (script, name, value)


def test_the_append_statuses_are_the_scripts() -> None:
    from memtier.memory.core import AppendStatus

    python = {n: v for n, v in vars(AppendStatus).items() if n.isupper() and v < 0}
    lua = header_refusals(_scripts()["memory/append_turn"])
    assert status_mismatches("append_turn", lua, python) == []


def test_every_refusing_script_is_mapped_or_a_documented_outcome() -> None:
    refusals = {script: header_refusals(source) for script, source in _scripts().items()}
    mapped = ["memory/append_turn", "langgraph/checkpoint_write"]
    mapped += [s for s in refusals if s.startswith("threads/")]
    assert unclassified_scripts(refusals, mapped, OUTCOME_STATUSES) == []
    for script in OUTCOME_STATUSES:
        assert refusals[script], f"{script} no longer refuses: drop it from OUTCOME_STATUSES"


def test_every_script_error_reply_is_a_script_error() -> None:
    replies = re.findall(r"redis\.error_reply\(\s*'([^']*)'", "".join(_scripts().values()))
    assert len(replies) >= 20
    assert [r for r in replies if not r.startswith("memtier: ")] == []


def test_every_lua_refusal_maps_to_exactly_one_error_code_and_back() -> None:
    mapped = _lua_refusal_codes()
    assert len(mapped) >= 15  # the thread table, append_turn, checkpoint_write, error_reply
    from_script = {code.value for code, spec in ERRORS.items() if spec.from_script}
    assert code_mismatches(mapped, CANONICAL_CODES, from_script) == []


def test_every_reason_code_a_script_emits_is_one_reason_code_and_back() -> None:
    sources = [p.read_text() for p in sorted((LUA / "memory").glob("*.lua"))]
    sources += [p.read_text() for p in sorted((LUA / "includes").glob("memory_*.lua"))]
    emitted = reasons_emitted(sources)
    assert len(emitted) >= 10
    assert reason_mismatches(emitted, [r.value for r in ReasonCode], PYTHON_ONLY_REASONS) == []


# --- one enum, one table, one class per code -------------------------------------------------


def test_grep_finds_one_error_code_enum() -> None:
    pattern = re.compile(r"^class (\w*Code\w*)\((?:\w+\.)?(?:Str|Int)?Enum\)", re.MULTILINE)
    found = [
        (path.relative_to(REPO).as_posix(), name)
        for path in sorted((REPO / "memtier").rglob("*.py"))
        for name in pattern.findall(path.read_text())
    ]
    error_enums = [(p, n) for p, n in found if "Error" in n]
    assert error_enums == [("memtier/errorcodes.py", "ErrorCode")], found


def test_the_table_has_every_code_and_every_status_a_title() -> None:
    assert set(ERRORS) == set(ErrorCode)
    assert set(THREADS_API_CODES) <= set(ERRORS) and len(set(THREADS_API_CODES)) == 20
    assert {ERRORS[c].status for c in THREADS_API_CODES} <= set(errors.HTTP_STATUS_TITLES)
    for code, spec in ERRORS.items():
        assert errors.http_status_for(code.value) == spec.status and spec.description, code


def _error_classes() -> list[type[MemtierError]]:
    found: list[type[MemtierError]] = []
    stack: list[type[MemtierError]] = [MemtierError]
    while stack:
        cls = stack.pop()
        found.append(cls)
        stack.extend(cls.__subclasses__())
    return [c for c in found if c.__module__ == "memtier.errors" and not c.__name__.startswith("_")]


def test_a_class_per_code_with_the_same_arguments() -> None:
    classes = [c for c in _error_classes() if c not in (MemtierError, ConversationError)]
    threads = [c for c in classes if issubclass(c, ConversationError)]
    memory = [c for c in classes if not issubclass(c, ConversationError)]
    assert sorted(c.code for c in threads) == sorted(THREADS_API_CODES)  # one each
    renamed = {"InvalidThreadCursorError", "ConversationBackendError"}  # docs/threads.md
    for cls in threads:
        camel = "".join(part.title() for part in cls.code.value.split("_")) + "Error"
        assert cls.__name__ == camel or cls.__name__ in renamed, cls
    assert len({c.code for c in memory}) == len(memory)
    for cls in classes:
        error = cls("went wrong", limit=3)
        assert (error.message, error.details, error.code) == ("went wrong", {"limit": 3}, cls.code)
        assert error.retryable is ERRORS[cls.code].retryable
        assert error.http_status == ERRORS[cls.code].status
        assert error.to_dict() == {"code": cls.code.value, "message": "went wrong", "limit": 3}
        with pytest.raises(TypeError):
            cls("a second code", code="other")


def test_conversation_error_builds_the_class_of_its_code() -> None:
    for code in THREADS_API_CODES:
        error = ConversationError(code, "m", limit=1)
        assert type(error).code is code and isinstance(error, ConversationError)
        assert (error.message, error.details) == ("m", {"limit": 1})
        assert type(ConversationError(code.value)) is type(error)  # a plain string works
    with pytest.raises(ThreadBusyError):
        raise ConversationError(ErrorCode.THREAD_BUSY, "another turn holds the thread")
    assert ConversationError(ErrorCode.NOT_FOUND).message == "not found"

    class HostBusy(ThreadBusyError):  # a host may subclass; the factory keeps memtier's
        pass

    assert type(ConversationError(ErrorCode.THREAD_BUSY)) is ThreadBusyError
    assert HostBusy("x").code is ErrorCode.THREAD_BUSY
    with pytest.raises(ValueError, match="not a conversation-threads code"):
        ConversationError(ErrorCode.SESSION_FULL)
    with pytest.raises(ValueError):
        ConversationError("no_such_code")


def test_the_deprecated_threads_enum_is_a_view_of_the_one_enum() -> None:
    from memtier.errors import ConversationErrorCode

    assert ConversationErrorCode.THREAD_BUSY is ErrorCode.THREAD_BUSY
    assert list(ConversationErrorCode) == list(THREADS_API_CODES)
    assert ConversationErrorCode("not_found") is ErrorCode.NOT_FOUND
    assert ErrorCode.THREAD_BUSY in ConversationErrorCode
    assert ErrorCode.SESSION_FULL not in ConversationErrorCode


def test_the_old_memory_spelling_is_still_accepted() -> None:
    error = ValidationError("bad")
    assert error.code is ErrorCode.INVALID_REQUEST is ErrorCode.INVALID_INPUT
    assert error.code == "invalid_input" and error.code == "invalid_request"
    assert error.code != "invalid_cursor" and (error.code != "invalid_input") is False
    assert error.to_dict()["code"] == "invalid_request"  # emitted: the one spelling
    assert ErrorCode("invalid_input") is ErrorCode.INVALID_REQUEST
    assert errors.http_status_for("invalid_input") == 400
    assert errors.http_status_for("no_such_code") == 500


def test_the_retry_predicate_reads_retryable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert retry.classify(TransientBackendError("slot moved")) is retry.Fault.NOT_APPLIED
    assert retry.classify(BackendBusyError("no slot")) is retry.Fault.BUSY
    for cls in _error_classes():
        if cls is ConversationError:
            continue
        error = cls("x")
        if not error.retryable:
            assert retry.classify(error) is retry.Fault.PASS_THROUGH, cls
    # the flag decides, not the type: the same class, declared not retryable, passes through
    monkeypatch.setattr(TransientBackendError, "retryable", False)
    assert retry.classify(TransientBackendError("slot moved")) is retry.Fault.PASS_THROUGH
    assert not retry.is_transient(TransientBackendError("slot moved"))


# --- the HTTP API emits enum members only ----------------------------------------------------


def test_every_code_the_http_api_emits_is_a_threads_enum_member() -> None:
    emitted: set[str] = set()
    for path in sorted((REPO / "memtier" / "threads" / "http").glob("*.py")):
        tree = ast.parse(path.read_text())
        exported = {
            id(element)
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__"
            for element in ast.walk(node.value)
        }
        for node in ast.walk(tree):
            if id(node) in exported:
                continue
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ConversationError":
                first = node.args[0] if node.args else None
                assert isinstance(first, ast.Attribute | ast.Name), (path.name, ast.dump(node))
                if isinstance(first, ast.Attribute):
                    emitted.add(first.attr)
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                # no code spelt as a string: every one goes through ErrorCode
                assert node.value not in CANONICAL_CODES, (path.name, node.value)
    assert emitted  # the scan saw the error constructors
    names = {code.name for code in THREADS_API_CODES}
    assert emitted <= names, emitted - names


def test_the_docs_describe_each_threads_code_from_the_table() -> None:
    doc = (REPO / "docs" / "threads.md").read_text()
    section = doc.split("Every code and its one status:", 1)[1].split("## Limits", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \| (\d{3}) \| (.*) \|$", section, flags=re.MULTILINE)
    assert [code for code, _, _ in rows] == [c.value for c in THREADS_API_CODES]
    for code, status, when in rows:
        spec = ERRORS[ErrorCode(code)]
        assert (int(status), when) == (spec.status, spec.description), code


def test_the_readme_error_table_is_the_class_table() -> None:
    readme = (REPO / "README.md").read_text()
    rows = re.findall(r"^\| `(\w+Error)` \| `(\w+)` \| (\d{3}) \|$", readme, flags=re.MULTILINE)
    by_name = {c.__name__: c for c in _error_classes()}
    assert len(rows) >= 14
    for name, code, status in rows:
        cls = by_name[name]
        assert (cls.code.value, ERRORS[cls.code].status) == (code, int(status)), name
