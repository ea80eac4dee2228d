"""The restore's ``restore_session`` calls, bound per partition and channel.

:class:`~memtier.memory.persistence.restorebatch.RestoreCalls` binds the inputs every
session of one partition and channel sends alike once, and fills in the rest by
position.  Held to the call built from names (what ``restore_session_call`` built
before: ``RESTORE_SESSION.call_with_tail`` with every KEYS role and ARGV name), over
generated sessions spread across partitions and both channels, through one
``RestoreCalls`` (its bound specs reused across sessions): the same script, KEYS and
ARGV, value for value; and the wire plan packs the bytes hiredis packs for the whole
call.  The restore's behaviour on every backend is in test_restore_read_ahead.py and
test_worker_recovery.py.
"""

from __future__ import annotations

import uuid
from typing import Any

import hiredis
from hypothesis import given, settings
from hypothesis import strategies as st

from memtier import limits
from memtier.config import MemtierConfig
from memtier.engine import ScriptCall
from memtier.memory.core import MemoryCore
from memtier.memory.models import Channel, ConversationKey
from memtier.memory.persistence.restorebatch import RestoreCalls, restore_session_call
from memtier.memory.scriptspecs import RESTORE_SESSION
from memtier.memory.snapshot.validation import ValidatedSession
from memtier.memory.turncodec import StoredTurn

SHA = "b" * 40


def _by_names(
    core: MemoryCore, session: ValidatedSession, detail: str, session_id: str | None, flush: int
) -> ScriptCall:
    """The call as built from names (restore_session_call before it was bound)."""
    key = ConversationKey.from_member(session.member)
    part = core.partition_for(key)
    sk = part.session(session.member)
    other = Channel.IM if key.channel is Channel.PUBLIC else Channel.PUBLIC
    receipts: list[str] = []
    for turn_id, receipt in session.receipts:
        receipts += (turn_id, receipt)
    keys = {
        "session": sk.session,
        "turns": sk.turns,
        "turn_ids": sk.turn_ids,
        "lru": part.lru(key.channel.value),
        "other_lru": part.lru(other.value),
        "index": part.index,
        "meta": part.meta,
        "events": part.events,
    }
    return RESTORE_SESSION.call_with_tail(
        keys,
        (*(r.encode() for r in session.records), *receipts),
        member=session.member,
        session_id=session_id or session.session_id,
        created_ms=session.created_ms,
        created_wall_ms=session.created_wall_ms,
        last_ms=session.last_ms,
        last_wall_ms=session.last_wall_ms,
        seq=session.seq,
        summary=session.summary or "",
        summary_version=session.summary_version,
        age_ms=session.age_ms,
        read_wall_ms=session.read_wall_ms,
        flush_wall_ms=flush,
        ttl_ms=core.ttl_ms(key.channel),
        grace_ms=limits.EXPIRY_GRACE_MS,
        max_sessions=core.max_sessions_per_partition,
        max_aggregate=core.max_bytes_per_partition,
        max_session_bytes=core.conv.max_session_bytes,
        max_turns=core.conv.max_turns_per_session,
        max_events=core.conv.max_events,
        clock_override=core.clock_arg(),
        detail=detail,
        n_records=len(session.records),
    )


_TEXT = st.text(max_size=20)


@st.composite
def _sessions(draw: Any) -> ValidatedSession:
    n = draw(st.integers(0, 4))
    records = tuple(
        StoredTurn(
            seq=i + 1,
            clock_ms=1_700_000_000_000 + i,
            wall_ms=1_700_000_000_000 + i,
            nbytes=len(text.encode()),
            is_tool=False,
            kind="avatar",
            turn_id=f"t{i}",
            fields={"text": text},
            redactor_version=1,
        )
        for i, text in enumerate(draw(st.lists(_TEXT, min_size=n, max_size=n)))
    )
    receipts = tuple(
        (f"t{i}", f"ses_{'a' * 16}|{i + 1}|1|1|1|0") for i in range(draw(st.integers(0, n)))
    )
    avatar = uuid.UUID(int=draw(st.integers(1, 2**64)))
    return ValidatedSession(
        member=f"{avatar}:{draw(st.sampled_from(['im', 'public']))}",
        session_id="ses_" + draw(st.sampled_from(["a", "b"])) * 20,
        created_ms=draw(st.integers(0, 2**45)),
        created_wall_ms=draw(st.integers(0, 2**45)),
        last_ms=draw(st.integers(0, 2**45)),
        last_wall_ms=draw(st.integers(0, 2**45)),
        age_ms=draw(st.integers(0, 2**40)),
        read_wall_ms=draw(st.integers(0, 2**45)),
        seq=draw(st.integers(0, 2**40)),
        summary=draw(st.one_of(st.none(), _TEXT)),
        summary_version=draw(st.integers(0, 9)),
        nbytes=sum(r.nbytes for r in records),
        records=records,
        receipts=receipts,
    )


@settings(max_examples=60, deadline=None)
@given(
    sessions=st.lists(_sessions(), min_size=1, max_size=8),
    partitions=st.sampled_from([1, 4, 64]),
    new_id=st.booleans(),
    clock=st.one_of(st.none(), st.integers(0, 2**45)),
    flush=st.integers(0, 2**45),
    detail=_TEXT,
)
def test_a_bound_restore_call_is_the_call_built_from_names(
    sessions: list[ValidatedSession],
    partitions: int,
    new_id: bool,
    clock: int | None,
    flush: int,
    detail: str,
) -> None:
    config = MemtierConfig.load(partitions=partitions, conversation={"max_events": 500})
    core = MemoryCore(config, clock=None if clock is None else (lambda: clock))
    calls = RestoreCalls(core, flush)
    for n, session in enumerate(sessions * 2):  # the second time from the bound specs kept
        session_id = f"ses_{n:020d}" if new_id else None
        got = calls.call(session, detail, session_id)
        named = _by_names(core, session, detail, session_id, flush)
        assert (got.script, got.keys, got.args) == (named.script, named.keys, named.args)
        alone = restore_session_call(
            core, session, detail, session_id=session_id, flush_wall_ms=flush
        )
        assert (alone.keys, alone.args) == (got.keys, got.args)
        assert got.wire is not None
        values = (*got.keys, *got.args)
        whole = hiredis.pack_command(("EVALSHA", SHA, len(got.keys), *values))
        assert got.wire.pack(SHA, values) == bytes(whole)
