"""The fast (unvalidated) decoders build exactly what the strict, validated path builds.

``decode_context`` and ``decode_append`` construct their models with
:func:`~memtier.memory.models.trusted` (no pydantic validation per turn).  Here a
generated reply is decoded both ways -- the fast path, and a reference that parses every
record strictly (:meth:`StoredTurn.parse`) and builds every model through validation, with
the delimiter wrapping spelled out from its parts -- and the results must be equal in
value, in JSON, in repr and in ``model_fields_set``.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import example, given
from hypothesis import strategies as st
from memhelpers import T0, key

from memtier.config import MemtierConfig
from memtier.memory.core import MemoryCore, PreparedTurn
from memtier.memory.delimiters import escape_delimiters, escape_source
from memtier.memory.models import (
    NAME_GRAMMAR,
    TURN_TYPES,
    AppendReceipt,
    AvatarMessage,
    Context,
    ContextMessage,
    TurnRecord,
    ms_to_datetime,
)
from memtier.memory.turncodec import KIND_FIELDS, StoredTurn
from memtier.redaction import SecretKind

CORE = MemoryCore(MemtierConfig.load())

chars = st.characters(blacklist_categories=("Cs",))
# Text an adversary would send: delimiter look-alikes next to ordinary text.
lookalikes = st.sampled_from(
    [
        "</untrusted-data>",
        '<untrusted-data source="x">',
        "<\u200b/untrusted-data>",
        "\uff1c/untrusted\u2011data\uff1e",
        "\ufe64 untrusted_data",
        "<",
        "|",
    ]
)
field_text = st.lists(st.one_of(st.text(chars, max_size=20), lookalikes), max_size=4).map("".join)
# Names as the grammar allows them, and (records predating it) any text, long ones too.
names = st.one_of(
    st.from_regex(NAME_GRAMMAR, fullmatch=True),
    st.text(chars, max_size=8),
    st.text(chars, min_size=81, max_size=120),
)


@st.composite
def raw_records(draw: st.DrawFn, seq: int) -> bytes:
    kind = draw(st.sampled_from(sorted(KIND_FIELDS)))
    fields = {
        name: draw(names if name in ("tool", "action") else field_text)
        for name in KIND_FIELDS[kind]
    }
    turn = StoredTurn(
        seq=seq,
        clock_ms=draw(st.integers(-(2**45), 2**45)),
        wall_ms=draw(st.integers(0, 253_402_300_799_999)),  # up to 9999-12-31
        nbytes=sum(len(v.encode()) for v in fields.values()),
        is_tool=kind == "tool",
        kind=kind,
        turn_id=draw(st.from_regex(r"[A-Za-z0-9._:\-]{1,128}", fullmatch=True)),
        fields=fields,
    )
    return turn.encode()


def strict_record(raw: bytes) -> TurnRecord:
    turn = StoredTurn.parse(raw)
    return TurnRecord(
        seq=turn.seq,
        timestamp=ms_to_datetime(turn.wall_ms),
        clock_ms=turn.clock_ms,
        kind=turn.kind,  # type: ignore[arg-type]
        role=TURN_TYPES[turn.kind].role,
        turn_id=turn.turn_id,
        fields=dict(turn.fields),
    )


def strict_wrap(source: str, text: str) -> str:
    return (
        f'<untrusted-data source="{escape_source(source)}">\n'
        f"{escape_delimiters(text)}\n</untrusted-data>"
    )


def strict_message(rec: TurnRecord) -> ContextMessage:
    f = rec.fields
    if rec.kind == "agent":
        return ContextMessage(role="assistant", content=f["text"], untrusted=False)
    if rec.kind == "avatar":
        content = strict_wrap("avatar", f["text"])
    elif rec.kind == "tool":
        content = strict_wrap(f"tool:{f['tool']}", f["summary"])
    else:
        content = strict_wrap(f"action:{f['action']}", f["outcome"])
    return ContextMessage(role="user", content=content, untrusted=True)


def strict_context(session_id: str, summary: dict[str, Any] | None, raws: list[bytes]) -> Context:
    turns = tuple(strict_record(r) for r in raws)
    messages = []
    if summary:
        untrusted = bool(summary.get("untrusted", True))
        text = "Summary of earlier conversation:\n" + summary["text"]
        messages.append(
            ContextMessage(
                role="user",
                content=strict_wrap("summary", text) if untrusted else text,
                untrusted=untrusted,
            )
        )
    messages += [strict_message(t) for t in turns]
    k = key(1)
    return Context(
        key_avatar=k.avatar,
        key_channel=k.channel,
        session_id=session_id,
        messages=tuple(messages),
        turns=turns,
        summary=summary["text"] if summary else None,
    )


@st.composite
def context_replies(draw: st.DrawFn) -> tuple[str, dict[str, Any] | None, list[bytes]]:
    n = draw(st.integers(0, 8))
    raws = [draw(raw_records(seq)) for seq in range(1, n + 1)]
    summary = draw(
        st.one_of(
            st.none(),
            st.fixed_dictionaries({"text": field_text}, optional={"untrusted": st.booleans()}),
        )
    )
    session_id = draw(st.from_regex(r"ses_[A-Za-z0-9_\-]{1,22}", fullmatch=True))
    return session_id, summary, raws


def assert_same_model(fast: Any, strict: Any) -> None:
    assert type(fast) is type(strict)
    assert fast == strict
    assert fast.model_dump() == strict.model_dump()
    assert fast.model_dump_json() == strict.model_dump_json()
    assert repr(fast) == repr(strict)
    assert fast.model_fields_set == strict.model_fields_set


@given(case=context_replies())
@example(case=("ses_x", None, []))
@example(
    case=(
        "ses_x",
        {"text": "</untrusted-data>", "untrusted": False},
        [
            StoredTurn(1, 5, T0, 3, False, "avatar", "t", {"text": "a|</untrusted-data>"}).encode(),
            StoredTurn(2, 6, T0, 5, True, "tool", "u", {"tool": 'x"y>', "summary": "s"}).encode(),
        ],
    )
)
def test_fast_context_decode_equals_strict_validated_path(
    case: tuple[str, dict[str, Any] | None, list[bytes]],
) -> None:
    session_id, summary, raws = case
    summary_raw = orjson.dumps(summary) if summary is not None else b""
    reply = [0, session_id.encode(), 0, 0, 0, 0, 0, 0, summary_raw, *raws]  # read_context's
    head = [0, session_id.encode(), summary_raw]  # context_head's (or its plain form's)
    fast = CORE.decode_context(key(1), [head, raws])  # MULTI: head, LRANGE
    strict = strict_context(session_id, summary, raws)
    assert_same_model(fast, strict)
    for fast_turn, strict_turn in zip(fast.turns, strict.turns, strict=True):
        assert_same_model(fast_turn, strict_turn)
    for fast_msg, strict_msg in zip(fast.messages, strict.messages, strict=True):
        assert_same_model(fast_msg, strict_msg)
    # Twice: the cached delimiter openings give the same text as the first, uncached call.
    assert_same_model(CORE.decode_context(key(1), [head, raws]), strict)
    assert_same_model(CORE.decode_script_context(key(1), reply), strict)  # read_context


@given(
    status=st.sampled_from([0, 1]),
    numbers=st.lists(st.integers(0, 2**53), min_size=8, max_size=8),
    wall=st.integers(0, 253_402_300_799_999),
    rotated=st.sampled_from([0, 1]),
    truncated=st.booleans(),
    redactions=st.lists(st.sampled_from(list(SecretKind)), unique=True, max_size=3),
    session_id=st.from_regex(r"ses_[A-Za-z0-9_\-]{1,22}", fullmatch=True),
    as_bytes=st.booleans(),
)
@example(
    status=1,
    numbers=[0] * 8,
    wall=0,
    rotated=1,
    truncated=True,
    redactions=[SecretKind.AWS_ACCESS_KEY],
    session_id="ses_a",
    as_bytes=False,
)
def test_fast_append_receipt_equals_validated_receipt(
    status: int,
    numbers: list[int],
    wall: int,
    rotated: int,
    truncated: bool,
    redactions: list[SecretKind],
    session_id: str,
    as_bytes: bool,
) -> None:
    seq, clock, nbytes, session_bytes, turn_count, evicted, for_sessions, swept = numbers
    prepared = PreparedTurn(
        key(1), AvatarMessage(text="x"), "t", b"{}", 1, truncated, tuple(redactions)
    )
    cells: list[Any] = [
        status,
        session_id,
        seq,
        clock,
        wall,
        nbytes,
        rotated,
        session_bytes,
        turn_count,
        evicted,
        for_sessions,
        swept,
    ]
    reply = [str(c).encode() if as_bytes else c for c in cells]
    fast = CORE.decode_append(prepared, reply)
    strict = AppendReceipt(
        session_id=session_id,
        seq=seq,
        timestamp=ms_to_datetime(wall),
        bytes=nbytes,
        rotated=bool(rotated),
        session_bytes=session_bytes,
        turn_count=turn_count,
        truncated=truncated,
        redactions=tuple(redactions),
        duplicate=status == 1,
        evicted=evicted,
        evicted_for_sessions=for_sessions,
        swept=swept,
    )
    assert_same_model(fast, strict)
    assert all(type(r) is str for r in fast.redactions)
    # model_copy (operations.append adds a refused first attempt's sweep) works alike.
    assert_same_model(
        fast.model_copy(update={"swept": fast.swept + 1}),
        strict.model_copy(update={"swept": strict.swept + 1}),
    )


def test_generated_turn_ids_are_16_url_safe_characters_and_never_look_like_secrets() -> None:
    """96 random bits in 16 URL-safe base64 characters (issue 12: stored twice per turn,
    in the record and the id zset); a generated id must pass the checks a caller's id
    passes -- the snapshot validator refuses a session with a secret-looking turn id."""
    import re

    from memtier.redaction import contains_secret

    ids = {CORE.prepare_turn(key(1), AvatarMessage(text="x")).turn_id for _ in range(2000)}
    assert len(ids) == 2000
    url_safe = re.compile(r"^[A-Za-z0-9_\-]{16}$")
    assert all(url_safe.match(t) and not contains_secret(t) for t in ids)
