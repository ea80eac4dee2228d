"""The conversation service's behaviour, on fakeredis, a real Redis and a real Redis Cluster,
through the sync service and the asyncio service (this module's ``make_service``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import threadfixtures
from threadfixtures import Service
from threadhelpers import (
    OTHER,
    OTHER_TENANT,
    OWNER,
    AsyncServiceAdapter,
    Clock,
    CountingRunner,
    ServiceMaker,
    scan_keys,
    watch_requests,
)

from memtier.errors import ConversationError
from memtier.keys import ThreadKeyspace
from memtier.threads import (
    AgentDenied,
    ContinueResult,
    ContinueStatus,
    ConversationService,
    EntryRole,
    Ownership,
    RunnerEvent,
    ThreadState,
)

MakeService = Callable[..., Service]

# Every behaviour test here runs on the sync and the asyncio service: [sync-fake], ...
make_service = threadfixtures.make_service
service = threadfixtures.service
make_sync_service = threadfixtures.make_sync_service


def err(fn: Callable[[], Any]) -> ConversationError:
    with pytest.raises(ConversationError) as info:
        fn()
    return info.value


# --- create / get / list -----------------------------------------------------------------------


def test_create_returns_the_spec_shape(service: Service) -> None:
    thread = service.create(OWNER, title="Q3 planning", metadata={"color": "blue"})
    wire = thread.to_wire()
    assert wire["id"].startswith("conv_")
    assert wire["title"] == "Q3 planning"
    assert wire["state"] == "active"
    assert wire["branches"] == []
    assert wire["tenantId"] == "acme" and wire["userId"] == "alice"
    assert wire["metadata"] == {"color": "blue"}
    assert wire["createdAt"].endswith("Z") and wire["updatedAt"] == wire["createdAt"]
    assert wire["version"] == 1
    assert service.get(OWNER, thread.id) == thread


def test_create_with_explicit_id_is_get_or_create(service: Service) -> None:
    """Spec: a sequential duplicate returns the existing thread unchanged, whatever its body."""
    first = service.create(OWNER, thread_id="plan-1", title="one", request_id="r1")
    bodies: list[dict[str, Any]] = [
        {},
        {"title": "one", "request_id": "r1"},
        {"title": "two"},
        {"title": "one", "metadata": {"x": 1}},
        {"request_id": "another"},
    ]
    for body in bodies:
        thread, created = service.create_or_get(OWNER, thread_id="plan-1", **body)
        assert not created and thread == first, body
        assert service.create(OWNER, thread_id="plan-1", **body) == first
    assert service.get(OWNER, "plan-1") == first  # never overwritten
    _, created = service.create_or_get(OWNER, thread_id="plan-2")
    assert created


def test_only_the_loser_of_a_true_create_race_gets_metadata_conflict(
    make_sync_service: ServiceMaker,
) -> None:
    """The rival's create lands between this create's read and its create-only write.

    Sync only: the race is staged by watching the sync executor's requests."""
    from memtier.engine import ScriptCall

    service, rival = make_sync_service(), make_sync_service()
    rival_body: dict[str, Any] = {}

    def see(request: Any) -> None:
        if isinstance(request, ScriptCall) and request.script == "create":
            rival.create(OWNER, **rival_body)

    watch_requests(service, see)
    rival_body.update(thread_id="raced", title="winner")
    lost = err(lambda: service.create(OWNER, thread_id="raced", title="loser"))
    assert lost.code == "metadata_conflict" and lost.http_status == 409
    assert "won the race" in lost.message and "do not retry" in lost.message
    assert service.get(OWNER, "raced").title == "winner"
    # an identical concurrent create is no conflict: both get the one thread
    rival_body.clear()
    rival_body.update(thread_id="same", title="t")
    thread, created = service.create_or_get(OWNER, thread_id="same", title="t")
    assert not created and thread == service.get(OWNER, "same")


def test_request_id_derived_ids_are_rfc4122_version_5(service: Service) -> None:
    import uuid

    from memtier.threads.core import REQUEST_ID_NAMESPACE

    thread = service.create(OWNER, request_id="ui-create-1")
    assert thread.id.startswith("conv_")
    derived = uuid.UUID(thread.id.removeprefix("conv_"))
    assert derived.version == 5 and derived.variant == uuid.RFC_4122
    assert derived == uuid.uuid5(REQUEST_ID_NAMESPACE, "ui-create-1")
    assert str(REQUEST_ID_NAMESPACE) == "1cb70487-82fe-5c2f-9bfb-44f9d172d9a6"  # documented
    random_id = uuid.UUID(service.create(OWNER).id.removeprefix("conv_"))
    assert random_id.version == 4


@pytest.mark.parametrize(
    "bad_id",
    [
        ".",
        "..",
        "...",
        ".hidden",
        "openapi.json",
        "events",
        "continue",
        "branch",
        "archive",
        "export",
        "EVENTS",
        "a/b",
        "",
        "x" * 129,
    ],
)
def test_create_refuses_ids_clients_cannot_address(service: Service, bad_id: str) -> None:
    refused = err(lambda: service.create(OWNER, thread_id=bad_id))
    assert refused.code == "invalid_request"
    assert service.list(OWNER).items == ()


def test_create_with_request_id_only_is_idempotent(service: Service) -> None:
    first = service.create(OWNER, title="x", request_id="create-1")
    assert service.create(OWNER, title="x", request_id="create-1") == first
    assert service.create(OWNER, title="x", request_id="create-2").id != first.id
    assert len(service.list(OWNER).items) == 2


def test_titles_and_metadata_are_redacted(service: Service) -> None:
    token = "ghp_" + "a1" * 18
    thread = service.create(OWNER, title=f"deploy with {token}", metadata={"note": token})
    assert token not in thread.to_wire().__repr__()
    assert "[REDACTED:github_token]" in (thread.title or "")


def test_list_is_newest_first_and_pages_exactly(make_service: MakeService) -> None:
    svc = make_service(clock=Clock())
    ids = [svc.create(OWNER, title=f"t{i}").id for i in range(7)]
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = svc.list(OWNER, cursor=cursor, limit=3)
        seen += [t.id for t in page.items]
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == list(reversed(ids))
    assert pages == 3
    assert svc.list(OTHER).items == ()  # another owner sees nothing


def test_list_skips_deleted_threads_between_pages(make_service: MakeService) -> None:
    service = make_service(clock=Clock())  # distinct creation times: a deterministic order
    ids = [service.create(OWNER).id for _ in range(4)]
    page = service.list(OWNER, limit=2)
    service.delete(OWNER, ids[0])  # the oldest, on the next page
    rest = service.list(OWNER, cursor=page.next_cursor, limit=2)
    assert [t.id for t in rest.items] == [ids[1]]


# --- continue -----------------------------------------------------------------------------------


def test_continue_records_entries_and_history_along_the_head(make_service: MakeService) -> None:
    histories: list[list[str]] = []

    def runner(turn: Any) -> str:
        histories.append([e.content for e in turn.history])
        return f"answer {len(turn.history)}"

    service = make_service(runner=runner)
    thread = service.create(OWNER)
    first = service.continue_(OWNER, thread.id, "one")
    second = service.continue_(OWNER, thread.id, "two")
    assert [e.role for e in first.entries] == [EntryRole.USER, EntryRole.ASSISTANT]
    assert first.entries[0].parent_id is None and first.entries[1].parent_id == "e1"
    assert second.entries[0].parent_id == "e2"  # continues from the head
    assert histories == [[], ["one", "answer 0"]]
    assert service.get(OWNER, thread.id).head_id == second.leaf_id == "e4"


def test_continue_from_a_branch_forks(make_service: MakeService) -> None:
    histories: list[list[str]] = []

    def runner(turn: Any) -> str:
        histories.append([e.content for e in turn.history])
        return "ok"

    service = make_service(runner=runner)
    thread = service.create(OWNER)
    service.continue_(OWNER, thread.id, "one")
    service.continue_(OWNER, thread.id, "two")
    unknown = err(lambda: service.continue_(OWNER, thread.id, "fork", leaf_id="e2"))
    assert unknown.code == "unknown_leaf" and unknown.http_status == 400  # not a branch ref yet
    branched = service.branch(OWNER, thread.id, "e2")
    assert [b.leaf_id for b in branched.branches] == ["e2"]
    fork = service.continue_(OWNER, thread.id, "fork", leaf_id="e2")
    assert fork.entries[0].parent_id == "e2"
    assert histories[-1] == ["one", "ok"]  # history along the branch, not the head


def test_continue_redacts_messages_events_and_replies(make_service: MakeService) -> None:
    token = "ghp_" + "Z9" * 18
    runner = CountingRunner(
        reply=lambda turn: f"I saw {token}",
        events=[
            RunnerEvent(
                "tool.call",
                {
                    "tool": "shell",
                    "cwd": "/home/alice/project",
                    "arguments": {"cmd": "cat"},
                    "apiKey": "hunter2hunter2",
                },
            )
        ],
    )
    service = make_service(runner=runner)
    thread = service.create(OWNER)
    result = service.continue_(OWNER, thread.id, f"my token {token}")
    assert all(token not in e.content for e in result.entries)
    page = service.replay(OWNER, thread.id)
    text = repr([r.to_wire() for r in page.records])
    assert token not in text and "hunter2" not in text
    assert "/home/alice" not in text and "[PATH]" in text
    tool = next(r for r in page.records if r.type == "tool.call")
    assert tool.data["arguments"] == {"omitted": True}
    assert all(r.redacted for r in page.records)


def test_ledger_messages_carry_no_local_paths(service: Service) -> None:
    thread = service.create(OWNER)
    text = "please read /home/alice/notes.txt and C:\\Users\\alice\\plan.docx"
    result = service.continue_(OWNER, thread.id, text)
    assert result.entries[0].content == text  # the entry keeps what the agent works with
    ledger = repr(service.export(OWNER, thread.id).to_wire())
    assert "/home/alice" not in ledger and "Users" not in ledger and "[PATH]" in ledger


def test_continue_on_archived_thread_fails_closed(service: Service) -> None:
    thread = service.create(OWNER)
    service.archive(OWNER, thread.id)
    error = err(lambda: service.continue_(OWNER, thread.id, "hello"))
    assert error.code == "thread_archived" and error.http_status == 409


def test_continue_request_id_returns_the_first_result(make_service: MakeService) -> None:
    runner = CountingRunner()
    service = make_service(runner=runner)
    thread = service.create(OWNER)
    first = service.continue_(OWNER, thread.id, "hello", request_id="req-1")
    again = service.continue_(OWNER, thread.id, "hello", request_id="req-1")
    assert again == first and runner.calls == 1
    conflict = err(lambda: service.continue_(OWNER, thread.id, "other", request_id="req-1"))
    assert conflict.code == "request_conflict" and conflict.http_status == 422
    assert len(service.replay(OWNER, thread.id).records) == 4  # one turn's rows, once


def test_runner_failure_records_error_and_allows_retry(make_service: MakeService) -> None:
    runner = CountingRunner(fail=RuntimeError("boom /home/alice/secret.txt"))
    service = make_service(runner=runner)
    thread = service.create(OWNER)
    error = err(lambda: service.continue_(OWNER, thread.id, "hi", request_id="r"))
    assert error.code == "runner_failed" and error.http_status == 502
    page = service.replay(OWNER, thread.id)
    assert page.records[-1].type == "error" and page.terminal
    assert "/home/alice" not in repr(page.to_wire())
    assert service.get(OWNER, thread.id).head_id is None  # no entries
    runner.fail = None
    ok = service.continue_(OWNER, thread.id, "hi", request_id="r")
    assert ok.status is ContinueStatus.COMPLETED and runner.calls == 2


@pytest.mark.parametrize("denied", [False, True], ids=["completed", "denied"])
def test_a_turn_result_is_the_validated_model(make_service: MakeService, denied: bool) -> None:
    """``continue_`` builds its result without validation (``turns._commit``, as the
    entries and the thread): field for field, with the same fields set and the same wire
    form, it is the model pydantic validates from the same values."""
    runner = CountingRunner(fail=AgentDenied("policy says no") if denied else None)
    service = make_service(runner=runner)
    thread = service.create(OWNER)
    result = service.continue_(OWNER, thread.id, "hi", request_id="v1")
    validated = ContinueResult(
        thread_id=result.thread_id,
        request_id=result.request_id,
        status=result.status.value,  # as a caller's JSON would give it: converted
        leaf_id=result.leaf_id,
        entries=result.entries,
        reason=result.reason,
    )
    assert result == validated and type(result.status) is ContinueStatus
    assert result.model_fields_set == validated.model_fields_set
    assert result.model_dump(mode="json", by_alias=True) == validated.model_dump(
        mode="json", by_alias=True
    )
    assert result.status is (ContinueStatus.DENIED if denied else ContinueStatus.COMPLETED)
    # a replay of the request answers from the run record: the same result
    assert service.continue_(OWNER, thread.id, "hi", request_id="v1") == result


def test_denied_turn_is_recorded_without_entries(make_service: MakeService) -> None:
    runner = CountingRunner(fail=AgentDenied("policy says no"))
    service = make_service(runner=runner)
    thread = service.create(OWNER)
    result = service.continue_(OWNER, thread.id, "hi", request_id="d1")
    assert result.status is ContinueStatus.DENIED and result.entries == ()
    assert result.reason == "policy says no"
    assert service.continue_(OWNER, thread.id, "hi", request_id="d1") == result
    assert runner.calls == 1
    page = service.replay(OWNER, thread.id)
    assert page.records[-1].type == "agent_denied" and page.terminal


def test_runner_events_past_the_per_turn_cap_are_counted(make_service: MakeService) -> None:
    from memtier import limits

    n = limits.THREAD_EVENTS_PER_TURN + 3
    runner = CountingRunner(events=[RunnerEvent("step", {"i": i}) for i in range(n)])
    service = make_service(runner=runner, threads={"replay_page_rows": 500})
    thread = service.create(OWNER)
    service.continue_(OWNER, thread.id, "go")
    records = service.replay(OWNER, thread.id, limit=500).records
    assert sum(r.type == "step" for r in records) == limits.THREAD_EVENTS_PER_TURN
    assert records[-1].data["eventsDropped"] == 3


def test_reserved_event_types_are_refused_to_the_runner(make_service: MakeService) -> None:
    seen: list[str] = []

    def runner(turn: Any) -> str:
        try:
            turn.emit(RunnerEvent("agent_finished", {}))
        except ConversationError as exc:
            seen.append(exc.code)
        return "ok"

    service = make_service(runner=runner)
    thread = service.create(OWNER)
    service.continue_(OWNER, thread.id, "go")
    assert seen == ["invalid_request"]


def test_message_limits(service: Service) -> None:
    from memtier import limits

    thread = service.create(OWNER)
    assert err(lambda: service.continue_(OWNER, thread.id, "  ")).code == "invalid_request"
    over = "x" * (limits.THREAD_MESSAGE_BYTES + 1)
    assert err(lambda: service.continue_(OWNER, thread.id, over)).code == "limit_exceeded"
    at_cap = "x" * limits.THREAD_MESSAGE_BYTES
    result = service.continue_(OWNER, thread.id, at_cap)
    assert result.entries[0].content == at_cap
    assert result.entries[1].truncated  # the echo reply is longer and was cut


# --- branch / archive ---------------------------------------------------------------------------


def _thread_with_turns(service: Service, turns: int) -> str:
    thread = service.create(OWNER)
    for i in range(turns):
        service.continue_(OWNER, thread.id, f"m{i}")
    return thread.id


def test_branch_cas_and_append_only(service: Service) -> None:
    tid = _thread_with_turns(service, 2)
    v1 = service.get(OWNER, tid).version
    branched = service.branch(OWNER, tid, "e2", expected_version=v1)
    assert branched.version == v1 + 1
    stale = err(lambda: service.branch(OWNER, tid, "e4", expected_version=v1))
    assert stale.code == "metadata_conflict" and stale.http_status == 409
    # the same leaf again is a no-op (refs are append-only; a retried call succeeds)
    assert service.branch(OWNER, tid, "e2", expected_version=v1).branches == branched.branches
    assert err(lambda: service.branch(OWNER, tid, "e99")).code == "unknown_leaf"
    assert err(lambda: service.branch(OWNER, tid, "bad id!")).code == "invalid_request"


def test_archive_is_cas_and_idempotent(service: Service) -> None:
    tid = _thread_with_turns(service, 1)
    v = service.get(OWNER, tid).version
    service.branch(OWNER, tid, "e2")
    stale = err(lambda: service.archive(OWNER, tid, expected_version=v))
    assert stale.code == "metadata_conflict"
    archived = service.archive(OWNER, tid)
    assert archived.state is ThreadState.ARCHIVED
    again = service.archive(OWNER, tid, expected_version=0)  # a no-op whatever the version
    assert again == archived
    assert err(lambda: service.branch(OWNER, tid, "e1")).code == "thread_archived"


@pytest.mark.parametrize("cap", [None, 64])
def test_active_branch_cap_at_default_and_ceiling(
    make_service: MakeService, cap: int | None
) -> None:
    service = make_service(threads={"max_active_branches": cap} if cap else None)
    limit = cap or 16
    assert service.limits.max_active_branches == limit
    tid = _thread_with_turns(service, (limit + 2) // 2)
    for i in range(1, limit + 1):
        service.branch(OWNER, tid, f"e{i}")
    error = err(lambda: service.branch(OWNER, tid, f"e{limit + 1}"))
    assert error.code == "branch_limit" and error.http_status == 409
    assert len(service.get(OWNER, tid).branches) == limit


# --- delete and legal hold ----------------------------------------------------------------------


def test_delete_removes_every_key_of_the_thread(backend: Any, service: Service) -> None:
    keep = _thread_with_turns(service, 1)
    tid = _thread_with_turns(service, 2)
    service.branch(OWNER, tid, "e2")
    client = backend.sync_client()
    keyspace = ThreadKeyspace(service.config.namespace)
    owner_pattern = keyspace.owner(OWNER.tenant_id, OWNER.user_id).pattern()
    before = scan_keys(backend, client, owner_pattern)
    assert any(f":{tid}" in k for k in before)
    assert service.delete(OWNER, tid).model_dump() == {"deleted": True, "held": False}
    after = scan_keys(backend, client, owner_pattern)
    assert not [k for k in after if tid in k]
    members = client.zrange(keyspace.owner("acme", "alice").index, 0, -1)
    assert [m.decode().split("|", 1)[1] for m in members] == [keep]
    assert [t.id for t in service.list(OWNER).items] == [keep]
    assert err(lambda: service.get(OWNER, tid)).code == "not_found"
    assert err(lambda: service.delete(OWNER, tid)).code == "not_found"
    service.delete(OWNER, keep)
    # nothing of the owner is left but the recent-deletes set (ids and random tokens, so a
    # retried delete knows what its lost first attempt did), which expires by itself
    recent = keyspace.owner("acme", "alice").recent_deletes
    assert scan_keys(backend, client, owner_pattern) == [recent]
    assert 0 < client.pttl(recent) <= 10 * 60 * 1000
    assert sorted(m.decode().split("|")[0] for m in client.zrange(recent, 0, -1)) == sorted(
        [keep, tid]
    )


def test_legal_hold_blocks_delete_until_released(backend: Any, service: Service) -> None:
    tid = _thread_with_turns(service, 1)
    assert service.set_legal_hold(OWNER, tid).legal_hold
    assert service.delete(OWNER, tid).model_dump() == {"deleted": False, "held": True}
    assert service.get(OWNER, tid).legal_hold
    assert len(service.replay(OWNER, tid).records) == 5  # nothing removed
    assert not service.release_legal_hold(OWNER, tid).legal_hold
    assert service.delete(OWNER, tid).model_dump() == {"deleted": True, "held": False}
    client = backend.sync_client()
    okeys = ThreadKeyspace(service.config.namespace).owner("acme", "alice")
    assert scan_keys(backend, client, okeys.pattern()) == [okeys.recent_deletes]


# --- ownership ----------------------------------------------------------------------------------


def _all_operations(service: Service, owner: Ownership, tid: str) -> dict[str, Any]:
    return {
        "get": lambda: service.get(owner, tid),
        "continue": lambda: service.continue_(owner, tid, "hi"),
        "branch": lambda: service.branch(owner, tid, "e2"),
        "archive": lambda: service.archive(owner, tid),
        "export": lambda: service.export(owner, tid),
        "delete": lambda: service.delete(owner, tid),
        "replay": lambda: service.replay(owner, tid),
        "set_legal_hold": lambda: service.set_legal_hold(owner, tid),
        "release_legal_hold": lambda: service.release_legal_hold(owner, tid),
    }


@pytest.mark.parametrize("intruder", [OTHER, OTHER_TENANT])
def test_wrong_owner_is_indistinguishable_from_missing(
    service: Service, intruder: Ownership
) -> None:
    tid = _thread_with_turns(service, 1)
    before = service.get(OWNER, tid)
    wrong = _all_operations(service, intruder, tid)
    missing = _all_operations(service, OWNER, "conv_does-not-exist")
    for name in wrong:
        a, b = err(wrong[name]), err(missing[name])
        assert (a.code, a.message, a.http_status, a.to_dict()) == (
            b.code,
            b.message,
            b.http_status,
            b.to_dict(),
        ), name
        assert a.code == "not_found"
    # ... and the replay cursor of the real thread does not help the intruder
    cursor = service.replay(OWNER, tid, limit=1).next_cursor
    assert cursor
    assert (
        err(lambda: service.replay(intruder, tid, cursor=cursor)).to_dict()
        == err(lambda: service.replay(OWNER, "conv_does-not-exist", cursor=cursor)).to_dict()
    )
    assert service.get(OWNER, tid) == before  # nothing changed


def test_ownership_ids_are_validated() -> None:
    for bad in ["", "a:b", "{x}", "a b", "x" * 129]:
        with pytest.raises(ConversationError) as info:
            Ownership(bad, "u")
        assert info.value.code == "invalid_request"
    assert Ownership("t-1.x", "user+tag@example.com").user_id == "user+tag@example.com"


# --- async twin ---------------------------------------------------------------------------------


async def test_async_service_mirrors_the_sync_one(make_async_service: Callable[..., Any]) -> None:
    calls = 0

    async def runner(turn: Any) -> str:
        nonlocal calls
        calls += 1
        await turn.emit(RunnerEvent("thinking", {"step": 1}))
        return f"async reply to {turn.message}"

    service = make_async_service(runner=runner)
    thread = await service.create(OWNER, title="async")
    result = await service.continue_(OWNER, thread.id, "hello", request_id="a1")
    assert result.entries[1].content == "async reply to hello"
    assert await service.continue_(OWNER, thread.id, "hello", request_id="a1") == result
    assert calls == 1
    branched = await service.branch(OWNER, thread.id, "e2")
    assert branched.version == 2
    page = await service.replay(OWNER, thread.id)
    assert [r.type for r in page.records] == [
        "agent_started",
        "user_message",
        "thinking",
        "assistant_message",
        "agent_finished",
    ]
    assert page.terminal and page.next_cursor is None
    listing = await service.list(OWNER)
    assert [t.id for t in listing.items] == [thread.id]
    exported = await service.export(OWNER, thread.id)
    assert len(exported.events) == 5 and not exported.truncated
    await service.set_legal_hold(OWNER, thread.id)
    assert (await service.delete(OWNER, thread.id)).held
    await service.release_legal_hold(OWNER, thread.id)
    assert (await service.delete(OWNER, thread.id)).deleted
    with pytest.raises(ConversationError) as info:
        await service.get(OWNER, thread.id)
    assert info.value.code == "not_found"
    archived = await service.create(OWNER)
    assert (await service.archive(OWNER, archived.id)).state is ThreadState.ARCHIVED


async def test_async_service_runs_sync_runners_in_a_thread(
    make_async_service: Callable[..., Any],
) -> None:
    runner = CountingRunner(events=[RunnerEvent("sync.step", {"ok": True})])
    service = make_async_service(runner=runner)
    thread = await service.create(OWNER)
    result = await service.continue_(OWNER, thread.id, "hi")
    assert result.entries[1].content == "reply to hi" and runner.calls == 1
    page = await service.replay(OWNER, thread.id)
    assert "sync.step" in [r.type for r in page.records]


async def test_async_concurrent_duplicates_run_the_runner_once(
    make_async_service: Callable[..., Any],
) -> None:
    import asyncio

    gate, entered = asyncio.Event(), asyncio.Event()
    calls = 0

    async def runner(turn: Any) -> str:
        nonlocal calls
        calls += 1
        entered.set()
        await gate.wait()
        return "once"

    services = [make_async_service(runner=runner, inflight_wait_s=120.0) for _ in range(4)]
    thread = await services[0].create(OWNER)
    tasks = [
        asyncio.create_task(s.continue_(OWNER, thread.id, "same", request_id="dup"))
        for s in services
    ]
    await asyncio.wait_for(entered.wait(), 60)
    await asyncio.sleep(0.2)  # let the duplicates meet the request in flight (not asserted)
    gate.set()
    results = await asyncio.gather(*tasks)
    assert calls == 1
    assert len({r.model_dump_json() for r in results}) == 1


# --- the two APIs of this suite ---------------------------------------------------------------

SYNC_ONLY_NAMES = {"close": "aclose", "script_names": "script_names"}  # sync name: async twin


def test_each_variant_drives_the_service_of_its_name(make_service: ServiceMaker) -> None:
    import threading

    from memtier.threads import AsyncConversationService

    thread_names: list[str] = []

    def runner(turn: Any) -> str:
        thread_names.append(threading.current_thread().name)
        return "ok"

    service = make_service(runner=runner)
    thread = service.create(OWNER)
    assert service.continue_(OWNER, thread.id, "hi").entries[1].content == "ok"
    if make_service.api == "sync":
        assert type(service) is ConversationService
        assert thread_names == [threading.current_thread().name]
    else:
        assert isinstance(service, AsyncServiceAdapter)
        assert type(service.async_service) is AsyncConversationService
        assert thread_names and thread_names[0] != threading.current_thread().name
        with pytest.raises(AttributeError, match="private"):
            service._execute  # noqa: B018 -- the adapter refuses private plumbing


def test_every_public_sync_method_has_an_awaited_twin() -> None:
    import inspect

    from memtier.threads import AsyncConversationService

    public = {n for n in dir(ConversationService) if not n.startswith("_")}
    methods = {n for n in public if callable(getattr(ConversationService, n))}
    assert len(methods) > len(SYNC_ONLY_NAMES)  # not vacuous
    for name in sorted(methods):
        twin = getattr(AsyncConversationService, SYNC_ONLY_NAMES.get(name, name), None)
        assert twin is not None, f"AsyncConversationService has no twin of {name}"
        if name == "script_names":
            continue  # a pure function on both
        assert inspect.iscoroutinefunction(twin), name
