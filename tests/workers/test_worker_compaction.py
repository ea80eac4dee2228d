"""Compaction: deterministic summaries, exact accounting, the compare-and-swap script.

Pure tests run without Redis; behaviour runs on fakeredis, a real server and a real
cluster (the ``backend`` fixture).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from workhelpers import (
    Clock,
    append_raw,
    assert_exact_accounting,
    async_store,
    key,
    session_hash,
    summary_doc,
    sync_store,
    turn_for,
    turn_records,
)

from memtier import (
    ActionResult,
    AgentResponse,
    AvatarMessage,
    ConversationStore,
    ReasonCode,
    SessionFullError,
    ToolSummary,
)
from memtier.config import ConversationConfig
from memtier.errors import ScriptError
from memtier.memory.compaction import (
    CompactionStatus,
    apply_call,
    plan_compaction,
    read_session_call,
)
from memtier.memory.scriptspecs import APPLY_COMPACTION
from memtier.memory.state import SessionState, StoredTurn, iter_sessions
from memtier.memory.summary import SummaryRequest, build_summary
from memtier.redaction import contains_secret

REPO = Path(__file__).resolve().parents[2]
SMALL = {"max_turns_per_session": 10, "max_tool_results": 4}


def _records(n: int, start_seq: int = 1) -> tuple[StoredTurn, ...]:
    out = []
    kinds = [
        ("avatar", {"text": "hi there, can you help me find the sandbox? ünï"}),
        ("agent", {"text": "Sure, teleporting you now."}),
        ("action", {"action": "teleport", "outcome": "arrived at Sandbox Island (128, 64, 22)"}),
        ("tool", {"tool": "weather", "summary": "sunny, 21 degrees"}),
    ]
    for i in range(n):
        kind, fields = kinds[i % 4]
        nbytes = sum(len(v.encode()) for v in fields.values())
        out.append(
            StoredTurn(
                seq=start_seq + i,
                clock_ms=1_800_000_000_000 + (start_seq - 1 + i) * 1000,
                wall_ms=1_800_000_000_000 + (start_seq - 1 + i) * 1000,
                nbytes=nbytes,
                is_tool=kind == "tool",
                kind=kind,
                turn_id=f"t{start_seq + i}",
                fields=fields,
            )
        )
    return tuple(out)


def _state(records: tuple[StoredTurn, ...], summary: bytes | None = None) -> SessionState:
    nbytes = sum(r.nbytes for r in records) + (len(summary) if summary else 0)
    return SessionState(
        member="00000000-0000-0000-0000-000000000001:public",
        session_id="ses_" + "a" * 22,
        created_ms=records[0].clock_ms,
        created_wall_ms=records[0].wall_ms,
        last_ms=records[-1].clock_ms,
        last_wall_ms=records[-1].wall_ms,
        seq=records[-1].seq,
        turns=len(records),
        nbytes=nbytes,
        tools=sum(r.is_tool for r in records),
        summary_bytes=len(summary) if summary else 0,
        summary_version=1 if summary else 0,
        summary=summary.decode() if summary else None,
        records=records,
    )


# --------------------------------------------------------------------------- pure


def test_summary_keeps_the_facts_that_matter() -> None:
    # 40 turns folded: enough bytes for the facts and excerpts (a summary never takes more
    # bytes than the turns it replaces).
    conv = ConversationConfig(max_turns_per_session=80)
    plan = plan_compaction(_state(_records(80)), conv)
    assert plan is not None
    assert plan.summary_bytes <= plan.removed_bytes
    doc = orjson.loads(plan.summary)
    text = doc["text"]
    assert doc["seq"] == [1, plan.last_seq] and doc["turns"] == plan.fold_n
    assert doc["counts"] == {
        "avatar": (plan.fold_n + 3) // 4,
        "agent": (plan.fold_n + 2) // 4,
        "action": (plan.fold_n + 1) // 4,
        "tool": plan.fold_n // 4,
    }
    assert f"turns 1-{plan.last_seq} ({plan.fold_n} turns)" in text  # span and count
    assert "2027-01-15T08:00:00Z to 2027-01-15T08:00" in text  # time span, UTC
    assert "Tools used: weather x" in text and "Actions: teleport x" in text
    assert "action teleport: arrived at Sandbox Island (128, 64, 22)" in text  # action result
    assert "tool weather: sunny, 21 degrees" in text  # tool outcome
    assert "avatar: hi there, can you help me find the sandbox? ünï" in text  # who said what
    assert "agent: Sure, teleporting you now." in text
    assert doc["untrusted"] is True
    assert len(plan.summary) <= conv.max_summary_bytes


def test_summary_of_agent_turns_only_is_trusted_and_untrusted_stays_untrusted() -> None:
    conv = ConversationConfig(max_turns_per_session=10)
    text = "hello from the agent, " * 10  # enough bytes for a summary with its facts
    agent_only = tuple(
        StoredTurn(i, i, i, len(text), False, "agent", f"t{i}", {"text": text})
        for i in range(1, 11)
    )
    plan = plan_compaction(_state(agent_only), conv)
    assert plan is not None and orjson.loads(plan.summary)["untrusted"] is False
    # A summary too small for its facts (the minimal one) never claims to be trusted:
    # nothing in it would show which kinds of turns it folded.
    tiny = tuple(
        StoredTurn(i, i, i, 5, False, "agent", f"t{i}", {"text": "hello"}) for i in range(1, 11)
    )
    plan = plan_compaction(_state(tiny), conv)
    assert plan is not None and set(orjson.loads(plan.summary)) == {"untrusted", "text"}
    assert orjson.loads(plan.summary)["untrusted"] is True
    # An untrusted previous summary keeps the next one untrusted, even over agent turns.
    prev = build_summary(None, _records(4), conv.max_summary_bytes)
    assert prev is not None
    more = tuple(
        StoredTurn(i, i, i, 5, False, "agent", f"t{i}", {"text": "hello"}) for i in range(5, 15)
    )
    plan = plan_compaction(_state(more, prev), conv)
    assert plan is not None and orjson.loads(plan.summary)["untrusted"] is True


def test_repeated_compaction_merges_facts_exactly() -> None:
    conv = ConversationConfig(max_turns_per_session=10)
    first = build_summary(None, _records(8), conv.max_summary_bytes)
    assert first is not None
    second = build_summary(first.decode(), _records(6, start_seq=9), conv.max_summary_bytes)
    assert second is not None
    doc = orjson.loads(second)
    assert doc["seq"] == [1, 14] and doc["turns"] == 14
    assert sum(doc["counts"].values()) == 14
    assert doc["wall"] == [1_800_000_000_000, 1_800_000_000_000 + 13_000]
    assert "#1 avatar:" in doc["text"] and "#14 agent:" in doc["text"]  # old and new excerpts


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(st.text(min_size=0, max_size=400), min_size=1, max_size=40),
    kinds=st.lists(st.sampled_from(["avatar", "agent", "tool", "action"]), min_size=40),
    budget=st.integers(min_value=256, max_value=4096),
)
def test_summary_is_bounded_redacted_and_deterministic(
    texts: list[str], kinds: list[str], budget: int
) -> None:
    records = []
    for i, text in enumerate(texts):
        text = text.encode("utf-8", "replace").decode("utf-8", "replace")
        kind = kinds[i]
        fields = (
            {"tool": "t" + str(i % 3), "summary": text}
            if kind == "tool"
            else {"action": "a", "outcome": text}
            if kind == "action"
            else {"text": text}
        )
        nbytes = sum(len(v.encode()) for v in fields.values())
        records.append(StoredTurn(i + 1, i, i, nbytes, kind == "tool", kind, f"t{i}", fields))
    first = build_summary(None, records, budget)
    again = build_summary(None, list(records), budget)
    assert first == again
    assert first is not None and len(first) <= budget
    doc = orjson.loads(first)
    assert not contains_secret(doc["text"])
    assert doc["untrusted"] is any(k != "agent" for k in kinds[: len(texts)])


def test_secrets_in_custom_summarizer_output_are_redacted_and_flag_cannot_be_lowered() -> None:
    # 20 turns folded: room for the facts and the token (the summary never outgrows them).
    conv = ConversationConfig(max_turns_per_session=40)
    seen: list[SummaryRequest] = []

    def llm(request: SummaryRequest) -> str:
        seen.append(request)
        return "The user shared token ghp_" + "a" * 36 + " and " + "x" * 100_000

    plan = plan_compaction(_state(_records(40)), conv, llm)
    assert plan is not None and seen and seen[0].untrusted is True
    doc = orjson.loads(plan.summary)
    assert "ghp_" not in doc["text"] and "[REDACTED:github_token]" in doc["text"]
    assert doc["untrusted"] is True and len(plan.summary) <= conv.max_summary_bytes
    assert doc["counts"]["avatar"] == 5  # facts are computed here (20 folded), not by the hook


def test_summary_is_identical_in_another_process_with_another_hash_seed() -> None:
    """Same input on two workers gives identical bytes (no dict-order / hash-seed effects)."""
    script = textwrap.dedent(
        """
        import hashlib, sys
        sys.path.insert(0, sys.argv[1])
        from test_worker_compaction import _records, _state
        from memtier.config import ConversationConfig
        from memtier.memory.compaction import plan_compaction
        plan = plan_compaction(_state(_records(40)), ConversationConfig(max_turns_per_session=40))
        print(hashlib.sha256(plan.summary).hexdigest())
        """
    )
    here = str(Path(__file__).parent)
    digests = set()
    for seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "LC_ALL": "C", "TZ": "Pacific/Apia"}
        out = subprocess.run(
            [sys.executable, "-c", script, here],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        )
        digests.add(out.stdout.strip())
    plan = plan_compaction(_state(_records(40)), ConversationConfig(max_turns_per_session=40))
    assert plan is not None
    digests.add(hashlib.sha256(plan.summary).hexdigest())
    assert len(digests) == 1


# --------------------------------------------------------------------------- on Redis


def test_two_workers_produce_identical_summaries(backend: Any) -> None:
    """Two stores (two workers) compact identical sessions: byte-identical summaries."""
    stores = []
    for ns in ("w1", "w2"):
        store = ConversationStore(
            backend.sync_client(),
            backend.config(conversation=SMALL).model_copy(
                update={"namespace": backend.namespace + ns}
            ),
            clock=Clock(),
            inline_compaction=False,
        )
        for i in range(8):
            append_raw(store, key(1), turn_for(i))
        outcome = store.compact(key(1))
        assert outcome.status is CompactionStatus.APPLIED
        stores.append(store)
    a, b = (session_hash(s, key(1))["summary"] for s in stores)
    assert a == b and a.encode() == b.encode()
    for store in stores:
        assert_exact_accounting(store)
        for part in store.core.keyspace.all_partitions():
            store.client.delete(*store.client.keys(part.tag + "*"))


def test_worker_style_compaction_exact_accounting_and_event(backend: Any) -> None:
    store = sync_store(backend, Clock(), conversation=SMALL, inline_compaction=False)
    k = key(7, "im")
    for i in range(8):
        append_raw(store, k, turn_for(i))
    other = key(8)
    append_raw(store, other, AvatarMessage(text="unrelated"))
    before = store.stats()["bytes"]
    outcome = store.compact(k)
    assert outcome.status is CompactionStatus.APPLIED
    assert outcome.folded == 3  # keeps 5 of max 10 turns
    assert [int(r.split("|")[0]) for r in turn_records(store, k)] == [4, 5, 6, 7, 8]
    h = session_hash(store, k)
    assert h["sv"] == "1" and "cq" not in h
    assert store.stats()["bytes"] == before - outcome.removed_bytes + outcome.summary_bytes
    assert_exact_accounting(store)
    events = [e for e in store.events(limit=100) if e.reason is ReasonCode.COMPACTED]
    assert (
        len(events) == 1
        and events[0].avatar == k.avatar
        and events[0].detail == ("folded=3 seq=1-3")
    )
    ctx = store.context(k)
    assert ctx.messages[0].untrusted and ctx.messages[0].role == "user"
    assert ctx.messages[0].content.startswith('<untrusted-data source="summary">')
    assert [t.seq for t in ctx.turns] == [4, 5, 6, 7, 8]
    # Below the trigger nothing happens.
    assert store.compact(k).status is CompactionStatus.RELEASED


def test_append_queues_one_job_and_inline_compaction_removes_it(backend: Any) -> None:
    store = sync_store(backend, Clock(), conversation=SMALL)
    k = key(3)
    part = store.core.partition_for(k)
    for i in range(8):  # 80 % of 10 turns: a job is queued
        store.append(k, AgentResponse(text=f"r{i}"))
    jobs = store.client.xrange(part.compact)
    assert len(jobs) == 1 and session_hash(store, k)["cq"] == jobs[0][0].decode()
    store.append(k, AgentResponse(text="r8"))  # still one job (cq set)
    assert len(store.client.xrange(part.compact)) == 1
    store.append(k, AgentResponse(text="r9"))
    store.append(k, AgentResponse(text="r10"))  # SESSION_FULL -> inline compaction + retry
    assert "cq" not in session_hash(store, k)
    assert store.client.xrange(part.compact) == []  # the stale job went with it
    assert_exact_accounting(store)


def test_inline_compaction_keeps_sessions_bounded_without_workers(backend: Any) -> None:
    conv = {
        "max_turns_per_session": 12,
        "max_tool_results": 3,
        "max_session_bytes": 4096,
        "max_summary_bytes": 1024,
        "max_turn_bytes": 512,
        "max_tool_result_bytes": 256,
    }
    store = sync_store(backend, Clock(), conversation=conv)
    k = key(11)
    for i in range(150):
        receipt = store.append(k, turn_for(i) if i % 9 else AvatarMessage(text="é" * 200))
        assert receipt.seq == i + 1
        assert receipt.turn_count <= 12 and receipt.session_bytes <= 4096
    h = session_hash(store, k)
    assert int(h["turns"]) <= 12 and int(h["tools"]) <= 3 and int(h["bytes"]) <= 4096
    doc = summary_doc(store, k)
    assert doc is not None and doc["seq"][0] == 1 and doc["turns"] + int(h["turns"]) == 150
    assert len(h["summary"].encode()) <= 1024
    assert_exact_accounting(store)
    compacted = [e for e in store.events(limit=1000) if e.reason is ReasonCode.COMPACTED]
    assert len(compacted) == int(h["sv"])


def test_inline_compaction_can_be_switched_off(backend: Any) -> None:
    store = sync_store(
        backend, Clock(), conversation={"max_turns_per_session": 4}, inline_compaction=False
    )
    k = key(1)
    for i in range(4):
        store.append(k, AvatarMessage(text=str(i)))
    with pytest.raises(SessionFullError):
        store.append(k, AvatarMessage(text="5"))


async def test_async_store_compacts_inline_too(backend: Any) -> None:
    store = async_store(backend, Clock(), conversation=SMALL)
    k = key(2)
    for i in range(40):
        receipt = await store.append(k, turn_for(i))
        assert receipt.turn_count <= 10
    ctx = await store.context(k)
    assert ctx.summary is not None and ctx.messages[0].untrusted
    outcome = await store.compact(k, force=True)
    assert outcome.status is CompactionStatus.APPLIED


# --------------------------------------------------------------------------- CAS losses


def _read(store: Any, k: Any) -> SessionState:
    (state,) = iter_sessions(store.executor.execute(read_session_call(store.core, k)))
    return state


def _plan(store: Any, k: Any) -> tuple[SessionState, Any]:
    state = _read(store, k)
    plan = plan_compaction(state, store.core.conv)
    assert plan is not None
    return state, plan


def test_cas_append_racing_a_compaction_keeps_the_new_turn(backend: Any) -> None:
    store = sync_store(backend, Clock(), conversation=SMALL, inline_compaction=False)
    k = key(1)
    for i in range(8):
        append_raw(store, k, turn_for(i))
    state, plan = _plan(store, k)
    append_raw(store, k, AvatarMessage(text="racing turn"))  # lands between read and swap
    reply = store.executor.execute(apply_call(store.core, k, state.session_id, plan))
    assert int(reply[0]) == 0
    seqs = [int(r.split("|")[0]) for r in turn_records(store, k)]
    assert seqs == list(range(plan.fold_n + 1, 10))  # only the old prefix was folded
    assert "racing turn" in turn_records(store, k)[-1]
    assert_exact_accounting(store)


def test_cas_concurrent_compaction_applies_once(backend: Any) -> None:
    store = sync_store(backend, Clock(), conversation=SMALL, inline_compaction=False)
    k = key(1)
    for i in range(9):
        append_raw(store, k, turn_for(i))
    state, plan = _plan(store, k)
    first = store.executor.execute(apply_call(store.core, k, state.session_id, plan))
    second = store.executor.execute(apply_call(store.core, k, state.session_id, plan))
    assert int(first[0]) == 0
    assert [int(second[0]), second[1].decode()] == [-2, "sv"]  # the same plan cannot apply twice
    # A second worker with the same job re-reads, finds it done, and releases.
    assert store.compact(k).status is CompactionStatus.RELEASED
    assert len([e for e in store.events(limit=100) if e.reason is ReasonCode.COMPACTED]) == 1
    assert_exact_accounting(store)


def test_cas_range_mismatch_is_a_conflict(backend: Any) -> None:
    store = sync_store(backend, Clock(), conversation=SMALL, inline_compaction=False)
    k = key(1)
    for i in range(9):
        append_raw(store, k, turn_for(i))
    state, plan = _plan(store, k)
    from dataclasses import replace

    for bad in (
        replace(plan, first_seq=2),
        replace(plan, last_seq=plan.last_seq + 1),
        replace(plan, fold_n=50, last_seq=50),
    ):
        reply = store.executor.execute(apply_call(store.core, k, state.session_id, bad))
        assert [int(reply[0]), reply[1].decode()] == [-2, "range"]
    assert len(turn_records(store, k)) == 9
    assert_exact_accounting(store)


@pytest.mark.parametrize("loss", ["rotation", "delete", "expire", "eviction"])
def test_cas_session_replaced_or_gone_nothing_lost_or_resurrected(backend: Any, loss: str) -> None:
    clock = Clock()
    conv = {**SMALL, "public_ttl_seconds": 60.0, "max_active_sessions": 1}
    store = sync_store(backend, clock, conversation=conv, inline_compaction=False)
    k = key(1)
    for i in range(9):
        append_raw(store, k, turn_for(i))
    state, plan = _plan(store, k)
    if loss == "rotation":
        clock.advance(60_000)
        receipt = append_raw(store, k, AvatarMessage(text="fresh start"))
        assert receipt.rotated
    elif loss == "delete":
        assert store.delete(k)
    elif loss == "expire":
        assert store.expire(k)
    else:
        clock.advance(1)
        append_raw(store, key(2), AvatarMessage(text="pressure"))  # evicts key(1)
    reply = store.executor.execute(apply_call(store.core, k, state.session_id, plan))
    assert int(reply[0]) == -1
    h = session_hash(store, k)
    if loss == "rotation":
        assert h["id"] != state.session_id and "summary" not in h
        assert len(turn_records(store, k)) == 1  # nothing of the old transcript
    else:
        assert h == {} and turn_records(store, k) == []  # nothing resurrected
    assert_exact_accounting(store)
    assert not [e for e in store.events(limit=100) if e.reason is ReasonCode.COMPACTED]


def test_apply_compaction_bounds_and_bad_arguments(backend: Any) -> None:
    store = sync_store(backend, Clock(), conversation=SMALL, inline_compaction=False)
    k = key(1)
    for i in range(9):
        append_raw(store, k, turn_for(i))
    state, plan = _plan(store, k)
    from dataclasses import replace

    too_big = replace(plan, summary=b"x" * (store.core.conv.max_summary_bytes + 1))
    reply = store.executor.execute(apply_call(store.core, k, state.session_id, too_big))
    assert int(reply[0]) == -3 and reply[1] == b"summary"
    grown = replace(plan, summary=b"y" * 1000)
    call = APPLY_COMPACTION.replace(
        apply_call(store.core, k, state.session_id, plan),
        max_aggregate=store.stats()["bytes"],  # no room for any growth
        summary=grown.summary,
    )
    reply = store.executor.execute(call)
    assert int(reply[0]) == -3 and reply[1] == b"aggregate"
    with pytest.raises(ScriptError):
        store.executor.execute(APPLY_COMPACTION.replace(call, fold_n="not a number"))
    assert len(turn_records(store, k)) == 9
    assert_exact_accounting(store)


def test_summary_never_grows_a_session_past_its_bound(backend: Any) -> None:
    """Tiny turns at the turn bound: the summary may not push the session over its bytes."""
    conv = {
        "max_turns_per_session": 40,
        "max_session_bytes": 1024,
        "max_summary_bytes": 512,
        "max_turn_bytes": 64,
        "max_tool_result_bytes": 64,
    }
    store = sync_store(backend, Clock(), conversation=conv)
    k = key(1)
    for i in range(200):
        store.append(
            k,
            ToolSummary(tool="x", summary="ok")
            if i % 3 == 0
            else ActionResult(action="wave", outcome=f"waved {i}"),
        )
    h = session_hash(store, k)
    assert int(h["bytes"]) <= 1024 and int(h["turns"]) <= 40
    assert_exact_accounting(store)


def test_inline_compaction_falls_back_when_the_summarizer_hook_fails(backend: Any) -> None:
    calls: list[int] = []

    def broken(request: SummaryRequest) -> str:
        calls.append(1)
        raise RuntimeError("the summarizer service is down")

    store = sync_store(backend, Clock(), conversation=SMALL, summarizer=broken)
    k = key(4)
    for i in range(12):
        assert store.append(k, turn_for(i)).seq == i + 1  # never fails because of the hook
    doc = summary_doc(store, k)
    assert calls and doc is not None and doc["text"].startswith("Earlier conversation")
    # The hook is still used when it works.
    store.summarizer = lambda request: "custom summary"
    for i in range(12, 20):
        store.append(k, turn_for(i))
    doc = summary_doc(store, k)
    assert doc is not None and doc["text"] == "custom summary" and doc["untrusted"] is True
    assert_exact_accounting(store)
