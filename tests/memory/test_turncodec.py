"""The turn-record codec: its two readers agree, and a record survives a round trip."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from memtier.errors import ScriptError
from memtier.memory.models import TURN_TYPES, ms_to_datetime
from memtier.memory.turncodec import (
    KIND_FIELDS,
    KIND_ROLES,
    StoredTurn,
    decode_record,
    encode_payload,
)

field_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@st.composite
def stored_turns(draw: st.DrawFn) -> StoredTurn:
    kind = draw(st.sampled_from(sorted(KIND_FIELDS)))
    fields = {name: draw(field_text) for name in KIND_FIELDS[kind]}
    return StoredTurn(
        seq=draw(st.integers(1, 2**40)),
        clock_ms=draw(st.integers(0, 2**45)),
        wall_ms=draw(st.integers(0, 2**42)),
        nbytes=sum(len(v.encode()) for v in fields.values()),
        is_tool=kind == "tool",
        kind=kind,
        turn_id=draw(st.from_regex(r"[A-Za-z0-9._:\-]{1,32}", fullmatch=True)),
        fields=fields,
    )


@given(turn=stored_turns())
@example(
    turn=StoredTurn(1, 5, 7, 3, False, "avatar", "t-1", {"text": "a|b"})
)  # a separator inside the payload
def test_both_readers_agree_and_the_record_round_trips(turn: StoredTurn) -> None:
    raw = turn.encode()
    assert raw.endswith(encode_payload(turn.kind, turn.turn_id, turn.fields))
    parsed = StoredTurn.parse(raw)
    assert parsed == turn and parsed.encode() == raw
    assert StoredTurn.parse(raw.decode()) == turn  # str replies too
    record = decode_record(raw)
    assert (record.seq, record.clock_ms, record.kind, record.turn_id, dict(record.fields)) == (
        turn.seq,
        turn.clock_ms,
        turn.kind,
        turn.turn_id,
        dict(turn.fields),
    )
    assert record.timestamp == ms_to_datetime(turn.wall_ms)
    assert record.role.value == KIND_ROLES[turn.kind] == parsed.role


def test_kind_tables_follow_the_turn_models() -> None:
    assert set(KIND_FIELDS) == set(KIND_ROLES) == set(TURN_TYPES)


@pytest.mark.parametrize(
    "raw",
    [
        b'1|2|3|0|0|{"k":"system","id":"x","f":{"text":"hi"}}',
        b'1|2|3|0|0|{"k":"avatar","id":7,"f":{"text":"hi"}}',
        b'1|2|3|0|0|{"k":"avatar","id":"x","f":{"text":1}}',
    ],
)
def test_the_read_path_refuses_malformed_records(raw: bytes) -> None:
    with pytest.raises(ScriptError):
        decode_record(raw)


@pytest.mark.parametrize("raw", [b'1|2|3|0|2|{"k":"a","id":"x","f":{}}', b'x|2|3|0|0|{"k":"a"}'])
def test_the_strict_reader_refuses_malformed_heads(raw: bytes) -> None:
    with pytest.raises(ValueError):
        StoredTurn.parse(raw)
