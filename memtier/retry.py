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

import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, NoReturn, TypeVar

from redis import exceptions as rexc
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
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


# Built once: both are stateless (tenacity keeps per-call state in RetryCallState).
_STOP_ATTEMPTS: Final = stop_after_attempt(MAX_ATTEMPTS)


def _backoff() -> wait_exponential_jitter:
    """50 ms * 2**n, at most 2 s, plus up to 100 ms jitter."""
    try:
        return wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.1)
    except TypeError:  # tenacity < 9.2 has no `multiplier` (and no deprecation of `initial`)
        return wait_exponential_jitter(initial=0.05, max=2.0, jitter=0.1)


_WAIT_BACKOFF: Final = _backoff()
_WAIT_NONE: Final = wait_none()
_RETRY_TRANSIENT: Final = retry_if_exception(is_transient)


def _stop(started: float) -> Callable[[RetryCallState], bool]:
    """At most MAX_ATTEMPTS attempts and MAX_DELAY_S seconds, counted from the first call."""

    def stop(state: RetryCallState) -> bool:
        return bool(_STOP_ATTEMPTS(state)) or time.monotonic() - started >= MAX_DELAY_S

    return stop


def _wait() -> Any:
    return _WAIT_NONE if _testing else _WAIT_BACKOFF


def _count(operation: str) -> Callable[[RetryCallState], None]:
    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        metrics.RETRIES.labels(operation, type(exc).__name__).inc()

    return before_sleep


def _raise_mapped(exc: BaseException) -> NoReturn:
    mapped = translate(exc)
    if mapped is exc:
        raise exc
    raise mapped from exc


def _replay_first(first: BaseException, fn: Callable[[], T]) -> Callable[[], T]:
    """``fn``, except that its first call raises ``first`` (the failure already seen).

    The fast path made attempt 1 itself; the tenacity loop starts from that outcome, so
    attempts, waits and retry metrics are exactly those of a loop that made every call.
    """
    pending = [first]

    def attempt() -> T:
        if pending:
            raise pending.pop()
        return fn()

    return attempt


def retry_sync(operation: str, fn: Callable[[], T]) -> T:
    """Call ``fn`` with bounded retries on transient errors; raise memtier errors only.

    Fast path: the first attempt is a plain call; the tenacity machinery is built only
    after a transient failure (which counts as attempt 1 of :data:`MAX_ATTEMPTS`).
    """
    started = time.monotonic()
    try:
        return fn()
    except BaseException as exc:
        if not is_transient(exc):
            _raise_mapped(exc)
        first = exc
    call = _replay_first(first, fn)
    del first
    try:
        for attempt in Retrying(
            retry=_RETRY_TRANSIENT,
            stop=_stop(started),
            wait=_wait(),
            before_sleep=_count(operation),
            reraise=True,
        ):
            with attempt:
                return call()
    except BaseException as exc:
        _raise_mapped(exc)
    raise AssertionError("unreachable")  # pragma: no cover


async def retry_async(operation: str, fn: Callable[[], Awaitable[T]]) -> T:
    """Asyncio twin of :func:`retry_sync` (same fast path)."""
    started = time.monotonic()
    try:
        return await fn()
    except BaseException as exc:
        if not is_transient(exc):
            _raise_mapped(exc)
        first = exc
    call = _replay_first(first, fn)
    del first
    try:
        async for attempt in AsyncRetrying(
            retry=_RETRY_TRANSIENT,
            stop=_stop(started),
            wait=_wait(),
            before_sleep=_count(operation),
            reraise=True,
        ):
            with attempt:
                return await call()
    except BaseException as exc:
        _raise_mapped(exc)
    raise AssertionError("unreachable")  # pragma: no cover
