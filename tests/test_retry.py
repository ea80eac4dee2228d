"""The retry layer: fast path, attempt caps, the time cap, metrics, error mapping (no Redis)."""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import REGISTRY
from redis import exceptions as rexc

from memtier import retry
from memtier.errors import BackendError, ValidationError


def retries(operation: str, error: str) -> float:
    value = REGISTRY.get_sample_value(
        "memtier_retries_total", {"operation": operation, "error_type": error}
    )
    return value or 0.0


class Flaky:
    """Fails ``failures`` times with ``error``, then returns ``"ok"``; counts calls."""

    def __init__(self, failures: int, error: BaseException | None = None) -> None:
        self.failures = failures
        self.error = error or rexc.ConnectionError("reset")
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


async def _as_async(fn: Callable[[], str]) -> str:
    return fn()


def run(mode: str, operation: str, fn: Callable[[], str]) -> Any:
    if mode == "sync":
        return retry.retry_sync(operation, fn)
    return asyncio.run(retry.retry_async(operation, lambda: _as_async(fn)))


MODES = pytest.mark.parametrize("mode", ["sync", "async"])


@MODES
def test_success_is_one_call_and_no_retry_metric(mode: str) -> None:
    fn = Flaky(0)
    before = retries(f"t-ok-{mode}", "ConnectionError")
    assert run(mode, f"t-ok-{mode}", fn) == "ok"
    assert fn.calls == 1
    assert retries(f"t-ok-{mode}", "ConnectionError") == before


@MODES
@pytest.mark.parametrize("failures", [1, 4])
def test_transient_failures_are_retried_and_counted(mode: str, failures: int) -> None:
    op = f"t-flaky-{mode}-{failures}"
    fn = Flaky(failures)
    assert run(mode, op, fn) == "ok"
    assert fn.calls == failures + 1
    assert retries(op, "ConnectionError") == failures


@MODES
def test_attempts_are_capped_at_five_counting_the_first_call(mode: str) -> None:
    op = f"t-down-{mode}"
    fn = Flaky(100)
    with pytest.raises(BackendError) as info:
        run(mode, op, fn)
    assert fn.calls == retry.MAX_ATTEMPTS == 5
    assert retries(op, "ConnectionError") == 4  # one per retry, none after the last attempt
    assert isinstance(info.value.__cause__, rexc.ConnectionError)


@MODES
def test_non_transient_errors_are_not_retried(mode: str) -> None:
    fn = Flaky(1, rexc.ResponseError("WRONGTYPE Operation against a key"))
    with pytest.raises(BackendError):
        run(mode, f"t-bug-{mode}", fn)
    assert fn.calls == 1
    own = Flaky(1, ValidationError("bad input"))
    with pytest.raises(ValidationError):
        run(mode, f"t-own-{mode}", own)
    assert own.calls == 1
    other = Flaky(1, KeyError("x"))
    with pytest.raises(KeyError):
        run(mode, f"t-other-{mode}", other)
    assert other.calls == 1


def test_time_cap_counts_the_first_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 10 s cap runs from the first call (the fast path's), not from the retry loop."""
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])

    def slow_failure() -> str:
        now[0] += retry.MAX_DELAY_S  # the first call alone used up the whole budget
        raise rexc.TimeoutError("timeout")

    calls = []

    def fn() -> str:
        calls.append(1)
        return slow_failure()

    with pytest.raises(BackendError):
        retry.retry_sync("t-slow", fn)
    assert len(calls) == 1


def test_backoff_uses_multiplier_without_deprecation_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wait = retry._backoff()
    assert wait.multiplier == pytest.approx(0.05)
    assert wait.max == pytest.approx(2.0) and wait.jitter == pytest.approx(0.1)


def test_real_waits_are_the_configured_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without set_testing the loop sleeps 50 ms * 2**n (+ jitter <= 100 ms), no warnings."""
    slept: list[float] = []
    monkeypatch.setattr(retry, "_testing", False)
    monkeypatch.setattr("tenacity.nap.time.sleep", slept.append)
    fn = Flaky(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert retry.retry_sync("t-waits", fn) == "ok"
    assert fn.calls == 4 and len(slept) == 3
    for n, wait in enumerate(slept):
        assert 0.05 * 2**n <= wait <= 0.05 * 2**n + 0.1
