"""``memtier_events_total{reason}`` counts exactly the events the scripts published.

A generated sequence of operations (appends, clock jumps past the TTL, operator
deletes and expiries, sweeps, forced compactions, evictions under a small session
ceiling, then a flush, a wipe and a recovery) runs on every backend; the counter's
increase per reason must equal the events on the stream per reason -- the stream is
the model.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from workhelpers import Clock, key, persistent_store, sync_store

from memtier import AvatarMessage
from memtier.memory.models import ReasonCode

REASONS = [r.value for r in ReasonCode]
SESSIONS = 4
TTL_S = 60
FILL = 8
SMALL = {"max_turns_per_session": 10, "max_tool_results": 4}

EXAMPLE: list[tuple[str, int]] = [
    *[("append", n) for n in range(2 * SESSIONS)],  # 8 sessions > the ceiling of 6: evictions
    ("fill", 7),
    ("compact", 7),  # compacted
    ("delete", 6),  # operator_deleted
    ("advance", 0),
    ("append", 3),  # rotated
    ("sweep", 0),  # expired
    ("expire", 4),  # operator_expired
]
EXAMPLE_REASONS = {
    "evicted_session_pressure",
    "compacted",
    "operator_deleted",
    "rotated",
    "expired",
    "operator_expired",
}

operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 2 * SESSIONS - 1)),
        st.tuples(st.just("fill"), st.integers(0, 2 * SESSIONS - 1)),
        st.tuples(st.just("advance"), st.just(0)),
        st.tuples(st.just("delete"), st.integers(0, 2 * SESSIONS - 1)),
        st.tuples(st.just("expire"), st.integers(0, 2 * SESSIONS - 1)),
        st.tuples(st.just("sweep"), st.just(0)),
        st.tuples(st.just("compact"), st.integers(0, 2 * SESSIONS - 1)),
    ),
    max_size=25,
)


def _counts() -> dict[str, float]:
    return {
        reason: REGISTRY.get_sample_value("memtier_events_total", {"reason": reason}) or 0.0
        for reason in REASONS
    }


def _key(n: int) -> Any:
    return key(1 + n // 2, "public" if n % 2 else "im")


def _run(store: Any, clock: Clock, ops: list[tuple[str, int]]) -> None:
    for op, n in ops:
        if op == "append":
            store.append(_key(n), AvatarMessage(text=f"turn {n}"))
        elif op == "fill":  # past the compaction trigger (and, repeated, inline compaction)
            for i in range(FILL):
                store.append(_key(n), AvatarMessage(text=f"turn {n}.{i}"))
        elif op == "advance":
            clock.advance(TTL_S * 1000 + 1)  # every public session past its TTL
        elif op == "delete":
            store.delete(_key(n))
        elif op == "expire":
            store.expire(_key(n))
        elif op == "sweep":
            store.sweep()
        else:
            store.compact(_key(n), force=True)


@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
@example(ops=EXAMPLE)
def test_events_total_counts_recovery_events(
    backend: Any, tmp_path: Path, ops: list[tuple[str, int]]
) -> None:
    backend.delete_namespace()
    clock = Clock()
    store = persistent_store(
        backend,
        tmp_path,
        clock,
        public_ttl_seconds=TTL_S,
        max_active_sessions=2 * SESSIONS - 2,
        **SMALL,
    )
    _run(store, clock, ops)
    store.flush()
    # Wipe Redis (the stream too), recover: every event now on the stream is recovery's
    # (`restored`, or `expired` for a session past its TTL by now).
    backend.delete_namespace()
    if backend.is_fake:
        store.client.flushall()
    clock.advance(1)
    before = _counts()
    store.recover()
    after = _counts()
    published = Counter(e.reason.value for e in store.events(limit=1000))
    delta = {r: int(after[r] - before[r]) for r in REASONS if after[r] != before[r]}
    assert delta == dict(published), (delta, published)


@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
@example(ops=EXAMPLE)
def test_events_total_matches_the_event_stream(backend: Any, ops: list[tuple[str, int]]) -> None:
    backend.delete_namespace()
    clock = Clock()
    store = sync_store(
        backend,
        clock,
        conversation={
            "public_ttl_seconds": TTL_S,
            "max_active_sessions": 2 * SESSIONS - 2,
            **SMALL,
        },
    )
    if backend.is_fake:
        store.client.flushall()
    before = _counts()
    _run(store, clock, ops)
    after = _counts()
    published = Counter(e.reason.value for e in store.events(limit=1000))
    delta = {r: int(after[r] - before[r]) for r in REASONS if after[r] != before[r]}
    assert delta == dict(published), (delta, published)
    if ops == EXAMPLE:  # the pinned example publishes every kind an operation can
        assert set(published) == EXAMPLE_REASONS, published
