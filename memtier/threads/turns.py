"""The continue protocol, I/O-free: claim a turn, hand it to the runner, commit or abort.

``continue_`` claims the thread (``run_claim``: the per-request run record for exact
retries and the per-thread lease that serializes turns, the opening rows, the thread and
its history in one call), waits with bounded polls while another turn or its own first
attempt runs, reads any history beyond the claim's inline budget, then yields a
:class:`~memtier.engine.Handoff` of the :class:`TurnState`: the shell runs the runner
(with its emit, heartbeat, wall-clock limit and cancellation, see
:mod:`memtier.threads.runturn`) and sends back its reply, or throws its error in.  The
flow then commits the turn (``run_commit``) or closes it without committing anything
(``run_abort``: the runner failed, was cancelled, or passed a shared run limit).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import orjson

from memtier import limits, metrics
from memtier.engine import Command, Handoff, Plan, ScriptCall, Sleep
from memtier.errors import ConversationError, ErrorCode
from memtier.keys import ThreadKeys
from memtier.redaction import scrub_paths
from memtier.threads.ledger import event_data, message_event, row_args
from memtier.threads.models import (
    MARKER,
    AgentIdentity,
    CancelResult,
    CancelStatus,
    ContinueResult,
    ContinueStatus,
    ConversationEntry,
    ConversationThread,
    Ownership,
    check_identity,
)
from memtier.threads.records import (
    entry_from_json,
    entry_from_row,
    entry_row,
    pairs,
    text,
    thread_from_fields,
)
from memtier.threads.runlimits import TurnBudget
from memtier.threads.runner import AgentDenied, RunnerReply
from memtier.threads.runoptions import validate_run_options
from memtier.threads.specs import (
    EVENTS_APPEND,
    RUN_ABORT,
    RUN_CANCEL,
    RUN_CLAIM,
    RUN_COMMIT,
    thread_call,
)
from memtier.threads.status import ThreadStatus, status_error
from memtier.threads.validation import (
    dumps,
    fingerprint,
    message_text,
    sanitized,
    thread_keys,
    valid_entry_id,
    valid_request_id,
)
from memtier.trustedmodels import trusted

if TYPE_CHECKING:
    from memtier.threads.core import ThreadsCore

__all__ = ["TurnCancelled", "TurnState", "cancel_run", "continue_"]

Code = ErrorCode

_HMGET_CHUNK: Final = 500  # entries read per HMGET when rebuilding history
# Where each turn's history came from (memtier_thread_history_entries_total{source}).
_HISTORY_HELD, _HISTORY_SENT, _HISTORY_READ = (
    metrics.THREAD_HISTORY_ENTRIES.labels(source) for source in ("held", "sent", "read")
)
_POLL_FIRST_S: Final = 0.02  # first wait before re-trying a busy thread / in-flight duplicate
_POLL_MAX_S: Final = 0.5  # ... doubling up to this
_MAX_POLLS: Final = 2_000  # hard cap on claim attempts (300 s / 0.5 s plus the ramp)
_ENTRIES_PER_TURN: Final = 2
# History entries run_claim sends inline (the rest by HMGET): bounds the claim's reply and
# the time Redis spends copying it; a typical thread fits whole.
_INLINE_HISTORY_BYTES: Final = 1 * 2**20
# Closing rows of a turn besides the runner's: agent_started, user_message,
# assistant_message, agent_finished (or agent_denied / error).
_SERVICE_EVENTS_PER_TURN: Final = 4
_TURN_EVENTS: Final = limits.THREAD_EVENTS_PER_TURN + _SERVICE_EVENTS_PER_TURN
# Upper bound of the bytes one turn can add (reserved by run_claim): two entries and two
# message events of at most THREAD_MESSAGE_BYTES each (+ JSON envelope), runner events.
_ENVELOPE_BYTES: Final = 1024
_TURN_BYTES: Final = 4 * (limits.THREAD_MESSAGE_BYTES + _ENVELOPE_BYTES) + (
    limits.THREAD_EVENTS_PER_TURN * (limits.THREAD_EVENT_BYTES + 64 + _ENVELOPE_BYTES)
)


class TurnCancelled(Exception):
    """Raised by the shells into the continue flow when they cancelled the runner."""


@dataclass
class TurnState:
    """Everything about one claimed turn that the shells need while the runner runs."""

    owner: Ownership
    keys: ThreadKeys
    thread: ConversationThread
    history: tuple[ConversationEntry, ...]
    message: str
    message_truncated: bool
    request_id: str
    leaf_id: str | None
    base: str
    token: str
    fingerprint: str
    entry_count: int
    first_entry: int  # number of the turn's first entry id, from the never-reused sequence
    run_options: dict[str, Any] | None = None
    stored_options: dict[str, Any] | None = None  # redacted, as the run record keeps them
    history_inc: str = ""  # the thread incarnation the claim named (its history cache's)
    identity: AgentIdentity | None = None
    budget: TurnBudget | None = None  # shared run limits: allowance and consumption
    seq: int = 1  # emit batches; 1 = the agent_started batch
    kept: int = 0
    dropped: int = 0
    closed: bool = False
    # Why the shells stopped the runner: "caller" (run_cancel), "shutdown", "lease_lost",
    # "limit" (the wall-clock allowance).
    cancel_reason: str | None = None

    def entry_ids(self) -> list[str]:
        return [f"e{self.first_entry + i}" for i in range(_ENTRIES_PER_TURN)]

    def usage_arg(self) -> str:
        return "" if self.budget is None or not self.budget.used else dumps(self.budget.used)


# --- continue ------------------------------------------------------------------------------------


def continue_(
    core: ThreadsCore,
    owner: Ownership,
    thread_id: str,
    message: str,
    *,
    request_id: str | None,
    leaf_id: str | None,
    run_options: Mapping[str, Any] | None,
    identity: AgentIdentity | None,
) -> Plan[ContinueResult]:
    keys = thread_keys(core.keyspace, owner, thread_id)
    check_identity(owner, identity)  # before any Redis call
    content, truncated = message_text(message)
    # The attempt's token and, when the caller gave none, the request id: 128 random bits
    # each, from one CSPRNG read (a syscall per read).
    entropy = secrets.token_hex(32)
    rid = valid_request_id(request_id, core.config.request_id_bytes) or f"req_{entropy[32:]}"
    leaf = "" if leaf_id is None else valid_entry_id(leaf_id)
    options = validate_run_options(core.run_options_schema, run_options)
    # A retry must repeat the message, the leaf and the options (else request_conflict);
    # turns without options keep the fingerprint of earlier versions.
    digest = fingerprint([content, leaf] if options is None else [content, leaf, options])
    token = entropy[:32]
    running: dict[str, Any] = {"s": "running", "tok": token, "fp": digest}
    running["at"] = core.clock()
    ledger_options = None if options is None else event_data(options)
    if ledger_options is not None:
        running["opt"] = ledger_options  # stored with the run record, redacted
    if identity is not None:
        running["aid"] = identity.agent_id
    meters = core.run_limits.claim_args() if core.run_limits else (0,)
    # The opening rows go in with the claim (one round trip): their data is encoded here,
    # cut at the one value only the claim knows (the base entry, the first entry id).
    # The slot is unguessable (the attempt's token), and precedes any caller text.
    slot = f"\x00{token}"
    started_row: dict[str, Any] = {"requestId": rid, "leafId": slot}
    if ledger_options is not None:
        started_row["runOptions"] = ledger_options
    if identity is not None:
        started_row["agentId"] = identity.agent_id  # the ledger records who ran it
    started_head, started_tail = _template(started_row, slot)
    message_head, message_tail = _template(message_event(slot, content, truncated), slot)

    # The path this process handed out last for the thread: run_claim sends only what
    # follows it (when it is still the path's prefix, in the same incarnation).
    known = core.history_cache.known(keys.entries)

    def claim(now_ms: int) -> ScriptCall:
        return thread_call(
            RUN_CLAIM,
            keys,
            tail=meters[1:],
            marker=MARKER,
            request_id=rid,
            token=token,
            fingerprint=digest,
            lease_ms=core.lease_ms,
            leaf_id=leaf,
            max_entries=limits.THREAD_MAX_ENTRIES,
            turn_entries=_ENTRIES_PER_TURN,
            max_events=limits.THREAD_MAX_EVENTS,
            turn_events=_TURN_EVENTS,
            max_bytes=limits.THREAD_MAX_BYTES,
            turn_bytes=_TURN_BYTES,
            record=dumps(running),
            tenant=owner.tenant_id,
            user=owner.user_id,
            now_ms=now_ms,
            started_head=started_head,
            started_tail=started_tail,
            message_head=message_head,
            message_tail=message_tail,
            inline_bytes=_INLINE_HISTORY_BYTES,
            known_inc="" if known is None else known.inc,
            known_n=0 if known is None else len(known.entries),
            known_last="" if known is None else known.last_id,
            known_end=0 if known is None else known.text_bytes,
            n_meters=meters[0],
        )

    reply = yield from _claim(core, keys, claim)
    if int(reply[0]) == ThreadStatus.DONE:
        result = yield from _recorded_result(keys, thread_id, rid, text(reply[1]))
        return result

    claimed = _claimed(reply)
    thread = thread_from_fields(claimed.fields, owner, thread_id)
    if any(value is None for value in claimed.inline):  # the thread was deleted meanwhile
        raise status_error(ThreadStatus.NOT_FOUND)
    inc = claimed.fields.get("inc", "")
    inline: list[ConversationEntry] = []
    sizes: list[int] = []
    for value in claimed.inline:
        raw = value.encode() if isinstance(value, str) else value
        inline.append(entry_from_json(raw))
        sizes.append(len(raw))
    if claimed.known:  # the first claimed.known path entries are the ones named: not sent
        if known is None or claimed.known > len(known.entries) or inc != known.inc:
            raise ConversationError(Code.BACKEND_UNAVAILABLE, "run_claim: malformed reply")
        forked = claimed.known < len(known.entries)
        if forked:  # a turn on another branch: up to the fork
            known = known.prefix(claimed.known)
        # Only what the claim sent is new: the path held is not walked again, and the
        # tuple kept is the runner's history when all of it fit (one copy, not two).
        if forked or inline or claimed.path:
            held = core.history_cache.extend(keys.entries, known, claimed.path, inline, sizes)
            if len(held) != len(known.entries) + len(inline):
                held = known.entries + tuple(inline)
        else:  # the cache holds the whole path already (this process's last turn kept it)
            held = known.entries
    else:
        core.history_cache.keep(keys.entries, inc, claimed.path, inline, sizes)
        held = tuple(inline)
    rest = yield from _load_entries(keys, claimed.path[len(inline) :])
    history = held + tuple(rest)
    # (Counters of nothing are not touched: each inc takes the child's lock; on a thread
    # the process holds whole, two of the three are 0 on every turn.)
    if claimed.known:
        _HISTORY_HELD.inc(claimed.known)
    if inline:
        _HISTORY_SENT.inc(len(inline))
    if rest:
        _HISTORY_READ.inc(len(rest))
    state = TurnState(
        owner=owner,
        keys=keys,
        thread=thread,
        history=history,
        message=content,
        message_truncated=truncated,
        request_id=rid,
        leaf_id=leaf or None,
        base=claimed.base,
        token=token,
        fingerprint=digest,
        entry_count=claimed.entry_count,
        first_entry=claimed.first,
        run_options=options,
        stored_options=ledger_options,
        identity=identity,
        budget=None if core.run_limits is None else core.run_limits.budget(thread.usage),
        history_inc=inc,
    )
    started = core.monotonic()  # the wall-clock meter counts from here

    try:
        outcome = yield Handoff(state)
    except Exception as exc:
        state.closed = True
        if state.budget is not None:
            state.budget.charge_wall(int((core.monotonic() - started) * 1000))
        result = yield from _after_failure(core, state, exc)
        return result
    state.closed = True
    if state.budget is not None:
        if isinstance(outcome, RunnerReply) and outcome.usage:
            with contextlib.suppress(ConversationError):  # over: budget.exceeded says so
                state.budget.consume(outcome.usage)
        state.budget.charge_wall(int((core.monotonic() - started) * 1000))
        if state.budget.exceeded:
            result = yield from _abort_over_limit(core, state)
            return result
    if state.cancel_reason is not None:  # the runner returned after its cancellation
        result = yield from _abort_cancelled(core, state)
        return result
    reply_text = outcome.content if isinstance(outcome, RunnerReply) else outcome
    if not isinstance(reply_text, str):
        raise ConversationError(Code.RUNNER_FAILED, "the runner returned no text")
    result = yield from _commit(core, state, reply_text, None)
    return result


def _claim(
    core: ThreadsCore, keys: ThreadKeys, claim: Callable[[int], ScriptCall]
) -> Plan[Sequence[Any]]:
    """``run_claim`` until it claims (OK) or finds the request done (DONE); bounded waits
    while the thread is busy or the request's first attempt is still running.  Each poll
    is stamped with the clock of its own attempt (its opening rows' time)."""
    started = core.monotonic()
    delay = _POLL_FIRST_S
    for _ in range(_MAX_POLLS):
        reply: Sequence[Any] = yield claim(core.clock())
        status = int(reply[0])
        if status in (ThreadStatus.OK, ThreadStatus.DONE):
            return reply
        if status in (ThreadStatus.THREAD_BUSY, ThreadStatus.REQUEST_IN_PROGRESS):
            wait = core.busy_wait_s if status == ThreadStatus.THREAD_BUSY else core.inflight_wait_s
            if core.monotonic() + delay - started > wait:
                raise status_error(status)
            yield Sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)
            continue
        raise status_error(status, reply)
    raise status_error(ThreadStatus.THREAD_BUSY)


class _Claimed(NamedTuple):
    """run_claim's OK reply: the turn's place, the thread hash, the history path (a named
    tuple: one is built per continue, at half a frozen dataclass's cost)."""

    base: str
    entry_count: int  # the thread's entries so far
    first: int
    fields: dict[str, str]
    known: int  # the first path entries, root first, the claim named as held: not sent
    path: list[str]  # the path root -> base after those
    inline: Sequence[Any]  # entry JSON of path[: len(inline)] (None: missing)


def _claimed(reply: Sequence[Any]) -> _Claimed:
    n_fields = int(reply[4])
    at = 5 + n_fields
    n_path, n_known = int(reply[at]), int(reply[at + 1])
    if not 0 <= n_known <= n_path:
        raise ConversationError(Code.BACKEND_UNAVAILABLE, "run_claim: malformed reply")
    sent = n_path - n_known
    path = [text(x) for x in reply[at + 2 : at + 2 + sent]]
    inline = reply[at + 2 + sent :]
    if len(path) != sent or len(inline) > sent:
        raise ConversationError(Code.BACKEND_UNAVAILABLE, "run_claim: malformed reply")
    return _Claimed(
        base=text(reply[1]),
        entry_count=int(reply[2]),
        first=int(reply[3]),
        fields=pairs(reply[5:at]),
        known=n_known,
        path=path,
        inline=inline,
    )


def _template(row: Mapping[str, Any], slot: str) -> tuple[str, str]:
    """``row``'s JSON cut around its ``slot`` value (the first occurrence: the slot's key
    comes before any caller text): (before, after)."""
    head, found, tail = dumps(row).partition(dumps(slot))
    if not found:  # pragma: no cover - the row holds the slot
        raise AssertionError("opening row template")
    return head, tail


def _entry(value: Any) -> ConversationEntry:
    if value is None:  # the thread was deleted meanwhile
        raise status_error(ThreadStatus.NOT_FOUND)
    return entry_from_json(value)


def _after_failure(core: ThreadsCore, state: TurnState, exc: Exception) -> Plan[ContinueResult]:
    """Close a turn whose runner raised: over a limit, cancelled, denied or failed."""
    if _is_cancel(exc) and state.cancel_reason is None:
        state.cancel_reason = "caller"  # an emit saw run_cancel's mark
    if state.budget is not None and state.budget.exceeded:
        result = yield from _abort_over_limit(core, state)
        return result
    if state.cancel_reason is not None:
        result = yield from _abort_cancelled(core, state)
        return result
    if isinstance(exc, AgentDenied):
        result = yield from _commit(core, state, None, _denial_reason(exc))
        return result
    error = {
        "code": Code.RUNNER_FAILED.value,
        "errorType": type(exc).__name__,
        # The ledger says what was committed: nothing.  The user_message row's
        # entryId is discarded and never reused by a later turn.
        "entryIds": [],
        "discardedEntryIds": state.entry_ids(),
    }
    abort = yield _abort_call(core, state, "error", error, record="")
    status = int(abort[0])
    if status != ThreadStatus.OK:
        # The thread was deleted (delete wins) or the turn lost its lease.
        raise status_error(status) from exc
    raise ConversationError(
        Code.RUNNER_FAILED, f"the runner failed ({type(exc).__name__})"
    ) from exc


def _commit(
    core: ThreadsCore, state: TurnState, content: str | None, denied: str | None
) -> Plan[ContinueResult]:
    now = core.clock()
    entries: list[dict[str, Any]] = []
    events: list[tuple[str, dict[str, Any]]] = []
    if content is not None:
        reply_text = sanitized(content, limits.THREAD_MESSAGE_BYTES)
        user_id, asst_id = state.entry_ids()
        rid = state.request_id
        user = entry_row(
            user_id, state.base, "user", state.message, now, rid, state.message_truncated
        )
        assistant = entry_row(
            asst_id, user_id, "assistant", reply_text.text, now, rid, reply_text.truncated
        )
        entries = [user, assistant]
        events.append(
            ("assistant_message", message_event(asst_id, reply_text.text, reply_text.truncated))
        )
        finished: dict[str, Any] = {
            "requestId": rid,
            "leafId": asst_id,
            "entryIds": [user_id, asst_id],
        }
        if state.dropped:
            finished["eventsDropped"] = state.dropped
        if state.budget is not None:
            finished["usage"] = state.budget.used
        events.append(("agent_finished", finished))
        outcome = ContinueStatus.COMPLETED
        res: dict[str, Any] = {
            "status": outcome.value,
            "leafId": asst_id,
            "entryIds": [user_id, asst_id],
        }
        new_head = asst_id
    else:
        reason = sanitized(scrub_paths(denied or "denied"), 1024).text
        denied_row = {
            "requestId": state.request_id,
            "reason": reason,
            "entryIds": [],
            "discardedEntryIds": state.entry_ids(),
        }
        events.append(("agent_denied", denied_row))
        outcome = ContinueStatus.DENIED
        res = {"status": outcome.value, "reason": reason, "entryIds": []}
        new_head = ""
    done_record: dict[str, Any] = {"s": "done", "tok": state.token, "fp": state.fingerprint}
    done_record.update(at=now, res=res)
    if state.stored_options is not None:
        done_record["opt"] = state.stored_options
    if state.identity is not None:
        done_record["aid"] = state.identity.agent_id
    entry_json = [dumps(e) for e in entries]
    tail: list[str | int | bytes] = []
    for entry, encoded in zip(entries, entry_json, strict=True):
        tail += [entry["id"], entry["parentId"], encoded]
    tail += row_args(events)
    reply = yield thread_call(
        RUN_COMMIT,
        state.keys,
        tail=tail,
        marker=MARKER,
        token=state.token,
        request_id=state.request_id,
        now_ms=now,
        expected_count=state.entry_count,
        new_head=new_head,
        done_record=dumps(done_record),
        n_entries=len(entries),
        n_events=len(events),
        usage=state.usage_arg(),
    )
    status = int(reply[0])
    if status == ThreadStatus.CANCELLED:  # cancelled while the runner finished
        state.cancel_reason = state.cancel_reason or "caller"
        result = yield from _abort_cancelled(core, state)
        return result
    if status not in (ThreadStatus.OK, ThreadStatus.DONE):
        raise status_error(status)
    stored = tuple([entry_from_row(e) for e in entries])  # the rows just stored
    if status == ThreadStatus.OK and stored:
        _keep_own_entries(core, state, stored, entry_json)
    # Built without validation: every value is of its field's type right here (the
    # entries are models already); tests/threads/test_threads_service.py
    # (test_a_turn_result_is_the_validated_model) compares it with the validated result.
    return trusted(
        ContinueResult,
        {
            "thread_id": state.thread.id,
            "request_id": state.request_id,
            "status": outcome,
            "leaf_id": res.get("leafId"),
            "entries": stored,
            "reason": res.get("reason"),
        },
    )


def _keep_own_entries(
    core: ThreadsCore,
    state: TurnState,
    stored: tuple[ConversationEntry, ...],
    encoded: Sequence[str],
) -> None:
    """After a commit: the turn's entries continue the path its claim handed out, so the
    history cache keeps them too, and this process's next turn on the branch is sent no
    entry (it was sent back the two it had just written, and decoded them again).

    Only when the cache holds that whole path (its last entry is the turn's base, in the
    claim's incarnation), or the path was empty: run_commit then extends the thread's
    path text the same way (a chain off the base), which the next claim checks the
    cache against.  Anything else (the cache dropped the thread meanwhile, or holds
    another branch) keeps what the cache holds: the next claim is sent what it lacks."""
    cache, key = core.history_cache, state.keys.entries
    ids = [entry.id for entry in stored]
    sizes = [len(raw.encode("utf-8")) for raw in encoded]  # stored bytes, as a claim sends
    if not state.base:
        cache.keep(key, state.history_inc, ids, stored, sizes)
        return
    held = cache.known(key)
    if held is not None and held.inc == state.history_inc and held.last_id == state.base:
        cache.extend(key, held, ids, stored, sizes)


def _abort_call(
    core: ThreadsCore, state: TurnState, etype: str, data: Mapping[str, Any], record: str
) -> ScriptCall:
    return thread_call(
        RUN_ABORT,
        state.keys,
        marker=MARKER,
        token=state.token,
        request_id=state.request_id,
        now_ms=core.clock(),
        type=etype,
        data=dumps(data),
        record=record,
        usage=state.usage_arg(),
    )


def _abort_cancelled(core: ThreadsCore, state: TurnState) -> Plan[ContinueResult]:
    """Close a cancelled turn: nothing committed, a ``cancelled`` terminal row, and a
    ``cancelled`` run record (a retry with the same request id is a new run)."""
    data = {
        "requestId": state.request_id,
        "reason": state.cancel_reason,
        "entryIds": [],
        "discardedEntryIds": state.entry_ids(),
    }
    record = dumps(
        {"s": "cancelled", "tok": state.token, "fp": state.fingerprint, "at": core.clock()}
    )
    abort = yield _abort_call(core, state, "cancelled", data, record)
    status = int(abort[0])
    if status != ThreadStatus.OK:
        raise status_error(status)  # deleted meanwhile, or the lease was lost
    raise ConversationError(
        Code.RUN_CANCELLED,
        f"the run was cancelled ({state.cancel_reason}); nothing was committed",
        reason=state.cancel_reason,
    )


def _abort_over_limit(core: ThreadsCore, state: TurnState) -> Plan[ContinueResult]:
    """Close a turn that would have passed a shared run limit: nothing committed, an
    ``error`` row (``limit_exceeded``); what it consumed (within its allowance) is
    charged; the request id may be retried."""
    assert state.budget is not None and state.budget.exceeded
    meter = state.budget.exceeded
    data = {
        "code": Code.LIMIT_EXCEEDED.value,
        "limit": f"run:{meter}",
        "usage": state.budget.used,
        "entryIds": [],
        "discardedEntryIds": state.entry_ids(),
    }
    abort = yield _abort_call(core, state, "error", data, record="")
    status = int(abort[0])
    if status != ThreadStatus.OK:
        raise status_error(status)
    raise ConversationError(
        Code.LIMIT_EXCEEDED,
        f"the turn would pass the shared run limit {meter!r}; nothing was committed",
        limit=f"run:{meter}",
    )


def _recorded_result(
    keys: ThreadKeys, thread_id: str, request_id: str, record: str
) -> Plan[ContinueResult]:
    """The first result of a request, rebuilt from its run record and stored entries."""
    res = orjson.loads(record)["res"]
    ids = [str(i) for i in res.get("entryIds", [])]
    entries = yield from _load_entries(keys, ids)
    return ContinueResult(
        thread_id=thread_id,
        request_id=request_id,
        status=ContinueStatus(res["status"]),
        leaf_id=res.get("leafId"),
        entries=tuple(entries),
        reason=res.get("reason"),
    )


def _load_entries(keys: ThreadKeys, ids: Sequence[str]) -> Plan[list[ConversationEntry]]:
    entries: list[ConversationEntry] = []
    for start in range(0, len(ids), _HMGET_CHUNK):
        chunk = ids[start : start + _HMGET_CHUNK]
        values = yield Command("hmget", (keys.entries, *chunk))
        entries += [_entry(value) for value in values]
    return entries


# --- cancel --------------------------------------------------------------------------------


def cancel_run(
    core: ThreadsCore, owner: Ownership, thread_id: str, request_id: str
) -> Plan[CancelResult]:
    """Cancel a run by request id (owner-only, idempotent); see ``run_cancel``."""
    keys = thread_keys(core.keyspace, owner, thread_id)
    rid = valid_request_id(request_id, core.config.request_id_bytes)
    if rid is None:
        raise ConversationError(Code.INVALID_REQUEST, "requestId is required")
    data = {"requestId": rid, "reason": "abandoned", "entryIds": []}
    reply = yield thread_call(
        RUN_CANCEL,
        keys,
        marker=MARKER,
        request_id=rid,
        tenant=owner.tenant_id,
        user=owner.user_id,
        now_ms=core.clock(),
        data=dumps(data),
    )
    status = int(reply[0])
    if status == ThreadStatus.NOT_FOUND:
        raise ConversationError(Code.NOT_FOUND, "no such run on this conversation")
    if status == ThreadStatus.OK:
        state = CancelStatus.CANCELLING
    elif status == ThreadStatus.ENDED_CANCELLED:
        state = CancelStatus.CANCELLED
    else:
        state = CancelStatus(text(reply[1]))
    return CancelResult(thread_id=thread_id, request_id=rid, status=state)


# --- the ledger rows of a running turn (memtier.threads.runturn writes the runner's) ----------


def append_call(
    core: ThreadsCore,
    state: TurnState,
    events: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    seq: int,
) -> ScriptCall:
    return thread_call(
        EVENTS_APPEND,
        state.keys,
        tail=row_args(events),
        marker=MARKER,
        token=state.token,
        seq=seq,
        lease_ms=core.lease_ms,
        now_ms=core.clock(),
        request_id=state.request_id,
        n_events=len(events),
    )


def check_append(reply: Sequence[Any]) -> None:
    """An events_append reply: appended or a replayed batch, else the refusal's error."""
    status = int(reply[0])
    if status in (ThreadStatus.OK, ThreadStatus.EXISTED):
        return
    raise status_error(status)


def _is_cancel(exc: BaseException) -> bool:
    return isinstance(exc, TurnCancelled) or (
        isinstance(exc, ConversationError) and exc.code == Code.RUN_CANCELLED
    )


def _denial_reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return reason if isinstance(reason, str) and reason else "denied"
