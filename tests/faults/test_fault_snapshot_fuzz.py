"""Fault row "Files": a structure-aware fuzzer of generation files.

Hypothesis mutates a real generation where it has structure -- header fields, session
fields, records, content fields, the summary document, receipts; values of any JSON type
and size; deleted and added keys; duplicated sessions; reordered records -- optionally
repairs the byte/turn/tool counts so the mutation reaches the deeper checks, and
re-signs the file so every checksum passes.  Then ``verify_generation`` and
``recover()`` (real redis-server) run on it.  Any exception other than a typed rejection
fails; so does recovery quarantining a file for a validator crash (``validator_error``).
Crashers found are pinned as ``@example`` seeds (D1: a JSON list as a record's kind).
"""

from __future__ import annotations

import copy
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from snapfaults import config_for, key, populate, wipe

from memtier import ActionResult, AvatarMessage, ConversationStore, ToolSummary
from memtier.memory import snapshot
from memtier.memory.persistence import snapshot_dir_for
from memtier.memory.snapshot import (
    Rejection,
    VerifiedGeneration,
    fit_session,
    iter_generation,
    verify_generation,
)

pytestmark = pytest.mark.real

_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from([0, 1, -1, 2**53, 2**53 + 1, 946_684_800_000, 253_402_300_800_000]),
    st.floats(allow_nan=False, allow_infinity=False),
    _TEXT,
    st.sampled_from(["avatar", "agent", "tool", "action", "\x00", "ses_" + "A" * 22, "ghp_x"]),
)
_VALUE = st.recursive(
    _LEAF,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=6,
)
_NAMES = (
    st.sampled_from(
        sorted(
            snapshot.fileformat.SESSION_KEYS
            | snapshot.fileformat.RECORD_KEYS
            | snapshot.fileformat.HEADER_KEYS
            | {"text", "tool", "summary", "action", "outcome", "v", "untrusted", "counts", "seq"}
            | {"tools", "actions", "wall", "turns", "tools_other", "actions_other"}
        )
    )
    | _TEXT
)
_TARGETS = st.sampled_from(
    ["header", "session", "record", "field", "summary", "receipt", "dup_session", "swap"]
)
# (target, session index, record index, name, value, delete the key instead)
_MUTATION = st.tuples(
    _TARGETS, st.integers(0, 7), st.integers(0, 31), _NAMES, _VALUE, st.booleans()
)
_PROTECTED_HEADER = {"format", "format_version", "schema_version", "header_sha256"}


def _set(obj: Any, name: str, value: Any, delete: bool) -> None:
    if not isinstance(obj, dict):
        return
    if delete:
        obj.pop(name, None)
    else:
        obj[name] = value


def _mutate(header: dict[str, Any], lines: list[Any], mutation: tuple[Any, ...]) -> None:
    target, i, j, name, value, delete = mutation
    if not lines:
        return
    session = lines[i % len(lines)]
    records = session.get("records") if isinstance(session, dict) else None
    record = records[j % len(records)] if isinstance(records, list) and records else None
    if target == "header" and name not in _PROTECTED_HEADER:
        _set(header, name, value, delete)
    elif target == "session":
        _set(session, name, value, delete)
    elif target == "record":
        _set(record, name, value, delete)
    elif target == "field" and isinstance(record, dict):
        _set(record.get("f"), name, value, delete)
    elif (
        target == "summary"
        and isinstance(session, dict)
        and isinstance(session.get("summary"), str)
    ):
        doc = orjson.loads(session["summary"])
        _set(doc, name, value, delete)
        session["summary"] = orjson.dumps(doc).decode()
    elif target == "receipt" and isinstance(session, dict):
        receipts = session.get("receipts")
        if isinstance(receipts, list) and receipts:
            receipts[j % len(receipts)] = value
    elif target == "dup_session":
        lines.append(copy.deepcopy(session))
    elif target == "swap" and isinstance(records, list) and len(records) > 1:
        records.reverse()


def _size(value: Any) -> int:
    return len(value.encode("utf-8")) if isinstance(value, str) else 0


def _repair_counts(lines: list[Any]) -> None:
    """Make bytes/turns/tools/summary_bytes agree with the content (deeper checks run)."""
    for session in lines:
        if not isinstance(session, dict) or not isinstance(session.get("records"), list):
            continue
        total = 0
        for rec in session["records"]:
            if isinstance(rec, dict) and isinstance(rec.get("f"), dict):
                rec["bytes"] = sum(_size(v) for v in rec["f"].values())
                total += rec["bytes"]
        summary = session.get("summary")
        session["summary_bytes"] = _size(summary)
        session["bytes"] = total + _size(summary)
        session["turns"] = len(session["records"])
        session["tools"] = sum(
            1 for r in session["records"] if isinstance(r, dict) and r.get("tool") == 1
        )


def _write(path: Path, header: dict[str, Any], lines: list[Any]) -> None:
    payload = b"".join(orjson.dumps(line) + b"\n" for line in lines)
    header = {k: v for k, v in header.items() if k != "header_sha256"}
    if "sessions" in header:
        header["sessions"] = len(lines)
    if "payload_bytes" in header:
        header["payload_bytes"] = len(payload)
    if "payload_sha256" in header:
        header["payload_sha256"] = hashlib.sha256(payload).hexdigest()
    try:
        block = snapshot.fileformat.encode_header(header)
    except Exception:  # a header too large for its block: write it unsigned (a rejection)
        block = (snapshot.MAGIC + orjson.dumps(header))[: snapshot.HEADER_BLOCK]
    path.write_bytes(block + payload)
    os.chmod(path, 0o600)


class Seed:
    """One real generation (summaries, receipts, every turn kind) and a store to recover."""

    def __init__(self, url: str) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="memtier-fuzz-"))
        self.namespace = "fz" + os.urandom(4).hex()
        config = config_for(url, self.namespace, self.tmp, max_turns_per_session=8)
        self.store = ConversationStore(
            redis.Redis.from_url(url), config, snapshots=snapshot_dir_for(config)
        )
        populate(self.store, 3)
        k = key(99)
        for n in range(12):  # inline compaction: a summary
            self.store.append(k, AvatarMessage(text=f"avatar {n}", turn_id=f"z{n}"))
        self.store.append(k, ToolSummary(tool="search", summary="found"))
        self.store.append(k, ActionResult(action="teleport", outcome="arrived"))
        path = Path(self.store.flush().path)
        raw = path.read_bytes()
        block = raw[: snapshot.HEADER_BLOCK]
        self.header = orjson.loads(block[len(snapshot.MAGIC) : -1].rstrip(b" "))
        self.lines = [orjson.loads(x) for x in raw[snapshot.HEADER_BLOCK :].splitlines()]
        self.path = path
        assert self.store.snapshots is not None
        self.dir = self.store.snapshots
        wipe(self.store)

    def close(self) -> None:
        wipe(self.store)
        self.store.close()
        for p in sorted(self.tmp.rglob("*"), reverse=True):
            p.unlink() if not p.is_dir() else p.rmdir()
        self.tmp.rmdir()


@pytest.fixture(scope="module")
def seed(redis_server: Any) -> Iterator[Seed]:
    made = Seed(redis_server.url)
    try:
        yield made
    finally:
        made.close()


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@example(mutations=[("record", 0, 0, "kind", ["tool"], False)], repair=False)  # D1
@example(mutations=[("record", 3, 0, "kind", {"a": 1}, False)], repair=True)
@example(mutations=[("field", 3, 0, "text", ["x"], False)], repair=True)
@example(mutations=[("summary", 3, 0, "counts", [], False)], repair=True)
@example(mutations=[("summary", 3, 0, "tools", [["\x00", 1]], False)], repair=True)
@example(mutations=[("summary", 3, 0, "untrusted", False, False)], repair=True)
@example(mutations=[("header", 0, 0, "generation", -1, False)], repair=False)
@example(mutations=[("receipt", 3, 0, "", ["t1", 5], False)], repair=False)
@given(mutations=st.lists(_MUTATION, min_size=1, max_size=4), repair=st.booleans())
def test_fuzzed_generations_are_typed_rejections_or_restorable(
    seed: Seed, mutations: list[tuple[Any, ...]], repair: bool
) -> None:
    header = copy.deepcopy(seed.header)
    lines = copy.deepcopy(seed.lines)
    for mutation in mutations:
        _mutate(header, lines, mutation)
    if repair:
        _repair_counts(lines)
    try:
        _write(seed.path, header, lines)
    except orjson.JSONEncodeError:
        return  # not representable as JSON: no such file can exist
    gen = seed.dir.generations()[0]
    conv = seed.store.core.conv
    result = verify_generation(gen, seed.namespace, conv, seed.dir.max_bytes)
    assert isinstance(result, (Rejection, VerifiedGeneration))
    if isinstance(result, VerifiedGeneration):
        lowered = conv.model_copy(update={"max_turns_per_session": 4})
        for session in iter_generation(result, conv):
            fit_session(session, lowered)
    wipe(seed.store)
    report = seed.store.recover()
    assert report.outcome in ("restored", "empty"), report
    assert all(reason != "validator_error" for _, reason in report.quarantined), report
    for meta in seed.store.iter_metadata():
        seed.store.context((meta.avatar, meta.channel))
    # Put the file back for the next example (recovery may have quarantined it).
    for q in seed.dir.quarantined():
        q.unlink()
