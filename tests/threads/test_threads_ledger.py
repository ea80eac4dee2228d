"""Replay, reconnect, cursors, export and every frozen limit (default and hard cap)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
import threadfixtures
from threadfixtures import Service
from threadhelpers import OWNER, Clock, CountingRunner

from memtier import limits
from memtier.config import MemtierConfig
from memtier.errors import ConfigurationError, ConversationError
from memtier.keys import ThreadKeyspace
from memtier.threads import RunnerEvent, RunnerReply, RunnerTurn

MakeService = Callable[..., Service]

# The behaviour tests run on the sync and the asyncio service (issue 13): [sync-fake], ...
make_service = threadfixtures.make_service
service = threadfixtures.service
make_sync_service = threadfixtures.make_sync_service


def err(fn: Callable[[], Any]) -> ConversationError:
    with pytest.raises(ConversationError) as info:
        fn()
    return info.value


def _turns(service: Service, n: int, thread_id: str | None = None) -> str:
    tid = thread_id or service.create(OWNER).id
    for i in range(n):
        service.continue_(OWNER, tid, f"message {i}")
    return tid


def _read_all(service: Service, tid: str, limit: int | None = None) -> list[Any]:
    records: list[Any] = []
    cursor = None
    for _ in range(10_000):
        page = service.replay(OWNER, tid, cursor=cursor, limit=limit)
        records += page.records
        if page.next_cursor is None:
            return records
        cursor = page.next_cursor
    raise AssertionError("replay never ended")


# --- replay and reconnect -----------------------------------------------------------------------


def test_replay_pages_in_timestamp_id_order_and_ends_terminal(service: Service) -> None:
    tid = _turns(service, 3)
    records = _read_all(service, tid, limit=4)
    assert len(records) == 15
    keys = [(r.timestamp, tuple(int(p) for p in r.id.split("-"))) for r in records]
    assert keys == sorted(keys) and len(set(keys)) == 15
    last = service.replay(OWNER, tid, limit=100)
    assert last.terminal and last.next_cursor is None
    assert service.replay(OWNER, service.create(OWNER).id).model_dump() == {
        "records": (),
        "next_cursor": None,
        "terminal": False,
    }


def test_reconnect_resumes_from_the_last_cursor_exactly_once(make_service: MakeService) -> None:
    service = make_service()
    tid = _turns(service, 4)
    everything = _read_all(service, tid, limit=100)
    # A client reads two pages, then its connection drops: it kept only the last cursor.
    first = service.replay(OWNER, tid, limit=3)
    second = service.replay(OWNER, tid, cursor=first.next_cursor, limit=3)
    kept_cursor = second.next_cursor
    seen = {r.id: r for r in (*first.records, *second.records)}
    # A brand-new client (new connection) resumes; it also re-reads from an older cursor
    # once (at-least-once across the boundary) and dedupes by id.
    reconnected = make_service()
    resumed = reconnected.replay(OWNER, tid, cursor=first.next_cursor, limit=3).records
    cursor = kept_cursor
    while cursor:
        page = reconnected.replay(OWNER, tid, cursor=cursor, limit=3)
        resumed += page.records
        cursor = page.next_cursor
    for record in resumed:
        seen.setdefault(record.id, record)
    ordered = sorted(seen.values(), key=lambda r: (r.timestamp, [int(p) for p in r.id.split("-")]))
    assert [r.id for r in ordered] == [r.id for r in everything]
    assert [r.to_wire() for r in ordered] == [r.to_wire() for r in everything]


def test_live_replay_while_a_turn_runs(make_service: MakeService) -> None:
    gate = threading.Event()
    runner = CountingRunner(events=[RunnerEvent("step", {"n": 1})], gate=gate)
    service = make_service(runner=runner)
    tid = service.create(OWNER).id
    worker = threading.Thread(target=lambda: service.continue_(OWNER, tid, "go"))
    worker.start()
    try:
        assert runner.entered.wait(60)
        page = service.replay(OWNER, tid)
        # the opening rows are there once the runner runs; its own emit follows (bounded wait)
        assert [r.type for r in page.records][:2] == ["agent_started", "user_message"]
        deadline = time.monotonic() + 60
        while len(page.records) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
            page = service.replay(OWNER, tid)
        assert [r.type for r in page.records] == ["agent_started", "user_message", "step"]
        assert not page.terminal and page.next_cursor  # the run is still writing
        idle = service.replay(OWNER, tid, cursor=page.next_cursor)
        assert idle.records == () and idle.next_cursor == page.next_cursor and not idle.terminal
    finally:
        gate.set()
        worker.join(60)
    rest = service.replay(OWNER, tid, cursor=page.next_cursor)
    assert [r.type for r in rest.records] == ["assistant_message", "agent_finished"]
    assert rest.terminal and rest.next_cursor is None
    assert runner.calls == 1


def test_replay_and_export_never_rerun_the_runner(make_service: MakeService) -> None:
    runner = CountingRunner()
    service = make_service(runner=runner)
    tid = _turns(service, 2)
    for _ in range(3):
        _read_all(service, tid, limit=2)
        service.export(OWNER, tid)
    assert runner.calls == 2


def test_rows_without_redaction_are_never_served(backend: Any, service: Service) -> None:
    tid = _turns(service, 1)
    keys = ThreadKeyspace(service.config.namespace).owner("acme", "alice").thread(tid)
    client = backend.sync_client()
    client.xadd(keys.events, {"type": "tool_result", "data": '{"secret": "raw"}', "run": "x"})
    records = _read_all(service, tid, limit=2)
    assert "tool_result" not in [r.type for r in records] and len(records) == 5
    assert "tool_result" not in [e.type for e in service.export(OWNER, tid).events]


def test_event_order_survives_a_clock_going_backwards(make_service: MakeService) -> None:
    clock = Clock()
    service = make_service(clock=clock)
    tid = _turns(service, 1)
    clock.now -= 60_000  # this host's clock steps back a minute
    service.continue_(OWNER, tid, "later")
    records = _read_all(service, tid, limit=100)
    ids = [tuple(int(p) for p in r.id.split("-")) for r in records]
    assert ids == sorted(ids)
    assert [r.timestamp for r in records] == sorted(r.timestamp for r in records)


# --- cursors ------------------------------------------------------------------------------------


def test_cursors_are_bound_to_their_thread(service: Service) -> None:
    a, b = _turns(service, 1), _turns(service, 1)
    cursor = service.replay(OWNER, a, limit=1).next_cursor
    assert cursor
    mismatch = err(lambda: service.replay(OWNER, b, cursor=cursor))
    assert mismatch.code == "cursor_thread_mismatch" and mismatch.http_status == 400
    assert err(lambda: service.export(OWNER, b, cursor=cursor)).code == "cursor_thread_mismatch"
    tampered = cursor[:-3] + ("A" if cursor[-3] != "A" else "B") + cursor[-2:]
    invalid = err(lambda: service.replay(OWNER, a, cursor=tampered))
    assert invalid.code == "invalid_cursor" and invalid.http_status == 400
    for garbage in ["", "x", "!!!!", "é" * 10, cursor + "AAAA"]:
        assert err(lambda g=garbage: service.replay(OWNER, a, cursor=g)).code == "invalid_cursor"
    list_cursor = service.list(OWNER, limit=1).next_cursor
    assert list_cursor
    assert err(lambda: service.replay(OWNER, a, cursor=list_cursor)).code == "invalid_cursor"
    assert err(lambda: service.list(OWNER, cursor=cursor)).code == "invalid_cursor"


def test_cursors_minted_with_another_secret_are_invalid(make_service: MakeService) -> None:
    first = make_service(cursor_secret=b"s" * 32)
    other = make_service(cursor_secret=b"t" * 32)
    tid = _turns(first, 1)
    cursor = first.replay(OWNER, tid, limit=1).next_cursor
    with pytest.raises(ConversationError) as info:
        other.replay(OWNER, tid, cursor=cursor)
    assert info.value.code == "invalid_cursor"


def test_the_cursor_secret_is_shared_through_redis(make_service: MakeService) -> None:
    one, two = make_service(), make_service()  # two processes of one deployment
    tid = _turns(one, 1)
    cursor = one.replay(OWNER, tid, limit=2).next_cursor
    assert len(two.replay(OWNER, tid, cursor=cursor).records) == 3


@pytest.mark.parametrize("cap", [None, 16 * 1024])
def test_cursor_size_limit_at_default_and_ceiling(
    make_service: MakeService, cap: int | None
) -> None:
    service = make_service(threads={"cursor_bytes": cap} if cap else None)
    limit = cap or 4096
    tid = _turns(service, 1)
    at = "A" * limit
    assert err(lambda: service.replay(OWNER, tid, cursor=at)).code == "invalid_cursor"
    over = err(lambda: service.replay(OWNER, tid, cursor=at + "A"))
    assert over.code == "limit_exceeded" and over.http_status == 400
    assert err(lambda: service.list(OWNER, cursor=at + "A")).code == "limit_exceeded"


def test_the_longest_cursor_fits_the_smallest_cursor_limit(make_service: MakeService) -> None:
    service = make_service(threads={"cursor_bytes": 256})
    long_id = "x" * 128
    service.create(OWNER, thread_id=long_id)
    service.create(OWNER, thread_id="y" * 128)
    page = service.list(OWNER, limit=1)
    assert page.next_cursor and len(page.next_cursor) <= 256
    assert len(service.list(OWNER, cursor=page.next_cursor).items) == 1


# --- export -------------------------------------------------------------------------------------


def _big_runner(turn: RunnerTurn) -> RunnerReply:
    """256 events of ~16 KiB: about 4 MiB of ledger per turn."""
    for i in range(limits.THREAD_EVENTS_PER_TURN):
        turn.emit(RunnerEvent("chunk", {"i": i, "text": "x" * 16_000}))
    return RunnerReply("done")


def _export_all(service: Service, tid: str) -> tuple[list[Any], int]:
    events: list[Any] = []
    cursor = None
    calls = 0
    while True:
        result = service.export(OWNER, tid, cursor=cursor)
        calls += 1
        size = len(orjson.dumps(result.to_wire()))
        assert size <= service.limits.export_bytes
        events += result.events
        if not result.truncated:
            assert result.next_cursor is None
            return events, calls
        assert result.next_cursor
        cursor = result.next_cursor


@pytest.mark.slow
@pytest.mark.parametrize("cap_mib", [None, 32])
def test_export_bytes_at_default_and_ceiling(
    make_sync_service: MakeService, cap_mib: int | None
) -> None:
    # Sync only, for time: it moves 8-32 MiB per run (about two minutes more on the five
    # backends for the async twin).  The async export's truncate-and-resume loop runs on
    # both APIs in the two export tests below.
    cap = cap_mib * 1024 * 1024 if cap_mib else None
    service = make_sync_service(runner=_big_runner, threads={"export_bytes": cap} if cap else None)
    limit = cap or 8 * 1024 * 1024
    assert service.limits.export_bytes == limit
    turns = limit // (4 * 1024 * 1024) + 1  # a little more ledger than one export may carry
    tid = _turns(service, turns)
    events, calls = _export_all(service, tid)
    assert calls == 2  # truncated once, resumed once
    assert [e.id for e in events] == [r.id for r in _read_all(service, tid)]


def test_export_truncates_at_page_granularity_and_resumes(make_service: MakeService) -> None:
    service = make_service(threads={"export_bytes": 4096, "replay_page_rows": 2})
    tid = _turns(service, 3)
    first = service.export(OWNER, tid)
    assert first.truncated and first.next_cursor and len(first.events) % 2 == 0
    events, _ = _export_all(service, tid)
    assert len(events) == 15 and len({e.id for e in events}) == 15


def test_a_page_larger_than_the_export_cap_is_refused(make_service: MakeService) -> None:
    service = make_service(threads={"export_bytes": 1024})
    tid = service.create(OWNER).id
    service.continue_(OWNER, tid, "y" * 2000)
    error = err(lambda: service.export(OWNER, tid))
    assert error.code == "export_too_large" and error.http_status == 413
    assert len(service.replay(OWNER, tid, limit=1).records) == 1  # page with replay instead


@pytest.mark.parametrize("cap", [None, 500])
def test_export_pages_at_default_and_ceiling(make_service: MakeService, cap: int | None) -> None:
    pages = cap or 100
    runner = CountingRunner(events=[RunnerEvent("e", {})] * 250)
    service = make_service(
        runner=runner, threads={"replay_page_rows": 1, **({"export_pages": cap} if cap else {})}
    )
    assert service.limits.export_pages == pages
    tid = service.create(OWNER).id
    while len(_read_all(service, tid)) <= pages:
        service.continue_(OWNER, tid, "more")
    first = service.export(OWNER, tid)
    assert len(first.events) == pages and first.truncated and first.next_cursor
    assert service.export(OWNER, tid, cursor=first.next_cursor).events[0].id != first.events[-1].id


# --- frozen limits: defaults, ceilings, one past the ceiling ------------------------------------

CEILINGS = {
    "list_page": (50, 200),
    "replay_page_rows": (100, 500),
    "cursor_bytes": (4096, 16384),
    "title_bytes": (256, 2048),
    "request_id_bytes": (256, 2048),
    "max_active_branches": (16, 64),
    "export_bytes": (8 * 1024 * 1024, 32 * 1024 * 1024),
    "export_pages": (100, 500),
    "request_body_bytes": (64 * 1024, 1024 * 1024),
    "history_cache_bytes": (8 * 1024 * 1024, 256 * 1024 * 1024),
    "history_cache_threads": (256, 16_384),
}


@pytest.mark.parametrize("field", sorted(CEILINGS))
def test_configuration_may_lower_but_never_raise_a_limit(field: str) -> None:
    default, ceiling = CEILINGS[field]
    assert getattr(MemtierConfig.load().threads, field) == default
    assert getattr(MemtierConfig.load(threads={field: ceiling}).threads, field) == ceiling
    with pytest.raises(ConfigurationError) as info:
        MemtierConfig.load(threads={field: ceiling + 1})
    assert "ceiling" in info.value.message


@pytest.mark.parametrize("cap", [None, 200])
def test_list_page_limit(make_service: MakeService, cap: int | None) -> None:
    service = make_service(threads={"list_page": cap} if cap else None)
    limit = cap or 50
    for _ in range(limit + 1):
        service.create(OWNER)
    assert len(service.list(OWNER).items) == limit  # the default page is the limit
    page = service.list(OWNER, limit=limit)
    assert len(page.items) == limit and page.next_cursor
    error = err(lambda: service.list(OWNER, limit=limit + 1))
    assert error.code == "limit_exceeded" and error.http_status == 400
    assert err(lambda: service.list(OWNER, limit=0)).code == "invalid_request"


@pytest.mark.parametrize("cap", [None, 500])
def test_replay_page_limit(make_service: MakeService, cap: int | None) -> None:
    runner = CountingRunner(events=[RunnerEvent("e", {})] * 250)
    service = make_service(runner=runner, threads={"replay_page_rows": cap} if cap else None)
    limit = cap or 100
    tid = service.create(OWNER).id
    while len(_read_all(service, tid, limit=limit)) <= limit:
        service.continue_(OWNER, tid, "more")
    assert len(service.replay(OWNER, tid).records) == limit
    assert len(service.replay(OWNER, tid, limit=limit).records) == limit
    assert err(lambda: service.replay(OWNER, tid, limit=limit + 1)).code == "limit_exceeded"


@pytest.mark.parametrize("cap", [None, 2048])
def test_title_limit(make_service: MakeService, cap: int | None) -> None:
    service = make_service(threads={"title_bytes": cap} if cap else None)
    limit = cap or 256
    assert service.create(OWNER, title="é" * (limit // 2)).title == "é" * (limit // 2)
    error = err(lambda: service.create(OWNER, title="t" * (limit + 1)))
    assert error.code == "limit_exceeded" and error.http_status == 400


@pytest.mark.parametrize("cap", [None, 2048])
def test_request_id_limit(make_service: MakeService, cap: int | None) -> None:
    service = make_service(threads={"request_id_bytes": cap} if cap else None)
    limit = cap or 256
    tid = service.create(OWNER).id
    ok = service.continue_(OWNER, tid, "hi", request_id="r" * limit)
    assert ok.request_id == "r" * limit
    over = err(lambda: service.continue_(OWNER, tid, "hi", request_id="r" * (limit + 1)))
    assert over.code == "limit_exceeded"
    assert err(lambda: service.create(OWNER, request_id="c" * (limit + 1))).code == (
        "limit_exceeded"
    )


def test_metadata_limit(service: Service) -> None:
    fits = {"k": "v" * (limits.THREAD_METADATA_BYTES - 8)}
    assert len(orjson.dumps(fits)) == limits.THREAD_METADATA_BYTES
    assert service.create(OWNER, metadata=fits).metadata == fits
    too_big = {"k": "v" * (limits.THREAD_METADATA_BYTES - 7)}
    assert err(lambda: service.create(OWNER, metadata=too_big)).code == "limit_exceeded"
    assert err(lambda: service.create(OWNER, metadata={"x": object()})).code == "invalid_request"
