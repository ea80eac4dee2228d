"""AgentIdentity (issue 15): projects onto the ownership without widening it, refused before
any Redis call otherwise; the runner receives it, the ledger records its id."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
import threadfixtures
from httphelpers import ALICE, MALLORY, api_server
from hypothesis import example, given
from hypothesis import strategies as st
from starlette.requests import Request
from threadfixtures import Service
from threadhelpers import OTHER, OTHER_TENANT, OWNER, CountingRunner

from memtier.errors import ConversationError
from memtier.threads import AgentIdentity, ConversationService, Ownership, Principal, RunnerTurn

AGENT = AgentIdentity("planner-1", "acme", "alice", scopes=("tools:read", "tools:read", "a"))


# The service tests run on the sync and the asyncio service (issue 13): [sync-fake], ...
make_service = threadfixtures.make_service


def _recording() -> tuple[CountingRunner, list[Any]]:
    seen: list[Any] = []

    def reply(turn: RunnerTurn) -> str:
        seen.append(turn.identity)
        return "ok"

    return CountingRunner(reply=reply), seen


def test_the_runner_receives_the_identity_and_the_ledger_its_id(
    make_service: Callable[..., Service],
) -> None:
    runner, seen = _recording()
    service = make_service(runner=runner)
    thread = service.create(OWNER)
    service.continue_(OWNER, thread.id, "hi", request_id="r1", identity=AGENT)
    service.continue_(OWNER, thread.id, "hi again")
    assert seen == [AGENT, None]
    assert AGENT.scopes == ("a", "tools:read")  # sorted, deduplicated
    started = [r for r in service.replay(OWNER, thread.id).records if r.type == "agent_started"]
    assert started[0].data["agentId"] == "planner-1"
    assert "agentId" not in started[1].data


class _NoRedis:
    """A client that fails the test on any call: the refusal must come before Redis."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"Redis was called ({name}) before the identity check")


@pytest.mark.fake
def test_a_widening_identity_is_refused_before_any_redis_call() -> None:
    runner = CountingRunner()
    service = ConversationService(_NoRedis(), runner=runner)
    for owner in (OTHER, OTHER_TENANT):
        with pytest.raises(ConversationError) as err:
            service.continue_(owner, "conv_x", "hi", identity=AGENT)
        assert err.value.code == "unauthorized"
    with pytest.raises(ConversationError) as err:
        service.continue_(OWNER, "conv_x", "hi", identity="planner-1")  # type: ignore[arg-type]
    assert err.value.code == "invalid_request"
    assert runner.calls == 0


_IDS = st.sampled_from(["acme", "alice", "globex", "mallory", "Alice", "acme "])


@given(_IDS, _IDS)
@example("acme", "Alice")  # case matters: a different user
def test_projection_is_exact_equality(tenant: str, user: str) -> None:
    try:
        identity = AgentIdentity("bot", tenant, user)
    except ConversationError as exc:
        assert exc.code == "invalid_request" and " " in tenant + user
        return
    assert identity.projects_onto(OWNER) == (tenant == "acme" and user == "alice")


def test_identity_validation() -> None:
    for bad in (
        {"agent_id": "a b"},
        {"tenant_id": "{x}"},
        {"scopes": "tools"},
        {"scopes": ("ok", "no space")},
        {"scopes": tuple(f"s{i}" for i in range(65))},
    ):
        args: dict[str, Any] = {"agent_id": "a", "tenant_id": "t", "user_id": "u", **bad}
        with pytest.raises(ConversationError) as err:
            AgentIdentity(**args)
        assert err.value.code == "invalid_request"


def _principal_auth(request: Request) -> Principal | Ownership | None:
    token = request.headers.get("authorization", "").removeprefix("Bearer ")
    return {
        "agent-token": Principal(OWNER, AGENT),
        # a host bug: an identity of alice attached to mallory's ownership
        "widening-token": Principal(OTHER, AGENT),
        "bare-token": OWNER,
        "alice-token": OWNER,
        "mallory-token": OTHER,
    }.get(token)


def test_identity_over_http(backend: Any) -> None:
    runner, seen = _recording()
    with (
        api_server(backend, runner=runner, auth=_principal_auth) as api,
        httpx.Client(timeout=60) as c,
    ):
        agent = {"Authorization": "Bearer agent-token"}
        tid = c.post(api.url, json={}, headers=agent).json()["id"]
        ok = c.post(f"{api.url}/{tid}/continue", json={"message": "hi"}, headers=agent)
        assert ok.status_code == 200, ok.text
        assert c.get(f"{api.url}/{tid}", headers=ALICE).status_code == 200  # same owner
        assert c.get(f"{api.url}/{tid}", headers=MALLORY).status_code == 404
        widening = {"Authorization": "Bearer widening-token"}
        for method, path, body in (
            ("POST", f"/{tid}/continue", {"message": "hi"}),
            ("GET", f"/{tid}", None),
            ("GET", "", None),
        ):
            refused = c.request(method, api.url + path, json=body, headers=widening)
            assert refused.status_code == 401, refused.text
            assert refused.json()["code"] == "unauthorized"
        assert seen == [AGENT] and runner.calls == 1
        rows = c.get(f"{api.url}/{tid}/events", headers=ALICE).json()["records"]
        assert [r["data"].get("agentId") for r in rows if r["type"] == "agent_started"] == [
            "planner-1"
        ]
