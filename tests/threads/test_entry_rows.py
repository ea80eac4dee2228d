"""Stored entry rows -> ConversationEntry without validation (memtier.threads.records).

``entry_from_row`` builds the model unvalidated (:func:`memtier.trustedmodels.trusted`)
when every value has the type ``entry_row`` writes, and validates anything else.  The
promise: for any row -- the rows memtier writes, and rows with wrong types, missing keys
or bad values as a hand-edited or corrupted store could hold -- the result equals the
validated model field for field, with the same fields set and the same wire form, or
both ways fail alike.  No Redis.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from memtier.threads.models import ConversationEntry, EntryRole
from memtier.threads.records import entry_from_json, entry_from_row, entry_row
from memtier.wire import ms_to_datetime


def validated(data: dict[str, Any]) -> ConversationEntry:
    """What entry_from_json built before: every field through pydantic."""
    return ConversationEntry(
        id=data["id"],
        parent_id=data.get("parentId") or None,
        role=EntryRole(data["role"]),
        content=data["content"],
        created_at=ms_to_datetime(int(data["createdAt"])),
        request_id=data.get("requestId"),
        truncated=True if data.get("truncated") else None,
    )


def outcome(build: Any, data: dict[str, Any]) -> tuple[Any, ...]:
    try:
        entry = build(data)
    except Exception as exc:  # the same failure both ways (pydantic's, a KeyError...)
        return ("error", type(exc))
    return ("entry", entry, entry.model_fields_set, entry.to_wire(), entry.model_dump())


TEXT = st.text(max_size=12)
WRITTEN = st.builds(
    entry_row,
    TEXT,
    TEXT,
    st.sampled_from([r.value for r in EntryRole]),
    TEXT,
    st.integers(0, 2**41),
    TEXT,
    st.booleans(),
)
ODD = st.none() | st.integers(-3, 3) | st.booleans() | TEXT | st.lists(st.integers(), max_size=2)
KEYS = ("id", "parentId", "role", "content", "createdAt", "requestId", "truncated")


@st.composite
def rows(draw: st.DrawFn) -> dict[str, Any]:
    """A row memtier writes, then perhaps damaged: values replaced, keys dropped."""
    row: dict[str, Any] = dict(draw(WRITTEN))
    for key in draw(st.lists(st.sampled_from(KEYS), max_size=3, unique=True)):
        if draw(st.booleans()):
            row.pop(key, None)
        else:
            row[key] = draw(ODD)
    return row


@settings(max_examples=600, deadline=None)
@given(rows())
@example({"id": "e1", "parentId": "", "role": "user", "content": "hi", "createdAt": 5})
@example(
    {"id": "e1", "parentId": "e0", "role": "assistant", "content": "x", "createdAt": 1,
     "requestId": "r", "truncated": True}
)  # fmt: skip
@example({"id": 7, "role": "user", "content": "hi", "createdAt": 5})  # refused as before
@example({"id": "e1", "role": "user", "content": "hi", "createdAt": 5, "requestId": 3})
@example({"id": "e1", "parentId": 0, "role": "user", "content": "hi", "createdAt": 5})
@example({"id": "e1", "role": "robot", "createdAt": 5})  # the role's error comes first
def test_a_row_builds_the_validated_entry_or_fails_alike(row: dict[str, Any]) -> None:
    expected = outcome(validated, row)
    assert outcome(entry_from_row, row) == expected
    # and as stored: the row's JSON (every value here is JSON)
    assert outcome(lambda r: entry_from_json(orjson.dumps(r)), row) == expected


def test_the_rows_memtier_writes_take_the_unvalidated_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check is not vacuous: a written row never reaches pydantic's validator."""
    calls: list[Any] = []

    class Counting(ConversationEntry):
        def __init__(self, **data: Any) -> None:
            calls.append(data)
            super().__init__(**data)

    monkeypatch.setattr("memtier.threads.records.ConversationEntry", Counting)
    row = entry_row("e2", "e1", "assistant", "hello", 1_700_000_000_000, "req_1", False)
    entry = entry_from_row(row)
    assert calls == [] and type(entry) is Counting
    assert entry.model_dump() == validated(row).model_dump()
    with pytest.raises(ValueError):  # a wrong type: validated, and refused (pydantic's)
        entry_from_row({**row, "requestId": 12})
    assert len(calls) == 1
