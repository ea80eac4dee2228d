"""The page bounds of the flush are hard ceilings (issue 12: no page holds a shard long).

A flush asked for pages of any size -- far larger than the ceilings included -- sends no
``snapshot_page`` call with more than
:data:`~memtier.memory.persistence.flush.MAX_PAGE_SESSIONS` members (or the smaller
number asked for; :data:`~memtier.memory.persistence.flush.PAGE_SESSIONS` by default),
nor members whose indexed bytes pass
:data:`~memtier.memory.persistence.flush.MAX_PAGE_BYTES` (or the smaller bound asked for;
:data:`~memtier.memory.persistence.flush.PAGE_BYTES` by default) unless one session is
alone in its call; and every session is still written (nothing dropped to keep a bound).
Generated sessions of 1-3 turns of up to 12 KiB, so that 64 sessions pass 32 KiB and
single sessions pass the small bounds.  Fakeredis, real Redis and the real cluster.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from workhelpers import Clock, key, persistent_store, snaps

from memtier import AgentResponse, AvatarMessage, ConversationStore
from memtier.engine import Overlap, ScriptCall
from memtier.memory.persistence import flush_plan
from memtier.memory.persistence.flush import (
    MAX_PAGE_BYTES,
    MAX_PAGE_SESSIONS,
    PAGE_BYTES,
    PAGE_SESSIONS,
)
from memtier.wire import text as _b

# (turns, text bytes per turn)
_SESSION = st.tuples(st.integers(1, 3), st.integers(1, 12 * 1024))
_FIXED_ARGS = 4  # snapshot_page's ARGV before the members: prefix, two TTLs, clock


def _wipe(backend: Any, store: ConversationStore) -> None:
    if backend.is_fake:
        store.client.flushall()
    else:
        backend.delete_namespace()


def _indexed_bytes(store: ConversationStore) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in store.core.keyspace.all_partitions():
        for member, nbytes in store.client.hgetall(part.index).items():
            out[_b(member)] = int(nbytes)
    return out


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    sessions=st.lists(_SESSION, min_size=1, max_size=90),
    page_sessions=st.none() | st.integers(1, 10_000),
    page_bytes=st.none() | st.integers(1, 64 * 1024 * 1024),
)
@example(sessions=[(3, 12 * 1024)] * 70, page_sessions=10_000, page_bytes=64 * 1024 * 1024)
@example(sessions=[(1, 100)] * 90, page_sessions=256, page_bytes=MAX_PAGE_BYTES)
@example(sessions=[(3, 12 * 1024)] * 70, page_sessions=None, page_bytes=None)
@example(sessions=[(2, 5000), (1, 1), (3, 12 * 1024)], page_sessions=2, page_bytes=1)
def test_no_page_passes_the_ceilings_whatever_is_asked(
    backend: Any,
    tmp_path: Path,
    sessions: list[tuple[int, int]],
    page_sessions: int | None,
    page_bytes: int | None,
) -> None:
    store = persistent_store(
        backend,
        tmp_path / os.urandom(4).hex(),
        Clock(),
        max_turns_per_session=8,
        max_session_bytes=64 * 1024,
    )
    try:
        _wipe(backend, store)
        for n, (turns, nbytes) in enumerate(sessions):
            for j in range(turns):
                text = ("x" * nbytes) if j % 2 == 0 else ("y" * nbytes)
                turn = AvatarMessage(text=text) if j % 2 == 0 else AgentResponse(text=text)
                store.append(key(n + 1, "im" if n % 3 == 0 else "public"), turn)
        indexed = _indexed_bytes(store)
        pages: list[list[str]] = []
        execute = store.executor.execute

        def recording(request: Any, operation: str | None = None) -> Any:
            inner = request.request if isinstance(request, Overlap) else request
            if isinstance(inner, ScriptCall) and inner.script == "snapshot_page":
                pages.append([_b(m) for m in inner.args[_FIXED_ARGS:]])
            return execute(request, operation)

        store.executor.execute = recording  # type: ignore[method-assign]
        asked: dict[str, int] = {}
        if page_sessions is not None:
            asked["page_sessions"] = page_sessions
        if page_bytes is not None:
            asked["page_bytes"] = page_bytes
        try:
            result = store.executor.run(flush_plan(store.core, snaps(store), **asked))
        finally:
            del store.executor.execute
        max_members = min(page_sessions or PAGE_SESSIONS, MAX_PAGE_SESSIONS)
        max_bytes = min(page_bytes or PAGE_BYTES, MAX_PAGE_BYTES)
        for members in pages:
            assert len(members) <= max_members, (len(members), max_members)
            if len(members) > 1:
                assert sum(indexed[m] for m in members) <= max_bytes, members
        # every live session written: no bound dropped one
        assert result.sessions == len(sessions) and result.skipped == {}
        assert {m for members in pages for m in members} == set(indexed)
    finally:
        _wipe(backend, store)
        store.close()
