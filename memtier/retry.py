"""The one operation-level retry layer (tenacity) for transient Redis errors.

Connection-level retries inside redis-py are switched off for the clients
memtier builds (``Retry(NoBackoff(), 0)``), so a failure is retried here and
only here: never 10 x 10.  Every write script is replay-safe (turn ids,
request ids, version checks), so a retry after a lost reply stores nothing
twice.

Defaults: exponential backoff 50 ms -> 2 s with up to 100 ms jitter, at most
5 attempts and 10 s in total.  :func:`set_testing` removes the waits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis import exceptions as rexc
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    stop_any,
    wait_exponential_jitter,
    wait_none,
)

from memtier import metrics
from memtier.errors import BackendError, MemtierError, TransientBackendError

__all__ = ["is_transient", "retry_async", "retry_sync", "set_testing", "translate"]

T = TypeVar("T")

MAX_ATTEMPTS = 5
MAX_DELAY_S = 10.0
_testing = False

# Error replies Redis sends while it cannot serve a command right now.
_TRANSIENT_PREFIXES = ("LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY")


def set_testing(enabled: bool) -> None:
    """Tests: retry without waiting (attempt caps stay)."""
    global _testing
    _testing = enabled


def is_transient(exc: BaseException) -> bool:
    """Connection reset, timeout, LOADING, BUSY, TRYAGAIN, CLUSTERDOWN (and friends)."""
    if isinstance(exc, TransientBackendError):
        return True
    if isinstance(exc, MemtierError):
        return False
    if isinstance(exc, rexc.ConnectionError | rexc.TimeoutError | rexc.BusyLoadingError):
        return True
    cluster_errors = (rexc.ClusterDownError, rexc.TryAgainError, rexc.MasterDownError)
    if isinstance(exc, cluster_errors):
        return True
    if isinstance(exc, rexc.ResponseError):
        return str(exc).startswith(_TRANSIENT_PREFIXES)
    return False


def translate(exc: BaseException) -> BaseException:
    """Map a backend exception to memtier's hierarchy (at one boundary)."""
    if isinstance(exc, MemtierError):
        return exc
    if is_transient(exc):
        return BackendError(
            f"Redis unavailable after {MAX_ATTEMPTS} attempts: {type(exc).__name__}: {exc}",
            error_type=type(exc).__name__,
        )
    if isinstance(exc, rexc.RedisError):
        return BackendError(
            f"Redis error: {type(exc).__name__}: {exc}", error_type=type(exc).__name__
        )
    return exc


def _stop() -> Any:
    return stop_any(stop_after_attempt(MAX_ATTEMPTS), stop_after_delay(MAX_DELAY_S))


def _wait() -> Any:
    return wait_none() if _testing else wait_exponential_jitter(initial=0.05, max=2.0, jitter=0.1)


def _count(operation: str) -> Callable[[RetryCallState], None]:
    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        metrics.RETRIES.labels(operation, type(exc).__name__).inc()

    return before_sleep


def retry_sync(operation: str, fn: Callable[[], T]) -> T:
    """Call ``fn`` with bounded retries on transient errors; raise memtier errors only."""
    try:
        for attempt in Retrying(
            retry=retry_if_exception(is_transient),
            stop=_stop(),
            wait=_wait(),
            before_sleep=_count(operation),
            reraise=True,
        ):
            with attempt:
                return fn()
    except BaseException as exc:
        mapped = translate(exc)
        if mapped is exc:
            raise
        raise mapped from exc
    raise AssertionError("unreachable")  # pragma: no cover


async def retry_async(operation: str, fn: Callable[[], Awaitable[T]]) -> T:
    """Asyncio twin of :func:`retry_sync`."""
    try:
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(is_transient),
            stop=_stop(),
            wait=_wait(),
            before_sleep=_count(operation),
            reraise=True,
        ):
            with attempt:
                return await fn()
    except BaseException as exc:
        mapped = translate(exc)
        if mapped is exc:
            raise
        raise mapped from exc
    raise AssertionError("unreachable")  # pragma: no cover
