"""The flush's direct decoding of a ``snapshot_page`` reply equals the object path.

``page_lines`` writes session lines straight from the reply; the reference is
``session_to_json`` over ``iter_sessions`` (the SessionState path the flush used before).
A generator of replies -- well-formed sessions, missing or non-integer hash fields,
malformed records, trailing data -- must give the same lines or the same error kind.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from memtier.errors import ScriptError
from memtier.memory.snapshot.fileformat import page_lines, session_to_json
from memtier.memory.state import iter_sessions

_KINDS = {"avatar": ("text",), "agent": ("text",), "tool": ("tool", "summary")}


@st.composite
def _record(draw: st.DrawFn) -> bytes | str:
    kind = draw(st.sampled_from([*_KINDS, "nope"]))
    names = _KINDS.get(kind, ("text",))
    fields = {n: draw(st.text(max_size=8)) for n in names}
    payload = orjson.dumps({"k": kind, "id": draw(st.text(max_size=6)), "f": fields})
    if draw(st.integers(0, 30)) == 0:
        payload = draw(st.sampled_from([b"[]", b"{", b'{"k":1}']))
    # both record formats (memtier/memory/turncodec.py), and malformed flags
    tool = draw(st.sampled_from(["0", "1"] * 8 + ["0v1", "1rv1", "0v12"] * 3 + ["2", "0v", "0v01"]))
    nums = [str(draw(st.integers(0, 2**40))) for _ in range(4)]
    if len(tool) > 1 and draw(st.booleans()):
        nums[2] = ""  # the new format leaves a wall time equal to the clock out
    if draw(st.integers(0, 30)) == 0:
        nums[draw(st.integers(0, 3))] = draw(st.sampled_from(["x", "", " 1", "-3"]))
    raw = "|".join([*nums, tool]).encode() + b"|" + payload
    return raw if draw(st.booleans()) else raw.decode()


_HASH_FIELDS = ["id", "created", "created_wall", "seq", "turns", "bytes", "tools"]
_OPTIONAL = ["last", "last_wall", "summary_bytes", "sv", "summary", "cq"]


@st.composite
def _session(draw: st.DrawFn) -> list[Any]:
    member = draw(st.sampled_from(["a:public", b"b:im", "c:public"]))
    h: dict[str, str] = {}
    for name in _HASH_FIELDS:
        if draw(st.integers(0, 60)) > 0:
            h[name] = "ses_x" if name == "id" else str(draw(st.integers(0, 2**45)))
    for name in _OPTIONAL:
        if draw(st.booleans()):
            bad = draw(st.integers(0, 20)) == 0
            h[name] = (
                draw(st.sampled_from(["", "{}", "q"])) if bad else str(draw(st.integers(0, 9)))
            )
    for tid in draw(st.lists(st.text(min_size=1, max_size=4), max_size=3)):
        h["r:" + tid] = draw(st.text(max_size=5))
    flat: list[Any] = []
    for k, v in h.items():
        flat += [k.encode() if draw(st.booleans()) else k, v]
    recs = draw(st.lists(_record(), max_size=3))
    return [member, len(flat), *flat, len(recs), *recs]


@st.composite
def _reply(draw: st.DrawFn) -> list[Any]:
    sessions = draw(st.lists(_session(), max_size=3))
    out: list[Any] = [draw(st.integers(0, 2**45)), draw(st.integers(0, 2**45)), len(sessions)]
    for s in sessions:
        out += s
    if draw(st.integers(0, 10)) == 0:
        out.append(b"extra")
    return out


def _reference(reply: list[Any]) -> list[dict[str, Any]] | type[Exception]:
    try:
        return [session_to_json(s) for s in iter_sessions(reply)]
    except ScriptError:
        return ScriptError


@given(_reply())
@example([5, 6, 0])
@example([5, 6, 0, b"extra"])
def test_page_lines_equal_the_session_state_path(reply: list[Any]) -> None:
    expected = _reference(reply)
    if expected is ScriptError:
        with pytest.raises(ScriptError):
            page_lines(reply)
        return
    got = page_lines(reply)
    assert got == expected
    # Same bytes in the file too (key order included).
    assert [orjson.dumps(x) for x in got] == [orjson.dumps(x) for x in expected]  # type: ignore[union-attr]


def test_a_generated_reply_is_sometimes_well_formed() -> None:
    """The generator reaches the success path (not only errors): one fixed example."""
    rec = b"1|1764500000001|1764500000001|2|0|" + orjson.dumps(
        {"k": "avatar", "id": "t1", "f": {"text": "hi"}}
    )
    flat = [
        "id",
        "ses_x",
        "created",
        "1764500000000",
        "created_wall",
        "1764500000000",
        "seq",
        "1",
        "turns",
        "1",
        "bytes",
        "2",
        "tools",
        "0",
        "r:t1",
        "r",
    ]
    reply = [1764500000005, 1764500000006, 1, "a:public", len(flat), *flat, 1, rec]
    (line,) = page_lines(reply)
    assert line == session_to_json(next(iter_sessions(reply)))
    assert line["age_ms"] == 5 and line["receipts"] == [["t1", "r"]]
