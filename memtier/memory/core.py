"""The I/O-free core of conversation memory, shared by the sync and asyncio stores.

It validates and sanitizes turns (redaction before bounding, both before any
byte leaves the process), builds KEYS/ARGV for each script, decodes replies
into models, maps status codes to exceptions, and projects sessions into
LLM context.  It never touches a socket.
"""

from __future__ import annotations

import base64
import os
import secrets
from binascii import b2a_base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final, NamedTuple

import orjson

from memtier import limits, wire
from memtier.config import MemtierConfig
from memtier.engine import ScriptCall, Transaction
from memtier.errors import (
    CapacityError,
    InvalidCursorError,
    ScriptError,
    SessionFullError,
    TurnTooLargeError,
    ValidationError,
)
from memtier.keys import MemoryKeyspace, PartitionKeys, SessionKeys
from memtier.memory.contextdecode import ReadCache, decode_turns
from memtier.memory.contexthead import plain_head
from memtier.memory.delimiters import wrap_untrusted
from memtier.memory.models import (
    TURN_TYPES,
    AppendReceipt,
    Channel,
    Context,
    ContextMessage,
    ConversationKey,
    Event,
    ReasonCode,
    SessionMetadata,
    Turn,
    TurnRecord,
    check_name,
    trusted,
)
from memtier.memory.recordcheck import check_fields_for_append, check_turn_id_for_append
from memtier.memory.scriptspecs import (
    APPEND_TURN,
    CONTEXT_HEAD,
    DROP_SESSION,
    LIST_METADATA,
    PARTITION_STATS,
    POP_TURN,
    READ_CONTEXT,
    SWEEP_EXPIRED,
)
from memtier.memory.turncodec import decode_record, encode_payload, record_flags
from memtier.redaction import sanitize
from memtier.scripts import Durable
from memtier.scriptspec import BoundSpec
from memtier.wire import ms_to_datetime

__all__ = [
    "AppendStatus",
    "MemoryCore",
    "ScriptCall",
    "context_limit",
    "new_session_id",
    "wrap_untrusted",
]


# Members whose keys are kept (about 0.5 KB each): the sessions a process is busy with.
_ROUTE_CACHE_SIZE = 4096
# Context read requests kept, by (member, channel, newest): about 1.5 KB each.
_CONTEXT_REQUEST_CACHE_SIZE = 4096


def context_limit(limit: int) -> int:
    """The newest-turns count of a context read: 0 (all) for 0, a negative count, or one
    above the hard turns ceiling (no session holds more, and LRANGE takes 64-bit ints)."""
    n = int(limit)
    return n if 0 < n <= limits.MAX_TURNS_PER_SESSION.ceiling else 0


class AppendStatus:
    """Status codes of ``append_turn`` (mirrors the script header)."""

    STORED = 0
    DUPLICATE = 1
    SESSION_FULL = -1
    AGGREGATE_FULL = -2
    TURN_TOO_LARGE = -3


class PreparedTurn(NamedTuple):
    """A turn after redaction and bounding: what is sent to Redis (immutable; a named
    tuple because one is built per append, at a quarter of a frozen dataclass's cost)."""

    key: ConversationKey
    turn: Turn
    turn_id: str
    payload: bytes
    turn_bytes: int
    truncated: bool
    redactions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _AppendFixed:
    """The part of an ``append_turn`` call that depends only on partition and channel."""

    bound: BoundSpec
    durable: Durable | None


_TURN_CLASSES: Final = tuple(TURN_TYPES.values())
# The text fields of each turn kind that are redacted and bounded (names are checked).
_BODY_FIELDS: Final = {
    "avatar": ("text",),
    "agent": ("text",),
    "tool": ("summary",),
    "action": ("outcome",),
}
_ANY_BODY: Final = ("text", "summary", "outcome")

# The inputs append_call gives per append (the rest is bound per partition and channel).
_APPEND_FREE: Final = (
    ("session", "turns", "turn_ids"),
    ("member", "turn_id", "payload", "turn_bytes", "flags", "new_session_id", "clock_override"),
)


# secrets.token_urlsafe's alphabet, from binascii directly (half its cost: once per append).
_URLSAFE: Final = bytes.maketrans(b"+/", b"-_")


def new_session_id() -> str:
    """A cryptographically random session id (128 bits, URL-safe): what
    ``"ses_" + secrets.token_urlsafe(16)`` gives."""
    return "ses_" + b2a_base64(os.urandom(16), newline=False).translate(_URLSAFE, b"=").decode()


def new_turn_id() -> str:
    """A cryptographically random turn id: 16 URL-safe characters (96 bits), what
    ``secrets.token_urlsafe(12)`` gives."""
    return b2a_base64(os.urandom(12), newline=False).translate(_URLSAFE).decode()


class MemoryCore:
    """Everything conversation memory does that is not I/O."""

    def __init__(self, config: MemtierConfig, *, clock: Callable[[], int] | None = None) -> None:
        self.config = config
        self.conv = config.conversation
        self.keyspace = MemoryKeyspace(config.namespace, config.partitions)
        # Per-partition shares of the aggregate ceilings (documented trade, see keys.py).
        self.max_sessions_per_partition = max(1, self.conv.max_active_sessions // config.partitions)
        self.max_bytes_per_partition = self.conv.max_aggregate_bytes // config.partitions
        # Test-only clock hook: never reachable from configuration.
        self._clock = clock
        self._append_fixed: dict[tuple[int, Channel], _AppendFixed] = {}
        # member -> its partition and session keys: pure functions of the member, rebuilt
        # on every call otherwise (a hash, three f-strings, two small objects).
        self._route = lru_cache(maxsize=_ROUTE_CACHE_SIZE)(self._route_uncached)
        # (member, channel, newest) -> its context read: the same immutable request on
        # every read without a test clock (built anew, it is a few us that cost twice as
        # much between two replies; docs/performance.md, "The context read's request, kept").
        self._context_requests = lru_cache(maxsize=_CONTEXT_REQUEST_CACHE_SIZE)(
            self._context_request
        )
        # each key's last context read, decoded (bounded: memtier.memory.contextdecode)
        self._read_cache = ReadCache()

    # --- helpers -------------------------------------------------------------------------------
    def clock_arg(self) -> str:
        return "" if self._clock is None else str(int(self._clock()))

    def ttl_ms(self, channel: Channel) -> int:
        return self.conv.public_ttl_ms if channel is Channel.PUBLIC else self.conv.im_ttl_ms

    def partition_for(self, key: ConversationKey) -> PartitionKeys:
        return self._route(key.member)[0]

    def route(self, member: str) -> tuple[PartitionKeys, SessionKeys]:
        """``member``'s partition keys and session keys (remembered, bounded)."""
        return self._route(member)

    def _route_uncached(self, member: str) -> tuple[PartitionKeys, SessionKeys]:
        part = self.keyspace.partition(self.keyspace.partition_of(member))
        return part, part.session(member)

    @staticmethod
    def coerce_key(key: ConversationKey | tuple[Any, Any]) -> ConversationKey:
        if isinstance(key, ConversationKey):
            return key
        if isinstance(key, tuple) and len(key) == 2:
            return ConversationKey(key[0], key[1])
        raise ValidationError("key must be a ConversationKey(avatar, channel)")

    # --- append --------------------------------------------------------------------------------
    def prepare_turn(self, key: ConversationKey, turn: Turn) -> PreparedTurn:
        """Redact, then bound, every text field; build the JSON payload."""
        if not isinstance(turn, _TURN_CLASSES):
            raise ValidationError(
                "turn must be AvatarMessage, AgentResponse, ToolSummary or ActionResult"
            )
        conv = self.conv
        fields = turn.content_fields()
        raw_limit = limits.MAX_RAW_INPUT_FACTOR * conv.max_turn_bytes
        for name, value in fields.items():
            if len(value) > raw_limit:  # characters >= bytes/4: a cheap, safe pre-check
                raise TurnTooLargeError(
                    f"{name} is over the input limit of {raw_limit} characters"
                    f" (at most {conv.max_turn_bytes} bytes of a turn are stored)",
                    field=name,
                    limit_bytes=raw_limit,
                )
        kinds: list[str] = []
        truncated = False
        out: dict[str, str] = {}
        used = 0  # UTF-8 bytes of the sanitized fields so far
        kind = turn.kind
        budget = conv.max_turn_bytes
        if kind in ("tool", "action"):
            # Names (tool, action) are short labels in a fixed grammar, checked again here
            # (a model_construct()ed turn skips pydantic): refused, never rewritten, so what
            # is stored is what snapshot validation accepts.  The body gets the rest of the
            # budget; sanitize() redacts before it bounds, so a cut can never leave half a
            # secret behind.
            for name in ("tool", "action"):
                if name in fields:
                    out[name] = check_name(fields[name], name)
                    used += len(out[name])  # ASCII: bytes == characters
            budget = min(budget - used, conv.max_tool_result_bytes)
        for name in _BODY_FIELDS.get(kind, _ANY_BODY):
            if name not in fields:
                continue
            clean = sanitize(fields[name], budget)
            if clean.kinds:
                kinds += clean.kinds
            truncated |= clean.truncated
            out[name] = clean.text
            used += clean.byte_length
        turn_bytes = used
        if turn_bytes > conv.max_session_bytes:  # unreachable with a valid config; defence
            raise TurnTooLargeError(
                "turn is larger than a session may hold",
                turn_bytes=turn_bytes,
                limit_bytes=conv.max_session_bytes,
            )
        turn_id = turn.turn_id
        if turn_id is not None:
            check_turn_id_for_append(turn_id)
        else:
            # 16 URL-safe base64 characters (96 random bits): stored twice per turn (record
            # and id zset), so 32 bytes a turn less than 32 hex characters; a collision
            # inside one session's id window (<= 1,024 ids) has a chance below 2**-76.
            turn_id = new_turn_id()
        if out != fields:
            # Sanitising changed the content: it must still be a record that a snapshot
            # flush and recovery accept (one shared validator; "\x00" as a name is empty).
            check_fields_for_append(kind, out, turn_id)
        payload = encode_payload(kind, turn_id, out)
        return PreparedTurn(
            key,
            turn,
            turn_id,
            payload,
            turn_bytes,
            truncated,
            tuple(dict.fromkeys(kinds)) if kinds else (),
        )

    def durable(self, part: PartitionKeys) -> Durable | None:
        """With ``redis.durability="replicated"``: what an append must WAIT for (the touch
        key is the partition's meta hash, a key of the script's slot)."""
        settings = self.config.redis
        if settings.durability != "replicated":
            return None
        return Durable(settings.wait_replicas, settings.wait_timeout_ms, part.meta)

    def append_call(
        self,
        prepared: PreparedTurn,
        session_id: str | None = None,
        more: Sequence[PreparedTurn] = (),
    ) -> ScriptCall:
        """The ``append_turn`` call of ``prepared``, and of ``more`` turns of the same
        session after it (``append_many``: the script then replies with one reply per turn
        it handled, :meth:`decode_append` each)."""
        key = prepared.key
        member = key.member
        part, sk = self._route(member)
        fixed = self._append_fixed.get((part.partition, key.channel))
        if fixed is None:
            fixed = self._append_fixed[(part.partition, key.channel)] = self._append_bounds(
                part, key.channel
            )
        # The free inputs in _APPEND_FREE order (checked against the spec when bound).
        call = fixed.bound.call(
            (sk.session, sk.turns, sk.turn_ids),
            (
                member,
                prepared.turn_id,
                prepared.payload,
                prepared.turn_bytes,
                record_flags(prepared.turn.kind == "tool"),
                session_id or new_session_id(),
                self.clock_arg(),
            ),
            fixed.durable,
        )
        if not more:
            return call
        extra: list[str | int | bytes] = []
        for p in more:
            tool = p.turn.kind == "tool"
            extra += (p.turn_id, p.payload, p.turn_bytes, record_flags(tool))
        # (the wire plan packs the extra turns as a counted tail)
        return ScriptCall(
            call.script, call.keys, (*call.args, *extra), durable=call.durable, wire=call.wire
        )

    def _append_bounds(self, part: PartitionKeys, channel: Channel) -> _AppendFixed:
        """What every append to ``channel`` on ``part`` sends alike: its partition keys,
        TTLs and bounds (built once per partition and channel, not per append)."""
        other = Channel.IM if channel is Channel.PUBLIC else Channel.PUBLIC
        conv = self.conv
        keys = {
            "lru": part.lru(channel.value),
            "lru_other": part.lru(other.value),
            "index": part.index,
            "meta": part.meta,
            "events": part.events,
            "compact": part.compact,
        }
        argv: dict[str, str | int | bytes] = {
            "prefix": part.prefix,
            "ttl_ms": self.ttl_ms(channel),
            "other_ttl_ms": self.ttl_ms(other),
            "max_sessions": self.max_sessions_per_partition,
            "max_turns": conv.max_turns_per_session,
            "max_session_bytes": conv.max_session_bytes,
            "max_aggregate": self.max_bytes_per_partition,
            "max_tool_results": conv.max_tool_results,
            "max_events": conv.max_events,
            "compact_percent": limits.COMPACTION_TRIGGER_PERCENT,
            "id_window": limits.IDEMPOTENCY_WINDOW,
            "max_evictions": limits.MAX_EVICTIONS_PER_CALL,
            "sweep_n": limits.SWEEP_PER_WRITE,
            "grace_ms": limits.EXPIRY_GRACE_MS,
            "sweep_interval_ms": limits.SWEEP_INTERVAL_MS,
            "ttl_refresh_ms": limits.TTL_REFRESH_MS,
        }
        bound = APPEND_TURN.bind(keys, argv)
        if bound.names != _APPEND_FREE:  # a spec change must update append_call's order
            raise AssertionError(f"append_turn's free inputs are {bound.names}")
        return _AppendFixed(bound, self.durable(part))

    def decode_append(self, prepared: PreparedTurn, reply: Sequence[Any]) -> AppendReceipt:
        status = int(reply[0])
        if status in (AppendStatus.STORED, AppendStatus.DUPLICATE):
            # Unvalidated construction (see ``trusted``): every value is converted to its
            # declared type right here; tests/memory/test_core_decode.py compares it with
            # the validated receipt.
            return trusted(
                AppendReceipt,
                {
                    "session_id": wire.text(reply[1]),
                    "seq": int(reply[2]),
                    "timestamp": ms_to_datetime(int(reply[4])),
                    "bytes": int(reply[5]),
                    "rotated": bool(int(reply[6])),
                    "session_bytes": int(reply[7]),
                    "turn_count": int(reply[8]),
                    "truncated": bool(prepared.truncated),
                    # SecretKind members -> plain str, as validation would convert them
                    "redactions": tuple(map(str, prepared.redactions)),
                    "duplicate": status == AppendStatus.DUPLICATE,
                    "evicted": int(reply[9]),
                    "evicted_for_sessions": int(reply[10]),
                    "swept": int(reply[11]),
                },
            )
        # Refusals report the expired sessions the script swept first (``swept`` detail).
        if status == AppendStatus.SESSION_FULL:
            which, current, limit = wire.text(reply[1]), int(reply[2]), int(reply[3])
            raise SessionFullError(
                f"session is at its {which} bound ({current} of {limit}); compact it first",
                bound=which,
                current=current,
                limit=limit,
                swept=int(reply[4]),
            )
        if status == AppendStatus.AGGREGATE_FULL:
            raise CapacityError(
                "evicting the least-recently-active sessions cannot make room for this turn"
                f" within {limits.MAX_EVICTIONS_PER_CALL} evictions; nothing was stored",
                needed=int(reply[1]),
                freeable=int(reply[2]),
                swept=int(reply[3]),
            )
        if status == AppendStatus.TURN_TOO_LARGE:
            raise TurnTooLargeError(
                "turn is larger than a session may hold",
                turn_bytes=int(reply[1]),
                limit_bytes=int(reply[2]),
                swept=int(reply[3]),
            )
        raise ScriptError(f"append_turn returned unknown status {status}")

    # --- context -------------------------------------------------------------------------------
    def context_call(self, key: ConversationKey, limit: int = 0) -> Transaction:
        """The context read in one round trip: ``MULTI``, ``context_head`` (the expiry
        verdict and the session's fields, atomic with the read), a plain ``LRANGE`` of the
        newest ``limit`` records (0: all), ``EXEC``.  The records never pass through Lua,
        and on the lean paths neither does the check (:mod:`memtier.memory.contexthead`).

        The request depends only on the key, the limit and the configuration, so without
        a test clock the one built for them is handed out again (it is immutable)."""
        newest = context_limit(limit)
        if self._clock is not None:  # a test clock: each read carries the clock's value
            return self._context_request(key.member, key.channel, newest)
        return self._context_requests(key.member, key.channel, newest)

    def _context_request(self, member: str, channel: Channel, newest: int) -> Transaction:
        part, sk = self._route(member)
        ttl_ms, clock = self.ttl_ms(channel), self.clock_arg()
        return Transaction(
            CONTEXT_HEAD.call(
                {"session": sk.session, "meta": part.meta}, ttl_ms=ttl_ms, clock_override=clock
            ),
            (("LRANGE", sk.turns, -newest if newest else 0, -1),),
            # the same check as plain commands, for the shells that pack it themselves
            plain_head(sk.session, part.meta, ttl_ms, clock),
        )

    def script_context_call(self, key: ConversationKey, limit: int = 0) -> ScriptCall:
        """The former context read, turns through Lua (``read_context``): the reference
        the transactional read is tested against, and a bench row."""
        part, sk = self._route(key.member)
        return READ_CONTEXT.call(
            {"session": sk.session, "turns": sk.turns, "meta": part.meta},
            ttl_ms=self.ttl_ms(key.channel),
            clock_override=self.clock_arg(),
            limit=context_limit(limit),
        )

    def decode_context(self, key: ConversationKey, replies: Sequence[Any]) -> Context:
        """:meth:`context_call`'s reply: ``[context_head reply, LRANGE reply]``, the head
        ``[0, sid, summary]`` or ``[-1]``.  The head decides: an expired or absent session
        is empty whatever the list held."""
        head = replies[0]
        live = int(head[0]) == 0
        return self._context(key, head[1] if live else None, head[2] if live else None, replies[1])

    def decode_script_context(self, key: ConversationKey, reply: Sequence[Any]) -> Context:
        """:meth:`script_context_call`'s reply (head fields, then the records)."""
        live = int(reply[0]) == 0
        return self._context(key, reply[1] if live else None, reply[8] if live else None, reply[9:])

    def _context(
        self, key: ConversationKey, sid: Any, summary_field: Any, raw_records: Sequence[Any]
    ) -> Context:
        """The context of a live session (``sid`` and its ``summary_field`` as read), or
        an empty one for ``sid`` None (absent or expired)."""
        if sid is None:
            self._read_cache.take(key.member)  # expired or gone: nothing of it is kept
            return Context(
                key_avatar=key.avatar, key_channel=key.channel, session_id=None, messages=()
            )
        session_id = wire.text(sid)
        summary_raw = wire.text(summary_field)
        fast = decode_turns(key.member, raw_records, self._read_cache)
        if fast is None:  # a record of another shape: the general path decodes or raises
            return self._general_context(key, session_id, summary_raw, raw_records)
        records, turn_messages = fast
        summary: dict[str, Any] | None = orjson.loads(summary_raw) if summary_raw else None
        messages = (*self.project(summary, ()), *turn_messages) if summary else turn_messages
        # Unvalidated construction: every part is already typed (key: a validated
        # ConversationKey; records and messages: built and checked by decode_turns).
        return trusted(
            Context,
            {
                "key_avatar": key.avatar,
                "key_channel": key.channel,
                "session_id": session_id,
                "messages": messages,
                "turns": records,
                "summary": summary["text"] if summary else None,
            },
        )

    def _general_context(
        self, key: ConversationKey, session_id: str, summary_raw: str, raw_records: Sequence[Any]
    ) -> Context:
        """The context of any records the read path accepts (the first format too): each
        through :func:`decode_record`, then :meth:`project`.  The reference the fast path
        (:func:`~memtier.memory.contextdecode.decode_turns`) is tested against."""
        records = tuple(self.decode_record(r) for r in raw_records)
        summary: dict[str, Any] | None = orjson.loads(summary_raw) if summary_raw else None
        # Unvalidated construction: every part is already typed (key: a validated
        # ConversationKey; records and messages: built and checked below).
        return trusted(
            Context,
            {
                "key_avatar": key.avatar,
                "key_channel": key.channel,
                "session_id": session_id,
                "messages": tuple(self.project(summary, records)),
                "turns": records,
                "summary": summary["text"] if summary else None,
            },
        )

    # One stored record (the turn-record codec's read path).
    decode_record = staticmethod(decode_record)

    @staticmethod
    def project(
        summary: dict[str, Any] | None, records: Sequence[TurnRecord]
    ) -> list[ContextMessage]:
        """Summary first, then turns; avatar and tool data stay untrusted user-role data."""
        out: list[ContextMessage] = []
        if summary:
            untrusted = bool(summary.get("untrusted", True))
            text = "Summary of earlier conversation:\n" + summary["text"]
            out.append(
                ContextMessage(
                    role="user",
                    content=wrap_untrusted("summary", text) if untrusted else text,
                    untrusted=untrusted,
                )
            )
        # Unvalidated per turn (see _trusted): role and untrusted are literals here, content
        # a str (decode_record checked every field is one).
        for rec in records:
            f = rec.fields
            kind = rec.kind
            if kind == "agent":
                role, content, untrusted = "assistant", f["text"], False
            elif kind == "avatar":
                role, content, untrusted = "user", wrap_untrusted("avatar", f["text"]), True
            elif kind == "tool":
                role = "user"
                content = wrap_untrusted(f"tool:{f['tool']}", f["summary"])
                untrusted = True
            else:
                role = "user"
                content = wrap_untrusted(f"action:{f['action']}", f["outcome"])
                untrusted = True
            if type(content) is not str:
                raise ScriptError("read_context returned a malformed turn record")
            out.append(
                trusted(ContextMessage, {"role": role, "content": content, "untrusted": untrusted})
            )
        return out

    # --- operators -----------------------------------------------------------------------------
    def drop_call(self, key: ConversationKey, reason: ReasonCode) -> ScriptCall:
        """An operator drop with its own operation id: every retry of this one call (after
        a lost reply) finds the first attempt's receipt and returns the same result."""
        self._read_cache.take(key.member)  # nothing of a dropped session stays decoded here
        part = self.partition_for(key)
        sk = part.session(key.member)
        return DROP_SESSION.call(
            {
                "session": sk.session,
                "turns": sk.turns,
                "turn_ids": sk.turn_ids,
                "lru": part.lru(key.channel.value),
                "index": part.index,
                "meta": part.meta,
                "events": part.events,
            },
            prefix=part.prefix,
            member=key.member,
            reason=reason.value,
            max_events=self.conv.max_events,
            clock_override=self.clock_arg(),
            receipt_key=part.drop_receipt(secrets.token_urlsafe(16)),
            receipt_ttl_ms=limits.DROP_RECEIPT_MS,
        )

    def pop_call(self, key: ConversationKey) -> ScriptCall:
        """``pop_turn``: remove and return the newest turn of exactly this key."""
        self._read_cache.take(key.member)  # the popped turn does not stay decoded here
        part = self.partition_for(key)
        sk = part.session(key.member)
        return POP_TURN.call(
            {
                "session": sk.session,
                "turns": sk.turns,
                "turn_ids": sk.turn_ids,
                "index": part.index,
                "meta": part.meta,
                "events": part.events,
            },
            member=key.member,
            ttl_ms=self.ttl_ms(key.channel),
            max_events=self.conv.max_events,
            clock_override=self.clock_arg(),
        )

    def decode_pop(self, reply: Sequence[Any]) -> TurnRecord | None:
        """The popped record (None when the key had no live turn)."""
        if int(reply[0]) == 0:
            return None
        if int(reply[0]) != 1:
            raise ScriptError(f"pop_turn returned unknown status {reply[0]!r}")
        return self.decode_record(reply[1])

    def sweep_call(self, part: PartitionKeys, max_n: int = limits.SWEEP_PER_CALL) -> ScriptCall:
        return SWEEP_EXPIRED.call(
            self._lru_keys(part, "index", "meta", "events"),
            prefix=part.prefix,
            public_ttl_ms=self.conv.public_ttl_ms,
            im_ttl_ms=self.conv.im_ttl_ms,
            max_n=min(max_n, limits.SWEEP_PER_CALL),
            max_events=self.conv.max_events,
            clock_override=self.clock_arg(),
        )

    def stats_call(self, part: PartitionKeys) -> ScriptCall:
        return PARTITION_STATS.call(self._lru_keys(part, "meta", "index"))

    @staticmethod
    def _lru_keys(part: PartitionKeys, *more: str) -> dict[str, str]:
        """Both LRU zsets of ``part`` by role, and the partition keys named in ``more``."""
        named = {"index": part.index, "meta": part.meta, "events": part.events}
        return {
            "lru_public": part.lru_public,
            "lru_im": part.lru_im,
            **{role: named[role] for role in more},
        }

    # --- metadata paging -----------------------------------------------------------------------
    def metadata_call(self, part: PartitionKeys, scan_cursor: str, count: int) -> ScriptCall:
        return LIST_METADATA.call(
            {"index": part.index, "meta": part.meta, "lru_public": part.lru_public},
            prefix=part.prefix,
            cursor=scan_cursor,
            count=count,
            public_ttl_ms=self.conv.public_ttl_ms,
            im_ttl_ms=self.conv.im_ttl_ms,
            clock_override=self.clock_arg(),
        )

    @staticmethod
    def decode_metadata(reply: Sequence[Any]) -> tuple[str, list[SessionMetadata]]:
        next_cursor = wire.text(reply[0])
        out = []
        items = reply[1:]
        for i in range(0, len(items) - 7, 8):
            member, sid, _created, created_wall, _last, last_wall, turns, nbytes = items[i : i + 8]
            key = ConversationKey.from_member(wire.text(member))
            out.append(
                SessionMetadata(
                    session_id=wire.text(sid),
                    avatar=key.avatar,
                    channel=key.channel,
                    created_at=ms_to_datetime(int(created_wall)),
                    last_active_at=ms_to_datetime(int(last_wall)),
                    turn_count=int(turns),
                    bytes=int(nbytes),
                )
            )
        return next_cursor, out

    @staticmethod
    def encode_cursor(partition: int, scan_cursor: str) -> str:
        raw = f"m1:{partition}:{scan_cursor}".encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def decode_cursor(self, cursor: str | None) -> tuple[int, str]:
        if cursor is None:
            return 0, "0"
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
            tag, partition, scan = raw.split(":", 2)
            if tag != "m1" or not scan.isdigit():
                raise ValueError(tag)
            index = int(partition)
        except (ValueError, UnicodeDecodeError):
            raise InvalidCursorError("malformed metadata cursor") from None
        if not 0 <= index < self.config.partitions:
            raise InvalidCursorError("metadata cursor names an unknown partition")
        return index, scan

    # --- events --------------------------------------------------------------------------------
    def decode_events_cursor(self, cursor: str | None) -> list[str]:
        """Per-partition last-seen stream ids ("0-0" = from the start)."""
        n = self.config.partitions
        if cursor is None:
            return ["0-0"] * n
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
            tag, *ids = raw.split(",")
            if tag != "e1" or len(ids) != n:
                raise ValueError(tag)
            for sid in ids:
                ms, _, seq = sid.partition("-")
                if not (ms.isdigit() and seq.isdigit()):
                    raise ValueError(sid)
        except (ValueError, UnicodeDecodeError):
            raise InvalidCursorError("malformed events cursor") from None
        return ids

    @staticmethod
    def encode_events_cursor(ids: Sequence[str]) -> str:
        return base64.urlsafe_b64encode(("e1," + ",".join(ids)).encode()).decode().rstrip("=")

    @staticmethod
    def decode_event(
        partition: int, stream_id: str, fields: dict[Any, Any], positions: list[str]
    ) -> Event:
        f = {wire.text(k): wire.text(v) for k, v in fields.items()}
        member = f.get("member") or ""
        avatar = channel = None
        if member:
            key = ConversationKey.from_member(member)
            avatar, channel = key.avatar, key.channel
        return Event(
            id=f"{partition}:{stream_id}",
            cursor=MemoryCore.encode_events_cursor(positions),
            reason=ReasonCode(f["reason"]),
            avatar=avatar,
            channel=channel,
            session_id=f.get("sid") or None,
            timestamp=ms_to_datetime(int(f.get("wall") or f.get("ts") or 0)),
            detail=f.get("detail") or None,
        )

    @staticmethod
    def merge_events(
        per_partition: list[list[tuple[str, dict[Any, Any]]]], start: list[str], limit: int
    ) -> list[Event]:
        """Merge per-partition stream pages by stream id (time), bounded by ``limit``."""
        heads = [0] * len(per_partition)
        positions = list(start)
        out: list[Event] = []

        def id_key(sid: str) -> tuple[int, int]:
            ms, _, seq = sid.partition("-")
            return int(ms), int(seq)

        while len(out) < limit:
            best = -1
            for p, entries in enumerate(per_partition):
                if heads[p] < len(entries) and (
                    best < 0
                    or id_key(wire.text(entries[heads[p]][0]))
                    < id_key(wire.text(per_partition[best][heads[best]][0]))
                ):
                    best = p
            if best < 0:
                break
            stream_id, fields = per_partition[best][heads[best]]
            heads[best] += 1
            positions[best] = wire.text(stream_id)
            out.append(MemoryCore.decode_event(best, wire.text(stream_id), fields, positions))
        return out
