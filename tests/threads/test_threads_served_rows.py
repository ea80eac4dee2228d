"""Issue 12 (threads, branch threadsfast): replay and export remember what each ledger row
was served as (:class:`~memtier.threads.servedrows.ServedRows`), and serve exactly what
the full redactor serves.

An adversary writes rows by hand into the ledger (secrets from the secret corpus's
generator, local paths, sensitive key names, JSON that is not an object, invalid JSON,
rows not marked redacted), then reads them by replay and by export, twice: every read
serves what :func:`decode_row` (redaction on read, no memo) serves for each row, no planted
secret's core is served, and a caller mutating a served record's data changes nothing the
next read serves.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from threadhelpers import OWNER

from memtier.threads import ConversationService, servedrows
from memtier.threads.ledger import decode_row
from memtier.threads.servedrows import NOT_SERVABLE, ServedRows

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "adversarial"))
from secretgen import TurnText, turn_texts

_KEYS = st.sampled_from(["content", "password", "note", "api_key", "/home/u/x", "n"])


@st.composite
def _row_data(draw: st.DrawFn) -> tuple[str, tuple[str, ...]]:
    """(row data as stored, cores of the secrets planted in it)."""
    turn: TurnText = draw(turn_texts(max_segments=3))
    kind = draw(st.sampled_from(["object", "object", "nested", "list", "invalid", "path"]))
    cores = tuple(c for p in turn.planted for c in p.cores)
    if kind == "object":
        data = orjson.dumps({draw(_KEYS): turn.text, "entryId": "e1"}).decode()
    elif kind == "nested":
        data = orjson.dumps({"a": [{"b": turn.text}, 3, None, True]}).decode()
    elif kind == "list":
        data = orjson.dumps([turn.text]).decode()
    elif kind == "invalid":
        data = '{"content": ' + turn.text
    else:
        data = orjson.dumps({"file": "/home/alice/secret.txt " + turn.text}).decode()
    return data, cores


def _served(record: Any) -> str:
    return orjson.dumps(record.to_wire()).decode()


@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(st.tuples(_row_data(), st.sampled_from(["1", "1", "1", "0"])), max_size=6),
    repeat=st.booleans(),
)
@example(rows=[(('{"password": "hunter2-abc"}', ()), "1")], repeat=True)
@example(rows=[(("[1]", ()), "1"), (("{", ()), "1"), (('{"a": "b"}', ()), "0")], repeat=False)
def test_replay_and_export_serve_what_the_full_redactor_serves(
    backend: Any, rows: list[tuple[tuple[str, tuple[str, ...]], str]], repeat: bool
) -> None:
    client = backend.sync_client()
    service = ConversationService(client, backend.config())
    try:
        tid = service.create(OWNER).id
        keys = service.core.keyspace.owner(OWNER.tenant_id, OWNER.user_id).thread(tid)
        written = rows + (rows if repeat else [])  # the same data in two rows
        for (data, _), mark in written:
            client.xadd(keys.events, {"type": "note", "data": data, "run": "r1", "r": mark})
        expected = []
        for row_id, fields in client.xrange(keys.events):
            f = {k.decode(): v.decode() for k, v in fields.items()}
            record = decode_row(row_id.decode(), f["type"], f["data"], f["run"], f["r"], tid)
            if record is not None:
                expected.append(record)
        for _ in range(2):
            page = service.replay(OWNER, tid)
            assert list(page.records) == expected
            exported = service.export(OWNER, tid)
            assert list(exported.events) == expected
            served = " ".join(_served(r) for r in page.records + exported.events)
            for (_, cores), _mark in written:
                for core in cores:
                    assert core not in served
            for record in page.records:  # a caller's mutation never reaches the next read
                record.data["mutated"] = True
    finally:
        service.close()


def test_served_rows_keep_their_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(servedrows, "MAX_THREADS", 2)
    monkeypatch.setattr(servedrows, "MAX_BYTES", 100)
    monkeypatch.setattr(servedrows, "MAX_ROW_BYTES", 30)
    monkeypatch.setattr(servedrows, "MAX_ROWS_PER_THREAD", 3)
    rows = ServedRows()
    memo = rows.memo("k1")
    rows.keep("k1", memo, "x" * 31, b"{}")  # over the row bound: never kept
    assert memo == {} and rows.stats() == (1, 0)
    rows.keep("k1", memo, "a", b'{"a":1}')
    rows.keep("k1", memo, "b", NOT_SERVABLE)
    assert memo == {"a": b'{"a":1}', "b": NOT_SERVABLE} and rows.stats() == (1, 9)
    rows.keep("k1", memo, "c", b"{}")
    assert rows.memo("k1") is not memo  # past MAX_ROWS_PER_THREAD: starts over
    assert rows.stats() == (1, 0)
    for key in ("k2", "k3", "k4"):
        m = rows.memo(key)
        rows.keep(key, m, "row", b"{}")
    # Others dropped, never the thread being read; k1 (its memo empty) may be the one left.
    assert rows.stats() in ((2, 5), (2, 10))
    assert rows.memo("k4") == {"row": b"{}"}  # the last read kept its rows
    m = rows.memo("k5")
    for i in range(20):
        rows.keep("k5", m, f"{i:02d}" * 5, b"{}")  # 12 bytes each: past MAX_BYTES
        assert rows.stats()[1] <= 100
    stale = rows.memo("k6")
    for n in range(7, 200):  # other threads read until k6 is dropped (at random)
        rows.memo(f"k{n}")
        if "k6" not in rows._threads:
            break
    else:
        raise AssertionError("k6 was never dropped")
    rows.keep("k6", stale, "late", b"{}")  # what a reader still holds is no longer kept
    assert stale == {}


def test_served_rows_keep_hits_when_threads_are_read_in_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reader polling one thread more than fit, in turn: dropping the least recently read
    would drop each just before its next read (no hits at all); dropped at random, most
    reads find their rows."""
    monkeypatch.setattr(servedrows, "MAX_THREADS", 4)
    rows = ServedRows()
    hits = reads = 0
    for turn in range(200):
        key = f"k{turn % 5}"
        memo = rows.memo(key)
        if turn >= 5:
            reads += 1
            hits += "row" in memo
        rows.keep(key, memo, "row", b"{}")
        assert rows.stats()[0] <= 4
    assert hits >= reads // 3, (hits, reads)
