"""The flush's one-pass page check equals decode-then-check, session by session.

``memtier.memory.snapshot.pagecheck.check_page`` decodes and checks the common session
(every record format 2 by the current redactor, no summary, no stored receipt) in one
pass and hands every other session, and every session one of its checks fails, to the
strict path (``pagecodec.decode_session`` + ``check_session_line``).  Against that
reference:

* sessions generated from a small model of what the store writes -- consistent
  counters, times, byte counts and receipts, every kind, Unicode and multi-line texts --
  and the same sessions with one mutation each (a counter off by one, a field missing
  or misspelt, a time out of range, a control character, a lone surrogate, a bad id or
  name, a flag of another redactor, records out of order, a summary, a stored receipt...)
  give the same lines and the same verdicts (reason and detail), or both raise;
* an unmutated generated session is accepted by the one-pass check itself (it does not
  fall back), so the property compares the fast path, not the reference with itself;
* pages of the real ``snapshot_page`` over records the real ``append_turn`` wrote take
  the one-pass check for every session.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from workhelpers import Clock, key, sync_store, turn_for

from memtier.errors import ScriptError
from memtier.memory import persistence
from memtier.memory.snapshot import pagecheck
from memtier.memory.snapshot.fileformat import MAX_TIME_MS, MIN_TIME_MS, SnapshotValidationError
from memtier.memory.snapshot.pagecodec import decode_page
from memtier.memory.snapshot.validation import check_session_line
from memtier.memory.turncodec import KIND_CODES, KIND_FIELDS
from memtier.redaction import REDACTOR_VERSION

_V = REDACTOR_VERSION
_ID_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
# Content the live path stores: no C0 controls but TAB/LF/CR, no DEL or C1, no surrogates.
_clean_text = st.text(
    alphabet=st.characters(
        codec="utf-8", blacklist_categories=("Cc", "Cs"), blacklist_characters="\x7f"
    )
    | st.sampled_from(["\n", "\t", "\r", " ", "é", "日", "🙂", "|", '"', "\\"]),
    max_size=24,
)
_names = st.sampled_from(["search", "web.fetch", "a", "db:query", "x" * 64, "T-1_2"])
_turn_ids = st.sampled_from(["p0", "t.1", "a:b-c_d"]) | st.text(
    alphabet="abcXYZ019._:-", min_size=1, max_size=12
)
_BAD_INTS = ["-1", "", "x", " 5", "5 ", "+5", "\u0661", "1_0", str(2**60), "0x10"]


@st.composite
def _model(draw: st.DrawFn) -> dict[str, Any]:
    """A session as the store writes it: hash fields and records, all consistent.

    ``turns``, ``bytes`` and ``tools`` are left out of ``h``: :func:`_reply` derives
    them from the records as written (their heads' byte counts and tool flags), so a
    mutation of one record stays consistent with the session's counters unless it sets
    them itself -- each check is then the only one that can catch its mutation."""
    created = draw(st.integers(MIN_TIME_MS, MIN_TIME_MS + 10**12))
    n = draw(st.integers(0, 5))
    records = []
    clock, seq = created, 0
    for i in range(n):
        clock += draw(st.integers(0, 5000))
        seq += draw(st.integers(1, 3))
        kind = draw(st.sampled_from(list(KIND_FIELDS)))
        if kind in ("tool", "action"):
            values = [draw(_names), draw(_clean_text)]
        else:
            values = [draw(_clean_text)]
        wall = "" if draw(st.integers(0, 3)) else str(clock + draw(st.integers(1, 99)))
        rotated = i == 0 and draw(st.booleans())
        records.append(
            {
                "seq": seq,
                "clock": clock,
                "wall": wall,
                "kind": kind,
                "id": draw(_turn_ids),
                "values": values,
                "rot": rotated,
                "flags": f"{1 if kind == 'tool' else 0}{'r' if rotated else ''}v{_V}",
            }
        )
    last = clock + draw(st.integers(0, 5000)) if n else created
    h = {
        "id": "ses_" + draw(st.text(alphabet=_ID_CHARS, min_size=16, max_size=24)),
        "created": str(created),
        "created_wall": str(created + draw(st.integers(0, 10))),
        "seq": str(seq + draw(st.integers(0, 2))),
        "last": str(last),
        "last_wall": str(last),
        "xp": str(last),
    }
    if draw(st.booleans()):
        h["summary_bytes"] = "0"
    if draw(st.booleans()):
        del h["last_wall"]
    return {
        "member": f"{draw(st.uuids())}:{draw(st.sampled_from(['public', 'im']))}",
        "h": h,
        "records": records,
        "clock": last + draw(st.integers(0, 10**6)),
        "wall": last + draw(st.integers(-5, 10**6)),
    }


def _size(values: list[str]) -> int:
    return sum(len(v.encode("utf-8", "surrogatepass")) for v in values)


def _head_bytes(r: dict[str, Any]) -> int:
    return int(r.get("bytes", _size(r["values"])))


def _record_bytes(r: dict[str, Any]) -> bytes:
    head = f"{r['seq']}|{r['clock']}|{r['wall']}|{_head_bytes(r)}|{r['flags']}|"
    payload = r.get("payload") or orjson.dumps([KIND_CODES[r["kind"]], r["id"], *r["values"]])
    return head.encode("utf-8") + payload


def _reply(models: list[dict[str, Any]]) -> list[Any]:
    out: list[Any] = [models[0]["clock"] if models else 1, models[0]["wall"] if models else 1]
    out.append(len(models))
    for m in models:
        h = dict(m["h"])
        records = m["records"]
        h.setdefault("turns", str(len(records)))
        summary_bytes = int(h["summary_bytes"]) if (h.get("summary_bytes") or "").isdigit() else 0
        h.setdefault("bytes", str(sum(_head_bytes(r) for r in records) + summary_bytes))
        h.setdefault("tools", str(sum(r["flags"][:1] == "1" for r in records)))
        flat: list[Any] = []
        for name, value in h.items():
            if value is not None:
                flat += [name.encode("utf-8"), value.encode("utf-8", "surrogatepass")]
        recs = [_record_bytes(r) for r in records]
        out += [m["member"].encode("utf-8"), len(flat), *flat, len(recs), *recs]
    return out


_HASH_INTS = ["created", "created_wall", "seq", "turns", "bytes", "tools", "last", "last_wall"]
_HASH_INTS += ["summary_bytes", "sv"]
_SESSION_CHANGES = ["hash_up", "hash_down", "hash_bad", "hash_drop", "summary", "receipt"]
_SESSION_CHANGES += ["summary_unsized", "sid", "member", "times:clock", "times:wall"]
_RECORD_CHANGES = ["bytes", "tool_flag", "other_redactor", "first_format", "clock_out"]
_RECORD_CHANGES += ["wall_equal", "seq_zero", "seq_repeat", "control", "surrogate", "turn_id"]
_RECORD_CHANGES += ["name", "order", "payload", "big_body"]


def _mutate_record(draw: st.DrawFn, m: dict[str, Any], change: str) -> None:
    records = m["records"]
    r = draw(st.sampled_from(records))
    if change == "bytes":
        r["bytes"] = _size(r["values"]) + draw(st.sampled_from([1, -1]))
    elif change == "tool_flag":
        r["flags"] = ("0" if r["flags"][0] == "1" else "1") + r["flags"][1:]
    elif change == "other_redactor":
        r["flags"] = r["flags"][:-1] + str(_V + 1)
    elif change == "first_format":
        r["flags"] = r["flags"][0]
        fields = dict(zip(KIND_FIELDS[r["kind"]], r["values"], strict=True))
        r["payload"] = orjson.dumps({"k": r["kind"], "id": r["id"], "f": fields})
        if r["wall"] == "":
            r["wall"] = str(r["clock"])
    elif change == "clock_out":
        r["clock"] = draw(st.sampled_from([int(m["h"]["created"]) - 1, int(m["h"]["last"]) + 1]))
    elif change == "wall_equal":
        r["wall"] = str(r["clock"])
    elif change == "seq_zero":
        r["seq"] = 0
    elif change == "seq_repeat" and len(records) > 1:
        records[-1]["seq"] = records[-2]["seq"]
    elif change == "control":
        c = draw(st.sampled_from(["\x00", "\x07", "\x1b", "\x7f", "\x80", "\x85", "\x9f"]))
        at = draw(st.integers(0, len(r["values"]) - 1))
        r["values"][at] = c + r["values"][at] + draw(st.sampled_from(["", "é"]))
    elif change == "surrogate":  # as JSON escapes it: orjson reads it, UTF-8 cannot hold it
        payload = orjson.dumps([KIND_CODES[r["kind"]], r["id"], *r["values"]])
        r["payload"] = payload[:-2] + b'\\ud800"]'
    elif change == "turn_id":
        r["id"] = draw(
            st.sampled_from(["", "a b", "x" * 129, "é", "id\n", "t|x", "AKIAIOSFODNN7EXAMPLE"])
        )
    elif change == "name" and r["kind"] in ("tool", "action"):
        r["values"][0] = draw(
            st.sampled_from(
                ["", "_x", "x" * 65, "a b", "ghp_" + "a" * 36, "é", "AKIAIOSFODNN7EXAMPLE"]
            )
        )
    elif change == "order" and len(records) > 1:
        records.reverse()
    elif change == "payload":
        r["payload"] = draw(
            st.sampled_from([b"[]", b"{}", b"[0,1,2]", b'[0,"a"]', b'[9,"a","b"]', b"\xff"])
        )
    elif change == "big_body":
        size = draw(st.sampled_from([2**16, 2**16 + 1, 2**18, 2**18 + 1]))
        r["values"][-1] = "y" * size


_HASH_CHANGES = [f"{op}:{name}" for op in ("up", "down", "bad", "huge") for name in _HASH_INTS]
_HASH_CHANGES += ["drop:" + name for name in ("id", "created", "created_wall", "seq", "last")]
_HASH_CHANGES += ["drop:turns", "drop:bytes", "drop:tools"]
CHANGES = ["none", *_HASH_CHANGES, *_SESSION_CHANGES[4:], *_RECORD_CHANGES]


def _derived(m: dict[str, Any]) -> dict[str, str]:
    """The hash fields as :func:`_reply` writes them (the derived counters included)."""
    ((_, flat, _),) = _session_parts(_reply([m]))
    return {k.decode(): v.decode() for k, v in zip(flat[::2], flat[1::2], strict=True)}


@st.composite
def _mutated(draw: st.DrawFn, change: str | None = None) -> dict[str, Any]:
    """A model with one change the store would not make (``change``: which; None: any)."""
    m = draw(_model())
    h = m["h"]
    what = change or draw(st.sampled_from(CHANGES))
    if what in _RECORD_CHANGES:
        if m["records"]:
            _mutate_record(draw, m, what)
    elif what[:3] in ("up:", "dow", "bad", "hug", "dro"):
        op, _, name = what.partition(":")
        if op == "drop":
            h.update({k: v for k, v in _derived(m).items() if k == name})
            h.pop(name, None)
            if name in ("turns", "bytes", "tools"):
                h[name] = None  # _reply writes no such field
        elif op == "bad":
            h[name] = draw(st.sampled_from([str(MIN_TIME_MS - 1), *_BAD_INTS]))
        elif op == "huge":  # past every ceiling (2**53 for the counters, the times' end)
            h[name] = str(MAX_TIME_MS + 1 if name in ("created", "last") else 2**53 + 1)
        else:
            old = int(_derived(m).get(name, "0"))
            h[name] = str(old + 1 if op == "up" else old - 1)
    elif what in ("summary", "summary_unsized"):
        h["summary"] = draw(st.sampled_from(['{"untrusted":true,"text":"s"}', "x", ""]))
        # its size, or none written (a summary the counters do not know of)
        unsized = what == "summary_unsized"
        h["summary_bytes"] = "0" if unsized else str(len(h["summary"].encode()))
        h["sv"] = draw(st.sampled_from(["1", "0"]))
    elif what == "receipt":
        h["r:" + draw(_turn_ids)] = draw(st.sampled_from([f"{h['id']}|1|2|3|4|0", "junk"]))
    elif what == "sid":
        h["id"] = draw(st.sampled_from(["ses_short", "ses_" + "A" * 16 + "\n", "x" * 20, ""]))
    elif what == "member":
        avatar, _, channel = m["member"].partition(":")
        m["member"] = draw(
            st.sampled_from(
                [avatar.upper() + ":" + channel, avatar + ":other", m["member"] + ":x", avatar]
            )
        )
    elif what in ("times:clock", "times:wall"):  # the reply's clock or wall time
        m[what[6:]] = draw(st.sampled_from([0, MIN_TIME_MS - 1, 2**62]))
    return m


def _reference(reply: list[Any]) -> list[tuple[Any, Any]] | None:
    try:
        sessions = decode_page(reply)
    except ScriptError:
        return None
    out = []
    for s in sessions:
        try:
            check_session_line(s.line, redacted=s.redacted)
            verdict = None
        except SnapshotValidationError as exc:
            verdict = (exc.reason, exc.detail)
        out.append((s.line, verdict))
    return out


def _assert_same(reply: list[Any]) -> None:
    expected = _reference(reply)
    if expected is None:
        with pytest.raises(ScriptError):
            pagecheck.check_page(reply)
        return
    got = [
        (c.line, None if c.rejected is None else (c.rejected.reason, c.rejected.detail))
        for c in pagecheck.check_page(reply)
    ]
    assert got == expected
    # the same bytes in the file, key order included
    assert [orjson.dumps(line) for line, _ in got] == [orjson.dumps(x) for x, _ in expected]


def _session_parts(reply: list[Any]) -> list[tuple[str, list[Any], list[Any]]]:
    pos, out = 3, []
    for _ in range(int(reply[2])):
        member, nfields = reply[pos].decode(), int(reply[pos + 1])
        flat = reply[pos + 2 : pos + 2 + nfields]
        pos += 2 + nfields
        nrec = int(reply[pos])
        out.append((member, flat, reply[pos + 1 : pos + 1 + nrec]))
        pos += 1 + nrec
    return out


@settings(max_examples=300)
@given(st.lists(_mutated(), max_size=3))
@example([])
def test_check_page_equals_decode_then_check(models: list[dict[str, Any]]) -> None:
    """Pages of up to three sessions, each with a change drawn from every kind."""
    _assert_same(_reply(models))


@pytest.mark.parametrize("change", CHANGES)
@settings(max_examples=25)
@given(data=st.data())
def test_each_change_is_judged_as_the_strict_path_judges_it(change: str, data: Any) -> None:
    """Every kind of change on its own, often enough to reach the one check that sees it
    (the session's counters follow the records, so a record's change is not caught by a
    counter instead)."""
    _assert_same(_reply([data.draw(_mutated(change))]))


@settings(max_examples=300)
@given(_model())
def test_a_session_as_the_store_writes_it_takes_the_one_pass_check(model: dict[str, Any]) -> None:
    """Not the reference compared with itself: the one-pass check accepts it on its own."""
    reply = _reply([model])
    ((member, flat, recs),) = _session_parts(reply)
    line = pagecheck._common(member, flat, recs, int(reply[0]), int(reply[1]))
    if int(reply[1]) < MIN_TIME_MS:  # the generated read time fell before the epoch floor
        assert line is None
        return
    assert line is not None
    _assert_same(reply)


def _one(record: bytes, **hash_fields: str) -> list[Any]:
    h = {
        "id": "ses_" + "A" * 22,
        "created": "1800000000000",
        "created_wall": "1800000000000",
        "seq": "1",
        "turns": "1",
        "bytes": "2",
        "tools": "0",
        **hash_fields,
    }
    flat: list[Any] = []
    for name, value in h.items():
        flat += [name.encode(), value.encode()]
    member = f"{uuid.UUID(int=1)}:im".encode()
    return [1800000000009, 1800000000009, 1, member, len(flat), *flat, 1, record]


@pytest.mark.parametrize(
    "reply",
    [
        _one(b'1|1800000000000||2|0v%d|[0,"t","hi"]' % _V),  # accepted
        _one(b'1|1800000000000||2|0v%d|[0,"t","h\\u0085"]' % _V),  # a C1 control
        _one(b'1|1800000000000||2|0v%d|[0,"t\\n","hi"]' % _V),  # "$" matches before "\n"
        _one(b'1|1800000000000||2|0v%d|[0,"t","hi"]' % _V, id="ses_" + "A" * 22 + "\n"),
        _one(b'1|1800000000000||4|1v%d|[2,"t","ab","xy"]' % _V, tools="1", bytes="4"),
        _one(b'1|1800000000000||2|0v%d|[0,"t","hi"]' % _V, last="1799999999999"),
    ],
)
def test_pinned_edges(reply: list[Any]) -> None:
    _assert_same(reply)


def test_real_append_turn_pages_take_the_one_pass_check(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the real ``append_turn`` writes (every kind, a wall time apart from the clock)
    never falls back to the strict path: the flush's speed-up applies to it."""
    fallbacks: list[str] = []
    strict = pagecheck._strict

    def counted(member: str, *rest: Any) -> Any:
        fallbacks.append(member)
        return strict(member, *rest)

    monkeypatch.setattr(pagecheck, "_strict", counted)
    clock = Clock()
    store = sync_store(backend, clock)
    try:
        for n in range(4):
            for i in range(7):
                store.append(key(n, "im" if n % 2 else "public"), turn_for(i + n))
                clock.advance(5)
        replies = []
        for part in store.core.keyspace.all_partitions():
            members = [m.decode() for m in store.client.hkeys(part.index)]
            call = persistence.snapshot_page_call(store.core, part, members)
            replies.append(list(store.executor.execute(call)))
    finally:
        store.close()
    sessions = [c for reply in replies for c in pagecheck.check_page(reply)]
    assert len(sessions) == 4 and all(c.rejected is None for c in sessions)
    assert fallbacks == []
    for reply in replies:
        _assert_same(reply)
