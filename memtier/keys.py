"""Every Redis key memtier uses is built here, and nowhere else.

Hash tags put every key one script touches into one Redis Cluster slot:

* conversation memory: ``{<ns>:m:<partition>}``.  The partition is a stable
  hash of (avatar, channel) modulo ``partitions`` (default 1 = one slot, exact
  global LRU).  Aggregate ceilings are split evenly across partitions and
  eviction is exact inside a partition: the same trade Redis makes with its
  approximated LRU.
* conversation threads: ``{<ns>:o:<tenant>:<user>}``, so all of one owner's
  threads share a slot and a key derived from the caller's ownership cannot name
  another owner's thread (wrong-owner access is not-found by construction).

Memory layout of one partition (``T`` = the partition's hash tag)::

    T:s:<member>     HASH   one session: id, timestamps, counters, summary, receipts
                            ``r:<turn_id>``, ``cq`` (queued compaction job), ``xp``
                            (server ms of the last PEXPIRE of its keys)
    T:t:<member>     LIST   its turns, oldest first:
                            "<seq>|<clock_ms>|<wall_ms>|<bytes>|<is_tool 0/1>|<json>"
    T:i:<member>     ZSET   its turn ids (score = seq) for idempotent retries
    T:lru:public     ZSET   member -> last activity (ms) of public sessions
    T:lru:im         ZSET   member -> last activity (ms) of IM sessions
    T:ix             HASH   member -> session bytes (exact accounting, metadata paging)
    T:meta           HASH   bytes (aggregate), clock (non-decreasing ms high-water mark),
                            sw (clock ms when an append next sweeps expired sessions)
    T:events         STREAM reason-code events, MAXLEN-bounded, never content
    T:compact        STREAM compaction jobs for ``memtier worker`` (consumer group
                            ``memtier-compactors``; a session's ``cq`` names its queued job)
    T:op:<op id>     STRING result of one operator delete/expire ("1:<bytes>" | "0"), PX
                            expiry: its retry after a lost reply returns the same result

Snapshot restore of a namespace (its own hash tag, one script handles both)::

    {<ns>:m:restore}:lock    STRING the one restorer's token, PX expiry
    {<ns>:m:restore}:state   HASH   status (restoring / done), generation, outcome

``<member>`` is ``<avatar-uuid>:<channel>``: lowercase hyphenated UUID, so the
lexicographic order Redis uses for equal scores is UUID order, then channel
(``im`` < ``public``) -- the LRU tie-break the spec asks for.

Eviction and sweeping delete sessions the caller did not name: the scripts
derive those keys from the partition's tag prefix (ARGV), which is always in
the same slot as the declared keys.  This is the one documented exception to
"scripts touch only KEYS", tested on a real Redis Cluster.

Threads layout of one owner (``O`` = ``{<ns>:o:<tenant>:<user>}``; tenant and
user ids match ``[A-Za-z0-9_.@+-]{1,128}``, so they can neither close the tag
nor forge a ``:`` separator, and are SCAN-glob safe)::

    O:ix             ZSET   all scores 0, member "<created ms, 20 digits>|<thread id>":
                            BYLEX REV = newest first, exact cursor paging
    O:t:<thread>     HASH   marker, title, state, version, branches (JSON), timestamps,
                            ownership, metadata (JSON), head, counters, legal hold
    O:e:<thread>     HASH   entry id -> entry JSON (role, content, parent), redacted
    O:p:<thread>     HASH   entry id -> parent entry id ("" = root): the entry tree
    O:r:<thread>     HASH   request id -> run record JSON (idempotent continue)
    O:v:<thread>     STREAM redacted event ledger, ids "<ms>-<seq>", never trimmed
    O:l:<thread>     STRING lease token of the continue running on the thread (PX expiry)
    O:dx             ZSET   recent deletes, member "<thread id>|<delete token>", score ms:
                            a retried delete knows its lost first attempt did delete
                            (bounded: 10 minutes, at most 1,000 members)

    {<ns>:threads}:cursor-secret  STRING  HMAC key of replay/list cursors (created once)

Every thread script declares its keys (no key is derived inside Lua).

LangGraph checkpoints (memtier.integrations.langgraph; ``G`` =
``{<ns>:g:<blake2b-96 of the thread id, hex>}``, so any thread id is tag-safe and all of
one thread's keys share a slot; ``<ns>`` below is the checkpoint namespace, ``\0`` a NUL
byte)::

    G:s              HASH   tid (the thread id), bytes (sum of the value bytes of ck, v, b
                            and w: exact accounting), checkpoints, writes (counts)
    G:z              ZSET   all scores 0, member "<ns>\0<checkpoint id>": BYLEX REV =
                            newest first per namespace (checkpoint ids sort by time)
    G:ck             HASH   "<ns>\0<checkpoint id>" -> msgpack [checkpoint type, bytes,
                            metadata type, bytes, parent checkpoint id]
    G:v              HASH   "<ns>\0<checkpoint id>" -> "<run id>\1<blob field>\1..." (the
                            channel versions it references, for reads and blob GC)
    G:b              HASH   "<ns>\0<channel>\0<version>" -> "<type>\0<bytes>"
    G:w              HASH   "<ns>\0<checkpoint id>\0<task id>\0<idx>" -> msgpack
                            [task id, channel, type, bytes, task path]
    G:wz             ZSET   the G:w fields, all scores 0 (BYLEX prefix = one checkpoint)
    G:rz             ZSET   "<run id>\0<ns>\0<checkpoint id>", all scores 0

    {<ns>:g}:threads ZSET   thread id -> last write (ms): list(None) walks it
    {<ns>:g}:r:<run> SET    thread ids with a checkpoint of that run (delete_for_runs)

The two global keys live in another slot, so they are written by a separate command
*before* a thread's script (a crash in between leaves an index entry without data,
which readers skip) and cleaned after a delete.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Final
from uuid import UUID

from memtier.errors import ValidationError

__all__ = [
    "CheckpointKeyspace",
    "CheckpointThreadKeys",
    "MemoryKeyspace",
    "OwnerKeys",
    "PartitionKeys",
    "SessionKeys",
    "ThreadKeys",
    "ThreadKeyspace",
    "session_member",
]


def session_member(avatar: UUID, channel: str) -> str:
    """The member string naming one (avatar, channel) inside a partition."""
    return f"{avatar}:{channel}"


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """The three keys of one (avatar, channel) session."""

    session: str
    turns: str
    turn_ids: str


@dataclass(frozen=True)
class PartitionKeys:
    """The keys of one memory partition; every one carries the partition's hash tag."""

    namespace: str
    partition: int

    @cached_property
    def tag(self) -> str:
        return "{" + f"{self.namespace}:m:{self.partition}" + "}"

    @cached_property
    def prefix(self) -> str:
        """``T:`` -- the scripts derive victim session keys from it (same slot)."""
        return self.tag + ":"

    def lru(self, channel: str) -> str:
        return f"{self.prefix}lru:{channel}"

    @cached_property
    def lru_public(self) -> str:
        return self.lru("public")

    @cached_property
    def lru_im(self) -> str:
        return self.lru("im")

    @cached_property
    def index(self) -> str:
        return self.prefix + "ix"

    @cached_property
    def meta(self) -> str:
        return self.prefix + "meta"

    @cached_property
    def events(self) -> str:
        return self.prefix + "events"

    @cached_property
    def compact(self) -> str:
        return self.prefix + "compact"

    def drop_receipt(self, op_id: str) -> str:
        """``T:op:<op id>``: the result of one operator drop, for its retries (same slot)."""
        return f"{self.prefix}op:{op_id}"

    def session(self, member: str) -> SessionKeys:
        p = self.prefix
        return SessionKeys(f"{p}s:{member}", f"{p}t:{member}", f"{p}i:{member}")


@dataclass(frozen=True)
class MemoryKeyspace:
    """Key builder for conversation memory in one namespace."""

    namespace: str
    partitions: int = 1

    def partition_of(self, member: str) -> int:
        """Stable partition of a member: blake2b, the same on every host and Python version."""
        if self.partitions == 1:
            return 0
        digest = hashlib.blake2b(member.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") % self.partitions

    def partition(self, index: int) -> PartitionKeys:
        return _partition_keys(self.namespace, index)

    def all_partitions(self) -> list[PartitionKeys]:
        return [self.partition(i) for i in range(self.partitions)]

    @cached_property
    def restore_lock(self) -> str:
        """Held by the one worker that restores a snapshot into an empty namespace."""
        return "{" + f"{self.namespace}:m:restore" + "}:lock"

    @cached_property
    def restore_state(self) -> str:
        """HASH: the namespace was initialised from snapshots (status, generation, outcome).

        Same hash tag as :attr:`restore_lock` (one script handles both).
        """
        return "{" + f"{self.namespace}:m:restore" + "}:state"

    def pattern(self) -> str:
        """SCAN pattern matching every memory key of this namespace (operators, tests)."""
        return "{" + f"{self.namespace}:m:*"


_PARTITION_CACHE: dict[tuple[str, int], PartitionKeys] = {}


def _partition_keys(namespace: str, index: int) -> PartitionKeys:
    key = (namespace, index)
    found = _PARTITION_CACHE.get(key)
    if found is None:
        found = _PARTITION_CACHE[key] = PartitionKeys(namespace, index)
    return found


# --- conversation threads ---------------------------------------------------------------------

OWNER_ID_RE = re.compile(r"^[A-Za-z0-9_.@+\-]{1,128}\Z")
THREAD_ID_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}\Z")


@dataclass(frozen=True, slots=True)
class ThreadKeys:
    """The keys of one conversation thread; all carry the owner's hash tag."""

    thread: str
    entries: str
    parents: str
    runs: str
    events: str
    lease: str

    def all(self) -> tuple[str, ...]:
        """Every key of the thread (what ``delete`` removes, besides its index member)."""
        return (self.thread, self.entries, self.parents, self.runs, self.events, self.lease)


@dataclass(frozen=True)
class OwnerKeys:
    """The keys of one owner (tenant, user): every thread of theirs shares this hash tag."""

    namespace: str
    tenant: str
    user: str

    def __post_init__(self) -> None:
        for name, value in (("tenant", self.tenant), ("user", self.user)):
            if not OWNER_ID_RE.match(value):
                raise ValidationError(f"{name} id must match {OWNER_ID_RE.pattern}", field=name)

    @cached_property
    def tag(self) -> str:
        return "{" + f"{self.namespace}:o:{self.tenant}:{self.user}" + "}"

    @cached_property
    def prefix(self) -> str:
        return self.tag + ":"

    @cached_property
    def index(self) -> str:
        """ZSET of the owner's threads (newest first by lexicographic member order)."""
        return self.prefix + "ix"

    @cached_property
    def recent_deletes(self) -> str:
        """ZSET of this owner's recent deletes ("<thread id>|<token>", score ms), bounded."""
        return self.prefix + "dx"

    def thread(self, thread_id: str) -> ThreadKeys:
        if not THREAD_ID_RE.match(thread_id):
            raise ValidationError(f"thread id must match {THREAD_ID_RE.pattern}", field="id")
        return _thread_keys(self.prefix, thread_id)

    def pattern(self) -> str:
        """SCAN pattern matching every key of this owner."""
        return self.prefix + "*"


# Every thread call builds its owner's and its thread's keys; the same few owners and threads
# come back call after call, and building them (two id checks, seven strings) was a fiftieth
# of a continue's client work.  Both are immutable; a miss builds them as before, and an
# invalid id raises every time (lru_cache keeps no exception).
_KEYS_CACHED: Final = 4096


@lru_cache(maxsize=_KEYS_CACHED)
def _owner_keys(namespace: str, tenant: str, user: str) -> OwnerKeys:
    return OwnerKeys(namespace, tenant, user)


@lru_cache(maxsize=_KEYS_CACHED)
def _thread_keys(prefix: str, thread_id: str) -> ThreadKeys:
    return ThreadKeys(
        thread=f"{prefix}t:{thread_id}",
        entries=f"{prefix}e:{thread_id}",
        parents=f"{prefix}p:{thread_id}",
        runs=f"{prefix}r:{thread_id}",
        events=f"{prefix}v:{thread_id}",
        lease=f"{prefix}l:{thread_id}",
    )


@dataclass(frozen=True)
class ThreadKeyspace:
    """Key builder for conversation threads in one namespace."""

    namespace: str

    def owner(self, tenant: str, user: str) -> OwnerKeys:
        return _owner_keys(self.namespace, tenant, user)

    @cached_property
    def cursor_secret(self) -> str:
        """The HMAC key of thread cursors, shared by every process of the namespace."""
        return "{" + f"{self.namespace}:threads" + "}:cursor-secret"

    def pattern(self) -> str:
        """SCAN pattern matching every thread key of this namespace (operators, tests)."""
        return "{" + f"{self.namespace}:o:*"


# --- LangGraph checkpoints --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckpointThreadKeys:
    """The eight keys of one LangGraph thread; all carry the thread's hash tag."""

    state: str
    index: str
    checkpoints: str
    versions: str
    blobs: str
    writes: str
    write_index: str
    runs: str

    def all(self) -> tuple[str, ...]:
        """Every key, in the KEYS order of the lua/langgraph scripts."""
        return (
            self.state,
            self.index,
            self.checkpoints,
            self.versions,
            self.blobs,
            self.writes,
            self.write_index,
            self.runs,
        )

    def reads(self) -> tuple[str, ...]:
        """The KEYS of checkpoint_read-6.lua."""
        return (
            self.index,
            self.checkpoints,
            self.versions,
            self.blobs,
            self.writes,
            self.write_index,
        )


@dataclass(frozen=True)
class CheckpointKeyspace:
    """Key builder for LangGraph checkpoints in one memtier namespace."""

    namespace: str

    def thread(self, thread_id: str) -> CheckpointThreadKeys:
        digest = hashlib.blake2b(thread_id.encode(), digest_size=12).hexdigest()
        p = "{" + f"{self.namespace}:g:{digest}" + "}:"
        return CheckpointThreadKeys(
            state=p + "s",
            index=p + "z",
            checkpoints=p + "ck",
            versions=p + "v",
            blobs=p + "b",
            writes=p + "w",
            write_index=p + "wz",
            runs=p + "rz",
        )

    @cached_property
    def threads(self) -> str:
        """ZSET thread id -> last write ms (another slot than any thread's keys)."""
        return "{" + f"{self.namespace}:g" + "}:threads"

    def run(self, run_id: str) -> str:
        """SET of the thread ids holding checkpoints of ``run_id`` (same slot as threads)."""
        return "{" + f"{self.namespace}:g" + "}:r:" + run_id

    def pattern(self) -> str:
        """SCAN pattern matching every checkpoint key of this namespace."""
        return "{" + f"{self.namespace}:g*"
