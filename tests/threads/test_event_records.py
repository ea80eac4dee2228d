"""Ledger rows -> EventRecord without validation (memtier.threads.ledger).

``decode_row`` and the replay/export page reader build each served row's record with
:func:`memtier.trustedmodels.trusted`.  The promise: for any row -- what the scripts
write, and rows with odd data, stream ids, runs and redaction flags as a hand-edited or
older store could hold -- the record equals the one pydantic validates from the same
values, field for field, with the same fields set, wire form and dump, or both ways
fail alike (or neither is served).  No Redis.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import example, given
from hypothesis import strategies as st

from memtier.threads.ledger import decode_row, served_payload
from memtier.threads.models import EventRecord
from memtier.wire import ms_to_datetime


def validated(
    row_id: str, etype: str, data: str, run: str, redacted: str, thread_id: str
) -> EventRecord | None:
    """What decode_row built before: the record through pydantic."""
    if redacted != "1":
        return None
    payload = served_payload(data)
    if payload is None:
        return None
    return EventRecord(
        id=row_id,
        thread_id=thread_id,
        type=etype,
        timestamp=ms_to_datetime(int(row_id.split("-", 1)[0])),
        request_id=run or None,
        data=payload,
    )


def outcome(build: Any, *row: str) -> tuple[Any, ...]:
    try:
        record = build(*row)
    except Exception as exc:  # the same failure both ways
        return ("error", type(exc))
    if record is None:
        return ("not served",)
    return (
        "record",
        record,
        record.model_fields_set,
        record.to_wire(),
        record.model_dump(),
        orjson.dumps(record.to_wire()),
    )


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)
DATA = st.one_of(
    st.dictionaries(st.text(max_size=8), _JSON, max_size=4).map(lambda d: orjson.dumps(d).decode()),
    st.sampled_from(["", "x", "[]", "null", "1", '{"a":', '{"path":"/home/alice/k.pem"}']),
    st.just('{"text":"token sk-ant-api03-' + "A" * 40 + '"}'),  # redacted when served
)
ROW_ID = st.one_of(
    st.tuples(st.integers(0, 2**45), st.integers(0, 99)).map(lambda t: f"{t[0]}-{t[1]}"),
    st.sampled_from(["", "x-1", "-1-0", "1.5-0", "17"]),
)


@given(
    row_id=ROW_ID,
    etype=st.sampled_from(["agent_started", "user_message", "agent_message", ""]),
    data=DATA,
    run=st.sampled_from(["", "req_1", "r" * 40]),
    redacted=st.sampled_from(["1", "1", "0", ""]),
    thread_id=st.sampled_from(["conv_1", "t"]),
)
@example(
    row_id="1790000000123-0", etype="agent_message", data='{"text":"hi"}', run="",
    redacted="1", thread_id="conv_1",
)  # fmt: skip
@example(
    row_id="1790000000000-7", etype="user_message", data='{"a":[1,{"b":null}]}', run="req_1",
    redacted="1", thread_id="conv_1",
)  # fmt: skip
def test_a_row_decodes_to_the_record_pydantic_validates(
    row_id: str, etype: str, data: str, run: str, redacted: str, thread_id: str
) -> None:
    row = (row_id, etype, data, run, redacted, thread_id)
    assert outcome(decode_row, *row) == outcome(validated, *row)


def test_a_record_s_data_is_its_own() -> None:
    """Two records of one row share no data: a caller that changes one (the model is
    frozen, its dict is not) cannot change what the next read returns."""
    row = ("1790000000123-0", "agent_message", '{"text":"hi","n":[1]}', "", "1", "conv_1")
    first, second = decode_row(*row), decode_row(*row)
    assert first is not None and second is not None
    assert first == second and first.data is not second.data
