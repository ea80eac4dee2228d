"""Conversation threads: durable, ownership-scoped threads on Redis.

Public API: :func:`create_conversation_service` / :class:`ConversationService`
(sync), :func:`create_async_conversation_service` /
:class:`AsyncConversationService` (asyncio), the wire models
(:class:`ConversationThread`, ...), :class:`Ownership`, the runner protocol
(:mod:`memtier.threads.runner`), the HTTP app
(:func:`memtier.threads.http.create_conversation_app`, needs ``memtier[http]``)
and ``memtier serve`` (:mod:`memtier.threads.serve`).  User documentation:
``docs/threads.md``.

Design decisions (and why)
--------------------------

*One core, two shells.*  Every operation is a plan (:mod:`memtier.engine`)
built by :mod:`memtier.threads.core` that yields requests (script call, command,
pipelined reads, sleep, the hand-off of a claimed turn to the runner); the sync
and asyncio services only drive them through the public executors
(:mod:`memtier.executor`).  Validation, keys, ARGV (declared once per script in
:mod:`memtier.threads.specs`), decoding, errors, paging, the continue protocol
(:mod:`memtier.threads.turns`) and the run-turn protocol -- emit, heartbeat,
wall-clock limit, cancellation (:mod:`memtier.threads.runturn`) -- exist once,
so the two APIs cannot drift.

*Storage and ownership.*  All keys of one owner share the hash tag
``{<ns>:o:<tenant>:<user>}`` (layout in :mod:`memtier.keys`): each script runs
in one Cluster slot, and a key derived from the caller's ownership cannot name
another owner's thread -- wrong-owner access is ``not_found`` by construction,
byte-identical to a missing thread (an impossible id is ``not_found`` too).
Tenant and user ids are validated (``[A-Za-z0-9_.@+-]{1,128}``), so they can
neither close the tag nor forge a separator.  Ownership is written by ``create``
only.  Every thread script declares all of its keys.

*Clock.*  Threads have no TTL arithmetic, so the client's clock (ARGV
``now_ms``, injectable for tests) is enough for the human-facing timestamps.
Ledger ids are ``<ms>-<seq>`` with ``ms = max(now_ms, newest row)``, so
``(timestamp, id)`` order never goes backwards even when hosts' clocks
disagree (skew only shifts displayed times).

*create.*  Get-or-create (the spec's behaviour): with an explicit id (or one
derived from a request id: an RFC 4122 version-5 UUID under a fixed,
documented namespace) the flow first reads the thread and returns it unchanged
when it exists, whatever the new body says (HTTP 200).  Otherwise the write is
create-only; the script refuses an existing row, so the only loser is a true
create+create race (the row appeared between the read and the write) with
another body: ``metadata_conflict``.  A replay of the same create (same
fingerprint of title, metadata, request id) returns the thread.  Ids given to
create follow a grammar every client can address (no ``.``/``..``, no route
segment names).

*branch / archive.*  Compare-and-swap on ``version`` inside Lua, against the
caller's ``expectedVersion`` or a snapshot read just before.  Checks, in
order: exists (else ``not_found``: a write never re-creates a deleted thread);
branch of an already recorded leaf is a no-op (refs are append-only, and a
retried call after a lost reply succeeds); version (the loser of
branch+branch and branch+archive gets ``metadata_conflict``); archived; the
leaf is an entry; the active-branch cap (exact under concurrency because the
count and the write are one atomic step).  Archiving an archived thread is a
no-op whatever the version.

*continue.*  Entries form a tree (``parentId``); a thread's ``headId`` is the
last entry of its most recent turn, where a continue without ``leafId``
attaches; with ``leafId`` (a recorded branch ref) it forks there.  The
protocol, all in Lua: ``run_claim`` atomically checks the request's run record,
takes a per-thread lease (token, 30 s, renewed every 10 s by a heartbeat while
the runner works), writes the turn's opening rows (``agent_started``,
``user_message``) and answers the thread and the history, rebuilt from durable
entries along the chosen path (inline up to 1 MiB, the rest read by id); the
runner's events are appended live (batch numbers make a retried append a
no-op); ``run_commit`` writes both entries, the closing events and the run
result atomically and releases the lease, only if the token still holds it.
A successful turn is thus one round trip to claim, one per runner event and
one to commit.  Hence:

- two different continues never interleave: one holds the lease; the other
  waits up to ``busy_wait_s`` (5 s) and then fails ``thread_busy`` (409) with
  nothing stored;
- an exact retry (same ``requestId``, same message and leaf) returns the first
  result without running the agent again; arriving while the first attempt
  runs, it waits up to ``inflight_wait_s`` (30 s) for that result, then gets
  ``request_in_progress`` (409) and can retry later.  The same request id with
  another message is ``request_conflict`` (422, as the IETF Idempotency-Key draft);
- the runner is called once per request id while the process running it is
  alive and keeps its lease; if that process dies (or stalls longer than the
  lease), the lease expires and a retry takes the abandoned run over:
  at-least-once across crashes, yet only one result is ever recorded (a
  superseded run's commit fails its token check);
- a runner that raises records a terminal ``error`` row, releases the request
  id (a retry may run again) and answers ``runner_failed`` (502);
  :class:`AgentDenied` records ``agent_denied`` and is a result, not an error;
- ``delete`` wins: a turn whose thread was deleted writes nothing and answers
  ``not_found``.  Archiving a thread does not abort a turn already running.

*Ledger, replay, export.*  One Redis Stream per thread, never trimmed (its
size is bounded per thread, below).  Every row is written through the
redactor and flagged; rows without the flag are never served.  ``terminal``
is true when the page reaches the end, no turn holds the lease, and the newest
row is ``agent_finished``/``agent_denied``/``error``; ``nextCursor`` is present
while rows remain or a turn is still writing.  Cursors are
``HMAC-SHA256``-signed and bound to (owner, thread) (:mod:`memtier.threads.cursor`);
the key is created once per namespace in Redis (``SET NX``), so every process
of a deployment accepts every other's cursors (whoever can read Redis can
mint cursors, but can read the data anyway).  Export counts the JSON of the
thread, the envelope and each page and stops at page granularity.

*Redaction.*  Rows are checked again on read: ledger data is path-scrubbed and
redacted before replay/export serve it, and export scrubs local paths from the
thread's title and metadata; titles and metadata are secret-redacted on every
read.  On write, messages, replies and titles go through
:func:`memtier.redaction.sanitize`; metadata and runner event data through
:func:`memtier.redaction.redact_json`, after absolute local paths (and
``file://`` URLs) became ``[PATH]`` and raw payload fields (``raw``,
``payload``, ``arguments``, ``input``, ``output``, ``stdout``, ``stderr``,
``body``...) were omitted.

*Retries.*  One layer (:mod:`memtier.retry`); every write script is replay-safe:
create (fingerprint), branch (existing ref = no-op), archive (no-op), hold
(idempotent), run_claim (own token: a replay answers the same turn and ids and
writes no second pair of opening rows), events_append (batch seq), run_commit
(done record with our token), run_abort (token check); a ``delete`` carries
one random token for all its attempts and records it in the owner's bounded
recent-deletes set, so a retry whose first attempt's reply was lost reports
``deleted``, while a retry whose first attempt never reached Redis reports
``not_found`` for a missing or another owner's thread.

*Ownership inside the scripts.*  Besides the hash tag, every script that writes
a thread (create, branch, archive, hold, delete, run_claim) and read_events
compares the row's stored tenant and user with the caller's before doing
anything; the run scripts after run_claim act only with the lease token it
handed out.

*Entry ids* come from a per-thread sequence that only grows (``eidseq``,
advanced by run_claim): a failed or denied turn's ids are never reused, and its
closing row lists them as ``discardedEntryIds`` with ``entryIds: []``.

*Bounds* (fixed, :mod:`memtier.limits`): 256 KiB per message, 16 KiB of
metadata, 16 KiB per runner event and 256 events per turn (the rest counted in
``agent_finished.eventsDropped``), 2,000 entries, 100,000 ledger rows and 64
MiB per thread (``run_claim`` reserves a turn's worst case up front, so a
started turn never fails for space), 10,000 threads per owner, 128-byte ids;
waits at most 300 s.  Configurable frozen limits: :class:`memtier.config.ThreadsConfig`.
"""

from memtier.errors import ConversationError, ConversationErrorCode
from memtier.threads.aio import AsyncConversationService, create_async_conversation_service
from memtier.threads.models import (
    AgentIdentity,
    BranchRef,
    ContinueResult,
    ContinueStatus,
    ConversationEntry,
    ConversationThread,
    DeleteResult,
    EntryRole,
    EventRecord,
    ExportResult,
    Ownership,
    Principal,
    ReplayPage,
    ThreadPage,
    ThreadState,
)
from memtier.threads.runlimits import RunLimits
from memtier.threads.runner import (
    AgentDenied,
    AsyncConversationRunner,
    AsyncRunnerTurn,
    ConversationRunner,
    EchoRunner,
    RunnerEvent,
    RunnerReply,
    RunnerTurn,
)
from memtier.threads.service import ConversationService, create_conversation_service

__all__ = [
    "AgentDenied",
    "AgentIdentity",
    "AsyncConversationRunner",
    "AsyncConversationService",
    "AsyncRunnerTurn",
    "BranchRef",
    "ContinueResult",
    "ContinueStatus",
    "ConversationEntry",
    "ConversationError",
    "ConversationErrorCode",
    "ConversationRunner",
    "ConversationService",
    "ConversationThread",
    "DeleteResult",
    "EchoRunner",
    "EntryRole",
    "EventRecord",
    "ExportResult",
    "Ownership",
    "Principal",
    "ReplayPage",
    "RunLimits",
    "RunnerEvent",
    "RunnerReply",
    "RunnerTurn",
    "ThreadPage",
    "ThreadState",
    "create_async_conversation_service",
    "create_conversation_service",
]
