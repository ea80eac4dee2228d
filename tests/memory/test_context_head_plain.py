"""The context read's session check as plain commands against the script it replaces.

``memtier.memory.contexthead`` folds the replies of ``HMGET`` / ``TIME`` / ``HGET`` sent
inside the read's ``MULTI`` / ``EXEC`` into what ``lua/memory/context_head-2.lua``
replies.  Here Hypothesis writes raw session states into a real Redis -- each head
field (id, last, summary) present, empty or missing, the clock high-water mark absent,
behind or ahead, the test clock on both sides of the exact deadline ``last + ttl``, and
corrupt values memtier never writes -- and, for each, runs the script by ``EVALSHA`` and
the plain commands in one transaction, then holds the two to one rule: **the same
reply, or (only on a state whose ``last`` or clock mark is not a decimal integer) a
ScriptError -- never another answer.**
A second test does the same with the server's own clock (no test clock: ``TIME`` is
among the plain commands), on states far from their deadline.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import example, given, settings
from hypothesis import strategies as st
from servers import RedisServer

from memtier.errors import ScriptError
from memtier.memory.contexthead import HEAD_FIELDS, plain_head
from memtier.scripts import load_registry

T0 = 1_700_000_000_000
CORRUPT = ("", "abc", "1.5", " 7", "0x10", "1e3", "+5", "-")


def _canonical(value: str | None) -> bool:
    if value is None:
        return True
    digits = value[1:] if value[:1] == "-" else value
    return digits.isascii() and digits.isdigit()


@pytest.fixture(scope="module")
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_server.url) as c:
        yield c


def _number() -> st.SearchStrategy[str | None]:
    plain = st.integers(min_value=0, max_value=T0 * 2).map(str)
    return st.one_of(st.none(), plain, plain, plain, st.sampled_from(CORRUPT))


@st.composite
def _states(draw: st.DrawFn) -> dict[str, Any]:
    ttl = draw(st.sampled_from((1, 1_000, 3_600_000)))
    last_offset = draw(st.integers(min_value=-2 * ttl, max_value=2 * ttl))
    last = T0 + last_offset
    head: dict[str, str | None] = {
        "id": draw(st.one_of(st.none(), st.just("ses_" + "a" * 22), st.just(""))),
        "last": draw(st.one_of(st.just(str(last)), st.just(str(last)), _number())),
        "summary": draw(st.one_of(st.none(), st.just(""), st.just('{"text": "s"}'))),
    }
    # the clock on both sides of the deadline, exactly on it, and the high-water mark
    deadline = (int(head["last"]) + ttl) if _canonical(head["last"]) and head["last"] else T0
    now = deadline + draw(st.sampled_from((-1, 0, 1, -ttl, ttl)))
    hwm = draw(
        st.one_of(
            st.none(),
            st.integers(min_value=now - 5, max_value=now + 5).map(str),
            st.sampled_from(CORRUPT[:3]),
        )
    )
    return {"ttl": ttl, "head": head, "now": now, "hwm": hwm}


def _write(client: redis.Redis, state: dict[str, Any]) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:12]
    session, meta = f"{{h{tag}}}:s:m", f"{{h{tag}}}:meta"
    fields = {name: value for name, value in state["head"].items() if value is not None}
    fields["seq"] = "1"  # the hash exists even when every head field is missing
    client.hset(session, mapping=fields)
    if state["hwm"] is not None:
        client.hset(meta, "clock", state["hwm"])
    return session, meta


def _script_reply(
    client: redis.Redis, session: str, meta: str, ttl: int, clock: str
) -> Any | Exception:
    script = load_registry("memory")["context_head"]
    try:
        return client.evalsha(script.sha, 2, session, meta, ttl, clock)
    except redis.exceptions.NoScriptError:
        client.script_load(script.source)
        return client.evalsha(script.sha, 2, session, meta, ttl, clock)
    except redis.exceptions.ResponseError as exc:  # a Lua error on a corrupt state
        return exc


def _plain_reply(client: redis.Redis, session: str, meta: str, ttl: int, clock: str) -> Any:
    plain = plain_head(session, meta, ttl, clock)
    pipe = client.pipeline(transaction=True)
    for command in plain.commands:
        pipe.execute_command(*command)
    return plain.fold(pipe.execute())


def _judge(state: dict[str, Any], script: Any, plain: Any | ScriptError) -> None:
    # What memtier never writes: a `last` or a clock mark that is not a decimal integer
    # (a session without `last`, or without an id, reads as absent both ways).
    corrupt = not _canonical(state["head"]["last"]) or not _canonical(state["hwm"])
    if isinstance(plain, ScriptError):
        assert corrupt, (state, script)  # raised only where memtier never writes
        return
    assert not isinstance(script, Exception), (state, script, plain)
    assert plain == script, (state, script, plain)


@settings(max_examples=300, deadline=None)
@given(_states())
@example({"ttl": 1_000, "head": dict.fromkeys(HEAD_FIELDS), "now": T0, "hwm": None})
@example(
    {
        "ttl": 1_000,
        "head": {"id": "ses_" + "a" * 22, "last": str(T0), "summary": None},
        "now": T0 + 999,  # live: 1 ms before the deadline
        "hwm": str(T0 + 1_000),  # but the high-water mark is at it: absent
    }
)
def test_plain_check_answers_as_the_script(client: redis.Redis, state: dict[str, Any]) -> None:
    session, meta = _write(client, state)
    clock = str(state["now"])
    script = _script_reply(client, session, meta, state["ttl"], clock)
    try:
        plain: Any = _plain_reply(client, session, meta, state["ttl"], clock)
    except ScriptError as exc:
        plain = exc
    _judge(state, script, plain)
    client.delete(session, meta)


@settings(max_examples=60, deadline=None)
@given(
    live=st.booleans(),
    summary=st.one_of(st.none(), st.just('{"text": "s"}')),
    hwm=st.booleans(),
)
def test_plain_check_with_the_server_clock(
    client: redis.Redis, live: bool, summary: str | None, hwm: bool
) -> None:
    seconds, _ = client.time()
    server_ms = int(seconds) * 1000
    ttl = 60_000
    last = server_ms + (ttl * 10 if live else -ttl * 10)  # far from the deadline
    state = {
        "ttl": ttl,
        "head": {"id": "ses_" + "b" * 22, "last": str(last), "summary": summary},
        "now": server_ms,
        "hwm": str(server_ms - 1) if hwm else None,
    }
    session, meta = _write(client, state)
    script = _script_reply(client, session, meta, ttl, "")
    plain = _plain_reply(client, session, meta, ttl, "")
    assert plain == script
    assert (plain[0] == 0) is live
    assert plain_head(session, meta, ttl, "").commands[1] == ("TIME",)
    client.delete(session, meta)
