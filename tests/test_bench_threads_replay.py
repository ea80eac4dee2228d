"""The threads group's replay row (``bench.workers_threads.continue_scripts_measure``):
memtier's own claim, emit and commit requests, recorded from real continues and sent
again from a pre-encoded socket.  A figure from it means something only if what is
replayed is the work that was recorded: every reply must equal the recorded one, and a
replay on other state must be refused, never timed.  No speed is asserted."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from servers import require_real_redis

from bench.framework import Harness, Measure, Settings
from bench.server import BenchRedis
from bench.workers_threads import (
    _REPLAY_SIZES,
    _STREAM_ID,
    _without_clock,
    continue_scripts_measure,
)
from bench.workloads import bench_config, chat_text
from memtier.threads.models import Ownership
from memtier.threads.service import ConversationService


@pytest.fixture
def replay() -> Iterator[tuple[Harness, Measure, ConversationService]]:
    """The tiny profile's replay row on a private server, its rounds not yet sent."""
    require_real_redis("redis-server")
    with BenchRedis() as server:
        h = Harness(Settings.named("tiny"), None, lambda _msg: None)
        service = ConversationService(server.client(), bench_config("treplay"))
        try:
            yield h, continue_scripts_measure(h, server, service, chat_text(300)), service
        finally:
            service.close()


def test_every_recorded_round_replays_with_the_recorded_replies(
    replay: tuple[Harness, Measure, ConversationService],
) -> None:
    h, measure, service = replay
    per_round = _REPLAY_SIZES["tiny"][2]
    assert measure.fixed_ops == per_round
    admin = service.client
    for _ in range(h.settings.warmup_rounds + h.settings.rounds):
        before = admin.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        assert measure.run(per_round) > 0
        after = admin.info("commandstats")["cmdstat_evalsha"]["calls"]
        assert after - before == 3 * per_round  # claim, emit, commit per continue, no more
    # One chain per round was recorded; a round more has nothing valid to send.
    with pytest.raises(RuntimeError, match="recorded"):
        measure.run(per_round)


def test_a_replay_on_other_state_is_refused_not_timed(
    replay: tuple[Harness, Measure, ConversationService],
) -> None:
    _h, measure, service = replay
    per_round = _REPLAY_SIZES["tiny"][2]
    measure.run(per_round)  # round 0, on the keys the measure restored
    # The adversary: the threads move on outside the recording (one more turn on each),
    # so round 1's claims name a base that is no longer what the thread holds.
    owner = Ownership("bench", "replay")  # the owner whose keys the measure saved
    page = service.list(owner, limit=50)
    assert len(page.items) == _REPLAY_SIZES["tiny"][0]
    for thread in page.items:
        service.continue_(owner, thread.id, "a turn the recording never saw")
    with pytest.raises(RuntimeError, match="replied"):
        measure.run(per_round)


# A reply's shape: leaves that are stream ids (("id", seq): the server's clock in them) or
# plain values, which the comparison must see as they are.
_plain = st.one_of(
    st.binary(max_size=24).filter(lambda b: _STREAM_ID.fullmatch(b) is None),
    st.integers(),
    st.none(),
)
_shape = st.recursive(
    st.one_of(_plain, st.tuples(st.just("id"), st.integers(0, 99))),
    lambda inner: st.lists(inner, max_size=4),
    max_leaves=12,
)


def _at(shape: object, clock_ms: int) -> object:
    """The reply of ``shape`` from a server whose clock read ``clock_ms``."""
    if isinstance(shape, list):
        return [_at(part, clock_ms) for part in shape]
    if isinstance(shape, tuple):
        return f"{clock_ms}-{shape[1]}".encode()
    return shape


@given(_shape, st.integers(10**12, 10**13), st.integers(10**12, 10**13), _plain, _plain)
@example([0, b"e40", 40, 41], 1796590034010, 1796590099999, b"e41", b"e41")
@example([0, ("id", 0)], 1796590034010, 1796590099999, 0, 1)
@example(b"e1796590034010-0", 1796590034010, 1796590034010, b"e1", b"e2")  # an entry id
def test_replies_compare_equal_across_clocks_and_only_across_clocks(
    shape: object, clock_a: int, clock_b: int, x: object, y: object
) -> None:
    a, b = _at(shape, clock_a), _at(shape, clock_b)
    assert _without_clock(a) == _without_clock(b)  # the same work at another time
    # A plain part that differs (a status, an entry id, a count) is seen, wherever it is.
    assert (_without_clock([a, x]) == _without_clock([b, y])) == (x == y)
    assert (_without_clock([[x], a]) == _without_clock([[y], b])) == (x == y)
