"""The published langgraph-checkpoint-conformance suite against MemtierCheckpointSaver.

Every base capability (put, put_writes, get_tuple, list, delete_thread) and every
extended one (copy_thread, delete_for_runs, prune) must be detected and pass, on a real
Redis and on the real cluster; a capability reported as skipped or not detected fails.
The suite calls the ``a*`` methods; the ``sync`` form runs it through the sync methods
(each ``a*`` method calls its sync twin in a worker thread), so both forms are checked.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES, BASE_CAPABILITIES

from memtier.integrations.langgraph import MemtierCheckpointSaver


class SyncDrivenSaver(MemtierCheckpointSaver):
    """Every ``a*`` method runs the sync method: the suite then checks the sync form."""

    async def aput(self, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self.put, *args, **kwargs)

    async def aput_writes(self, *args: Any, **kwargs: Any) -> None:
        await asyncio.to_thread(self.put_writes, *args, **kwargs)

    async def aget_tuple(self, config: Any) -> Any:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config: Any, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        for tup in await asyncio.to_thread(lambda: list(self.list(config, **kwargs))):
            yield tup

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)


@pytest.mark.parametrize("form", ["async", "sync"])
async def test_conformance_every_capability_passes(backend_no_fake: Any, form: str) -> None:
    name = f"MemtierCheckpointSaver-{backend_no_fake.kind}-{form}"
    cls = MemtierCheckpointSaver if form == "async" else SyncDrivenSaver

    @checkpointer_test(name=name)
    async def factory() -> AsyncIterator[MemtierCheckpointSaver]:
        yield cls(
            backend_no_fake.sync_client(),
            aclient=backend_no_fake.async_client(),
            namespace=backend_no_fake.namespace,
        )

    report = await validate(factory)
    results = {cap: report.results[cap.value] for cap in ALL_CAPABILITIES}
    failures = {
        cap.value: (r.detected, r.passed, r.tests_passed, r.failures)
        for cap, r in results.items()
        if not (r.detected and r.passed and r.tests_passed > 0 and r.tests_failed == 0)
    }
    assert not failures, failures
    assert report.passed_all_base() and report.passed_all()
    assert report.conformance_level() == "FULL"
    assert {c.value for c in BASE_CAPABILITIES} <= set(report.results)
    assert sum(r.tests_passed for r in results.values()) >= 80
