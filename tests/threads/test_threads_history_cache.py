"""Issue 12 (threads, branch threadsfast): the history a continue hands its runner, cheaper.

* ``run_claim`` reads the path root -> base from a cache in the parents hash (``~path``,
  extended by ``run_commit``) instead of one ``HGET`` per entry: a generated adversary
  (turns on the head and on older leaves, failed and denied turns, lost claim replies,
  a corrupt cache) checks after every step that the cache, where there is one, is the
  true path of the entry it ends at, and that the runner saw exactly the branch path.
* :class:`HistoryCache` hands out what :func:`entry_from_json` would decode, for any bytes
  (changed, repeated, over the per-entry bound), and keeps its bounds.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from threadhelpers import OWNER, ModelRunner

from memtier.threads import (
    ConversationService,
    historycache,
)
from memtier.threads.historycache import HistoryCache
from memtier.threads.records import entry_from_json, entry_row

PATH_FIELD = "~path"


def _true_path(client: Any, parents_key: str, leaf: str) -> list[str]:
    path, cursor = [], leaf
    for _ in range(10_000):  # bounded: a path is never longer than the thread
        if not cursor:
            break
        path.append(cursor)
        raw = client.hget(parents_key, cursor)
        assert raw is not None, f"dangling parent of {cursor}"
        cursor = raw.decode() if isinstance(raw, bytes) else raw
    path.reverse()
    return path


_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["ok", "ok", "ok", "fail", "deny"]),
        st.integers(min_value=-1, max_value=8),  # continue from the n-th reply (-1: head)
        st.sampled_from(["keep", "keep", "keep", "drop", "forge"]),  # what happens to ~path
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=_STEPS)
@example(steps=[("ok", -1, "keep"), ("ok", -1, "keep"), ("ok", 0, "keep"), ("ok", -1, "keep")])
@example(steps=[("ok", -1, "keep"), ("ok", -1, "forge"), ("ok", -1, "keep")])
@example(steps=[("ok", -1, "keep"), ("fail", -1, "keep"), ("deny", 0, "drop"), ("ok", 0, "keep")])
def test_the_path_cache_is_always_the_true_path_of_its_leaf(
    backend: Any, steps: list[tuple[str, int, str]]
) -> None:
    runner = ModelRunner()
    client = backend.sync_client()
    service = ConversationService(client, backend.config(), runner=runner)
    try:
        tid = service.create(OWNER).id
        keys = service.core.keyspace.owner(OWNER.tenant_id, OWNER.user_id).thread(tid)
        replies: list[str] = []
        head: str | None = None
        for outcome, from_reply, cache_fate in steps:
            if cache_fate == "drop":
                client.hdel(keys.parents, PATH_FIELD)
            elif cache_fate == "forge" and head is not None:
                # a cache that does not end at the base is never used: written by hand,
                # by an older version, or for another leaf
                client.hset(keys.parents, PATH_FIELD, "e999 e1000")
            runner.outcome = outcome
            leaf = replies[from_reply] if 0 <= from_reply < len(replies) else None
            if leaf is not None:
                service.branch(OWNER, tid, leaf)
            base = leaf or head
            expected = tuple(_true_path(client, keys.parents, base)) if base else ()
            try:
                result = service.continue_(OWNER, tid, "hi", leaf_id=leaf)
            except Exception as exc:  # the failing runner
                assert outcome == "fail", exc
                result = None
            assert runner.seen[-1] == expected
            if result is not None and result.entries:
                replies.append(result.entries[-1].id)
                head = result.entries[-1].id
            cached = client.hget(keys.parents, PATH_FIELD)
            if cached is not None:
                ids = cached.decode().split(" ")
                if ids != ["e999", "e1000"]:  # the forged one stays until overwritten
                    assert ids == _true_path(client, keys.parents, ids[-1])
    finally:
        service.close()


def test_a_continue_on_the_head_walks_no_parents(backend: Any) -> None:
    """Once cached, the claim reads the path in one HGET: no HGET per entry."""
    runner = ModelRunner()
    client = backend.sync_client()
    service = ConversationService(client, backend.config(), runner=runner)
    try:
        tid = service.create(OWNER).id
        keys = service.core.keyspace.owner(OWNER.tenant_id, OWNER.user_id).thread(tid)
        for _ in range(6):
            service.continue_(OWNER, tid, "hi")
        cached = client.hget(keys.parents, PATH_FIELD)
        assert cached is not None
        assert cached.decode().split(" ") == [f"e{i}" for i in range(1, 13)]
        assert runner.seen[-1] == tuple(f"e{i}" for i in range(1, 11))
    finally:
        service.close()


# --- HistoryCache ---------------------------------------------------------------------------

_CONTENT = st.text(alphabet=st.sampled_from(["a", "é", '"', "\\", " ", "💥", "x"]), max_size=40)


def _raw(i: int, content: str, truncated: bool) -> bytes:
    parent = f"e{i - 1}" if i > 1 else ""
    row = entry_row(f"e{i}", parent, "user", content, 1_700_000, "r", truncated)
    return orjson.dumps(row)


@settings(max_examples=60)
@given(
    reads=st.lists(
        st.lists(st.tuples(st.integers(1, 6), _CONTENT, st.booleans()), max_size=8),
        min_size=1,
        max_size=6,
    ),
    threads=st.integers(1, 3),
)
@example(reads=[[(1, "a", False)], [(1, "a", True)], [(1, "b", False)]], threads=1)
def test_the_history_cache_decodes_what_entry_from_json_does(
    reads: list[list[tuple[int, str, bool]]], threads: int
) -> None:
    cache = HistoryCache()
    for n, read in enumerate(reads):
        values = [_raw(i, c, t) for i, c, t in read]
        got = cache.decode(f"k{n % threads}", values)
        assert got == [entry_from_json(v) for v in values]
        kept, size = cache.stats()
        assert kept <= threads and size <= historycache.MAX_BYTES


def test_the_history_cache_keeps_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(historycache, "MAX_THREADS", 3)
    monkeypatch.setattr(historycache, "MAX_BYTES", 1_000)
    monkeypatch.setattr(historycache, "MAX_ENTRY_BYTES", 200)
    cache = HistoryCache()
    small, big = _raw(1, "a", False), _raw(2, "x" * 300, False)
    assert cache.decode("k0", [small, big]) == [entry_from_json(small), entry_from_json(big)]
    assert cache.stats() == (1, len(small))  # the big entry is decoded, never kept
    for i in range(1, 6):
        cache.decode(f"k{i}", [small])
    assert cache.stats() == (3, 3 * len(small))  # least recently claimed dropped first
    many = [_raw(i, "y" * 150, False) for i in range(1, 9)]  # > MAX_BYTES in all
    assert cache.decode("k9", many) == [entry_from_json(v) for v in many]
    kept, size = cache.stats()
    assert size <= 1_000 and kept <= 3
    assert cache.decode("k9", [small]) == [entry_from_json(small)]  # str or bytes alike
    assert cache.decode("k9", [small.decode()]) == [entry_from_json(small)]
