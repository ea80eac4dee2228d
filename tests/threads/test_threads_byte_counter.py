"""The thread's byte counter is what its rows hold (issue 12, fifteenth round).

``run_claim``, ``events_append``, ``run_commit``, ``run_abort`` and ``run_cancel`` keep
the thread hash's ``bytes`` field, which the per-thread byte cap (``max_bytes``) is
judged by.  Three of them now write it with the HSET that writes their other fields
(the counter as read plus what they add) instead of a separate ``HINCRBY``.  Whatever
turns a thread has had -- replies with any number of emitted events, denials, runner
failures, cancellations, turns on an earlier branch -- the counter must equal the bytes
its stored entries and ledger rows hold: each entry's JSON, and each row's type and
data.  Generated sequences of turns, on every backend.
"""

from __future__ import annotations

from typing import Any

import threadfixtures
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from threadhelpers import OWNER, ServiceMaker

from memtier.keys import ThreadKeyspace
from memtier.threads import AgentDenied, RunnerEvent, RunnerReply, RunnerTurn

# One turn: what its runner does ("reply" with n events emitted first, "deny", "fail",
# "cancel": the run cancels itself, then emits), and whether it continues from the
# thread's first branch point instead of the head.
TURN = st.tuples(
    st.sampled_from(["reply", "deny", "fail", "cancel"]),
    st.integers(min_value=0, max_value=3),
    st.booleans(),
)


class _Scripted:
    """Does what the turn's message names (``<kind>:<events>``)."""

    def __init__(self) -> None:
        self.service: Any = None

    def __call__(self, turn: RunnerTurn) -> RunnerReply:
        kind, n = turn.message.split(":")
        if kind == "cancel":
            self.service.cancel_run(OWNER, turn.thread.id, turn.request_id)
        for i in range(int(n)):
            turn.emit(RunnerEvent("step", {"i": i, "note": "é" * i}))  # multibyte: bytes, not chars
        if kind == "deny":
            raise AgentDenied("not this one")
        if kind == "fail":
            raise RuntimeError("the model fell over")
        return RunnerReply(f"reply to {turn.message} " + "ü" * int(n))


def _stored_bytes(client: Any, keys: Any) -> tuple[int, int]:
    """(the counter, what the thread's entries and ledger rows hold)."""
    counter = int(client.hget(keys.thread, "bytes"))
    held = sum(len(v) for v in client.hvals(keys.entries))
    for _, row in client.xrange(keys.events):
        held += len(row[b"type"]) + len(row[b"data"])
    return counter, held


# The sync service on every backend (threadfixtures' fixture, named in this module).
make_sync_service = threadfixtures.make_sync_service


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(turns=st.lists(TURN, min_size=1, max_size=6))
@example(turns=[("reply", 0, False)])
@example(turns=[("reply", 3, False), ("reply", 1, True), ("cancel", 2, False)])
@example(turns=[("deny", 1, False), ("fail", 2, False), ("reply", 0, True)])
def test_the_byte_counter_is_what_the_rows_hold(
    make_sync_service: ServiceMaker, turns: list[Any]
) -> None:
    runner = _Scripted()
    service = make_sync_service(runner=runner)
    runner.service = service
    thread = service.create(OWNER, title="bytes")
    owner_keys = ThreadKeyspace(service.config.namespace).owner(OWNER.tenant_id, OWNER.user_id)
    keys = owner_keys.thread(thread.id)
    client = make_sync_service.backend.sync_client()
    first_leaf: str | None = None
    for kind, n, from_branch in turns:
        leaf = first_leaf if from_branch else None
        try:
            result = service.continue_(OWNER, thread.id, f"{kind}:{n}", leaf_id=leaf)
        except Exception as exc:  # fail and cancel end the turn with an error
            assert kind in ("fail", "cancel"), repr(exc)
        else:
            assert kind in ("reply", "deny"), result
            if first_leaf is None and result.leaf_id is not None:
                first_leaf = result.leaf_id  # a later turn may go on from here: a branch
                service.branch(OWNER, thread.id, first_leaf)
        counter, held = _stored_bytes(client, keys)
        assert counter == held, (kind, n, from_branch)
