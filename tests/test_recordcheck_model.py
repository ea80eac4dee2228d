"""``check_record`` refuses exactly what the turn models refuse, without building one.

The shared record validator (memtier/memory/recordcheck.py) used to build the kind's
pydantic turn model for every record of every flush and recovery; it now applies the
model's own checks directly (the turn-id pattern in full, ``check_name`` for a tool or
action name).  For content that passes the validator's other checks, the verdict must
be the model's, for every kind: generated turn ids and names, near misses of both
grammars (a trailing newline, Unicode digits and letters, 128/129 characters, a leading
separator) and names that look like secrets.
"""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from memtier import limits
from memtier.errors import ValidationError
from memtier.memory.models import TURN_TYPES
from memtier.memory.recordcheck import RecordInvalid, check_record
from memtier.memory.turncodec import KIND_FIELDS

GITHUB_TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"

_ids = st.one_of(
    st.from_regex(r"[A-Za-z0-9._:\-]{1,130}", fullmatch=True),
    st.text(max_size=12),
    st.sampled_from(["a\n", "\na", "a" * 128, "a" * 129, "", "\u0661", "é", "a b", "a/b"]),
)
_names = st.one_of(
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}", fullmatch=True),
    st.text(min_size=1, max_size=10).filter(lambda s: "\x00" not in s),
    st.sampled_from(["_a", ".a", "a b", 'a"', "a<", "é", "\u0661", "a\n", GITHUB_TOKEN]),
)
_bodies = st.text(max_size=20).filter(lambda s: s.isprintable())


def _model_accepts(kind: str, fields: dict[str, str], turn_id: str) -> bool:
    try:
        TURN_TYPES[kind](turn_id=turn_id, **fields)
    except ValidationError:
        return False
    return True


def _check_accepts(kind: str, fields: dict[str, str], turn_id: str) -> bool:
    try:
        check_record(kind, fields, turn_id)
    except RecordInvalid as exc:
        assert exc.reason == "invalid_record"
        return False
    return True


@given(st.sampled_from(sorted(KIND_FIELDS)), _ids, _names, _bodies)
@example("avatar", "abc\n", "x", "hi")  # the model's pattern is anchored at the very end
@example("tool", "t1", GITHUB_TOKEN, "result")  # a name that looks like a secret
@example("action", "t1", "a\n", "done")
@example("agent", "a" * 129, "x", "hi")
def test_check_record_refuses_what_the_turn_model_refuses(
    kind: str, turn_id: str, name: str, body: str
) -> None:
    names = KIND_FIELDS[kind]
    fields = {names[0]: name, names[1]: body} if len(names) == 2 else {names[0]: body}
    if len(names) == 2 and not 1 <= len(name.encode("utf-8", "surrogatepass")) <= 64:
        return  # refused earlier by the name-size check, not by the model
    if any(not v.isprintable() for v in fields.values()):
        return  # control characters: refused earlier (and the same either way)
    try:
        "".join(fields.values()).encode("utf-8")
    except UnicodeEncodeError:
        return
    assert _check_accepts(kind, fields, turn_id) == _model_accepts(kind, fields, turn_id)


def test_the_generators_reach_both_verdicts() -> None:
    assert _check_accepts("tool", {"tool": "search", "summary": "ok"}, "t1")
    assert not _check_accepts("tool", {"tool": GITHUB_TOKEN, "summary": "ok"}, "t1")
    assert not _check_accepts("avatar", {"text": "hi"}, "t1\n")
    assert int(limits.MAX_NAME_BYTES) == 64
