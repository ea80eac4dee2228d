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
    T:t:<member>     LIST   its turns, oldest first:
                            "<seq>|<clock_ms>|<wall_ms>|<bytes>|<is_tool 0/1>|<json>"
    T:i:<member>     ZSET   its turn ids (score = seq) for idempotent retries
    T:lru:public     ZSET   member -> last activity (ms) of public sessions
    T:lru:im         ZSET   member -> last activity (ms) of IM sessions
    T:ix             HASH   member -> session bytes (exact accounting, metadata paging)
    T:meta           HASH   bytes (aggregate), clock (non-decreasing ms high-water mark)
    T:events         STREAM reason-code events, MAXLEN-bounded, never content
    T:compact        STREAM compaction jobs for ``memtier worker``

``<member>`` is ``<avatar-uuid>:<channel>``: lowercase hyphenated UUID, so the
lexicographic order Redis uses for equal scores is UUID order, then channel
(``im`` < ``public``) -- the LRU tie-break the spec asks for.

Eviction and sweeping delete sessions the caller did not name: the scripts
derive those keys from the partition's tag prefix (ARGV), which is always in
the same slot as the declared keys.  This is the one documented exception to
"scripts touch only KEYS", tested on a real Redis Cluster.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from uuid import UUID

__all__ = ["MemoryKeyspace", "PartitionKeys", "SessionKeys", "session_member"]


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
