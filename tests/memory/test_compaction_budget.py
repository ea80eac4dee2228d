"""Compaction never grows a session (issue 8, *Compaction*).

The summary's budget is the smaller of ``max_summary_bytes`` and the bytes it replaces
(folded turns plus the previous summary); the deterministic summariser shortens to fit.
So a session at its turn bound can always make room, and appends of small turns never
start failing.  Pure properties on random sessions, then the same through the store on
fakeredis and a real redis-server.
"""

from __future__ import annotations

import itertools
from typing import Any

import memfixtures
import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from memhelpers import Clock, StoreMaker, key

from memtier import (
    ActionResult,
    AgentResponse,
    AvatarMessage,
    ToolSummary,
)
from memtier.config import ConversationConfig
from memtier.memory.compaction import CompactionStatus, plan_compaction
from memtier.memory.state import SessionState, StoredTurn
from memtier.memory.summary import build_summary, deterministic_summary, minimal_summary_bytes

fake_or_real = memfixtures.fake_or_real  # the fixture, in this module's namespace
make_store = memfixtures.make_store  # the store tests: sync and asyncio store (issue 13)

T0 = 1_800_000_000_000
KIND_FIELDS = {
    "avatar": ("text",),
    "agent": ("text",),
    "tool": ("tool", "summary"),
    "action": ("action", "outcome"),
}


def _record(seq: int, kind: str, size: int) -> StoredTurn:
    if kind in ("tool", "action"):
        fields = {kind: "search" if kind == "tool" else "wave", KIND_FIELDS[kind][1]: "r" * size}
    else:
        fields = {"text": "m" * size}
    return StoredTurn(
        seq=seq,
        clock_ms=T0 + seq * 1000,
        wall_ms=T0 + seq * 1000,
        nbytes=sum(len(v.encode()) for v in fields.values()),
        is_tool=kind == "tool",
        kind=kind,
        turn_id=f"t{seq}",
        fields=fields,
    )


def _state(records: tuple[StoredTurn, ...], summary: bytes | None) -> SessionState:
    summary_bytes = len(summary) if summary else 0
    return SessionState(
        member="00000000-0000-0000-0000-000000000001:public",
        session_id="ses_" + "a" * 22,
        created_ms=T0,
        created_wall_ms=T0,
        last_ms=records[-1].clock_ms if records else T0,
        last_wall_ms=records[-1].wall_ms if records else T0,
        seq=records[-1].seq if records else 0,
        turns=len(records),
        nbytes=sum(r.nbytes for r in records) + summary_bytes,
        tools=sum(r.is_tool for r in records),
        summary_bytes=summary_bytes,
        summary_version=1 if summary else 0,
        summary=summary.decode() if summary else None,
        records=records,
    )


configs = st.builds(
    lambda turns, session, summary_share, tools: ConversationConfig(
        max_turns_per_session=turns,
        max_session_bytes=session,
        max_summary_bytes=max(256, session * summary_share // 100),
        max_tool_results=tools,
    ),
    turns=st.integers(4, 40),
    session=st.integers(1024, 16384),
    summary_share=st.integers(1, 50),
    tools=st.integers(1, 8),
)


@st.composite
def sessions(draw: st.DrawFn) -> tuple[ConversationConfig, SessionState]:
    conv = draw(configs)
    n = draw(st.integers(1, conv.max_turns_per_session))
    kinds = draw(st.lists(st.sampled_from(list(KIND_FIELDS)), min_size=n, max_size=n))
    sizes = draw(st.lists(st.integers(0, 120), min_size=n, max_size=n))
    first = draw(st.integers(1, 500))
    records = tuple(
        _record(first + i, k, s) for i, (k, s) in enumerate(zip(kinds, sizes, strict=True))
    )
    summary = None
    if first > 1 and draw(st.booleans()):
        earlier = tuple(_record(i, "avatar", draw(st.integers(0, 200))) for i in range(1, 4))
        summary = build_summary(None, earlier, conv.max_summary_bytes)
    return conv, _state(records, summary)


@given(session=sessions(), force=st.booleans(), incoming=st.integers(0, 200))
@example(  # the finding: 8 bytes folded became a 445-byte summary (session 28 -> 465 B)
    session=(
        ConversationConfig(max_turns_per_session=4),
        _state(tuple(_record(i, "avatar", 7) for i in range(1, 5)), None),
    ),
    force=True,
    incoming=7,
)
@example(  # all-empty turns: no summary fits, the turns are folded without one
    session=(
        ConversationConfig(max_turns_per_session=4),
        _state(tuple(_record(i, "agent", 0) for i in range(1, 5)), None),
    ),
    force=True,
    incoming=0,
)
def test_compaction_never_grows_the_session(
    session: tuple[ConversationConfig, SessionState], force: bool, incoming: int
) -> None:
    conv, state = session
    plan = plan_compaction(state, conv, force=force, incoming_bytes=incoming)
    at_turn_bound = state.turns >= conv.max_turns_per_session
    if force and at_turn_bound:
        assert plan is not None and plan.fold_n >= 1  # room can always be made
    if plan is None:
        return
    replaced = plan.removed_bytes + state.summary_bytes
    assert plan.summary_bytes <= replaced
    assert plan.summary_bytes <= conv.max_summary_bytes
    new_bytes = state.nbytes - replaced + plan.summary_bytes
    assert new_bytes <= state.nbytes
    assert plan.removed_bytes == sum(r.nbytes for r in state.records[: plan.fold_n])
    if plan.summary:
        doc = orjson.loads(plan.summary)
        assert isinstance(doc["text"], str) and isinstance(doc["untrusted"], bool)
        folded_untrusted = any(r.kind != "agent" for r in state.records[: plan.fold_n])
        assert doc["untrusted"] or not folded_untrusted
    else:
        # No summary only when none existed and the folded bytes cannot hold the smallest.
        assert state.summary is None and replaced < minimal_summary_bytes()
    # Deterministic: the same state and bounds give the same bytes.
    assert plan_compaction(state, conv, force=force, incoming_bytes=incoming) == plan


@given(session=sessions(), budget=st.integers(0, 2000))
def test_the_deterministic_summariser_fits_any_budget(
    session: tuple[ConversationConfig, SessionState], budget: int
) -> None:
    _conv, state = session
    out = build_summary(state.summary, state.records, budget, deterministic_summary)
    if out is None:
        assert budget < minimal_summary_bytes()
    else:
        assert len(out) <= budget
        assert out == build_summary(state.summary, state.records, budget, deterministic_summary)


# --- through the store ----------------------------------------------------------------------

_AVATARS = itertools.count(5000)
_STORES: dict[str, dict[tuple[int, int, int, int], Any]] = {}
memfixtures.CACHES.append(_STORES)  # type: ignore[arg-type]


def _store(make_store: StoreMaker, backend: Any, bounds: tuple[int, int, int, int]) -> Any:
    """One store per backend and bounds for all examples (each test has its own namespace)."""
    per_backend = _STORES.setdefault(backend.namespace, {})
    if bounds not in per_backend:
        turns, session, summary, tools = bounds
        conversation = {
            "max_turns_per_session": turns,
            "max_session_bytes": session,
            "max_summary_bytes": summary,
            "max_tool_results": tools,
        }
        per_backend[bounds] = make_store(backend, Clock(), conversation=conversation)
    return per_backend[bounds]


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    bounds=st.sampled_from([(4, 1024, 256, 2), (6, 2048, 512, 3), (10, 4096, 1024, 4)]),
    turns=st.lists(
        st.tuples(st.sampled_from(list(KIND_FIELDS)), st.integers(0, 48)),
        min_size=1,
        max_size=40,
    ),
    compact_every=st.integers(1, 8),
)
@example(bounds=(4, 1024, 256, 2), turns=[("avatar", 7)] * 30, compact_every=3)
@example(bounds=(4, 1024, 256, 2), turns=[("agent", 0)] * 20, compact_every=8)
def test_small_turns_never_start_failing_and_compaction_never_grows(
    make_store: StoreMaker,
    fake_or_real: Any,
    bounds: tuple[int, int, int, int],
    turns: list[tuple[str, int]],
    compact_every: int,
) -> None:
    store = _store(make_store, fake_or_real, bounds)
    conv = store.config.conversation
    k = key(next(_AVATARS))
    builders = {
        "avatar": lambda n: AvatarMessage(text="a" * n),
        "agent": lambda n: AgentResponse(text="g" * n),
        "tool": lambda n: ToolSummary(tool="search", summary="t" * n),
        "action": lambda n: ActionResult(action="wave", outcome="o" * n),
    }
    for i, (kind, size) in enumerate(turns, start=1):
        receipt = store.append(k, builders[kind](size))  # never SessionFullError
        assert receipt.turn_count <= conv.max_turns_per_session
        assert receipt.session_bytes <= conv.max_session_bytes
        if i % compact_every == 0:
            before = receipt.session_bytes
            outcome = store.compact(k, force=True)
            if outcome.status is CompactionStatus.APPLIED:
                assert outcome.session_bytes <= before
            else:
                assert outcome.status is CompactionStatus.RELEASED
    ctx = store.context(k)
    assert len(ctx.turns) <= conv.max_turns_per_session


def test_every_summary_compaction_writes_passes_the_recovery_validator() -> None:
    """The minimal summary (compaction's last resort) is a shape recovery accepts:
    a session compacted that far must stay flushable and restorable."""
    import orjson
    import pytest

    from memtier.memory.recordcheck import RecordInvalid, check_summary

    minimal = orjson.loads(orjson.dumps({"untrusted": True, "text": "x"}))
    assert check_summary(minimal) == [("summary text", "x")]
    assert len(orjson.dumps({"untrusted": True, "text": ""})) == minimal_summary_bytes()
    with pytest.raises(RecordInvalid):
        check_summary({"untrusted": False, "text": "trust me"})
