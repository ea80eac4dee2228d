"""The one status convention of lua/threads, checked against memtier.threads.status.

Every status a thread script can return (its ``return { n`` literals, the statuses it
hands to ``thread_reply`` and the first element of a reply table it builds) must be
listed in its header's Output section as ``{ n ... }  NAME``, with NAME the
:class:`ThreadStatus` member of that value -- and every member must be returned by some
script.  Negative values are refusals (each maps to an error), zero is done, positive
values are documented variants (never errors).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from memtier.scripts import lua_root
from memtier.threads.status import STATUS_ERRORS, ThreadStatus

_CODE_STATUS = re.compile(
    r"return\s*\{\s*(-?\d+)"  # return { -1 }
    r"|thread_reply\(\s*(-?\d+)"  # return thread_reply(1, thread_key)
    r"|local\s+reply\s*=\s*\{\s*(-?\d+)"  # local reply = { 0, ... } ... return reply
)
_HEADER_STATUS = re.compile(r"\{\s*(-?\d+)[^}]*\}\s+([A-Z][A-Z_]+)\b")


def _sources() -> dict[str, str]:
    folder = Path(lua_root(), "threads")
    return {p.name: p.read_text("utf-8") for p in sorted(folder.glob("*-*.lua"))}


SOURCES = _sources()


def code_statuses(source: str) -> set[int]:
    body = source.split("]]", 1)[1]
    body = re.sub(r"--[^\n]*", "", body)  # comments are not code
    return {int(next(g for g in m.groups() if g is not None)) for m in _CODE_STATUS.finditer(body)}


def header_statuses(source: str) -> list[tuple[int, str]]:
    header = source.split("]]", 1)[0]
    assert "Output" in header, "the header has no Output section"
    output = header.split("Output", 1)[1].split("Side effects", 1)[0]
    return [(int(m[1]), m[2]) for m in _HEADER_STATUS.finditer(output)]


def problems(source: str) -> list[str]:
    """What breaks the convention in one script (empty: it keeps it)."""
    found: list[str] = []
    listed = header_statuses(source)
    for value, name in listed:
        try:
            member = ThreadStatus(value)
        except ValueError:
            found.append(f"header lists {value}, which is no ThreadStatus")
            continue
        if member.name != name:
            found.append(f"header calls {value} {name}, ThreadStatus calls it {member.name}")
    returned = code_statuses(source)
    if not returned:
        found.append("no status found in the code")
    for value in sorted(returned - {v for v, _ in listed}):
        found.append(f"returns {value}, which the header's Output does not list")
    for value in sorted({v for v, _ in listed} - returned):
        found.append(f"the header lists {value}, which the code never returns")
    return found


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_each_script_lists_every_status_it_returns(name: str) -> None:
    assert problems(SOURCES[name]) == []


def test_every_thread_status_is_returned_by_some_script_and_back() -> None:
    returned = set().union(*(code_statuses(s) for s in SOURCES.values()))
    assert returned == {member.value for member in ThreadStatus}
    # exactly one member per value (no aliases)
    assert len({m.value for m in ThreadStatus}) == len(ThreadStatus.__members__)


def test_negative_means_refused_zero_done_positive_a_variant() -> None:
    for member in ThreadStatus:
        if member < 0:
            assert member in STATUS_ERRORS, f"{member.name} refuses without an error"
        else:
            assert member not in STATUS_ERRORS, f"{member.name} is a success, not an error"
    assert ThreadStatus(0) is ThreadStatus.OK


def test_the_shared_include_lists_every_status() -> None:
    common = Path(lua_root(), "includes", "thread_common.lua").read_text("utf-8")
    table = common.split("]]", 1)[0]
    for member in ThreadStatus:
        assert re.search(rf"(?<![\d-]){member.value} {member.name}\b", table), member.name


_RETURN_SITES = [
    (name, m.start(1), m.end(1))
    for name, source in SOURCES.items()
    for m in re.finditer(r"return\s*\{\s*(-?\d+)", source.split("]]", 1)[1])
]


@given(site=st.sampled_from(_RETURN_SITES), value=st.integers(-40, 40))
@example(site=next(s for s in _RETURN_SITES if s[0].startswith("delete")), value=2)
def test_a_return_the_header_does_not_list_is_caught(
    site: tuple[str, int, int], value: int
) -> None:
    """The negative case: change one returned status to a value the header does not list
    (a new variant added without documenting it) and the check reports it."""
    name, start, end = site
    source = SOURCES[name]
    listed = {v for v, _ in header_statuses(source)}
    if value in listed:
        return  # still documented: not the defect this test plants
    header, body = source.split("]]", 1)
    mutated = header + "]]" + body[:start] + str(value) + body[end:]
    assert any(f"returns {value}," in p for p in problems(mutated))


def test_a_misnamed_status_in_the_header_is_caught() -> None:
    source = SOURCES["hold-1.lua"]
    assert problems(source) == []
    assert problems(source.replace("{ 0, hgetall... }  OK", "{ 0, hgetall... }  DONE", 1))
    assert problems(source.replace("{ -1 }             NOT_FOUND", "{ -1 }  LEASE_LOST", 1))
