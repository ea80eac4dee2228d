"""Run options (issue 15): validated against the host's schema, bounded, stored with the run
record, redacted on the ledger, part of a request id's identity -- Python and HTTP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import httpx
import orjson
import pytest
import threadfixtures
from httphelpers import ALICE, api_server
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict
from threadfixtures import Service
from threadhelpers import OWNER, CountingRunner, thread_key_names

from memtier import limits
from memtier.errors import ConfigurationError, ConversationError
from memtier.threads import RunnerReply, RunnerTurn
from memtier.threads.runoptions import check_schema, validate_run_options

SECRET = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"

MakeService = Callable[..., Service]

# The service tests run on the sync and the asyncio service (issue 13): [sync-fake], ...
make_service = threadfixtures.make_service


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature: float | None = None
    tool_choice: Literal["auto", "none", "required"] | None = None
    max_tokens: int | None = None
    hint: str | None = None


def _seen(runner: CountingRunner) -> list[Any]:
    return runner.seen  # type: ignore[attr-defined,no-any-return]


def _recording() -> CountingRunner:
    seen: list[Any] = []

    def reply(turn: RunnerTurn) -> str:
        seen.append(turn.run_options)
        return "ok"

    runner = CountingRunner(reply=reply)
    runner.seen = seen  # type: ignore[attr-defined]
    return runner


def test_options_reach_the_runner_stored_and_redacted(
    make_service: MakeService, backend: Any
) -> None:
    runner = _recording()
    service = make_service(runner=runner, run_options_schema=Options)
    thread = service.create(OWNER)
    options = {"temperature": 0.5, "tool_choice": "auto", "hint": f"use {SECRET}"}
    first = service.continue_(OWNER, thread.id, "hi", request_id="r1", run_options=options)
    again = service.continue_(OWNER, thread.id, "hi", request_id="r1", run_options=options)
    assert again == first and runner.calls == 1
    assert _seen(runner) == [options]  # the runner gets what the caller validated
    runs_key = thread_key_names(service, OWNER, thread.id)[3]
    client = backend.sync_client()  # the raw rows, read beside the service
    record = orjson.loads(client.hget(runs_key, "r1"))
    assert record["opt"]["temperature"] == 0.5
    stored = client.hgetall(runs_key)
    assert SECRET not in repr(stored)  # stored with the run record, redacted
    started = [r for r in service.replay(OWNER, thread.id).records if r.type == "agent_started"]
    assert started[0].data["runOptions"]["tool_choice"] == "auto"
    assert SECRET not in orjson.dumps([r.to_wire() for r in started]).decode()
    # a retry with other options is a different request: request_conflict
    with pytest.raises(ConversationError) as err:
        service.continue_(OWNER, thread.id, "hi", request_id="r1", run_options={"temperature": 0.6})
    assert err.value.code == "request_conflict"
    with pytest.raises(ConversationError) as err:
        service.continue_(OWNER, thread.id, "hi", request_id="r1")  # options dropped
    assert err.value.code == "request_conflict"
    assert runner.calls == 1


@pytest.mark.parametrize(
    ("options", "code"),
    [
        ({"temperature": "0.5"}, "invalid_request"),  # strict: a string is not a number
        ({"unknown": 1}, "invalid_request"),
        ({"requestId": "x"}, "invalid_request"),
        ({"tenant_id": "globex"}, "invalid_request"),
        ({"tool_choice": "sometimes"}, "invalid_request"),
        ({"hint": "x" * limits.THREAD_RUN_OPTIONS_BYTES}, "limit_exceeded"),
        (["temperature"], "invalid_request"),
    ],
)
def test_bad_options_are_refused_before_any_write(
    make_service: MakeService, backend: Any, options: Any, code: str
) -> None:
    runner = CountingRunner()
    service = make_service(runner=runner, run_options_schema=Options)
    thread = service.create(OWNER)
    with pytest.raises(ConversationError) as err:
        service.continue_(OWNER, thread.id, "hi", request_id="r", run_options=options)
    assert err.value.code == code
    assert runner.calls == 0
    assert service.replay(OWNER, thread.id).records == ()
    runs_key = thread_key_names(service, OWNER, thread.id)[3]
    assert not backend.sync_client().exists(runs_key)


def test_a_service_without_a_schema_refuses_options(
    make_service: MakeService,
) -> None:
    service = make_service()
    thread = service.create(OWNER)
    with pytest.raises(ConversationError) as err:
        service.continue_(OWNER, thread.id, "hi", run_options={"temperature": 1.0})
    assert err.value.code == "invalid_request"


def test_a_schema_must_forbid_extras_and_reserved_names() -> None:
    class Lax(BaseModel):
        temperature: float | None = None

    class Sneaky(BaseModel):
        model_config = ConfigDict(extra="forbid")
        user_id: str | None = None

    for schema in (Lax, Sneaky, dict):
        with pytest.raises(ConfigurationError):
            check_schema(schema)
    assert check_schema(Options) is Options


_KEYS = ["temperature", "tool_choice", "max_tokens", "hint", "junk", "requestId", "ownership"]
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.floats(-2, 2, allow_nan=False),
    st.sampled_from(["auto", "none", "required", "sometimes", "0.5"]),
    st.lists(st.integers(0, 3), max_size=2),
)


def _expected_ok(options: dict[str, Any]) -> bool:
    for key, value in options.items():
        if value is None and key in ("temperature", "tool_choice", "max_tokens", "hint"):
            continue
        if key == "temperature":
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        elif key == "tool_choice":
            ok = value in ("auto", "none", "required")
        elif key == "max_tokens":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif key == "hint":
            ok = isinstance(value, str)
        else:
            ok = False
        if not ok:
            return False
    return True


@given(st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=4))
@example({"temperature": True})  # a JSON boolean is not a number
@example({"max_tokens": 1.0})  # nor a float an integer
@example({"requestId": None})  # a reserved name is refused whatever its value
def test_validation_accepts_exactly_what_the_schema_says(options: dict[str, Any]) -> None:
    try:
        got = validate_run_options(Options, options)
    except ConversationError as exc:
        assert exc.code == "invalid_request"
        assert not _expected_ok(options), options
        return
    assert _expected_ok(options), options
    assert got == options


def test_run_options_over_http(backend: Any) -> None:
    runner = _recording()
    with (
        api_server(backend, runner=runner, run_options_schema=Options) as api,
        httpx.Client(timeout=60) as c,
    ):
        tid = c.post(api.url, json={}, headers=ALICE).json()["id"]
        body = {"message": "hi", "requestId": "h1", "runOptions": {"toolChoice": "none"}}
        # the schema's own field names, not camelCase
        assert c.post(f"{api.url}/{tid}/continue", json=body, headers=ALICE).status_code == 400
        body["runOptions"] = {"tool_choice": "none", "max_tokens": 7}
        ok = c.post(f"{api.url}/{tid}/continue", json=body, headers=ALICE)
        assert ok.status_code == 200, ok.text
        assert _seen(runner) == [{"tool_choice": "none", "max_tokens": 7}]
        body["runOptions"] = {"tool_choice": "none", "max_tokens": 8}
        conflict = c.post(f"{api.url}/{tid}/continue", json=body, headers=ALICE)
        assert conflict.json()["code"] == "request_conflict"
        for bad in ({"max_tokens": "7"}, {"max_tokens": 7.5}, {"userId": "x"}, [], "x"):
            body = {"message": "hi", "runOptions": bad}
            refused = c.post(f"{api.url}/{tid}/continue", json=body, headers=ALICE)
            assert refused.json()["code"] == "invalid_request", (bad, refused.text)
        doc = c.get(f"{api.url}/openapi.json").json()
        schemas = doc["components"]["schemas"]
        assert "runOptions" in schemas["ContinueRequest"]["properties"]
        assert schemas["Options"]["additionalProperties"] is False
        assert set(schemas["Options"]["properties"]) == set(Options.model_fields)


def test_without_a_schema_run_options_is_an_unknown_field_over_http(backend: Any) -> None:
    with api_server(backend) as api, httpx.Client(timeout=60) as c:
        tid = c.post(api.url, json={}, headers=ALICE).json()["id"]
        body = {"message": "hi", "runOptions": {}}
        refused = c.post(f"{api.url}/{tid}/continue", json=body, headers=ALICE)
        assert refused.json()["code"] == "invalid_request"
        doc = c.get(f"{api.url}/openapi.json").json()
        props = doc["components"]["schemas"]["ContinueRequest"]["properties"]
        assert "runOptions" not in props


def test_a_runner_may_carry_its_schema(
    make_service: MakeService,
) -> None:
    class Carrier:
        run_options_schema = Options

        def __call__(self, turn: RunnerTurn) -> RunnerReply:
            return RunnerReply(str(turn.run_options))

    service = make_service(runner=Carrier())
    thread = service.create(OWNER)
    result = service.continue_(OWNER, thread.id, "hi", run_options={"max_tokens": 3})
    assert result.entries[1].content == "{'max_tokens': 3}"
