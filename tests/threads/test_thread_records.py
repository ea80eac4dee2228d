"""Stored thread hashes -> ConversationThread without validation (memtier.threads.records).

``thread_from_fields`` builds the thread (and its branch refs) unvalidated
(:func:`memtier.trustedmodels.trusted`), making every value with its field's type.  The
promise: for any thread hash -- the fields the scripts write, and hashes with odd or
missing values as a hand-edited or corrupted store could hold -- the result equals the
thread pydantic validates from the same values, field for field, with the same fields
set and the same wire form, or both ways fail alike.  No Redis.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from memtier.errors import ValidationError as MemtierValidationError
from memtier.redaction import redact_text, served_json
from memtier.threads.models import MARKER, BranchRef, ConversationThread, Ownership, ThreadState
from memtier.threads.records import pairs, thread_from_fields, usage_of
from memtier.wire import ms_to_datetime

OWNER = Ownership("acme", "alice")
THREAD_ID = "conv_1"


def validated(fields: dict[str, str], owner: Ownership, thread_id: str) -> ConversationThread:
    """What thread_from_fields built before: the thread and its branch refs through pydantic."""
    if (
        fields.get("marker") != MARKER
        or fields.get("id") != thread_id
        or fields.get("tenant") != owner.tenant_id
        or fields.get("user") != owner.user_id
    ):
        raise LookupError("not found")
    branches = tuple(
        BranchRef(leaf_id=str(ref["leafId"]), created_at=ms_to_datetime(int(ref["createdAt"])))
        for ref in (orjson.loads(fields.get("branches") or "[]") or [])
    )
    title = fields.get("title")
    try:
        metadata = served_json(orjson.loads(fields.get("metadata") or "{}"), scrub=False)
    except (MemtierValidationError, orjson.JSONDecodeError):
        metadata = {}
    if not isinstance(metadata, dict):
        metadata = {}
    return ConversationThread(
        id=thread_id,
        # (redact_text itself, not served_text: the served form remembers clean titles)
        title=None if title is None else redact_text(title),
        state=ThreadState(fields.get("state", "active")),
        branches=branches,
        created_at=ms_to_datetime(int(fields["created"])),
        updated_at=ms_to_datetime(int(fields["updated"])),
        tenant_id=owner.tenant_id,
        user_id=owner.user_id,
        metadata=metadata,
        version=int(fields["version"]),
        head_id=fields.get("head") or None,
        legal_hold=fields.get("held") == "1",
        usage=usage_of(fields),
    )


def outcome(build: Any, fields: dict[str, str]) -> tuple[Any, ...]:
    try:
        thread = build(fields, OWNER, THREAD_ID)
    except Exception as exc:  # the same failure both ways (not found, a ValueError...)
        kind = "not_found" if getattr(exc, "code", None) == "not_found" else type(exc)
        return ("error", LookupError if kind == "not_found" else kind)
    return ("thread", thread, thread.model_fields_set, thread.to_wire(), thread.model_dump())


MS = st.integers(0, 2**41).map(str)
ODD = st.sampled_from(["", "x", "-1", "1.5", "null", "[]", "{}", "1e3", " 7"])
BRANCH = st.fixed_dictionaries(
    {"leafId": st.text(max_size=8) | st.integers(0, 99), "createdAt": st.integers(0, 2**41)}
)
BRANCHES = st.lists(BRANCH, max_size=3).map(lambda refs: orjson.dumps(refs).decode())
METADATA = st.dictionaries(
    st.text(max_size=6),
    st.text(max_size=12) | st.integers(-(2**53), 2**53) | st.booleans(),
    max_size=3,
).map(lambda m: orjson.dumps(m).decode())
WRITTEN = st.fixed_dictionaries(
    {
        "marker": st.just(MARKER),
        "id": st.just(THREAD_ID),
        "tenant": st.just(OWNER.tenant_id),
        "user": st.just(OWNER.user_id),
        "state": st.sampled_from(["active", "archived"]),
        "branches": BRANCHES,
        "created": MS,
        "updated": MS,
        "metadata": METADATA,
        "version": st.integers(0, 10**6).map(str),
        "head": st.sampled_from(["", "e2", "e40"]),
        "held": st.sampled_from(["0", "1"]),
        "entries": st.integers(0, 99).map(str),
    },
    optional={
        "title": st.text(max_size=20) | st.just("key sk-proj-" + "A1b2" * 8),
        "use.tokens": st.integers(0, 999).map(str) | ODD,
        "use.calls": st.integers(0, 9).map(str),
    },
)
DAMAGE = st.sampled_from(
    [
        "marker",
        "id",
        "tenant",
        "user",
        "state",
        "branches",
        "created",
        "updated",
        "metadata",
        "version",
        "head",
        "held",
        "title",
    ]
)


# What create writes for a thread without a title, before its first turn.
NEW_THREAD: dict[str, str] = {
    "marker": MARKER,
    "id": THREAD_ID,
    "tenant": "acme",
    "user": "alice",
    "state": "active",
    "branches": "[]",
    "created": "0",
    "updated": "0",
    "metadata": "{}",
    "version": "1",
    "head": "",
    "held": "0",
    "entries": "0",
}


@settings(max_examples=300, deadline=None)
@given(fields=WRITTEN)
@example(fields=dict(NEW_THREAD))
def test_a_written_thread_equals_the_validated_one(fields: dict[str, str]) -> None:
    built = outcome(thread_from_fields, fields)
    assert built[0] == "thread"
    assert built == outcome(validated, fields)


@settings(max_examples=300, deadline=None)
@given(fields=WRITTEN, damaged=st.lists(st.tuples(DAMAGE, ODD | st.none()), max_size=3))
@example(
    fields=dict(NEW_THREAD),
    damaged=[("branches", "{}"), ("state", "x")],
)
def test_a_damaged_thread_fails_or_reads_as_the_validated_one(
    fields: dict[str, str], damaged: list[tuple[str, str | None]]
) -> None:
    for name, value in damaged:
        if value is None:
            fields.pop(name, None)
        else:
            fields[name] = value
    assert outcome(thread_from_fields, fields) == outcome(validated, fields)


def pairs_as_before(flat: list[Any]) -> dict[str, str]:
    """What pairs() was: each element through text(), then taken two by two."""
    decoded = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in flat]
    return dict(zip(decoded[0::2], decoded[1::2], strict=False))


ELEMENT = st.binary(max_size=6) | st.text(max_size=6) | st.integers(-5, 5)


@settings(max_examples=300, deadline=None)
@given(flat=st.lists(st.binary(max_size=8), max_size=9) | st.lists(ELEMENT, max_size=9))
@example(flat=[b"a", b"1", b"b"])  # an odd last element is left out
@example(flat=[b"a", "1", b"b", 2])  # str and numbers among bytes (decode_responses=True)
@example(flat=[b"a", b"\xff"])  # not UTF-8: refused alike
def test_a_flat_hash_reply_reads_as_it_did_element_by_element(flat: list[Any]) -> None:
    def read(how: Any) -> Any:
        try:
            return ("ok", how(flat))
        except UnicodeDecodeError:
            return ("refused", None)

    assert read(pairs) == read(pairs_as_before)
