"""Issue 9/10 promises of the service (fakeredis, real Redis, real Cluster): failed turns
leave a consistent ledger, export/replay never emit local paths or stored secrets, and a
retried delete reports only what happened (D10)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
import redis.exceptions
import threadfixtures
from hypothesis import example, given, settings
from hypothesis import strategies as st
from threadfixtures import Service
from threadhelpers import OTHER, OWNER, CountingRunner

from memtier.errors import ConversationError
from memtier.keys import ThreadKeyspace
from memtier.threads import AgentDenied, ConversationService, RunnerEvent

MakeService = Callable[..., Service]

# The behaviour tests run on the sync and the asyncio service (issue 13): [sync-fake], ...
make_service = threadfixtures.make_service
service = threadfixtures.service
make_sync_service = threadfixtures.make_sync_service
SECRET = "ghp_" + "a1" * 18


def err(fn: Callable[[], Any]) -> ConversationError:
    with pytest.raises(ConversationError) as info:
        fn()
    return info.value


def _ledger(service: Service, tid: str) -> list[Any]:
    return list(service.replay(OWNER, tid).records)


# --- failed turns ---------------------------------------------------------------------------------


@pytest.mark.parametrize("failure", [RuntimeError("model exploded"), AgentDenied("no")])
def test_a_failed_turn_never_lends_its_entry_id_to_another_message(
    make_service: MakeService, failure: Exception
) -> None:
    runner = CountingRunner(fail=failure)
    service = make_service(runner=runner)
    tid = service.create(OWNER).id
    if isinstance(failure, AgentDenied):
        assert service.continue_(OWNER, tid, "first try").status.value == "denied"
    else:
        assert err(lambda: service.continue_(OWNER, tid, "first try")).code == "runner_failed"
    runner.fail = None
    done = service.continue_(OWNER, tid, "second try")
    records = _ledger(service, tid)
    # a consumer keying messages by entryId never sees two messages under one id
    by_entry: dict[str, set[str]] = {}
    for record in records:
        if record.type in ("user_message", "assistant_message"):
            by_entry.setdefault(record.data["entryId"], set()).add(record.data["content"])
    assert all(len(contents) == 1 for contents in by_entry.values()), by_entry
    first_user = next(r for r in records if r.type == "user_message")
    closing = next(r for r in records if r.type in ("error", "agent_denied"))
    # the ledger says what the failed turn committed (nothing) and which ids it discarded
    assert closing.data["entryIds"] == []
    assert first_user.data["entryId"] in closing.data["discardedEntryIds"]
    finished = [r for r in records if r.type == "agent_finished"]
    assert finished[-1].data["entryIds"] == [e.id for e in done.entries]
    assert not set(closing.data["discardedEntryIds"]) & {e.id for e in done.entries}
    stored = {e.id for e in done.entries}
    assert first_user.data["entryId"] not in stored  # never committed, never reused


# --- export / replay: paths and stored secrets ----------------------------------------------------


def test_export_never_emits_local_paths_in_title_or_metadata(service: Service) -> None:
    thread = service.create(
        OWNER,
        title="notes from /home/alice/plans/q3.md",
        metadata={"source": "C:\\Users\\alice\\q3.docx", "/etc/hosts": ["file:///tmp/x"]},
    )
    service.continue_(OWNER, thread.id, "read ~/secret/plan.txt")
    exported = service.export(OWNER, thread.id).to_wire()
    text = orjson.dumps(exported).decode()
    for fragment in ("/home/alice", "Users\\\\alice", "/etc/hosts", "file:///tmp", "~/secret"):
        assert fragment not in text, fragment
    assert exported["thread"]["title"] == "notes from [PATH]"
    assert "[PATH]" in exported["thread"]["metadata"]["source"]
    replay_text = orjson.dumps(service.replay(OWNER, thread.id).to_wire()).decode()
    assert "~/secret" not in replay_text and "/home/" not in replay_text


def test_stored_rows_with_secrets_or_paths_are_redacted_when_served(
    backend: Any, service: Service
) -> None:
    """Rows written by an older version or by hand are checked on read."""
    tid = service.create(OWNER, title="clean").id
    service.continue_(OWNER, tid, "hello")
    client = backend.sync_client()
    keys = ThreadKeyspace(service.config.namespace).owner("acme", "alice").thread(tid)
    newest = client.xrevrange(keys.events, "+", "-", count=1)[0][0].decode()
    ms = int(newest.split("-")[0]) + 1
    data = {"note": f"token {SECRET} at /home/alice/.ssh/id_rsa", "password": "hunter2"}
    client.xadd(
        keys.events,
        {"type": "legacy.row", "data": orjson.dumps(data), "run": "", "r": "1"},
        id=f"{ms}-0",
    )
    client.hset(
        keys.thread,
        mapping={"title": f"old {SECRET}", "metadata": orjson.dumps({"k": SECRET})},
    )
    served = [
        orjson.dumps(service.replay(OWNER, tid).to_wire()).decode(),
        orjson.dumps(service.export(OWNER, tid).to_wire()).decode(),
        orjson.dumps(service.get(OWNER, tid).to_wire()).decode(),
    ]
    for text in served:
        assert SECRET not in text
    for text in served[:2]:
        assert "/home/alice" not in text and "hunter2" not in text
    legacy = next(r for r in service.replay(OWNER, tid).records if r.type == "legacy.row")
    assert "[PATH]" in legacy.data["note"] and "[REDACTED:github_token]" in legacy.data["note"]


# --- D10: a retried delete reports only what happened ---------------------------------------------


class _FirstAttemptFails:
    """Wraps one script: its first call raises a connection error, either before Redis
    sees it (``reached=False``) or after it ran there (``reached=True``, a lost reply)."""

    def __init__(self, script: Any, reached: bool) -> None:
        self.script, self.reached, self.calls = script, reached, 0

    def __call__(self, client: Any, keys: Any, args: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            if self.reached:
                self.script(client, keys, args)
            raise redis.exceptions.ConnectionError("connection reset (injected)")
        return self.script(client, keys, args)


class _Scripts:
    def __init__(self, registry: Any, name: str, wrapper: Any) -> None:
        self.registry, self.name, self.wrapper = registry, name, wrapper

    def __getitem__(self, name: str) -> Any:
        return self.wrapper if name == self.name else self.registry[name]

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.registry, attr)


def _flaky_delete(service: Service, reached: bool) -> _FirstAttemptFails:
    wrapper = _FirstAttemptFails(service.scripts["delete"], reached)
    service.scripts = _Scripts(service.scripts, "delete", wrapper)  # type: ignore[assignment]
    return wrapper


def test_a_retried_delete_that_never_reached_redis_does_not_claim_a_delete(
    make_sync_service: MakeService,
) -> None:
    # Sync only: the fault is injected by wrapping the sync script registry's call.
    owner_service, service = make_sync_service(), make_sync_service()
    theirs = owner_service.create(OTHER).id
    for target in ("conv_missing", theirs):
        flaky = _flaky_delete(service, reached=False)
        refused = err(lambda target=target: service.delete(OWNER, target))
        assert refused.code == "not_found" and flaky.calls == 2
    assert owner_service.get(OTHER, theirs).id == theirs  # untouched


def test_a_retried_delete_whose_reply_was_lost_reports_the_delete(
    make_sync_service: MakeService,
) -> None:
    # Sync only: the fault is injected by wrapping the sync script registry's call.
    service = make_sync_service()
    tid = service.create(OWNER).id
    flaky = _flaky_delete(service, reached=True)
    assert service.delete(OWNER, tid).model_dump() == {"deleted": True, "held": False}
    assert flaky.calls == 2
    assert err(lambda: service.get(OWNER, tid)).code == "not_found"
    assert err(lambda: service.delete(OWNER, tid)).code == "not_found"  # a new call: not ours


def test_runner_events_with_paths_stay_scrubbed(make_service: MakeService) -> None:
    runner = CountingRunner(events=[RunnerEvent("tool.call", {"file": "/home/alice/a.txt"})])
    service = make_service(runner=runner)
    tid = service.create(OWNER).id
    service.continue_(OWNER, tid, "go")
    event = next(r for r in _ledger(service, tid) if r.type == "tool.call")
    assert event.data == {"file": "[PATH]"}


# --- a generated adversary: any sequence of turn outcomes keeps the ledger consistent -------------

_OUTCOMES = st.lists(st.sampled_from(["ok", "fail", "deny"]), min_size=1, max_size=8)


@pytest.mark.fake
@settings(max_examples=60)
@given(outcomes=_OUTCOMES, branch_after=st.integers(min_value=0, max_value=7))
@example(outcomes=["fail", "ok"], branch_after=0)  # the case: the id was reused
@example(outcomes=["deny", "fail", "ok", "ok"], branch_after=2)
def test_any_sequence_of_turn_outcomes_keeps_entry_ids_unique_and_ledger_exact(
    outcomes: list[str], branch_after: int
) -> None:
    import fakeredis

    from memtier.config import MemtierConfig

    runner = CountingRunner()
    service = ConversationService(
        fakeredis.FakeRedis(), MemtierConfig.load(namespace="prop"), runner=runner
    )
    tid = service.create(OWNER).id
    committed: list[str] = []
    for i, outcome in enumerate(outcomes):
        runner.fail = {"ok": None, "fail": RuntimeError("x"), "deny": AgentDenied("no")}[outcome]
        leaf = committed[-1] if i == branch_after and committed else None
        if leaf is not None:
            service.branch(OWNER, tid, leaf)
        try:
            result = service.continue_(OWNER, tid, f"message {i}", leaf_id=leaf)
        except ConversationError as exc:
            assert outcome == "fail" and exc.code == "runner_failed"
            continue
        committed += [e.id for e in result.entries]
    records = service.replay(OWNER, tid).records
    announced: dict[str, str] = {}
    for record in records:
        if record.type in ("user_message", "assistant_message"):
            entry_id = record.data["entryId"]
            assert (
                announced.setdefault(entry_id, record.data["content"]) == record.data["content"]
            ), entry_id  # never two messages under one id
    said_committed = [i for r in records if r.type == "agent_finished" for i in r.data["entryIds"]]
    discarded = [
        i
        for r in records
        if r.type in ("error", "agent_denied")
        for i in r.data["discardedEntryIds"]
    ]
    assert said_committed == committed  # the ledger says exactly which entries exist
    assert not set(discarded) & set(committed)
    assert set(announced) <= set(committed) | set(discarded)
    assert len(set(committed)) == len(committed) == 2 * outcomes.count("ok")
