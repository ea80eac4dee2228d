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

__all__ = ["SPECS", "thread_call", "thread_roles", "with_tail"]

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


def thread_roles(keys: ThreadKeys, owner: OwnerKeys | None = None) -> dict[str, str]:
    """Every KEYS role a thread script may take, for ``spec.call({...}[roles])``."""
    roles = {
        "thread": keys.thread,
        "entries": keys.entries,
        "parents": keys.parents,
        "runs": keys.runs,
        "events": keys.events,
        "lease": keys.lease,
    }
    if owner is not None:
        roles["index"] = owner.index
        roles["recent_deletes"] = owner.recent_deletes
    return roles


# The scripts whose KEYS are all thread keys (every run script): their KEYS tuple is read
# straight off the ThreadKeys, in KEYS order, by a getter made once per script -- the role
# mapping above cost a few microseconds on each of a continue's three calls.
_THREAD_KEY_ROLES: Final = frozenset(f.name for f in fields(ThreadKeys))


def _key_getter(spec: ScriptSpec) -> Callable[[ThreadKeys], tuple[str, ...]] | None:
    if not set(spec.keys) <= _THREAD_KEY_ROLES:
        return None
    if len(spec.keys) == 1:
        one = attrgetter(spec.keys[0])
        return lambda keys: (one(keys),)
    return attrgetter(*spec.keys)  # a tuple, in the order given


# By the spec object itself (the constants above live as long as the module).
_KEY_GETTERS: Final = {id(spec): _key_getter(spec) for spec in SPECS}


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
    getter = _KEY_GETTERS.get(id(spec)) if owner is None else None
    if getter is not None:
        return spec.call_with_tail(getter(keys), tail, **argv)
    roles = thread_roles(keys, owner)
    return spec.call_with_tail({role: roles[role] for role in spec.keys}, tail, **argv)


def with_tail(call: ScriptCall, tail: Iterable[str | int | bytes]) -> ScriptCall:
    """``call`` with the counted tail of its ARGV appended (the header documents it)."""
    return ScriptCall(call.script, call.keys, (*call.args, *tail), call.attempts, call.durable)
