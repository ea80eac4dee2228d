"""The I/O-free core of the threads service, shared by the sync and asyncio services.

Every operation is written once, as a generator (a "sans-I/O flow") that
*yields* what it needs done -- a script call, a plain Redis command, a batch of
reads, a sleep, or the runner call -- and receives the reply.  The two
services only execute those requests (:mod:`memtier.threads.service` with
redis-py's sync client, :mod:`memtier.threads.aio` with its asyncio client),
each with the same bounded retries.  So validation, key building, ARGV
encoding, reply decoding, status -> error mapping, cursor handling, paging and
the continue protocol (claim, wait, run, commit or abort) exist exactly once,
and the two APIs cannot drift apart.

Status codes of the scripts (:class:`ThreadStatus`) are listed in
``lua/includes/thread_common.lua`` and in every script's header.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import secrets
import time
import uuid
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Final, TypeAlias, TypeVar

import orjson

from memtier import limits
from memtier.config import ThreadsConfig
from memtier.errors import (
    ConfigurationError,
    ConversationError,
    ConversationErrorCode,
    MemtierError,
)
from memtier.errors import (
    ValidationError as MemtierValidationError,
)
from memtier.keys import THREAD_ID_RE, OwnerKeys, ThreadKeys, ThreadKeyspace
from memtier.redaction import (
    SanitizedText,
    contains_secret,
    redact_json,
    redact_text,
    sanitize,
)
from memtier.threads.cursor import CursorCodec, CursorKind
from memtier.threads.models import (
    MARKER,
    RESERVED_EVENT_TYPES,
    TERMINAL_EVENT_TYPES,
    AgentIdentity,
    BranchRef,
    CancelResult,
    CancelStatus,
    ContinueResult,
    ContinueStatus,
    ConversationEntry,
    ConversationThread,
    DeleteResult,
    EntryRole,
    EventRecord,
    ExportResult,
    Ownership,
    ReplayPage,
    ThreadPage,
    ThreadState,
    check_identity,
    ms_to_datetime,
)
from memtier.threads.runlimits import USAGE_EVENT, RunLimits, TurnBudget
from memtier.threads.runner import RunnerEvent, RunnerReply
from memtier.threads.runoptions import check_schema, validate_run_options

__all__ = [
    "BatchOp",
    "CommandOp",
    "Flow",
    "Op",
    "RunOp",
    "ScriptOp",
    "SleepOp",
    "ThreadStatus",
    "ThreadsCore",
    "TurnCancelled",
    "TurnState",
]

T = TypeVar("T")
Code = ConversationErrorCode


class ThreadStatus(IntEnum):
    """Outcomes of the thread scripts (mirrors ``lua/includes/thread_common.lua``)."""

    OK = 0
    EXISTED = 1  # create: same create already done; branch: already a ref; archive: no-op
    ENDED_CANCELLED = 2  # run_cancel: the run already ended cancelled
    DONE = 3  # run_claim/run_commit: this request's run is already recorded
    CLAIMED = 4
    NOT_FOUND = -1
    METADATA_CONFLICT = -2
    THREAD_ARCHIVED = -3
    BRANCH_LIMIT = -4
    UNKNOWN_LEAF = -5
    LIMIT_EXCEEDED = -6
    THREAD_BUSY = -7
    REQUEST_IN_PROGRESS = -8
    REQUEST_CONFLICT = -9
    LEASE_LOST = -10
    CANCELLED = -11


_STATUS_ERRORS: Final[dict[int, tuple[ConversationErrorCode, str]]] = {
    ThreadStatus.NOT_FOUND: (Code.NOT_FOUND, "conversation not found"),
    ThreadStatus.METADATA_CONFLICT: (
        Code.METADATA_CONFLICT,
        "the thread changed concurrently (version conflict); re-read and retry",
    ),
    ThreadStatus.THREAD_ARCHIVED: (Code.THREAD_ARCHIVED, "the thread is archived"),
    ThreadStatus.BRANCH_LIMIT: (Code.BRANCH_LIMIT, "the thread has its maximum of branches"),
    ThreadStatus.UNKNOWN_LEAF: (Code.UNKNOWN_LEAF, "leafId is not known on this thread"),
    ThreadStatus.LIMIT_EXCEEDED: (Code.LIMIT_EXCEEDED, "a thread limit would be exceeded"),
    ThreadStatus.THREAD_BUSY: (
        Code.THREAD_BUSY,
        "another continue is running on this thread; retry when it finished",
    ),
    ThreadStatus.REQUEST_IN_PROGRESS: (
        Code.REQUEST_IN_PROGRESS,
        "this requestId is still running; retry to get its result",
    ),
    ThreadStatus.REQUEST_CONFLICT: (
        Code.REQUEST_CONFLICT,
        "this requestId was already used for a different message or leaf",
    ),
    ThreadStatus.CANCELLED: (
        Code.RUN_CANCELLED,
        "the run was cancelled; nothing was committed (a retry is a new run)",
    ),
    ThreadStatus.LEASE_LOST: (
        Code.THREAD_BUSY,
        "the turn lost its lease on the thread before it was recorded; retry",
    ),
}

# --- the operations a flow yields ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScriptOp:
    """Run one Lua script of ``lua/threads``; ``attempts`` (if given) counts tries."""

    script: str
    keys: tuple[str, ...]
    args: tuple[str | int | bytes, ...]
    attempts: list[int] | None = None


@dataclass(frozen=True, slots=True)
class CommandOp:
    """One redis-py client method call (reads, and SET NX of the cursor secret)."""

    method: str
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class BatchOp:
    """Several read commands in one non-transactional pipeline (one slot)."""

    commands: tuple[CommandOp, ...]


@dataclass(frozen=True, slots=True)
class SleepOp:
    seconds: float


@dataclass(frozen=True, slots=True)
class RunOp:
    """Call the runner for a claimed turn; the reply is a RunnerReply (or the runner's error)."""

    turn: TurnState


Op: TypeAlias = ScriptOp | CommandOp | BatchOp | SleepOp | RunOp
Flow: TypeAlias = Generator[Op, Any, T]

# --- fixed protocol constants --------------------------------------------------------------------

_HMGET_CHUNK: Final = 500  # entries read per HMGET when rebuilding history
_POLL_FIRST_S: Final = 0.02  # first wait before re-trying a busy thread / in-flight duplicate
_POLL_MAX_S: Final = 0.5  # ... doubling up to this
_MAX_POLLS: Final = 2_000  # hard cap on claim attempts (300 s / 0.5 s plus the ramp)
_EVENT_TYPE_RE: Final = re.compile(r"^[a-z][a-z0-9_.]{0,63}\Z")
_ENTRY_ID_RE: Final = THREAD_ID_RE
_STREAM_ID_RE: Final = re.compile(r"^\d{1,20}-\d{1,20}\Z")
_LEDGER_START: Final = "0-0"  # before every row: "(0-0" reads from the start
_INDEX_MEMBER_RE: Final = re.compile(r"^\d{20}\|[A-Za-z0-9_.\-]{1,128}\Z")
_ENTRIES_PER_TURN: Final = 2
# Closing rows of a turn besides the runner's: agent_started, user_message,
# assistant_message, agent_finished (or agent_denied / error).
_SERVICE_EVENTS_PER_TURN: Final = 4
_TURN_EVENTS: Final = limits.THREAD_EVENTS_PER_TURN + _SERVICE_EVENTS_PER_TURN
# Upper bound of the bytes one turn can add (reserved by run_claim): two entries and two
# message events of at most THREAD_MESSAGE_BYTES each (+ JSON envelope), runner events.
_ENVELOPE_BYTES: Final = 1024
_EXPORT_ENVELOPE_BYTES: Final = 512  # export JSON around the thread and events (cursor incl.)
_TURN_BYTES: Final = 4 * (limits.THREAD_MESSAGE_BYTES + _ENVELOPE_BYTES) + (
    limits.THREAD_EVENTS_PER_TURN * (limits.THREAD_EVENT_BYTES + 64 + _ENVELOPE_BYTES)
)

# Runner event data: keys whose values are raw payloads are omitted (summaries only).
RAW_PAYLOAD_KEYS: Final = frozenset(
    {
        "raw",
        "payload",
        "rawinput",
        "rawoutput",
        "rawpayload",
        "arguments",
        "args",
        "input",
        "output",
        "stdout",
        "stderr",
        "body",
    }
)
# Absolute local paths (POSIX roots where users' files live, Windows drives, ~/, file://).
_LOCAL_PATH_RE: Final = re.compile(
    r"(?:file://[^\s\"'<>]{1,4096}+"
    r"|(?<![\w.:/~-])(?:/(?:home|Users|root|tmp|var|etc|opt|srv|mnt|media|private|usr"
    r"|Library|Volumes|proc|run|workspace|work|data|app)(?:/[^\s\"'<>|:]{0,4096}+)?"
    r"|~/[^\s\"'<>|:]{0,4096}+"
    r"|[A-Za-z]:\\[^\s\"'<>|]{0,4096}+))"
)
PATH_PLACEHOLDER: Final = "[PATH]"

# Ids derived from a create's requestId: RFC 4122 version-5 UUIDs (SHA-1, name = the
# request id's UTF-8 bytes) under this fixed namespace (docs/threads.md), itself
# uuid5(NAMESPACE_URL, "https://memtier.dev/threads/create-request-id").
REQUEST_ID_NAMESPACE: Final = uuid.uuid5(
    uuid.NAMESPACE_URL, "https://memtier.dev/threads/create-request-id"
)
# The grammar of an id given to create: 1..128 of [A-Za-z0-9_.-], not starting with "."
# (so never "." or "..", which clients normalise away in URLs), and not a route segment
# of the HTTP API (``{base}/openapi.json`` would shadow ``GET {base}/{id}``).
CREATE_ID_RE: Final = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.\-]{0,127}\Z")
RESERVED_THREAD_IDS: Final = frozenset(
    {"openapi.json", "events", "continue", "branch", "archive", "export", "docs", "redoc"}
)
# A retried delete finds its own lost first attempt by a token remembered this long.
_RECENT_DELETE_MS: Final = 10 * 60 * 1000
_RECENT_DELETES_MAX: Final = 1_000


def _s(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def _json(value: Any) -> str:
    return orjson.dumps(value).decode("utf-8")


def _sha256(value: Any) -> str:
    return hashlib.sha256(orjson.dumps(value)).hexdigest()


def _utf8_len(text: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ConversationError(Code.INVALID_REQUEST, "text is not valid Unicode") from None


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {_s(flat[i]): _s(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


def scrub_paths(text: str) -> str:
    """Replace absolute local paths (and file:// URLs) with ``[PATH]``."""
    return _LOCAL_PATH_RE.sub(PATH_PLACEHOLDER, text)


class TurnCancelled(Exception):
    """Raised by the shells into the continue flow when they cancelled the runner."""


@dataclass
class TurnState:
    """Everything about one claimed turn that the service shells need while the runner runs."""

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
    identity: AgentIdentity | None = None
    budget: TurnBudget | None = None  # shared run limits: allowance and consumption
    seq: int = 1  # emit batches; 1 = the agent_started batch
    kept: int = 0
    dropped: int = 0
    closed: bool = False
    # Why the shells stopped the runner: "caller" (run_cancel), "shutdown", "lease_lost".
    cancel_reason: str | None = None
    started_at: float = field(default_factory=time.perf_counter)


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
        self._codec: CursorCodec | None = None
        if cursor_secret is not None:
            raw = cursor_secret.encode("utf-8") if isinstance(cursor_secret, str) else cursor_secret
            self._codec = CursorCodec(raw, max_bytes=config.cursor_bytes)

    # --- validation (before any I/O) -------------------------------------------------------------

    def owner_keys(self, owner: Ownership) -> OwnerKeys:
        if not isinstance(owner, Ownership):
            raise ConversationError(Code.INVALID_REQUEST, "ownership must be an Ownership")
        return self.keyspace.owner(owner.tenant_id, owner.user_id)

    def thread_keys(self, owner: Ownership, thread_id: str) -> ThreadKeys:
        okeys = self.owner_keys(owner)
        if not isinstance(thread_id, str) or not THREAD_ID_RE.match(thread_id):
            # Not a possible id, so certainly not one of the caller's threads.
            raise ConversationError(Code.NOT_FOUND, "conversation not found")
        return okeys.thread(thread_id)

    def _page_size(self, limit: int | None, ceiling: int) -> int:
        if limit is None:
            return ceiling
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConversationError(Code.INVALID_REQUEST, "limit must be a positive integer")
        if limit > ceiling:
            raise ConversationError(
                Code.LIMIT_EXCEEDED, f"limit must not exceed {ceiling}", limit=ceiling
            )
        return limit

    def _request_id(self, request_id: str | None) -> str | None:
        if request_id is None:
            return None
        if not isinstance(request_id, str) or not request_id:
            raise ConversationError(Code.INVALID_REQUEST, "requestId must be a non-empty string")
        cap = self.config.request_id_bytes
        if _utf8_len(request_id) > cap:
            raise ConversationError(
                Code.LIMIT_EXCEEDED, f"requestId longer than {cap} bytes", limit=cap
            )
        if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in request_id):
            raise ConversationError(Code.INVALID_REQUEST, "requestId contains control characters")
        if contains_secret(request_id):
            raise ConversationError(Code.INVALID_REQUEST, "requestId looks like a credential")
        return request_id

    def _entry_id(self, leaf_id: str, what: str = "leafId") -> str:
        if not isinstance(leaf_id, str) or not _ENTRY_ID_RE.match(leaf_id):
            raise ConversationError(Code.INVALID_REQUEST, f"{what} is not a valid entry id")
        return leaf_id

    def _title(self, title: str | None) -> str | None:
        if title is None:
            return None
        if not isinstance(title, str):
            raise ConversationError(Code.INVALID_REQUEST, "title must be a string")
        cap = self.config.title_bytes
        if _utf8_len(title) > cap:
            raise ConversationError(
                Code.LIMIT_EXCEEDED, f"title longer than {cap} bytes", limit=cap
            )
        return self._sanitize(title, cap).text

    def _metadata(self, metadata: Mapping[str, Any] | None) -> str:
        if metadata is None:
            return "{}"
        if not isinstance(metadata, Mapping):
            raise ConversationError(Code.INVALID_REQUEST, "metadata must be a JSON object")
        try:
            encoded = orjson.dumps(dict(metadata))
        except (TypeError, orjson.JSONEncodeError) as exc:
            raise ConversationError(Code.INVALID_REQUEST, f"metadata is not JSON: {exc}") from None
        cap = limits.THREAD_METADATA_BYTES
        if len(encoded) > cap:
            raise ConversationError(
                Code.LIMIT_EXCEEDED, f"metadata longer than {cap} bytes as JSON", limit=cap
            )
        try:
            redacted, _ = redact_json(orjson.loads(encoded), max_depth=32)
        except MemtierValidationError as exc:
            raise ConversationError(Code.INVALID_REQUEST, f"metadata: {exc.message}") from None
        return _json(redacted)

    def _message(self, message: str) -> tuple[str, bool]:
        if not isinstance(message, str) or not message.strip():
            raise ConversationError(Code.INVALID_REQUEST, "message must be a non-empty string")
        cap = limits.THREAD_MESSAGE_BYTES
        if _utf8_len(message) > cap:
            raise ConversationError(
                Code.LIMIT_EXCEEDED, f"message longer than {cap} bytes", limit=cap
            )
        done = self._sanitize(message, cap)
        return done.text, done.truncated

    @staticmethod
    def _sanitize(text: str, cap: int) -> SanitizedText:
        try:
            return sanitize(text, cap)
        except MemtierValidationError as exc:
            raise ConversationError(Code.INVALID_REQUEST, exc.message) from None

    # --- decoding --------------------------------------------------------------------------------

    def thread_from_fields(
        self, fields: Mapping[str, str], owner: Ownership, thread_id: str
    ) -> ConversationThread:
        """A stored thread hash -> model; anything not this owner's thread is not-found."""
        if (
            fields.get("marker") != MARKER
            or fields.get("id") != thread_id
            or fields.get("tenant") != owner.tenant_id
            or fields.get("user") != owner.user_id
        ):
            raise ConversationError(Code.NOT_FOUND, "conversation not found")
        branches = tuple(
            BranchRef(leaf_id=str(ref["leafId"]), created_at=ms_to_datetime(int(ref["createdAt"])))
            for ref in (orjson.loads(fields.get("branches") or "[]") or [])
        )
        title = fields.get("title")
        try:
            metadata = served_json(orjson.loads(fields.get("metadata") or "{}"), scrub=False)
        except (MemtierValidationError, orjson.JSONDecodeError):
            metadata = {}  # a row written by hand beyond the bounds: never served as is
        if not isinstance(metadata, dict):
            metadata = {}
        return ConversationThread(
            id=thread_id,
            title=None if title is None else served_text(title, scrub=False),
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
            usage=_usage(fields),
        )

    def _thread_from_hgetall(
        self, raw: Mapping[Any, Any] | None, owner: Ownership, thread_id: str
    ) -> ConversationThread:
        fields = {_s(k): _s(v) for k, v in (raw or {}).items()}
        return self.thread_from_fields(fields, owner, thread_id)

    def _status_error(self, status: int, reply: Sequence[Any] = ()) -> ConversationError:
        code, message = _STATUS_ERRORS.get(status, (Code.BACKEND_UNAVAILABLE, "unexpected reply"))
        details: dict[str, Any] = {}
        if status == ThreadStatus.LIMIT_EXCEEDED and len(reply) > 1:
            details["limit"] = _s(reply[1])
        return ConversationError(code, message, **details)

    def _thread_reply(
        self, reply: Sequence[Any], owner: Ownership, thread_id: str, ok: Iterable[int]
    ) -> tuple[int, ConversationThread]:
        status = int(reply[0])
        if status not in set(ok):
            raise self._status_error(status, reply)
        return status, self.thread_from_fields(_pairs(reply[1:]), owner, thread_id)

    @staticmethod
    def entry_from_json(raw: str | bytes) -> ConversationEntry:
        data = orjson.loads(raw)
        return ConversationEntry(
            id=data["id"],
            parent_id=data.get("parentId") or None,
            role=EntryRole(data["role"]),
            content=data["content"],
            created_at=ms_to_datetime(int(data["createdAt"])),
            request_id=data.get("requestId"),
            truncated=True if data.get("truncated") else None,
        )

    # --- cursor secret ---------------------------------------------------------------------------

    def codec(self) -> Flow[CursorCodec]:
        if self._codec is None:
            key = self.keyspace.cursor_secret
            yield CommandOp("set", (key, secrets.token_hex(32)), (("nx", True),))
            stored = yield CommandOp("get", (key,))
            if stored is None:  # pragma: no cover - someone deleted it between the two calls
                raise ConversationError(Code.BACKEND_UNAVAILABLE, "cursor secret unavailable")
            self._codec = CursorCodec(
                _s(stored).encode("utf-8"), max_bytes=self.config.cursor_bytes
            )
        return self._codec

    # --- create / get / list ---------------------------------------------------------------------

    def create(
        self,
        owner: Ownership,
        *,
        title: str | None = None,
        thread_id: str | None = None,
        request_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Flow[ConversationThread]:
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
    ) -> Flow[tuple[ConversationThread, bool]]:
        """``(thread, created)``: get-or-create when an id is given or derived."""
        okeys = self.owner_keys(owner)
        clean_title = self._title(title)
        rid = self._request_id(request_id)
        meta = self._metadata(metadata)
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
            raw = yield CommandOp("hgetall", (keys.thread,))
            if raw:
                try:
                    return self._thread_from_hgetall(raw, owner, tid), False
                except ConversationError:
                    pass  # not a live thread of this owner: the create-only write decides
        now = self.clock()
        fingerprint = _sha256([clean_title, meta, rid])
        reply = yield ScriptOp(
            "create",
            (keys.thread, okeys.index),
            (
                MARKER,
                tid,
                owner.tenant_id,
                owner.user_id,
                now,
                "0" if clean_title is None else "1",
                clean_title or "",
                meta,
                fingerprint,
                f"{now:020d}|{tid}",
                limits.THREADS_PER_OWNER,
            ),
        )
        if int(reply[0]) == ThreadStatus.METADATA_CONFLICT:
            raise ConversationError(
                Code.METADATA_CONFLICT,
                "a concurrent create of this id won the race; get the thread (do not retry)",
            )
        status, thread = self._thread_reply(
            reply, owner, tid, (ThreadStatus.OK, ThreadStatus.EXISTED)
        )
        return thread, status == ThreadStatus.OK

    def get(self, owner: Ownership, thread_id: str) -> Flow[ConversationThread]:
        keys = self.thread_keys(owner, thread_id)
        raw = yield CommandOp("hgetall", (keys.thread,))
        return self._thread_from_hgetall(raw, owner, thread_id)

    def list_threads(
        self, owner: Ownership, *, cursor: str | None = None, limit: int | None = None
    ) -> Flow[ThreadPage]:
        okeys = self.owner_keys(owner)
        n = self._page_size(limit, self.config.list_page)
        start = "+"
        if cursor is not None:
            codec = yield from self.codec()
            position = codec.decode(
                cursor, CursorKind.LIST, tenant=owner.tenant_id, user=owner.user_id
            )
            if not _INDEX_MEMBER_RE.match(position):
                raise ConversationError(Code.INVALID_CURSOR, "invalid cursor")
            start = "(" + position
        members = yield CommandOp(
            "zrange",
            (okeys.index, start, "-"),
            (("desc", True), ("bylex", True), ("offset", 0), ("num", n + 1)),
        )
        members = [_s(m) for m in members]
        more = len(members) > n
        members = members[:n]
        ids = [m.split("|", 1)[1] for m in members]
        items: list[ConversationThread] = []
        if ids:
            hashes = yield BatchOp(
                tuple(CommandOp("hgetall", (okeys.thread(tid).thread,)) for tid in ids)
            )
            for tid, raw in zip(ids, hashes, strict=True):
                try:
                    items.append(self._thread_from_hgetall(raw, owner, tid))
                except ConversationError:
                    continue  # deleted between the index read and this one
        next_cursor = None
        if more:
            codec = yield from self.codec()
            next_cursor = codec.encode(
                CursorKind.LIST, members[-1], tenant=owner.tenant_id, user=owner.user_id
            )
        return ThreadPage(items=tuple(items), next_cursor=next_cursor)

    # --- branch / archive / hold / delete --------------------------------------------------------

    def branch(
        self,
        owner: Ownership,
        thread_id: str,
        leaf_id: str,
        *,
        expected_version: int | None = None,
    ) -> Flow[ConversationThread]:
        keys = self.thread_keys(owner, thread_id)
        leaf = self._entry_id(leaf_id)
        version = yield from self._expected_version(keys, owner, thread_id, expected_version)
        reply = yield ScriptOp(
            "branch",
            (keys.thread, keys.parents),
            (
                MARKER,
                leaf,
                version,
                self.config.max_active_branches,
                self.clock(),
                owner.tenant_id,
                owner.user_id,
            ),
        )
        _, thread = self._thread_reply(
            reply, owner, thread_id, (ThreadStatus.OK, ThreadStatus.EXISTED)
        )
        return thread

    def archive(
        self, owner: Ownership, thread_id: str, *, expected_version: int | None = None
    ) -> Flow[ConversationThread]:
        keys = self.thread_keys(owner, thread_id)
        version = yield from self._expected_version(keys, owner, thread_id, expected_version)
        reply = yield ScriptOp(
            "archive",
            (keys.thread,),
            (MARKER, version, self.clock(), owner.tenant_id, owner.user_id),
        )
        _, thread = self._thread_reply(
            reply, owner, thread_id, (ThreadStatus.OK, ThreadStatus.EXISTED)
        )
        return thread

    def _expected_version(
        self, keys: ThreadKeys, owner: Ownership, thread_id: str, given: int | None
    ) -> Flow[int]:
        """The caller's version, or the one of a fresh snapshot (the CAS compares against it)."""
        if given is not None:
            if isinstance(given, bool) or not isinstance(given, int) or given < 0:
                raise ConversationError(
                    Code.INVALID_REQUEST, "expectedVersion must be an integer >= 0"
                )
            return given
        raw = yield CommandOp("hgetall", (keys.thread,))
        return self._thread_from_hgetall(raw, owner, thread_id).version

    def set_legal_hold(
        self, owner: Ownership, thread_id: str, held: bool
    ) -> Flow[ConversationThread]:
        keys = self.thread_keys(owner, thread_id)
        reply = yield ScriptOp(
            "hold", (keys.thread,), (MARKER, "1" if held else "0", owner.tenant_id, owner.user_id)
        )
        _, thread = self._thread_reply(reply, owner, thread_id, (ThreadStatus.OK,))
        return thread

    def delete(self, owner: Ownership, thread_id: str) -> Flow[DeleteResult]:
        okeys = self.owner_keys(owner)
        keys = self.thread_keys(owner, thread_id)
        # Every attempt of this call carries one token: a retry after a lost reply learns
        # from the recent-deletes set that its first attempt deleted the thread, and never
        # claims a delete that did not happen (a missing or another owner's thread).
        token = secrets.token_hex(16)
        reply = yield ScriptOp(
            "delete",
            (*keys.all(), okeys.index, okeys.recent_deletes),
            (
                MARKER,
                owner.tenant_id,
                owner.user_id,
                thread_id,
                token,
                self.clock(),
                _RECENT_DELETE_MS,
                _RECENT_DELETES_MAX,
            ),
        )
        status = int(reply[0])
        if status == ThreadStatus.NOT_FOUND:
            raise self._status_error(status)
        held = int(reply[1]) == 1
        return DeleteResult(deleted=not held, held=held)

    # --- ledger: replay and export ---------------------------------------------------------------

    def _read_events(
        self, owner: Ownership, keys: ThreadKeys, position: str | None, count: int
    ) -> Flow[tuple[list[EventRecord], bool, str | None, bool, str]]:
        """One page: (records, more, last position, a turn is running, newest row's type)."""
        start = "-" if position is None else "(" + position
        reply = yield ScriptOp(
            "read_events",
            (keys.thread, keys.events, keys.lease),
            (MARKER, start, count + 1, owner.tenant_id, owner.user_id),
        )
        if int(reply[0]) != ThreadStatus.OK:
            raise self._status_error(int(reply[0]))
        running, newest_type = int(reply[1]) == 1, _s(reply[2])
        rows = reply[3:]
        total = len(rows) // 5
        more = total > count
        records: list[EventRecord] = []
        last = position
        thread_id = keys.thread.rsplit(":t:", 1)[1]
        for i in range(min(total, count)):
            rid, etype, data, run, redacted = (_s(x) for x in rows[5 * i : 5 * i + 5])
            last = rid
            if redacted != "1":
                continue  # rows not written through the redactor are never served
            try:
                payload = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(payload, dict):
                continue
            try:
                # Checked on read too: a row written by an older version or by hand may
                # still hold a secret or a local path; it is redacted before it is served.
                payload = served_json(payload, scrub=True)
            except (MemtierValidationError, TypeError, ValueError):
                continue
            records.append(
                EventRecord(
                    id=rid,
                    thread_id=thread_id,
                    type=etype,
                    timestamp=ms_to_datetime(int(rid.split("-", 1)[0])),
                    request_id=run or None,
                    data=payload,
                )
            )
        return records, more, last, running, newest_type

    def _ledger_position(
        self, owner: Ownership, thread_id: str, cursor: str | None
    ) -> Flow[tuple[str | None, ConversationError | None]]:
        """Decode a ledger cursor; the error is returned, raised only once the thread exists.

        So a wrong-owner or missing thread is ``not_found`` whatever cursor came with it.
        """
        if cursor is None:
            return None, None
        codec = yield from self.codec()
        try:
            position = codec.decode(
                cursor,
                CursorKind.LEDGER,
                tenant=owner.tenant_id,
                user=owner.user_id,
                thread_id=thread_id,
            )
        except ConversationError as exc:
            return None, exc
        if not _STREAM_ID_RE.match(position):
            return None, ConversationError(Code.INVALID_CURSOR, "invalid cursor")
        return position, None

    def _ledger_cursor(self, owner: Ownership, thread_id: str, position: str) -> Flow[str]:
        codec = yield from self.codec()
        return codec.encode(
            CursorKind.LEDGER,
            position,
            tenant=owner.tenant_id,
            user=owner.user_id,
            thread_id=thread_id,
        )

    def replay(
        self,
        owner: Ownership,
        thread_id: str,
        *,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Flow[ReplayPage]:
        keys = self.thread_keys(owner, thread_id)
        n = self._page_size(limit, self.config.replay_page_rows)
        position, cursor_error = yield from self._ledger_position(owner, thread_id, cursor)
        records, more, last, running, newest_type = yield from self._read_events(
            owner, keys, position, n
        )
        if cursor_error is not None:
            raise cursor_error
        # More may come while rows remain or a turn still holds the lease (it is writing).
        terminal = not more and not running and newest_type in TERMINAL_EVENT_TYPES
        next_cursor = None
        if more or running:
            next_cursor = yield from self._ledger_cursor(owner, thread_id, last or _LEDGER_START)
        return ReplayPage(records=tuple(records), next_cursor=next_cursor, terminal=terminal)

    def export(
        self, owner: Ownership, thread_id: str, *, cursor: str | None = None
    ) -> Flow[ExportResult]:
        keys = self.thread_keys(owner, thread_id)
        position, cursor_error = yield from self._ledger_position(owner, thread_id, cursor)
        raw = yield CommandOp("hgetall", (keys.thread,))
        thread = exported_thread(self._thread_from_hgetall(raw, owner, thread_id))
        if cursor_error is not None:
            raise cursor_error
        cap = self.config.export_bytes
        # the thread, the envelope ({"thread":..,"events":[..],"nextCursor":..}), then pages
        used = len(orjson.dumps(thread.to_wire())) + _EXPORT_ENVELOPE_BYTES
        events: list[EventRecord] = []
        truncated = False
        more = False
        for page in range(self.config.export_pages):
            records, more, last, _, _ = yield from self._read_events(
                owner, keys, position, self.config.replay_page_rows
            )
            size = sum(len(orjson.dumps(r.to_wire())) + 1 for r in records)
            if used + size > cap:
                if page == 0:
                    raise ConversationError(
                        Code.EXPORT_TOO_LARGE,
                        f"one page of events is larger than the export cap of {cap} bytes;"
                        " raise exportBytes or page with replay",
                        limit=cap,
                    )
                truncated = True
                break
            events.extend(records)
            used += size
            position = last
            if not more:
                break
        else:
            truncated = more
        next_cursor = None
        if truncated and position is not None:
            next_cursor = yield from self._ledger_cursor(owner, thread_id, position)
        return ExportResult(
            thread=thread, events=tuple(events), next_cursor=next_cursor, truncated=truncated
        )

    # --- continue --------------------------------------------------------------------------------

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
    ) -> Flow[ContinueResult]:
        keys = self.thread_keys(owner, thread_id)
        check_identity(owner, identity)  # before any Redis call
        text, truncated = self._message(message)
        rid = self._request_id(request_id) or f"req_{secrets.token_hex(16)}"
        leaf = "" if leaf_id is None else self._entry_id(leaf_id)
        options = validate_run_options(self.run_options_schema, run_options)
        # A retry must repeat the message, the leaf and the options (else request_conflict);
        # turns without options keep the fingerprint of earlier versions.
        fingerprint = _sha256([text, leaf] if options is None else [text, leaf, options])
        token = secrets.token_hex(16)
        running: dict[str, Any] = {"s": "running", "tok": token, "fp": fingerprint}
        running["at"] = self.clock()
        ledger_options = None if options is None else self.event_data(options)
        if ledger_options is not None:
            running["opt"] = ledger_options  # stored with the run record, redacted
        if identity is not None:
            running["aid"] = identity.agent_id
        record = _json(running)
        claim = ScriptOp(
            "run_claim",
            (keys.thread, keys.runs, keys.lease, keys.parents, keys.events),
            (
                MARKER,
                rid,
                token,
                fingerprint,
                self.lease_ms,
                leaf,
                limits.THREAD_MAX_ENTRIES,
                _ENTRIES_PER_TURN,
                limits.THREAD_MAX_EVENTS,
                _TURN_EVENTS,
                limits.THREAD_MAX_BYTES,
                _TURN_BYTES,
                record,
                owner.tenant_id,
                owner.user_id,
                *(self.run_limits.claim_args() if self.run_limits else (0,)),
            ),
        )
        started = self.monotonic()
        delay = _POLL_FIRST_S
        reply: Sequence[Any] = ()
        for _ in range(_MAX_POLLS):
            reply = yield claim
            status = int(reply[0])
            if status == ThreadStatus.CLAIMED:
                break
            if status == ThreadStatus.DONE:
                result = yield from self._recorded_result(keys, thread_id, rid, _s(reply[1]))
                return result
            if status in (ThreadStatus.THREAD_BUSY, ThreadStatus.REQUEST_IN_PROGRESS):
                wait = (
                    self.busy_wait_s if status == ThreadStatus.THREAD_BUSY else self.inflight_wait_s
                )
                if self.monotonic() + delay - started > wait:
                    raise self._status_error(status)
                yield SleepOp(delay)
                delay = min(delay * 2, _POLL_MAX_S)
                continue
            raise self._status_error(status, reply)
        else:
            raise self._status_error(ThreadStatus.THREAD_BUSY)

        base, count, first = _s(reply[1]), int(reply[2]), int(reply[3])
        path = [_s(x) for x in reply[4:]]
        path.reverse()  # root first
        raw_thread = yield CommandOp("hgetall", (keys.thread,))
        thread = self._thread_from_hgetall(raw_thread, owner, thread_id)
        history = yield from self._load_entries(keys, path)
        state = TurnState(
            owner=owner,
            keys=keys,
            thread=thread,
            history=tuple(history),
            message=text,
            message_truncated=truncated,
            request_id=rid,
            leaf_id=leaf or None,
            base=base,
            token=token,
            fingerprint=fingerprint,
            entry_count=count,
            first_entry=first,
            run_options=options,
            stored_options=ledger_options,
            identity=identity,
            budget=None if self.run_limits is None else self.run_limits.budget(thread.usage),
        )
        user_entry_id = f"e{first}"
        started_row: dict[str, Any] = {"requestId": rid, "leafId": base or None}
        if ledger_options is not None:
            started_row["runOptions"] = ledger_options
        if identity is not None:
            started_row["agentId"] = identity.agent_id  # the ledger records who ran it
        opening = [
            ("agent_started", started_row),
            ("user_message", self._message_event(user_entry_id, text, truncated)),
        ]
        reply = yield self._append_op(state, opening, seq=1)
        self.check_emit(reply)

        try:
            outcome = yield RunOp(state)
        except Exception as exc:
            state.closed = True
            if state.budget is not None:
                state.budget.charge_wall(int((time.perf_counter() - state.started_at) * 1000))
            if _is_cancel(exc) and state.cancel_reason is None:
                state.cancel_reason = "caller"  # an emit saw run_cancel's mark
            if state.budget is not None and state.budget.exceeded:
                result = yield from self._abort_over_limit(state)
                return result
            if state.cancel_reason is not None:
                result = yield from self._abort_cancelled(state)
                return result
            if _is_denial(exc):
                result = yield from self._commit(state, None, _denial_reason(exc))
                return result
            error = {
                "code": Code.RUNNER_FAILED.value,
                "errorType": type(exc).__name__,
                # The ledger says what was committed: nothing.  The user_message row's
                # entryId is discarded and never reused by a later turn.
                "entryIds": [],
                "discardedEntryIds": self._turn_entry_ids(state),
            }
            abort = yield ScriptOp(
                "run_abort",
                (keys.thread, keys.runs, keys.lease, keys.events),
                (MARKER, token, rid, self.clock(), "error", _json(error), "", _usage_arg(state)),
            )
            status = int(abort[0])
            if status != ThreadStatus.OK:
                # The thread was deleted (delete wins) or the turn lost its lease.
                raise self._status_error(status) from exc
            raise ConversationError(
                Code.RUNNER_FAILED, f"the runner failed ({type(exc).__name__})"
            ) from exc
        state.closed = True
        if state.budget is not None:
            if isinstance(outcome, RunnerReply) and outcome.usage:
                with contextlib.suppress(ConversationError):  # over: budget.exceeded says so
                    state.budget.consume(outcome.usage)
            state.budget.charge_wall(int((time.perf_counter() - state.started_at) * 1000))
            if state.budget.exceeded:
                result = yield from self._abort_over_limit(state)
                return result
        if state.cancel_reason is not None:  # the runner returned after its cancellation
            result = yield from self._abort_cancelled(state)
            return result
        content = outcome.content if isinstance(outcome, RunnerReply) else outcome
        if not isinstance(content, str):
            raise ConversationError(Code.RUNNER_FAILED, "the runner returned no text")
        result = yield from self._commit(state, content, None)
        return result

    def _abort_cancelled(self, state: TurnState) -> Flow[ContinueResult]:
        """Close a cancelled turn: nothing committed, a ``cancelled`` terminal row, and a
        ``cancelled`` run record (a retry with the same request id is a new run)."""
        keys = state.keys
        data = {
            "requestId": state.request_id,
            "reason": state.cancel_reason,
            "entryIds": [],
            "discardedEntryIds": self._turn_entry_ids(state),
        }
        record = _json(
            {"s": "cancelled", "tok": state.token, "fp": state.fingerprint, "at": self.clock()}
        )
        abort = yield ScriptOp(
            "run_abort",
            (keys.thread, keys.runs, keys.lease, keys.events),
            (
                MARKER,
                state.token,
                state.request_id,
                self.clock(),
                "cancelled",
                _json(data),
                record,
                _usage_arg(state),
            ),
        )
        status = int(abort[0])
        if status != ThreadStatus.OK:
            raise self._status_error(status)  # deleted meanwhile, or the lease was lost
        raise ConversationError(
            Code.RUN_CANCELLED,
            f"the run was cancelled ({state.cancel_reason}); nothing was committed",
            reason=state.cancel_reason,
        )

    def _abort_over_limit(self, state: TurnState) -> Flow[ContinueResult]:
        """Close a turn that would have passed a shared run limit: nothing committed, an
        ``error`` row (``limit_exceeded``); what it consumed (within its allowance) is
        charged; the request id may be retried."""
        assert state.budget is not None and state.budget.exceeded
        keys, meter = state.keys, state.budget.exceeded
        data = {
            "code": Code.LIMIT_EXCEEDED.value,
            "limit": f"run:{meter}",
            "usage": state.budget.used,
            "entryIds": [],
            "discardedEntryIds": self._turn_entry_ids(state),
        }
        abort = yield ScriptOp(
            "run_abort",
            (keys.thread, keys.runs, keys.lease, keys.events),
            (
                MARKER,
                state.token,
                state.request_id,
                self.clock(),
                "error",
                _json(data),
                "",
                _usage_arg(state),
            ),
        )
        status = int(abort[0])
        if status != ThreadStatus.OK:
            raise self._status_error(status)
        raise ConversationError(
            Code.LIMIT_EXCEEDED,
            f"the turn would pass the shared run limit {meter!r}; nothing was committed",
            limit=f"run:{meter}",
        )

    def cancel_run(
        self, owner: Ownership, thread_id: str, request_id: str
    ) -> Flow[CancelResult]:
        """Cancel a run by request id (owner-only, idempotent); see ``run_cancel``."""
        keys = self.thread_keys(owner, thread_id)
        rid = self._request_id(request_id)
        if rid is None:
            raise ConversationError(Code.INVALID_REQUEST, "requestId is required")
        data = {"requestId": rid, "reason": "abandoned", "entryIds": []}
        reply = yield ScriptOp(
            "run_cancel",
            (keys.thread, keys.runs, keys.lease, keys.events),
            (MARKER, rid, owner.tenant_id, owner.user_id, self.clock(), _json(data)),
        )
        status = int(reply[0])
        if status == ThreadStatus.NOT_FOUND:
            raise ConversationError(Code.NOT_FOUND, "no such run on this conversation")
        if status == ThreadStatus.OK:
            state = CancelStatus.CANCELLING
        elif status == ThreadStatus.ENDED_CANCELLED:
            state = CancelStatus.CANCELLED
        else:
            state = CancelStatus(_s(reply[1]))
        return CancelResult(thread_id=thread_id, request_id=rid, status=state)

    @staticmethod
    def _turn_entry_ids(state: TurnState) -> list[str]:
        return [f"e{state.first_entry + i}" for i in range(_ENTRIES_PER_TURN)]

    @staticmethod
    def _message_event(entry_id: str, text: str, truncated: bool) -> dict[str, Any]:
        """A message on the ledger: already redacted; local paths become ``[PATH]`` here
        (the entry itself keeps the text the agent works with)."""
        event: dict[str, Any] = {"entryId": entry_id, "content": scrub_paths(text)}
        if truncated:
            event["truncated"] = True
        return event

    def _commit(
        self, state: TurnState, content: str | None, denied: str | None
    ) -> Flow[ContinueResult]:
        keys, now = state.keys, self.clock()
        entries: list[dict[str, Any]] = []
        events: list[tuple[str, dict[str, Any]]] = []
        if content is not None:
            reply_text = self._sanitize(content, limits.THREAD_MESSAGE_BYTES)
            user_id, asst_id = self._turn_entry_ids(state)
            user: dict[str, Any] = {
                "id": user_id,
                "parentId": state.base,
                "role": "user",
                "content": state.message,
                "createdAt": now,
                "requestId": state.request_id,
            }
            if state.message_truncated:
                user["truncated"] = True
            assistant: dict[str, Any] = {
                "id": asst_id,
                "parentId": user_id,
                "role": "assistant",
                "content": reply_text.text,
                "createdAt": now,
                "requestId": state.request_id,
            }
            if reply_text.truncated:
                assistant["truncated"] = True
            entries = [user, assistant]
            events.append(
                (
                    "assistant_message",
                    self._message_event(asst_id, reply_text.text, reply_text.truncated),
                )
            )
            finished: dict[str, Any] = {
                "requestId": state.request_id,
                "leafId": asst_id,
                "entryIds": [user_id, asst_id],
            }
            if state.dropped:
                finished["eventsDropped"] = state.dropped
            if state.budget is not None:
                finished["usage"] = state.budget.used
            events.append(("agent_finished", finished))
            res: dict[str, Any] = {
                "status": ContinueStatus.COMPLETED.value,
                "leafId": asst_id,
                "entryIds": [user_id, asst_id],
            }
            new_head = asst_id
        else:
            reason = self._sanitize(scrub_paths(denied or "denied"), 1024).text
            denied_row = {
                "requestId": state.request_id,
                "reason": reason,
                "entryIds": [],
                "discardedEntryIds": self._turn_entry_ids(state),
            }
            events.append(("agent_denied", denied_row))
            res = {"status": ContinueStatus.DENIED.value, "reason": reason, "entryIds": []}
            new_head = ""
        done_record: dict[str, Any] = {"s": "done", "tok": state.token, "fp": state.fingerprint}
        done_record.update(at=now, res=res)
        if state.stored_options is not None:
            done_record["opt"] = state.stored_options
        if state.identity is not None:
            done_record["aid"] = state.identity.agent_id
        done = _json(done_record)
        args: list[str | int | bytes] = [
            MARKER,
            state.token,
            state.request_id,
            now,
            state.entry_count,
            new_head,
            done,
            len(entries),
            len(events),
            _usage_arg(state),
        ]
        entry_json = [_json(e) for e in entries]
        for entry, encoded in zip(entries, entry_json, strict=True):
            args += [entry["id"], entry["parentId"], encoded]
        for etype, data in events:
            args += [etype, _json(data)]
        reply = yield ScriptOp(
            "run_commit",
            (keys.thread, keys.entries, keys.parents, keys.runs, keys.lease, keys.events),
            tuple(args),
        )
        status = int(reply[0])
        if status == ThreadStatus.CANCELLED:  # cancelled while the runner finished
            state.cancel_reason = state.cancel_reason or "caller"
            result = yield from self._abort_cancelled(state)
            return result
        if status not in (ThreadStatus.OK, ThreadStatus.DONE):
            raise self._status_error(status)
        return ContinueResult(
            thread_id=state.thread.id,
            request_id=state.request_id,
            status=ContinueStatus(res["status"]),
            leaf_id=res.get("leafId"),
            entries=tuple(self.entry_from_json(e) for e in entry_json),
            reason=res.get("reason"),
        )

    def _recorded_result(
        self, keys: ThreadKeys, thread_id: str, request_id: str, record: str
    ) -> Flow[ContinueResult]:
        """The first result of a request, rebuilt from its run record and stored entries."""
        res = orjson.loads(record)["res"]
        ids = [str(i) for i in res.get("entryIds", [])]
        entries = yield from self._load_entries(keys, ids)
        return ContinueResult(
            thread_id=thread_id,
            request_id=request_id,
            status=ContinueStatus(res["status"]),
            leaf_id=res.get("leafId"),
            entries=tuple(entries),
            reason=res.get("reason"),
        )

    def _load_entries(self, keys: ThreadKeys, ids: Sequence[str]) -> Flow[list[ConversationEntry]]:
        entries: list[ConversationEntry] = []
        for start in range(0, len(ids), _HMGET_CHUNK):
            chunk = ids[start : start + _HMGET_CHUNK]
            values = yield CommandOp("hmget", (keys.entries, *chunk))
            for value in values:
                if value is None:  # the thread was deleted meanwhile
                    raise self._status_error(ThreadStatus.NOT_FOUND)
                entries.append(self.entry_from_json(value))
        return entries

    # --- while the runner runs (called by the shells) --------------------------------------------

    def _append_op(
        self, state: TurnState, events: Sequence[tuple[str, Mapping[str, Any]]], *, seq: int
    ) -> ScriptOp:
        args: list[str | int | bytes] = [
            MARKER,
            state.token,
            seq,
            self.lease_ms,
            self.clock(),
            state.request_id,
            len(events),
        ]
        for etype, data in events:
            args += [etype, _json(data)]
        keys = state.keys
        return ScriptOp("events_append", (keys.thread, keys.events, keys.lease), tuple(args))

    def emit_op(self, state: TurnState, event: RunnerEvent) -> ScriptOp | None:
        """The script call recording one runner event, or None if it is dropped.

        Raises ConversationError(invalid_request) for a malformed or reserved type
        (a runner bug, reported to the runner).
        """
        if not isinstance(event, RunnerEvent):
            raise ConversationError(Code.INVALID_REQUEST, "emit() takes a RunnerEvent")
        if not _EVENT_TYPE_RE.match(event.type) or event.type in RESERVED_EVENT_TYPES:
            raise ConversationError(
                Code.INVALID_REQUEST,
                f"event type {event.type[:64]!r} is invalid or reserved",
            )
        if state.closed:
            return None  # emitted after the turn ended: nothing is recorded
        if event.type == USAGE_EVENT and state.budget is not None:
            state.budget.consume(event.data)  # limit_exceeded (to the runner) past its allowance
        if state.kept >= limits.THREAD_EVENTS_PER_TURN:
            state.dropped += 1
            return None
        data = self.event_data(event.data)
        state.kept += 1
        state.seq += 1
        return self._append_op(state, [(event.type, data)], seq=state.seq)

    def event_data(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """Runner event data -> ledger data: raw fields omitted, paths/secrets redacted, cut."""
        if not isinstance(data, Mapping):
            raise ConversationError(Code.INVALID_REQUEST, "event data must be a mapping")
        try:
            summary = _summarize(data, 0)
            redacted, _ = redact_json(summary, max_depth=32)
        except (MemtierValidationError, TypeError, ValueError) as exc:
            raise ConversationError(
                Code.INVALID_REQUEST, f"event data is not JSON: {exc}"
            ) from None
        encoded = _json(redacted)
        cap = limits.THREAD_EVENT_BYTES
        if len(encoded.encode("utf-8")) <= cap:
            return dict(redacted)
        preview = self._sanitize(encoded, cap - 256).text
        return {"truncated": True, "preview": preview}

    def check_emit(self, reply: Sequence[Any]) -> None:
        status = int(reply[0])
        if status in (ThreadStatus.OK, ThreadStatus.EXISTED):
            return
        raise self._status_error(status)

    def renew_op(self, state: TurnState) -> ScriptOp:
        keys = state.keys
        return ScriptOp(
            "lease_renew", (keys.thread, keys.lease), (MARKER, state.token, self.lease_ms)
        )

    @staticmethod
    def renew_ok(reply: Sequence[Any]) -> bool:
        return int(reply[0]) == ThreadStatus.OK

    @staticmethod
    def renew_failure(reply: Sequence[Any]) -> str:
        """Why a heartbeat failed, as a cancel reason: ``caller`` (run_cancel marked the
        run) or ``lease_lost`` (expired, taken, or the thread deleted)."""
        return "caller" if int(reply[0]) == ThreadStatus.CANCELLED else "lease_lost"


_MAX_SUMMARY_DEPTH: Final = 16


def _summarize(node: Any, depth: int) -> Any:
    """Copy of event data with raw payload fields omitted and local paths scrubbed."""
    if depth > _MAX_SUMMARY_DEPTH:
        return "[omitted: nested too deeply]"
    if isinstance(node, str):
        return scrub_paths(node)
    if node is None or isinstance(node, bool | int | float):
        return node
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if not isinstance(key, str):
                raise TypeError("event data keys must be strings")
            if key.lower().replace("_", "").replace("-", "") in RAW_PAYLOAD_KEYS:
                out[key] = {"omitted": True}
            else:
                out[scrub_paths(key)] = _summarize(value, depth + 1)
        return out
    if isinstance(node, list | tuple):
        return [_summarize(item, depth + 1) for item in node]
    raise TypeError(f"not JSON: {type(node).__name__}")


def _usage(fields: Mapping[str, str]) -> dict[str, int]:
    """The shared run-limit counters of a thread hash (``use.<meter>`` fields)."""
    usage: dict[str, int] = {}
    for name, value in fields.items():
        if name.startswith("use."):
            try:
                usage[name[4:]] = int(value)
            except ValueError:
                continue
    return usage


def _usage_arg(state: TurnState) -> str:
    return "" if state.budget is None or not state.budget.used else _json(state.budget.used)


def _is_cancel(exc: BaseException) -> bool:
    return isinstance(exc, TurnCancelled) or (
        isinstance(exc, ConversationError) and exc.code == Code.RUN_CANCELLED
    )


def _is_denial(exc: BaseException) -> bool:
    from memtier.threads.runner import AgentDenied

    return isinstance(exc, AgentDenied)


def _denial_reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return reason if isinstance(reason, str) and reason else "denied"


def outcome_of(exc: BaseException | None) -> str:
    """Metric label of an operation's outcome: ``ok`` or the stable error code."""
    if exc is None:
        return "ok"
    if isinstance(exc, MemtierError):
        return exc.code
    return "error"


_MAX_SERVED_DEPTH: Final = 32


def served_text(text: str, *, scrub: bool) -> str:
    """A stored string as it may be served: secrets redacted (and local paths if ``scrub``)."""
    cleaned = redact_text(text)
    return scrub_paths(cleaned) if scrub else cleaned


def served_json(value: Any, *, scrub: bool) -> Any:
    """A stored JSON value as it may be served: every string (keys too) redacted, local
    paths scrubbed if ``scrub``; sensitive key names lose their values (redact_json)."""
    redacted, _ = redact_json(_scrub_json(value, 0) if scrub else value, max_depth=32)
    return redacted


def _scrub_json(node: Any, depth: int) -> Any:
    if depth > _MAX_SERVED_DEPTH:
        raise MemtierValidationError("JSON value nested too deeply")
    if isinstance(node, str):
        return scrub_paths(node)
    if isinstance(node, list | tuple):
        return [_scrub_json(item, depth + 1) for item in node]
    if isinstance(node, Mapping):
        return {scrub_paths(str(k)): _scrub_json(v, depth + 1) for k, v in node.items()}
    return node


def exported_thread(thread: ConversationThread) -> ConversationThread:
    """The thread as export serves it: no local paths in its title or metadata."""
    return thread.model_copy(
        update={
            "title": None if thread.title is None else scrub_paths(thread.title),
            "metadata": _scrub_json(thread.metadata, 0),
        }
    )


def create_thread_id(thread_id: Any) -> str:
    """An id given to create, checked against the documented grammar (``invalid_request``)."""
    if (
        not isinstance(thread_id, str)
        or not CREATE_ID_RE.match(thread_id)
        or thread_id.lower() in RESERVED_THREAD_IDS
    ):
        raise ConversationError(
            Code.INVALID_REQUEST,
            "id must match [A-Za-z0-9_-][A-Za-z0-9_.-]{0,127} and not be a route name"
            " (openapi.json, events, continue, branch, archive, export)",
        )
    return thread_id
