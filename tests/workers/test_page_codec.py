"""The flush's fast page decoder equals the strict ``StoredTurn.parse`` path.

``memtier.memory.snapshot.pagecodec.decode_page`` decodes the store's own record
spellings without a ``StoredTurn`` per record and hands everything else to
``StoredTurn.parse``.  Against the reference (``session_to_json`` over ``iter_sessions``,
every record through ``StoredTurn.parse``):

* generated replies -- records of format 2 (current redactor and others), format 1,
  and malformed ones (bad digits, Unicode digits, signs, a written wall time equal to
  the clock, payloads of the wrong shape, invalid UTF-8, ``str`` elements) -- give the
  same lines, byte for byte, or both raise;
* replies of the real ``snapshot_page`` over records the real ``append_turn`` wrote
  (every kind, a rotation, a wall time apart from the clock) and over the first-format
  records a restore writes give the same lines;
* the per-record redactor verdict is exactly ``redactor_version == REDACTOR_VERSION``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from workhelpers import Clock, key, persistent_store, sync_store, turn_for

from memtier import AvatarMessage
from memtier.errors import ScriptError
from memtier.memory import persistence
from memtier.memory.snapshot.fileformat import session_to_json
from memtier.memory.snapshot.pagecodec import decode_page
from memtier.memory.state import iter_sessions
from memtier.memory.turncodec import KIND_CODES, KIND_FIELDS, StoredTurn
from memtier.redaction import REDACTOR_VERSION

_CURRENT = f"v{REDACTOR_VERSION}"
_BAD_NUMBERS = ["x", "", " 1", "1 ", "-3", "+4", "1_0", "\u0661", "\u00b2", "0x1", "07", "-"]
_BAD_PAYLOADS = [
    b"[]",
    b"{",
    b'{"k":1}',
    b"[0]",
    b'[0,"a"]',
    b'[0,"a","b","c"]',
    b'[9,"a","b"]',
    b'[true,"a","b"]',
    b'[0.0,"a","b"]',
    b'[0,1,"b"]',
    b'[0,"a",1]',
    b'[0,"a",null]',
    b'[2,"a","t"]',
    b'[0,"a","b"] ',
    b' [0,"a","b"]',
    b'"s"',
    b"\xff\xfe",
    b'[0,"\xed\xa0\x80","x"]',
    b'[0,"a","\\ud800"]',
    b'[0,"a","\xc3"]',
    b'{"k":"avatar","id":"a","f":{"text":1}}',
    b'{"k":"avatar","id":"a","f":[]}',
    b'{"k":"avatar","id":"a","f":{"text":"x"},"extra":2}',
    b'{"k":"nope","id":"a","f":{"text":"x"}}',
    b'{"k":"avatar","id":7,"f":{"text":"x"}}',
]
_texts = st.text(max_size=8) | st.sampled_from(["|", "a|b", "\x00", "\u0661", "é", "\n"])


@st.composite
def _record(draw: st.DrawFn, clean: bool = False) -> Any:
    """A record element; ``clean``: one the store could have written (no corruption)."""
    if clean:
        fmt = draw(st.sampled_from(["current"] * 3 + ["first"]))
        kind = draw(st.sampled_from(list(KIND_FIELDS)))
    else:
        fmt = draw(st.sampled_from(["current"] * 6 + ["first"] * 2 + ["other"]))
        kind = draw(st.sampled_from([*KIND_FIELDS, *KIND_FIELDS, "nope"]))
    names = KIND_FIELDS.get(kind, ("text",))
    values = [draw(_texts) for _ in names]
    turn_id = draw(_texts)
    tool = draw(st.sampled_from(["0", "1"]))
    if fmt == "first":
        payload = orjson.dumps(
            {"k": kind, "id": turn_id, "f": dict(zip(names, values, strict=True))}
        )
        flags = tool
    else:
        payload = orjson.dumps([KIND_CODES.get(kind, 7), turn_id, *values])
        version = (
            _CURRENT
            if fmt == "current"
            else draw(st.sampled_from(["v2", "v12", "v01", "v", "v0", "x1", "v1a", "V1"]))
        )
        flags = tool + draw(st.sampled_from(["", "r"])) + version
        if not clean and draw(st.integers(0, 20)) == 0:
            flags = draw(st.sampled_from(["", "2v1", "0rrv1", "01", "1r", " 0v1"]))
    nums = [str(draw(st.integers(0, 2**45))) for _ in range(4)]
    if fmt != "first" and draw(st.integers(0, 3)) > 0:
        nums[2] = ""  # format 2 leaves a wall time equal to the clock out
    if clean:
        if fmt == "first" and draw(st.booleans()):
            nums[2] = nums[1]  # the first format writes an equal wall time
        return ("|".join([*nums, flags]) + "|").encode("utf-8") + payload
    if draw(st.integers(0, 8)) == 0:
        nums[2] = nums[1]  # written although equal: format 2 refuses it, format 1 not
    if draw(st.integers(0, 12)) == 0:
        nums[draw(st.integers(0, 3))] = draw(st.sampled_from(_BAD_NUMBERS))
    if draw(st.integers(0, 12)) == 0:
        payload = draw(st.sampled_from(_BAD_PAYLOADS))
    raw = ("|".join([*nums, flags]) + "|").encode("utf-8") + payload
    if draw(st.integers(0, 20)) == 0:
        raw = raw.replace(b"|", b"", 1)  # one part short
    shape = draw(st.integers(0, 12))
    if shape == 0:
        try:
            return raw.decode("utf-8")  # a str element: always the strict path
        except UnicodeDecodeError:
            return raw
    if shape == 1:
        return draw(st.integers(0, 9))
    return raw


@st.composite
def _session(draw: st.DrawFn) -> list[Any]:
    member = draw(st.sampled_from([b"00000000-0000-0000-0000-000000000001:public", "a:im"]))
    clean = draw(st.booleans())  # every field well-formed: the accepted path, many records
    h: dict[str, str] = {}
    for name in ("id", "created", "created_wall", "seq", "turns", "bytes", "tools"):
        if clean or draw(st.integers(0, 60)) > 0:
            h[name] = "ses_x" if name == "id" else str(draw(st.integers(0, 2**45)))
    for name in ("last", "last_wall", "summary_bytes", "sv", "summary", "xp"):
        if draw(st.booleans()):
            bad = not clean and draw(st.integers(0, 20)) == 0
            h[name] = (
                draw(st.sampled_from(["", "q", " 5", "\u0661"]))
                if bad
                else str(draw(st.integers(0, 9)))
            )
    for tid in draw(st.lists(_texts, max_size=2)):
        h["r:" + tid] = draw(st.sampled_from(["ses_y|1|2|3|4|0", "junk", "ses_y|x|2|3|4|1"]))
    flat: list[Any] = []
    for k, v in h.items():
        flat += [k.encode() if draw(st.booleans()) else k, v.encode()]
    recs = draw(st.lists(_record(clean), max_size=8 if clean else 4))
    return [member, len(flat), *flat, len(recs), *recs]


@st.composite
def _reply(draw: st.DrawFn) -> list[Any]:
    sessions = draw(st.lists(_session(), max_size=3))
    out: list[Any] = [draw(st.integers(0, 2**45)), draw(st.integers(0, 2**45)), len(sessions)]
    for s in sessions:
        out += s
    if draw(st.integers(0, 15)) == 0:
        out.append(b"extra")
    return out


def _reference(reply: list[Any]) -> tuple[list[dict[str, Any]], list[tuple[bool, ...]]] | None:
    """Lines and redactor verdicts by the strict path; None: it refuses the reply."""
    try:
        lines = [session_to_json(s) for s in iter_sessions(reply)]
    except ScriptError:
        return None
    verdicts = []
    pos = 3
    for _ in range(int(reply[2])):
        pos += 2 + int(reply[pos + 1])
        nrec = int(reply[pos])
        recs = reply[pos + 1 : pos + 1 + nrec]
        pos += 1 + nrec
        verdicts.append(
            tuple(StoredTurn.parse(r).redactor_version == REDACTOR_VERSION for r in recs)
        )
    return lines, verdicts


def _assert_same(reply: list[Any]) -> None:
    expected = _reference(reply)
    if expected is None:
        with pytest.raises(ScriptError):
            decode_page(reply)
        return
    got = decode_page(reply)
    assert [s.line for s in got] == expected[0]
    # the same bytes in the file (key order included)
    assert [orjson.dumps(s.line) for s in got] == [orjson.dumps(x) for x in expected[0]]
    assert [s.redacted for s in got] == expected[1]


_SID = b"ses_" + b"A" * 22
_HASH = [b"id", _SID, b"created", b"1800000000000", b"created_wall", b"1800000000000"]
_HASH += [b"seq", b"1", b"turns", b"1", b"bytes", b"2", b"tools", b"0"]


def _one(record: bytes) -> list[Any]:
    """A reply of one session with one record."""
    return [5, 6, 1, b"m:im", len(_HASH), *_HASH, 1, record]


@given(_reply())
@example([5, 6, 0])
@example([5, 6, 0, b"extra"])
# a format-2 record written with its wall time equal to the clock: refused by both
@example(_one(b'1|1800000000001|1800000000001|2|0v1|[0,"t","hi"]'))
# Unicode digits are str.isdigit() but not bytes.isdigit(): the strict path decides
@example(_one('1|18|\u0661|2|0|{"k":"agent","id":"t","f":{"text":"hi"}}'.encode()))
# another redactor version: accepted, but not "redacted by the current one"
@example(_one(b'1|1800000000001||2|1rv2|[2,"t","x","y"]'))
def test_decode_page_equals_the_strict_path(reply: list[Any]) -> None:
    _assert_same(reply)


@given(st.integers(0, 3))
def test_the_generator_reaches_accepted_replies_of_both_formats(n: int) -> None:
    """Not only errors: fixed records of each format decode, with their verdict."""
    recs = [
        b'1|1800000000001||2|0v%d|[0,"t1","hi"]' % REDACTOR_VERSION,
        b'2|1800000000002|1800000000001|2|0rv%d|[1,"t2","ok"]' % REDACTOR_VERSION,
        b'3|1800000000003|1800000000003|2|0|{"k":"avatar","id":"t3","f":{"text":"hi"}}',
        b'4|1800000000004||5|1v%d|[2,"t4","ab","xyz"]' % REDACTOR_VERSION,
    ][: n + 1]
    reply = [1800000000009, 1800000000009, 1, b"m:im", len(_HASH), *_HASH, len(recs), *recs]
    (session,) = decode_page(reply)
    assert session.redacted == (True, True, False, True)[: n + 1]
    _assert_same(reply)


def test_receipts_beyond_the_window_keep_the_newest() -> None:
    """More receipts than the idempotency window: the same newest ones as the reference."""
    from memtier import limits

    window = int(limits.IDEMPOTENCY_WINDOW)
    flat = list(_HASH)
    for i in range(window):
        flat += [f"r:old{i}".encode(), f"ses_y|{i + 1}|2|3|4|0".encode()]
    recs = [b'%d|1800000000001||2|0v1|[0,"n%d","hi"]' % (window + i, i) for i in range(1, 4)]
    reply = [1800000000009, 1800000000009, 1, b"m:im", len(flat), *flat, len(recs), *recs]
    (session,) = decode_page(reply)
    assert len(session.line["receipts"]) == window
    assert {"n1", "n2", "n3"} <= {tid for tid, _ in session.line["receipts"]}
    _assert_same(reply)


# --------------------------------------------------------------------------- real scripts


def _all_pages(store: Any) -> list[list[Any]]:
    replies = []
    for part in store.core.keyspace.all_partitions():
        members = [m.decode() for m in store.client.hkeys(part.index)]
        for member in members:
            call = persistence.snapshot_page_call(store.core, part, [member])
            replies.append(list(store.executor.execute(call)))
    return replies


def test_real_append_turn_records_decode_as_the_strict_path(backend: Any) -> None:
    """Every kind, an expiry rotation (``r`` flag), a wall time apart from the clock."""
    clock = Clock()
    store = sync_store(backend, clock, conversation={"max_turns_per_session": 50})
    plain = sync_store(backend)  # the server's clock: wall time = clock, left out
    try:
        for i in range(3):  # first: the partition's clock has not been moved ahead yet
            plain.append(key(9), turn_for(i))
        turns_key = plain.core.partition_for(key(9)).session(key(9).member).turns
        raw = plain.client.lrange(turns_key, 0, -1)
        assert any(r.split(b"|")[2] == b"" for r in raw)  # wall omitted: that spelling too
        store.append(key(0), AvatarMessage(text="before the expiry"))
        clock.advance(10**9)  # past every TTL: the next append rotates the session
        store.append(key(0), AvatarMessage(text="after the rotation"))
        for n in range(1, 5):
            for i in range(9):
                store.append(key(n, "im" if n % 2 else "public"), turn_for(i + n))
                clock.advance(7)
        replies = _all_pages(store)
    finally:
        store.close()
        plain.close()
    flags = set()
    for reply in replies:
        _assert_same(reply)
        for session in decode_page(reply):
            assert all(session.redacted) and session.redacted
        flags |= {r.split(b"|")[4] for r in reply if isinstance(r, bytes) and r.count(b"|") >= 5}
    assert {b"0v%d" % REDACTOR_VERSION, b"1v%d" % REDACTOR_VERSION} <= flags
    assert b"0rv%d" % REDACTOR_VERSION in flags  # the rotated session's first turn


def test_restored_first_format_records_decode_as_the_strict_path(
    backend: Any, tmp_path: Path
) -> None:
    """A restore writes the first format (no redactor version): never 'redacted'."""
    store = persistent_store(backend, tmp_path, Clock())
    try:
        for i in range(6):
            store.append(key(1), turn_for(i))
        store.flush()
        if backend.is_fake:
            store.client.flushall()
        else:
            backend.delete_namespace()
        report = store.recover()
        assert report.outcome == "restored", report
        store.append(key(1), AvatarMessage(text="a new turn after the restore"))
        replies = _all_pages(store)
    finally:
        store.close()
    (reply,) = replies
    _assert_same(reply)
    (session,) = decode_page(reply)
    assert session.redacted == (False,) * 6 + (True,)


# --------------------------------------------------------------------------- member check


def _uuid_spellings() -> st.SearchStrategy[str]:
    import uuid

    def spell(u: uuid.UUID, how: int) -> str:
        return [
            str(u),
            str(u).upper(),
            u.hex,
            "{" + str(u) + "}",
            "urn:uuid:" + str(u),
            str(u).replace("-", "_", 1),
            str(u)[:-1] + "\uff10",  # a full-width digit: int() takes it, str() does not
            str(u) + "\n",
            " " + str(u),
        ][how]

    return st.builds(spell, st.uuids(), st.integers(0, 8)) | st.text(max_size=40)


@given(_uuid_spellings())
@example("00000000-0000-0000-0000-00000000000\uff10")
def test_the_canonical_uuid_check_is_str_of_uuid(avatar: str) -> None:
    """check_session_line's member check (a regex) refuses exactly what
    ``str(UUID(avatar)) != avatar`` refused."""
    from uuid import UUID

    from memtier.memory.snapshot import validation

    try:
        expected = str(UUID(avatar)) == avatar
    except ValueError:
        expected = False
    assert (validation._CANONICAL_UUID_RE.fullmatch(avatar) is not None) == expected
