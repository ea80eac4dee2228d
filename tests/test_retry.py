"""The retry layer: fast path, the horizon and attempt caps, metrics, error mapping (no Redis)."""

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
from memtier.errors import (
    BackendBusyError,
    BackendError,
    OutcomeUnknownError,
    ValidationError,
)


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
def test_attempts_are_capped_in_testing_mode_counting_the_first_call(mode: str) -> None:
    op = f"t-down-{mode}"
    fn = Flaky(100)
    with pytest.raises(OutcomeUnknownError) as info:  # a reset: the reply may be lost
        run(mode, op, fn)
    assert fn.calls == retry.TESTING_MAX_ATTEMPTS == 5
    assert retries(op, "ConnectionError") == 4  # one per retry, none after the last attempt
    assert isinstance(info.value.__cause__, rexc.ConnectionError)
    assert info.value.retryable and info.value.code == "outcome_unknown"


REFUSED_CONNECT = rexc.ConnectionError(
    "Error 111 connecting to 127.0.0.1:6379. Connection refused."
)


@MODES
def test_never_sent_failures_end_as_backend_unavailable(mode: str) -> None:
    fn = Flaky(100, REFUSED_CONNECT)
    with pytest.raises(BackendError) as info:
        run(mode, f"t-refused-{mode}", fn)
    assert type(info.value) is BackendError and info.value.code == "backend_unavailable"
    assert fn.calls == retry.TESTING_MAX_ATTEMPTS


@MODES
def test_non_transient_errors_are_not_retried(mode: str) -> None:
    fn = Flaky(1, rexc.ResponseError("WRONGTYPE Operation against a key"))
    with pytest.raises(BackendError) as info:
        run(mode, f"t-bug-{mode}", fn)
    assert fn.calls == 1 and info.value.code == "backend_unavailable"
    own = Flaky(1, ValidationError("bad input"))
    with pytest.raises(ValidationError):
        run(mode, f"t-own-{mode}", own)
    assert own.calls == 1


@MODES
@pytest.mark.parametrize(
    "error",
    [
        AttributeError("'NoneType' object has no attribute 'writelines'"),
        TypeError("x"),
        KeyError("x"),
    ],
    ids=["attribute", "type", "key"],
)
def test_client_library_faults_become_typed_backend_errors(mode: str, error: Exception) -> None:
    """No bare exception of the client escapes: a few retries, then outcome_unknown."""
    once = Flaky(1, error)
    assert run(mode, f"t-race-{mode}", once) == "ok"  # the cold-start race clears on retry
    assert once.calls == 2
    always = Flaky(100, error)
    with pytest.raises(OutcomeUnknownError) as info:
        run(mode, f"t-fault-{mode}", always)
    assert always.calls == retry.CLIENT_FAULT_ATTEMPTS
    assert info.value.__cause__ is error and info.value.retryable


@MODES
def test_pool_exhaustion_is_backend_busy_and_not_retried_here(mode: str) -> None:
    for error in (rexc.MaxConnectionsError(), rexc.ConnectionError("No connection available.")):
        fn = Flaky(100, error)
        with pytest.raises(BackendBusyError) as info:
            run(mode, f"t-busy-{mode}", fn)
        assert fn.calls == 1 and info.value.retryable and info.value.code == "backend_busy"
    own = Flaky(100, BackendBusyError("no slot"))
    with pytest.raises(BackendBusyError):
        run(mode, f"t-busy-own-{mode}", own)
    assert own.calls == 1


@MODES
def test_busy_after_a_lost_reply_is_outcome_unknown(mode: str) -> None:
    errors: list[Exception] = [
        rexc.TimeoutError("Timeout reading from socket"),
        rexc.MaxConnectionsError(),
    ]

    def fn() -> str:
        raise errors.pop(0)

    with pytest.raises(OutcomeUnknownError):
        run(mode, f"t-busy-unknown-{mode}", fn)
    assert errors == []


@pytest.mark.parametrize(
    ("error", "fault"),
    [
        (rexc.ConnectionError("Connection closed by server."), retry.Fault.UNKNOWN),
        (rexc.TimeoutError("Timeout reading from socket"), retry.Fault.UNKNOWN),
        (REFUSED_CONNECT, retry.Fault.NOT_APPLIED),
        (rexc.TimeoutError("Timeout connecting to server"), retry.Fault.NOT_APPLIED),
        (rexc.BusyLoadingError("LOADING"), retry.Fault.NOT_APPLIED),
        (rexc.ResponseError("BUSY Redis is busy running a script"), retry.Fault.NOT_APPLIED),
        (rexc.TryAgainError("TRYAGAIN"), retry.Fault.NOT_APPLIED),
        (rexc.ClusterDownError("CLUSTERDOWN"), retry.Fault.NOT_APPLIED),
        (rexc.MasterDownError("MASTERDOWN"), retry.Fault.NOT_APPLIED),
        (
            rexc.ReadOnlyError("READONLY You can't write against a read only replica."),
            retry.Fault.NOT_APPLIED,
        ),
        (rexc.OutOfMemoryError("OOM command not allowed"), retry.Fault.REFUSED),
        (
            rexc.ResponseError("MISCONF Redis is configured to save RDB snapshots"),
            retry.Fault.REFUSED,
        ),
        (rexc.NoPermissionError("NOPERM no permissions"), retry.Fault.REFUSED),
        (rexc.AuthenticationError("WRONGPASS invalid username-password pair"), retry.Fault.REFUSED),
        (rexc.MaxConnectionsError(), retry.Fault.BUSY),
        (rexc.ResponseError("WRONGTYPE Operation against a key"), retry.Fault.ERROR),
        (rexc.SlotNotCoveredError("slot 1 not covered"), retry.Fault.NOT_APPLIED),
        (rexc.RedisClusterException("Redis Cluster cannot be connected."), retry.Fault.UNKNOWN),
        (AttributeError("x"), retry.Fault.CLIENT_FAULT),
        (OSError("x"), retry.Fault.CLIENT_FAULT),
        (ValidationError("x"), retry.Fault.PASS_THROUGH),
        (asyncio.CancelledError(), retry.Fault.PASS_THROUGH),
        (KeyboardInterrupt(), retry.Fault.PASS_THROUGH),
    ],
)
def test_classify_every_kind_of_failure(error: BaseException, fault: retry.Fault) -> None:
    assert retry.classify(error) is fault


def test_cancellation_passes_through_untouched() -> None:
    calls = []

    async def cancelled() -> str:
        calls.append(1)
        raise asyncio.CancelledError

    async def main() -> None:
        with pytest.raises(asyncio.CancelledError):
            await retry.retry_async("t-cancel", cancelled)

    asyncio.run(main())
    assert calls == [1]


class FakeTime:
    """time.monotonic and the backoff sleeps of the retry loop, on one fake clock."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        self.slept: list[float] = []
        monkeypatch.setattr(time, "monotonic", lambda: self.now)
        monkeypatch.setattr(retry, "_testing", False)
        monkeypatch.setattr("tenacity.nap.time.sleep", self.sleep)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_retries_run_until_the_horizon_and_cover_a_failover(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A primary crash takes ~4 s to fail over (each attempt 0.2 s, CLUSTERDOWN): with the
    default horizon the call outlives it, where 5 attempts ended after about 1 s."""
    clock = FakeTime(monkeypatch)
    failover_ends = clock.now + 4.0
    calls = []

    def fn() -> str:
        calls.append(clock.now)
        clock.now += 0.2
        if clock.now < failover_ends:
            raise rexc.ClusterDownError("CLUSTERDOWN The cluster is down")
        return "ok"

    assert retry.retry_sync("t-failover", fn) == "ok"
    assert len(calls) > 5 and calls[-1] - calls[0] >= 3.5


def test_the_horizon_bounds_the_whole_call(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeTime(monkeypatch)
    started = clock.now
    policy = retry.RetryPolicy(horizon_s=3.0)
    fn = Flaky(10_000, REFUSED_CONNECT)
    with pytest.raises(BackendError):
        retry.retry_sync("t-horizon", fn, policy)
    # the last attempt started before the horizon; none after it
    assert 3.0 <= clock.now - started <= 3.0 + 2.1
    assert sum(clock.slept) < 3.0 + 2.1
    assert 5 < fn.calls < retry.limits.RETRY_MAX_ATTEMPTS


def test_attempts_have_a_hard_cap_whatever_the_horizon(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeTime(monkeypatch)
    monkeypatch.setattr("tenacity.nap.time.sleep", lambda s: None)  # waits take no time
    fn = Flaky(10_000, REFUSED_CONNECT)
    with pytest.raises(BackendError):
        retry.retry_sync("t-cap", fn, retry.RetryPolicy(horizon_s=120.0))
    assert fn.calls == retry.limits.RETRY_MAX_ATTEMPTS
    assert clock.now == 1000.0


def test_policy_bounds_are_hard() -> None:
    with pytest.raises(ValueError):
        retry.RetryPolicy(horizon_s=retry.limits.RETRY_HORIZON_SECONDS.ceiling + 1)
    with pytest.raises(ValueError):
        retry.RetryPolicy(max_attempts=retry.limits.RETRY_MAX_ATTEMPTS + 1)
    with pytest.raises(ValueError):
        retry.RetryPolicy(max_attempts=0)


def test_time_cap_counts_the_first_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The horizon runs from the first call (the fast path's), not from the retry loop."""
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])

    def slow_failure() -> str:
        now[0] += retry.DEFAULT_POLICY.horizon_s  # the first call alone used up the budget
        raise rexc.TimeoutError("timeout")

    calls = []

    def fn() -> str:
        calls.append(1)
        return slow_failure()

    with pytest.raises(OutcomeUnknownError):
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
