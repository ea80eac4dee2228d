"""Declared inputs of every ``lua/threads`` script: KEYS by role, ARGV by name.

The flows build each call by name (``RUN_CLAIM.call(keys, request_id=..., ...)``);
tests/threads/test_threads_script_specs.py checks each declaration against its
script's header.  A script whose ARGV ends in a counted tail (event pairs, entry
triples, meter pairs) declares the fixed part; :func:`with_tail` appends the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import fields
from operator import attrgetter
from typing import Final

from memtier.engine import ScriptCall
from memtier.keys import OwnerKeys, ThreadKeys
from memtier.scriptspec import ScriptSpec

__all__ = ["SPECS", "thread_call", "with_tail"]

CREATE: Final = ScriptSpec(
    "create",
    keys=("thread", "index"),
    argv=(
        "marker",
        "thread_id",
        "tenant",
        "user",
        "now_ms",
        "has_title",
        "title",
        "metadata",
        "fingerprint",
        "index_member",
        "max_threads",
    ),
)
BRANCH: Final = ScriptSpec(
    "branch",
    keys=("thread", "parents"),
    argv=("marker", "leaf_id", "expected_version", "max_branches", "now_ms", "tenant", "user"),
)
ARCHIVE: Final = ScriptSpec(
    "archive",
    keys=("thread",),
    argv=("marker", "expected_version", "now_ms", "tenant", "user"),
)
HOLD: Final = ScriptSpec("hold", keys=("thread",), argv=("marker", "held", "tenant", "user"))
DELETE: Final = ScriptSpec(
    "delete",
    keys=("thread", "entries", "parents", "runs", "events", "lease", "index", "recent_deletes"),
    argv=("marker", "tenant", "user", "thread_id", "token", "now_ms", "keep_ms", "keep_max"),
)
READ_EVENTS: Final = ScriptSpec(
    "read_events",
    keys=("thread", "events", "lease"),
    argv=("marker", "start", "count", "tenant", "user"),
)
RUN_CLAIM: Final = ScriptSpec(
    "run_claim",
    keys=("thread", "runs", "lease", "parents", "events", "entries"),
    argv=(
        "marker",
        "request_id",
        "token",
        "fingerprint",
        "lease_ms",
        "leaf_id",
        "max_entries",
        "turn_entries",
        "max_events",
        "turn_events",
        "max_bytes",
        "turn_bytes",
        "record",
        "tenant",
        "user",
        "now_ms",
        "started_head",
        "started_tail",
        "message_head",
        "message_tail",
        "inline_bytes",
        "known_inc",
        "known_n",
        "known_last",
        "known_end",
        "n_meters",
    ),
)
EVENTS_APPEND: Final = ScriptSpec(
    "events_append",
    keys=("thread", "events", "lease"),
    argv=("marker", "token", "seq", "lease_ms", "now_ms", "request_id", "n_events"),
)
LEASE_RENEW: Final = ScriptSpec(
    "lease_renew", keys=("thread", "lease"), argv=("marker", "token", "lease_ms")
)
RUN_COMMIT: Final = ScriptSpec(
    "run_commit",
    keys=("thread", "entries", "parents", "runs", "lease", "events"),
    argv=(
        "marker",
        "token",
        "request_id",
        "now_ms",
        "expected_count",
        "new_head",
        "done_record",
        "n_entries",
        "n_events",
        "usage",
    ),
)
RUN_ABORT: Final = ScriptSpec(
    "run_abort",
    keys=("thread", "runs", "lease", "events"),
    argv=("marker", "token", "request_id", "now_ms", "type", "data", "record", "usage"),
)
RUN_CANCEL: Final = ScriptSpec(
    "run_cancel",
    keys=("thread", "runs", "lease", "events"),
    argv=("marker", "request_id", "tenant", "user", "now_ms", "data"),
)

SPECS: Final[tuple[ScriptSpec, ...]] = (
    ARCHIVE,
    BRANCH,
    CREATE,
    DELETE,
    EVENTS_APPEND,
    HOLD,
    LEASE_RENEW,
    READ_EVENTS,
    RUN_ABORT,
    RUN_CANCEL,
    RUN_CLAIM,
    RUN_COMMIT,
)


# KEYS roles: the thread's own keys (ThreadKeys' fields), and the owner's index and recent
# deletes (OwnerKeys' attributes of the same names), which create and delete also take.
_THREAD_ROLES: Final = frozenset(f.name for f in fields(ThreadKeys))
_OWNER_ROLES: Final = frozenset({"index", "recent_deletes"})

KeyReader = Callable[[ThreadKeys, OwnerKeys | None], tuple[str, ...]]


def _key_reader(spec: ScriptSpec) -> KeyReader:
    """How ``spec``'s KEYS tuple is read off a thread's (and its owner's) keys, in KEYS
    order: made once per script, so a call reads attributes instead of building a mapping
    of every role (a few microseconds on each of a continue's three calls)."""
    unknown = set(spec.keys) - _THREAD_ROLES - _OWNER_ROLES
    if unknown:
        raise TypeError(f"{spec.script} keys: unknown roles {sorted(unknown)}")
    if set(spec.keys) <= _THREAD_ROLES:
        if len(spec.keys) == 1:
            name = spec.keys[0]
            return lambda keys, owner: (getattr(keys, name),)
        get: Callable[[ThreadKeys], tuple[str, ...]] = attrgetter(*spec.keys)  # a tuple
        return lambda keys, owner: get(keys)
    roles = spec.keys

    def read(keys: ThreadKeys, owner: OwnerKeys | None) -> tuple[str, ...]:
        if owner is None:
            raise TypeError(f"{spec.script} takes the owner's keys too (owner=...)")
        return tuple([getattr(owner if role in _OWNER_ROLES else keys, role) for role in roles])

    return read


# By the spec object itself (the constants above live as long as the module).
_KEY_READERS: Final = {id(spec): _key_reader(spec) for spec in SPECS}


def thread_call(
    spec: ScriptSpec,
    keys: ThreadKeys,
    /,
    *,
    owner: OwnerKeys | None = None,
    tail: Iterable[str | int | bytes] = (),
    **argv: str | int | bytes,
) -> ScriptCall:
    """A call of ``spec`` on one thread: its KEYS picked by role, ARGV by name, then the
    counted ``tail``."""
    read = _KEY_READERS.get(id(spec)) or _key_reader(spec)
    return spec.call_with_tail(read(keys, owner), tail, **argv)


def with_tail(call: ScriptCall, tail: Iterable[str | int | bytes]) -> ScriptCall:
    """``call`` with the counted tail of its ARGV appended (the header documents it)."""
    return ScriptCall(call.script, call.keys, (*call.args, *tail), call.attempts, call.durable)
