"""A bound script call's wire plan (memtier.resppack) packs exactly what hiredis packs.

* generated layouts (fixed and free runs in any order, any length, counted tails) and
  values (UTF-8 text, empty, bytes, ints of any sign and size): the plan's bytes are
  ``hiredis.pack_command`` of the whole ``EVALSHA``, for every call and every SHA;
* what the plan must not take (a fixed value hiredis would pack unlike redis-py's
  encoder, too few values) leaves it unused or raises; a replaced call drops it;
* ``append_turn``'s own bound calls, one turn and several, pack the same bytes; and on
  real servers (standalone and Cluster, sync and asyncio) the lean paths send the plan's
  bytes for a store's appends, which read back whole.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import hiredis
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from memtier import (
    AgentResponse,
    AsyncConversationStore,
    AvatarMessage,
    ConversationKey,
    ConversationStore,
    MemtierConfig,
)
from memtier.memory.core import MemoryCore
from memtier.memory.scriptspecs import APPEND_TURN
from memtier.resppack import FREE, WirePlan, packs_alike

SHA = "a" * 40
_VALUES = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=40),
    st.integers(),
    st.sampled_from(["", "0", "-1", "ü€😀", "\r\n$3\r\n"]),
)
# A layout: (is_fixed, value) per KEYS + ARGV position.
_LAYOUTS = st.lists(st.tuples(st.booleans(), _VALUES), max_size=30)


def _whole(num_keys: int, values: tuple[Any, ...], sha: str = SHA) -> bytes:
    return bytes(hiredis.pack_command(("EVALSHA", sha, num_keys, *values)))


@settings(max_examples=300, deadline=None)
@given(
    layout=_LAYOUTS,
    num_keys=st.integers(0, 12),
    frees=st.data(),
    tail=st.lists(_VALUES, max_size=6),
)
@example(layout=[], num_keys=0, frees=None, tail=[])  # nothing but the EVALSHA
@example(layout=[(True, "k"), (True, 1)], num_keys=1, frees=None, tail=["x"])  # all fixed
@example(layout=[(False, "k"), (False, b"")], num_keys=2, frees=None, tail=[])  # all free
@example(  # alternating runs, a huge int
    layout=[(True, "a"), (False, ""), (True, -7), (False, 10**30)], num_keys=0, frees=None, tail=[]
)
def test_the_plan_packs_what_hiredis_packs_for_the_whole_call(
    layout: list[tuple[bool, Any]], num_keys: int, frees: Any, tail: list[Any]
) -> None:
    plan = WirePlan(num_keys, [v if fixed else FREE for fixed, v in layout])
    assert plan.usable
    for round_ in range(2):  # the fixed runs packed once serve every call
        values = [v for _, v in layout]
        for i, (fixed, _) in enumerate(layout):
            if not fixed and frees is not None:
                values[i] = frees.draw(_VALUES, label=f"free {i} round {round_}")
        call = (*values, *tail)
        assert plan.pack(SHA, call) == _whole(num_keys, call)
    other = "b" * 40  # another SHA: the EVALSHA run is packed again
    call = (*(v for _, v in layout), *tail)
    assert plan.pack(other, call) == _whole(num_keys, call, other)


@pytest.mark.parametrize("odd", [1.5, True, None, memoryview(b"x")])
def test_a_fixed_value_hiredis_would_pack_unlike_redis_py_leaves_the_plan_unused(
    odd: Any,
) -> None:
    assert not WirePlan(1, ["k", FREE, odd]).usable
    spec_argv = {name: 1 for name in APPEND_TURN.argv[-3:]} | {"prefix": odd}
    bound = APPEND_TURN.bind({}, spec_argv)
    keys = tuple(f"k{i}" for i in range(len(bound.names[0])))
    argv = tuple(f"a{i}" for i in range(len(bound.names[1])))
    assert bound.call(keys, argv).wire is None


def test_too_few_values_or_other_fixed_values_are_left_to_the_whole_pack() -> None:
    plan = WirePlan(1, ["k", FREE, 3])
    assert plan.pack(SHA, ("k", "x", 3)) == _whole(1, ("k", "x", 3))
    assert plan.pack(SHA, ("k", "x")) is None  # too few
    assert plan.pack(SHA, ("k", "x", 4)) is None  # a fixed value changed
    assert plan.pack(SHA, ("j", "x", 3)) is None
    with pytest.raises(TypeError):  # hiredis refuses a bool, as for a whole call
        plan.pack(SHA, ("k", True, 3))
    single = WirePlan(0, [FREE, "only"])  # one fixed value
    assert single.pack(SHA, ("x", "only")) == _whole(0, ("x", "only"))
    assert single.pack(SHA, ("x", "other")) is None


@settings(max_examples=100, deadline=None)
@given(layout=_LAYOUTS.filter(lambda lay: any(fixed for fixed, _ in lay)), data=st.data())
def test_a_call_with_other_fixed_values_is_not_packed_by_the_plan(
    layout: list[tuple[bool, Any]], data: Any
) -> None:
    plan = WirePlan(0, [v if fixed else FREE for fixed, v in layout])
    values = [v for _, v in layout]
    at = data.draw(st.sampled_from([i for i, (fixed, _) in enumerate(layout) if fixed]))
    other = data.draw(_VALUES.filter(lambda v: v != values[at]))
    values[at] = other
    assert plan.pack(SHA, tuple(values)) is None


def test_packs_alike_only_for_utf8_strict() -> None:
    assert packs_alike("utf-8", "strict") and packs_alike("UTF_8", "strict")
    assert packs_alike("utf8", "strict")
    assert not packs_alike("latin-1", "strict")
    assert not packs_alike("utf-8", "replace")


def _bound_append_calls(text: str) -> list[Any]:
    core = MemoryCore(MemtierConfig.load())
    key = ConversationKey(str(uuid.uuid4()), "im")
    one = core.prepare_turn(key, AvatarMessage(text=text))
    more = [core.prepare_turn(key, AgentResponse(text=text + "!")) for _ in range(3)]
    return [core.append_call(one), core.append_call(one, "sid", more)]


@settings(max_examples=60, deadline=None)
@given(text=st.text(min_size=1, max_size=200).filter(str.strip))
@example(text="password=hunter2 ü")
def test_append_turns_bound_calls_pack_the_same_bytes(text: str) -> None:
    for call in _bound_append_calls(text):
        assert call.wire is not None
        values = (*call.keys, *call.args)
        assert call.wire.pack(SHA, values) == _whole(len(call.keys), values)
        # A replaced call (other fixed values) carries no plan: it packs whole; one
        # derived with dataclasses.replace keeps it, and the plan refuses its values.
        replaced = APPEND_TURN.replace(call, ttl_ms=5)
        assert replaced.wire is None and APPEND_TURN.arg(replaced, "ttl_ms") == 5
        args = list(call.args)
        args[APPEND_TURN.index("ttl_ms")] = 5
        derived = dataclasses.replace(call, args=tuple(args))
        assert derived.wire is call.wire
        assert call.wire.pack(SHA, (*derived.keys, *derived.args)) is None


class _Spy:
    """Wraps WirePlan.pack: every packed call is compared with hiredis's whole pack."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        original = WirePlan.pack

        def pack(plan: WirePlan, sha: str, values: tuple[Any, ...]) -> bytes | None:
            self.calls += 1
            packed = original(plan, sha, values)
            assert packed == _whole(APPEND_TURN_KEYS, values, sha)
            return packed

        monkeypatch.setattr(WirePlan, "pack", pack)


APPEND_TURN_KEYS = len(APPEND_TURN.keys)


@pytest.mark.real
async def test_the_lean_paths_send_the_plans_bytes(
    backend_no_fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _Spy(monkeypatch)
    config = backend_no_fake.config()
    key = ConversationKey(str(uuid.uuid4()), "im")
    store = ConversationStore(backend_no_fake.sync_client(), config)
    store.append(key, AvatarMessage(text="one ü"))
    store.append_many(key, [AvatarMessage(text="two"), AgentResponse(text="three")])
    # Standalone always goes lean; a sync Cluster client does on redis-py >= 8.2 (the
    # floor release keeps redis-py's routing: no plan, the whole call packed by redis-py).
    lean = store.executor.lean_calls
    assert lean or backend_no_fake.is_cluster
    assert spy.calls == (2 if lean else 0)
    sync_calls = spy.calls
    client = backend_no_fake.async_client()
    aio = AsyncConversationStore(client, config)
    await aio.append(key, AvatarMessage(text="four"))
    executor = aio.executor
    aio_lean = executor.pipeline_for(client) or executor.lean_cluster_for(client)
    assert aio_lean or backend_no_fake.is_cluster  # (the same on asyncio)
    assert spy.calls == sync_calls + (1 if aio_lean else 0)
    context = await aio.context(key, limit=10)
    contents = [m.content for m in context.messages]
    assert len(contents) == 4
    for content, text in zip(contents, ["one ü", "two", "three", "four"], strict=True):
        assert text in content
