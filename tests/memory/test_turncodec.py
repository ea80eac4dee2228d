"""The turn-record codec: its two readers agree, and a record survives a round trip."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from memtier.errors import ScriptError
from memtier.memory.models import TURN_TYPES, ms_to_datetime
from memtier.memory.turncodec import (
    KIND_CODES,
    KIND_FIELDS,
    KIND_ROLES,
    StoredTurn,
    decode_record,
    encode_payload,
    encode_payload_first_format,
    record_flags,
)
from memtier.redaction import REDACTOR_VERSION

field_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@st.composite
def stored_turns(draw: st.DrawFn) -> StoredTurn:
    kind = draw(st.sampled_from(sorted(KIND_FIELDS)))
    fields = {name: draw(field_text) for name in KIND_FIELDS[kind]}
    # both formats: the first (no version) and the current one (version, rotation flag)
    version = draw(st.one_of(st.none(), st.just(REDACTOR_VERSION), st.integers(1, 10**6)))
    clock = draw(st.integers(0, 2**45))
    return StoredTurn(
        seq=draw(st.integers(1, 2**40)),
        clock_ms=clock,
        wall_ms=draw(st.one_of(st.just(clock), st.integers(0, 2**42))),
        nbytes=sum(len(v.encode()) for v in fields.values()),
        is_tool=kind == "tool",
        kind=kind,
        turn_id=draw(st.from_regex(r"[A-Za-z0-9._:\-]{1,32}", fullmatch=True)),
        fields=fields,
        rotated=version is not None and draw(st.booleans()),
        redactor_version=version,
    )


@given(turn=stored_turns())
@example(
    turn=StoredTurn(1, 5, 7, 3, False, "avatar", "t-1", {"text": "a|b"})
)  # a separator inside the payload
@example(turn=StoredTurn(1, 5, 5, 3, True, "tool", "t-1", {"tool": "a", "summary": "b"}, True, 1))
@example(turn=StoredTurn(1, 5, 5, 3, False, "agent", "t-1", {"text": "a"}))  # first format
def test_both_readers_agree_and_the_record_round_trips(turn: StoredTurn) -> None:
    raw = turn.encode()
    assert raw.endswith(turn.payload())
    if turn.redactor_version is None:  # the first format, as earlier versions wrote it
        assert raw.endswith(encode_payload_first_format(turn.kind, turn.turn_id, turn.fields))
        assert raw.split(b"|")[2] == str(turn.wall_ms).encode()
    else:
        assert raw.endswith(encode_payload(turn.kind, turn.turn_id, turn.fields))
        assert (raw.split(b"|")[2] == b"") == (turn.wall_ms == turn.clock_ms)
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
    assert set(KIND_FIELDS) == set(KIND_ROLES) == set(TURN_TYPES) == set(KIND_CODES)
    # stored in Redis: a code never changes meaning
    assert dict(KIND_CODES) == {"avatar": 0, "agent": 1, "tool": 2, "action": 3}


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


@pytest.mark.parametrize(
    "raw",
    [
        b'1|2|3|0|2|{"k":"a","id":"x","f":{}}',
        b'x|2|3|0|0|{"k":"a"}',
        b'1|2|3|2|0v|[0,"x","hi"]',  # no version digits
        b'1|2|3|2|0v01|[0,"x","hi"]',  # two spellings of one version
        b'1|2|3|2|0xv1|[0,"x","hi"]',
        b'1|2|3|2|2v1|[0,"x","hi"]',
        b'1|2|3|2|0v\xd9\xa1|[0,"x","hi"]',  # a non-ASCII digit
        b'1|2|2|2|0v1|[0,"x","hi"]',  # a wall equal to the clock must be left out
        b'1|2||2|0v1|{"k":"avatar","id":"x","f":{"text":"hi"}}',  # new head, old payload
        b'1|2|3|2|0|[0,"x","hi"]',  # old head, new payload
        b'1|2||2|0v1|[0,"x"]',  # a value missing
        b'1|2||2|0v1|[0,"x","hi","more"]',
        b'1|2||2|0v1|[7,"x","hi"]',
        b'1|2||2|0v1|["avatar","x","hi"]',  # a kind name, not its code
        b'1|2||2|0v1|[true,"x","hi"]',
    ],
)
def test_the_strict_reader_refuses_malformed_heads(raw: bytes) -> None:
    with pytest.raises(ValueError):
        StoredTurn.parse(raw)


@pytest.mark.parametrize(
    "raw",
    [b'1|2||2|0v1|[0,"x"]', b'1|2||2|0v1|[7,"x","hi"]', b"1|2||2|0v1|[]"],
)
def test_the_read_path_refuses_malformed_array_payloads(raw: bytes) -> None:
    with pytest.raises(ScriptError):
        decode_record(raw)


def test_a_record_of_the_first_format_reads_as_before() -> None:
    """What earlier versions stored (rolling upgrade): read, with no redactor version."""
    raw = b'7|1800000000005|1800000000001|2|1|{"k":"tool","id":"t","f":{"tool":"s","summary":"x"}}'
    turn = StoredTurn.parse(raw)
    assert (turn.seq, turn.clock_ms, turn.wall_ms, turn.nbytes, turn.is_tool) == (
        7,
        1800000000005,
        1800000000001,
        2,
        True,
    )
    assert turn.redactor_version is None and not turn.rotated
    assert turn.fields == {"tool": "s", "summary": "x"} and turn.encode() == raw
    record = decode_record(raw)
    assert record.turn_id == "t" and record.timestamp == ms_to_datetime(1800000000001)


def test_new_records_name_the_current_redactor() -> None:
    assert record_flags(False) == f"0v{REDACTOR_VERSION}"
    assert record_flags(True) == f"1v{REDACTOR_VERSION}"
    raw = b"3|1800000000005||2|%s|" % record_flags(False).encode() + encode_payload(
        "avatar", "t", {"text": "hi"}
    )
    turn = StoredTurn.parse(raw)
    assert turn.redactor_version == REDACTOR_VERSION and turn.wall_ms == turn.clock_ms
    assert decode_record(raw).timestamp == ms_to_datetime(1800000000005)
    with pytest.raises(ValueError):
        encode_payload("avatar", "t", {"text": "hi", "extra": "x"})  # names are not stored
