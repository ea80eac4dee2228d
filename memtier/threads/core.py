"""The I/O-free core of the threads service: every operation a plan, shared by both shells.

Each public operation is a generator plan (:mod:`memtier.engine`) that yields what it
needs done -- a script call, a plain command, a batch of reads, a sleep, or the hand-off
of a claimed turn to the runner -- and receives the reply.  The shells
(:mod:`memtier.threads.service`, :mod:`memtier.threads.aio`) only drive the plans
through :class:`~memtier.executor.SyncExecutor` / :class:`~memtier.executor.AsyncExecutor`,
so validation, key building, ARGV, reply decoding, status -> error mapping, cursors,
paging and the continue protocol exist once and the two APIs cannot drift apart.

The concerns live in their own modules: :mod:`~memtier.threads.validation` (what
callers pass), :mod:`~memtier.threads.records` (the thread hash and entries),
:mod:`~memtier.threads.ledger` (event rows, replay, export), :mod:`~memtier.threads.turns`
(continue, cancel), :mod:`~memtier.threads.runturn` (the run-turn protocol),
:mod:`~memtier.threads.specs` (script inputs) and :mod:`~memtier.threads.status` (the
scripts' status convention).  This module holds the lifecycle operations of a thread.
"""

from __future__ import annotations

import re
import secrets
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from memtier import limits
from memtier.config import ThreadsConfig
from memtier.engine import Batch, Command, Plan
from memtier.errors import ConfigurationError, ConversationError, ErrorCode
from memtier.keys import ThreadKeys, ThreadKeyspace
from memtier.threads import ledger, turns
from memtier.threads.cursor import CursorCodec, CursorKind
from memtier.threads.historycache import HistoryCache
from memtier.threads.models import (
    MARKER,
    AgentIdentity,
    CancelResult,
    ContinueResult,
    ConversationThread,
    DeleteResult,
    ExportResult,
    Ownership,
    ReplayPage,
    ThreadPage,
)
from memtier.threads.records import pairs, text, thread_from_fields, thread_of
from memtier.threads.runlimits import RunLimits
from memtier.threads.runoptions import check_schema
from memtier.threads.servedrows import ServedRows
from memtier.threads.specs import ARCHIVE, BRANCH, CREATE, DELETE, HOLD, thread_call
from memtier.threads.status import ThreadStatus, status_error
from memtier.threads.turns import TurnCancelled, TurnState
from memtier.threads.validation import (
    create_thread_id,
    fingerprint,
    metadata_json,
    owner_keys,
    page_size,
    thread_keys,
    title_text,
    valid_entry_id,
    valid_request_id,
    valid_version,
)

__all__ = [
    "REQUEST_ID_NAMESPACE",
    "ThreadStatus",
    "ThreadsCore",
    "TurnCancelled",
    "TurnState",
]

Code = ErrorCode

# Ids derived from a create's requestId: RFC 4122 version-5 UUIDs (SHA-1, name = the
# request id's UTF-8 bytes) under this fixed namespace (docs/threads.md), itself
# uuid5(NAMESPACE_URL, "https://memtier.dev/threads/create-request-id").
REQUEST_ID_NAMESPACE: Final = uuid.uuid5(
    uuid.NAMESPACE_URL, "https://memtier.dev/threads/create-request-id"
)
_INDEX_MEMBER_RE: Final = re.compile(r"^\d{20}\|[A-Za-z0-9_.\-]{1,128}\Z")
# A retried delete finds its own lost first attempt by a token remembered this long.
_RECENT_DELETE_MS: Final = 10 * 60 * 1000
_RECENT_DELETES_MAX: Final = 1_000


class ThreadsCore:
    """Everything the threads service does that is not I/O.

    ``config`` carries the frozen limits (hosts may only lower them).  ``clock``
    returns epoch milliseconds (tests drive it); ``cursor_secret`` is the HMAC
    key of cursors (``None``: one random secret per namespace, created in Redis
    on first use, so every process of a deployment shares it).
    """

    def __init__(
        self,
        namespace: str,
        config: ThreadsConfig,
        *,
        clock: Callable[[], int] | None = None,
        monotonic: Callable[[], float] | None = None,
        cursor_secret: bytes | str | None = None,
        lease_ms: int = limits.THREAD_LEASE_MS,
        busy_wait_s: float = 5.0,
        inflight_wait_s: float = 30.0,
        run_options_schema: Any = None,
        run_limits: RunLimits | None = None,
    ) -> None:
        if not 1_000 <= lease_ms <= 10 * limits.THREAD_LEASE_MS:
            raise ValueError(f"lease_ms must be within 1000..{10 * limits.THREAD_LEASE_MS}")
        for name, wait in (("busy_wait_s", busy_wait_s), ("inflight_wait_s", inflight_wait_s)):
            if not 0 <= wait <= limits.THREAD_WAIT_CEILING_S:
                raise ValueError(f"{name} must be within 0..{limits.THREAD_WAIT_CEILING_S}")
        self.config = config
        self.keyspace = ThreadKeyspace(namespace)
        self.clock = clock or (lambda: time.time_ns() // 1_000_000)
        self.monotonic = monotonic or time.monotonic
        self.lease_ms = lease_ms
        self.busy_wait_s = busy_wait_s
        self.inflight_wait_s = inflight_wait_s
        self.run_options_schema = check_schema(run_options_schema)
        if run_limits is not None and not isinstance(run_limits, RunLimits):
            raise ConfigurationError("run_limits must be a RunLimits")
        self.run_limits = run_limits
        # decoded history entries, by their bytes, within the config's bounds
        self.history_cache = HistoryCache(config.history_cache_bytes, config.history_cache_threads)
        self.served_rows = ServedRows()  # what ledger rows were served as, by their data
        self._codec: CursorCodec | None = None
        if cursor_secret is not None:
            raw = cursor_secret.encode("utf-8") if isinstance(cursor_secret, str) else cursor_secret
            self._codec = CursorCodec(raw, max_bytes=config.cursor_bytes)

    def thread_keys(self, owner: Ownership, thread_id: str) -> ThreadKeys:
        """The keys of one of ``owner``'s threads (an impossible id: ``not_found``)."""
        return thread_keys(self.keyspace, owner, thread_id)

    # --- cursor secret ---------------------------------------------------------------------

    def codec(self) -> Plan[CursorCodec]:
        if self._codec is None:
            key = self.keyspace.cursor_secret
            yield Command("set", (key, secrets.token_hex(32)), {"nx": True})
            stored = yield Command("get", (key,))
            if stored is None:  # pragma: no cover - someone deleted it between the two calls
                raise ConversationError(Code.BACKEND_UNAVAILABLE, "cursor secret unavailable")
            self._codec = CursorCodec(
                text(stored).encode("utf-8"), max_bytes=self.config.cursor_bytes
            )
        return self._codec

    # --- create / get / list ---------------------------------------------------------------

    def create(
        self,
        owner: Ownership,
        *,
        title: str | None = None,
        thread_id: str | None = None,
        request_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Plan[ConversationThread]:
        thread, _ = yield from self.create_or_get(
            owner, title=title, thread_id=thread_id, request_id=request_id, metadata=metadata
        )
        return thread

    def create_or_get(
        self,
        owner: Ownership,
        *,
        title: str | None = None,
        thread_id: str | None = None,
        request_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Plan[tuple[ConversationThread, bool]]:
        """``(thread, created)``: get-or-create when an id is given or derived."""
        okeys = owner_keys(self.keyspace, owner)
        clean_title = title_text(title, self.config.title_bytes)
        rid = valid_request_id(request_id, self.config.request_id_bytes)
        meta = metadata_json(metadata)
        if thread_id is not None:
            tid = create_thread_id(thread_id)
        elif rid is not None:
            # Idempotent without an explicit id: the id derives from the request id.
            tid = f"conv_{uuid.uuid5(REQUEST_ID_NAMESPACE, rid)}"
        else:
            tid = f"conv_{uuid.uuid4()}"
        keys = okeys.thread(tid)
        if thread_id is not None or rid is not None:
            # Get-or-create (spec): an existing thread is returned unchanged, whatever
            # this body says.  Only when the row appears between this read and the
            # create-only write below (a true create+create race) is there a loser.
            raw = yield Command("hgetall", (keys.thread,))
            if raw:
                try:
                    return thread_of(raw, owner, tid), False
                except ConversationError:
                    pass  # not a live thread of this owner: the create-only write decides
        now = self.clock()
        reply = yield thread_call(
            CREATE,
            keys,
            owner=okeys,
            marker=MARKER,
            thread_id=tid,
            tenant=owner.tenant_id,
            user=owner.user_id,
            now_ms=now,
            has_title="0" if clean_title is None else "1",
            title=clean_title or "",
            metadata=meta,
            fingerprint=fingerprint([clean_title, meta, rid]),
            index_member=f"{now:020d}|{tid}",
            max_threads=limits.THREADS_PER_OWNER,
        )
        if int(reply[0]) == ThreadStatus.METADATA_CONFLICT:
            raise ConversationError(
                Code.METADATA_CONFLICT,
                "a concurrent create of this id won the race; get the thread (do not retry)",
            )
        status, thread = _thread_reply(reply, owner, tid, (ThreadStatus.OK, ThreadStatus.EXISTED))
        return thread, status == ThreadStatus.OK

    def get(self, owner: Ownership, thread_id: str) -> Plan[ConversationThread]:
        keys = self.thread_keys(owner, thread_id)
        raw = yield Command("hgetall", (keys.thread,))
        return thread_of(raw, owner, thread_id)

    def list_threads(
        self, owner: Ownership, *, cursor: str | None = None, limit: int | None = None
    ) -> Plan[ThreadPage]:
        okeys = owner_keys(self.keyspace, owner)
        n = page_size(limit, self.config.list_page)
        start = "+"
        if cursor is not None:
            codec = yield from self.codec()
            position = codec.decode(
                cursor, CursorKind.LIST, tenant=owner.tenant_id, user=owner.user_id
            )
            if not _INDEX_MEMBER_RE.match(position):
                raise ConversationError(Code.INVALID_CURSOR, "invalid cursor")
            start = "(" + position
        found = yield Command(
            "zrange",
            (okeys.index, start, "-"),
            {"desc": True, "bylex": True, "offset": 0, "num": n + 1},
        )
        members = [text(m) for m in found]
        more = len(members) > n
        members = members[:n]
        ids = [m.split("|", 1)[1] for m in members]
        items: list[ConversationThread] = []
        if ids:
            hashes = yield Batch(
                tuple(Command("hgetall", (okeys.thread(tid).thread,)) for tid in ids)
            )
            for tid, raw in zip(ids, hashes, strict=True):
                try:
                    items.append(thread_of(raw, owner, tid))
                except ConversationError:
                    continue  # deleted between the index read and this one
        next_cursor = None
        if more:
            codec = yield from self.codec()
            next_cursor = codec.encode(
                CursorKind.LIST, members[-1], tenant=owner.tenant_id, user=owner.user_id
            )
        return ThreadPage(items=tuple(items), next_cursor=next_cursor)

    # --- branch / archive / hold / delete ------------------------------------------------------

    def branch(
        self,
        owner: Ownership,
        thread_id: str,
        leaf_id: str,
        *,
        expected_version: int | None = None,
    ) -> Plan[ConversationThread]:
        keys = self.thread_keys(owner, thread_id)
        leaf = valid_entry_id(leaf_id)
        version = yield from self._expected_version(keys, owner, thread_id, expected_version)
        reply = yield thread_call(
            BRANCH,
            keys,
            marker=MARKER,
            leaf_id=leaf,
            expected_version=version,
            max_branches=self.config.max_active_branches,
            now_ms=self.clock(),
            tenant=owner.tenant_id,
            user=owner.user_id,
        )
        _, thread = _thread_reply(reply, owner, thread_id, (ThreadStatus.OK, ThreadStatus.EXISTED))
        return thread

    def archive(
        self, owner: Ownership, thread_id: str, *, expected_version: int | None = None
    ) -> Plan[ConversationThread]:
        keys = self.thread_keys(owner, thread_id)
        version = yield from self._expected_version(keys, owner, thread_id, expected_version)
        reply = yield thread_call(
            ARCHIVE,
            keys,
            marker=MARKER,
            expected_version=version,
            now_ms=self.clock(),
            tenant=owner.tenant_id,
            user=owner.user_id,
        )
        _, thread = _thread_reply(reply, owner, thread_id, (ThreadStatus.OK, ThreadStatus.EXISTED))
        return thread

    def _expected_version(
        self, keys: ThreadKeys, owner: Ownership, thread_id: str, given: int | None
    ) -> Plan[int]:
        """The caller's version, or the one of a fresh snapshot (the CAS compares against it)."""
        if given is not None:
            return valid_version(given)
        raw = yield Command("hgetall", (keys.thread,))
        return thread_of(raw, owner, thread_id).version

    def set_legal_hold(
        self, owner: Ownership, thread_id: str, held: bool
    ) -> Plan[ConversationThread]:
        keys = self.thread_keys(owner, thread_id)
        reply = yield thread_call(
            HOLD,
            keys,
            marker=MARKER,
            held="1" if held else "0",
            tenant=owner.tenant_id,
            user=owner.user_id,
        )
        _, thread = _thread_reply(reply, owner, thread_id, (ThreadStatus.OK,))
        return thread

    def delete(self, owner: Ownership, thread_id: str) -> Plan[DeleteResult]:
        okeys = owner_keys(self.keyspace, owner)
        keys = self.thread_keys(owner, thread_id)
        # Every attempt of this call carries one token: a retry after a lost reply learns
        # from the recent-deletes set that its first attempt deleted the thread (DONE), and
        # never claims a delete that did not happen (a missing or another owner's thread).
        reply = yield thread_call(
            DELETE,
            keys,
            owner=okeys,
            marker=MARKER,
            tenant=owner.tenant_id,
            user=owner.user_id,
            thread_id=thread_id,
            token=secrets.token_hex(16),
            now_ms=self.clock(),
            keep_ms=_RECENT_DELETE_MS,
            keep_max=_RECENT_DELETES_MAX,
        )
        status = int(reply[0])
        if status == ThreadStatus.HELD:
            return DeleteResult(deleted=False, held=True)
        if status not in (ThreadStatus.OK, ThreadStatus.DONE):
            raise status_error(status)
        return DeleteResult(deleted=True, held=False)

    # --- the ledger and the continue protocol (their own modules) ------------------------------

    def replay(
        self,
        owner: Ownership,
        thread_id: str,
        *,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Plan[ReplayPage]:
        return ledger.replay(self, owner, thread_id, cursor, limit)

    def export(
        self, owner: Ownership, thread_id: str, *, cursor: str | None = None
    ) -> Plan[ExportResult]:
        return ledger.export(self, owner, thread_id, cursor)

    def continue_(
        self,
        owner: Ownership,
        thread_id: str,
        message: str,
        *,
        request_id: str | None = None,
        leaf_id: str | None = None,
        run_options: Mapping[str, Any] | None = None,
        identity: AgentIdentity | None = None,
    ) -> Plan[ContinueResult]:
        return turns.continue_(
            self,
            owner,
            thread_id,
            message,
            request_id=request_id,
            leaf_id=leaf_id,
            run_options=run_options,
            identity=identity,
        )

    def cancel_run(self, owner: Ownership, thread_id: str, request_id: str) -> Plan[CancelResult]:
        return turns.cancel_run(self, owner, thread_id, request_id)


def _thread_reply(
    reply: Sequence[Any], owner: Ownership, thread_id: str, ok: Iterable[int]
) -> tuple[int, ConversationThread]:
    """``{ status, hgetall... }`` -> (status, thread); a status not in ``ok`` raises."""
    status = int(reply[0])
    if status not in set(ok):
        raise status_error(status, reply)
    return status, thread_from_fields(pairs(reply[1:]), owner, thread_id)
