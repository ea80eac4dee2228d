"""The one operation-level retry layer (tenacity) for transient Redis errors.

Connection-level retries inside redis-py are switched off for the clients
memtier builds (``Retry(NoBackoff(), 0)``), so a failure is retried here and
only here: never 10 x 10.  Every call memtier retries is replay-safe (appends
carry their turn id, thread writes their request id or a version check,
operator drops an operation id, everything else only reads), so a retry after
a lost reply stores nothing twice.

What a failure means decides what happens (:func:`classify`):

* **not applied, transient** -- LOADING, BUSY, TRYAGAIN, CLUSTERDOWN, MASTERDOWN,
  READONLY, a refused connect: retried.
* **outcome unknown** -- a timeout or a connection lost after the command may
  have been sent, redis-py's cluster errors (``RedisClusterException``: a
  topology change), or any fault of the client library itself (a non-redis
  exception such as redis-py's cold-start ``AttributeError``): retried (a
  client-library fault at most :data:`CLIENT_FAULT_ATTEMPTS` times).  When the
  retries run out after such an attempt the caller gets
  :class:`~memtier.errors.OutcomeUnknownError` (``outcome_unknown``, retryable
  with the same id), never a plain ``backend_unavailable``.
* **refused** -- OOM, MISCONF, NOPERM, NOAUTH/WRONGPASS: not retried,
  :class:`~memtier.errors.BackendRefusedError` (``backend_refused``).
* **busy** -- no free connection within the pool timeout (back-pressure):
  not retried here (the caller already waited),
  :class:`~memtier.errors.BackendBusyError` (``backend_busy``, retryable).
* anything else from redis-py (WRONGTYPE, ...) -- a plain ``BackendError``.

Nothing but memtier errors leaves this layer for an ``Exception``; a
``BaseException`` that is not an ``Exception`` (cancellation, KeyboardInterrupt)
passes through untouched.

The horizon: transient failures are retried until ``horizon_s`` after the first
attempt (default 20 s: Redis Cluster's default ``cluster-node-timeout`` of 15 s
plus a margin, so a primary's failover is covered), and never more than
:data:`~memtier.limits.RETRY_MAX_ATTEMPTS` attempts.  Backoff: exponential
50 ms -> 2 s with up to 100 ms jitter.  :func:`set_testing` removes the waits
and caps attempts at :data:`TESTING_MAX_ATTEMPTS`.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NoReturn, TypeVar

from redis import exceptions as rexc
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    wait_exponential_jitter,
    wait_none,
)

from memtier import limits, metrics
from memtier.errors import (
    BackendBusyError,
    BackendError,
    BackendRefusedError,
    ErrorCode,
    MemtierError,
    OutcomeUnknownError,
    TransientBackendError,
)

__all__ = [
    "DEFAULT_POLICY",
    "Fault",
    "RetryPolicy",
    "classify",
    "is_transient",
    "retry_async",
    "retry_sync",
    "set_testing",
    "translate",
]

T = TypeVar("T")

TESTING_MAX_ATTEMPTS: Final = 5
# A fault of the client library (not a Redis reply, not a socket error) is a race that
# clears on the next attempt, or a bug that never will: a few attempts tell which.
CLIENT_FAULT_ATTEMPTS: Final = 3
_testing = False


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long transient failures are retried: seconds from the first attempt, attempts."""

    horizon_s: float = limits.RETRY_HORIZON_SECONDS.default
    max_attempts: int = limits.RETRY_MAX_ATTEMPTS

    def __post_init__(self) -> None:
        # Hard ceilings in code: a policy may only shorten the horizon.
        if not 0 <= self.horizon_s <= limits.RETRY_HORIZON_SECONDS.ceiling:
            raise ValueError(f"retry horizon {self.horizon_s} s is outside its bounds")
        if not 1 <= self.max_attempts <= limits.RETRY_MAX_ATTEMPTS:
            raise ValueError(f"max_attempts {self.max_attempts} is outside its bounds")

    @classmethod
    def from_config(cls, config: Any) -> RetryPolicy:
        """The policy of a :class:`~memtier.config.MemtierConfig` (its ``redis`` section)."""
        return cls(horizon_s=float(config.redis.retry_horizon_seconds))


DEFAULT_POLICY: Final = RetryPolicy()


def set_testing(enabled: bool) -> None:
    """Tests: retry without waiting, at most TESTING_MAX_ATTEMPTS attempts."""
    global _testing
    _testing = enabled


class Fault(enum.Enum):
    """What one failed attempt means (see the module documentation)."""

    PASS_THROUGH = "pass_through"  # a memtier error (or not an Exception): raised as it is
    NOT_APPLIED = "not_applied"  # transient, the command did not run: retry
    UNKNOWN = "unknown"  # transient, the command may have run: retry (replay-safe)
    CLIENT_FAULT = "client_fault"  # the client library failed: retry a few times
    REFUSED = "refused"  # Redis refused it, nothing applied: do not retry
    BUSY = "busy"  # no free connection in time: do not retry here
    ERROR = "error"  # another Redis error (a bug or a data problem): do not retry


# Error replies Redis sends while it cannot serve a command right now (nothing applied).
_TRANSIENT_PREFIXES = ("LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY")
# Error replies that refuse a command for good: an operator must act.  Matched anywhere
# in the message: inside a script Redis prefixes them ("ERR Error running script ...").
_REFUSED_MARKERS = ("OOM ", "MISCONF", "NOPERM", "NOAUTH", "WRONGPASS")
# redis-py's wording for a connection that was never made, and for an exhausted pool.
_CONNECT_MARKERS = ("connecting to", "Timeout connecting", "Connection refused")
_POOL_MARKERS = ("No connection available", "Too many connections")


# What a *retryable* memtier error raised inside an attempt means to this layer.  Any
# other retryable one (outcome_unknown, thread_busy, ...) is the caller's to retry with
# its id: passed through, never retried here on top of its own retries.
_RETRYABLE_ERROR_FAULTS: Final[Mapping[ErrorCode, Fault]] = {
    ErrorCode.BACKEND_TRANSIENT: Fault.NOT_APPLIED,  # memtier saw it: nothing applied
    ErrorCode.BACKEND_BUSY: Fault.BUSY,  # the caller already waited for a connection
}


def classify(exc: BaseException) -> Fault:
    """What ``exc`` (raised by one attempt) says about the command and its retry.

    A memtier error is retried only if it is ``retryable`` (:data:`memtier.errors.ERRORS`).
    """
    if isinstance(exc, MemtierError):
        if not exc.retryable:
            return Fault.PASS_THROUGH
        return _RETRYABLE_ERROR_FAULTS.get(exc.code, Fault.PASS_THROUGH)
    if not isinstance(exc, Exception):
        return Fault.PASS_THROUGH
    if isinstance(exc, rexc.SlotNotCoveredError):  # no node to send to: nothing sent
        return Fault.NOT_APPLIED
    if isinstance(exc, rexc.RedisClusterException):  # a topology change (no RedisError)
        return Fault.UNKNOWN
    if not isinstance(exc, rexc.RedisError):
        return Fault.CLIENT_FAULT
    text = str(exc)
    if isinstance(exc, rexc.MaxConnectionsError) or text.startswith(_POOL_MARKERS):
        return Fault.BUSY
    if isinstance(exc, rexc.AuthenticationError | rexc.NoPermissionError):
        return Fault.REFUSED
    if isinstance(exc, rexc.BusyLoadingError):
        return Fault.NOT_APPLIED
    if isinstance(exc, rexc.ConnectionError | rexc.TimeoutError):
        return Fault.NOT_APPLIED if any(m in text for m in _CONNECT_MARKERS) else Fault.UNKNOWN
    if isinstance(exc, rexc.ClusterDownError | rexc.TryAgainError | rexc.MasterDownError):
        return Fault.NOT_APPLIED
    if isinstance(exc, rexc.ResponseError):
        if text.startswith(_TRANSIENT_PREFIXES):
            return Fault.NOT_APPLIED
        if isinstance(exc, rexc.OutOfMemoryError) or any(m in text for m in _REFUSED_MARKERS):
            return Fault.REFUSED
    if isinstance(exc, rexc.ReadOnlyError):
        return Fault.NOT_APPLIED
    return Fault.ERROR


_RETRIED: Final = frozenset({Fault.NOT_APPLIED, Fault.UNKNOWN, Fault.CLIENT_FAULT})


def is_transient(exc: BaseException) -> bool:
    """True for failures the retry layer retries (see :func:`classify`)."""
    return classify(exc) in _RETRIED


def translate(exc: BaseException, *, maybe_applied: bool = False) -> BaseException:
    """Map a backend exception to memtier's hierarchy (at one boundary).

    ``maybe_applied``: an earlier attempt of the same call may have been applied, so
    whatever the last failure was, the outcome is unknown.
    """
    fault = classify(exc)
    if fault is Fault.PASS_THROUGH and not isinstance(exc, BackendError):
        return exc
    name = type(exc).__name__
    if maybe_applied or fault in (Fault.UNKNOWN, Fault.CLIENT_FAULT):
        return OutcomeUnknownError(
            f"Redis failed and an attempt may have been applied ({name}: {exc});"
            " retry with the same turn id / request id",
            error_type=name,
        )
    if isinstance(exc, TransientBackendError):  # one transient failure, now past the horizon
        return BackendError(f"Redis unavailable after retries: {exc.message}", error_type=name)
    if isinstance(exc, MemtierError):
        return exc
    if fault is Fault.NOT_APPLIED:
        return BackendError(f"Redis unavailable after retries: {name}: {exc}", error_type=name)
    if fault is Fault.REFUSED:
        return BackendRefusedError(f"Redis refused the command: {name}: {exc}", error_type=name)
    if fault is Fault.BUSY:
        return BackendBusyError(f"no Redis connection free in time: {exc}", error_type=name)
    return BackendError(f"Redis error: {name}: {exc}", error_type=name)


def _backoff() -> wait_exponential_jitter:
    """50 ms * 2**n, at most 2 s, plus up to 100 ms jitter."""
    try:
        return wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.1)
    except TypeError:  # tenacity < 9.2 has no `multiplier` (and no deprecation of `initial`)
        return wait_exponential_jitter(initial=0.05, max=2.0, jitter=0.1)


_WAIT_BACKOFF: Final = _backoff()
_WAIT_NONE: Final = wait_none()


class _Attempts:
    """The state of one call's retries: what the failures said, when to stop."""

    __slots__ = ("client_faults", "deadline", "max_attempts", "maybe_applied")

    def __init__(self, started: float, policy: RetryPolicy) -> None:
        self.deadline = started + policy.horizon_s
        self.max_attempts = (
            min(policy.max_attempts, TESTING_MAX_ATTEMPTS) if _testing else policy.max_attempts
        )
        self.maybe_applied = False
        self.client_faults = 0

    def note(self, exc: BaseException) -> bool:
        """Record one failure; True if it is worth another attempt."""
        fault = classify(exc)
        if fault in (Fault.UNKNOWN, Fault.CLIENT_FAULT):
            self.maybe_applied = True
        if fault is Fault.CLIENT_FAULT:
            self.client_faults += 1
            return self.client_faults < CLIENT_FAULT_ATTEMPTS
        return fault in _RETRIED

    def retry(self, state: RetryCallState) -> bool:
        outcome = state.outcome
        if outcome is None or not outcome.failed:
            return False
        exc = outcome.exception()
        return exc is not None and self.note(exc)

    def stop(self, state: RetryCallState) -> bool:
        return state.attempt_number >= self.max_attempts or time.monotonic() >= self.deadline

    def fail(self, exc: BaseException) -> NoReturn:
        mapped = translate(exc, maybe_applied=self.maybe_applied)
        if mapped is exc:
            raise exc
        raise mapped from exc


def _wait() -> Any:
    return _WAIT_NONE if _testing else _WAIT_BACKOFF


def _count(operation: str) -> Callable[[RetryCallState], None]:
    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        metrics.RETRIES.labels(operation, type(exc).__name__).inc()

    return before_sleep


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


def retry_sync(operation: str, fn: Callable[[], T], policy: RetryPolicy | None = None) -> T:
    """Call ``fn`` with bounded retries on transient errors; raise memtier errors only.

    Fast path: the first attempt is a plain call; the tenacity machinery is built only
    after a failure worth retrying (which counts as attempt 1).
    """
    started = time.monotonic()
    try:
        return fn()
    except Exception as exc:
        attempts = _Attempts(started, policy or DEFAULT_POLICY)
        if classify(exc) not in _RETRIED:  # the loop notes it (replayed as attempt 1)
            attempts.fail(exc)
        first: BaseException = exc
    call = _replay_first(first, fn)
    del first
    try:
        for attempt in Retrying(
            retry=attempts.retry,
            stop=attempts.stop,
            wait=_wait(),
            before_sleep=_count(operation),
            reraise=True,
        ):
            with attempt:
                return call()
    except Exception as exc:
        attempts.fail(exc)
    raise AssertionError("unreachable")  # pragma: no cover


async def retry_async(
    operation: str, fn: Callable[[], Awaitable[T]], policy: RetryPolicy | None = None
) -> T:
    """Asyncio twin of :func:`retry_sync` (same fast path)."""
    started = time.monotonic()
    try:
        return await fn()
    except Exception as exc:
        attempts = _Attempts(started, policy or DEFAULT_POLICY)
        if classify(exc) not in _RETRIED:  # the loop notes it (replayed as attempt 1)
            attempts.fail(exc)
        first: BaseException = exc
    call = _replay_first(first, fn)
    del first
    try:
        async for attempt in AsyncRetrying(
            retry=attempts.retry,
            stop=attempts.stop,
            wait=_wait(),
            before_sleep=_count(operation),
            reraise=True,
        ):
            with attempt:
                return await call()
    except Exception as exc:
        attempts.fail(exc)
    raise AssertionError("unreachable")  # pragma: no cover
