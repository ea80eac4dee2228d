"""Shared run limits: host-provided budgets (tokens, tool calls, wall time...) per turn and per
thread, consumed by every turn on every host.

The per-thread counters live in Redis in the thread hash (``use.<meter>``), so all processes
share them; they are shown on ``get`` as ``usage``.  ``run_claim`` refuses a turn when a
thread counter already reached its cap (``limit_exceeded``, before the runner starts).  Turns
of one thread are serialized by its lease, so the counters a claimed turn reads cannot move
until it ends: its *allowance* per meter is ``min(per-turn cap, per-thread cap - used)``, and a
turn can never consume more than that -- a report that would pass it is refused
(``limit_exceeded`` from ``emit``, the turn then ends ``limit_exceeded`` and commits nothing),
so a counter never passes its cap, whatever the concurrency.

A runner reports consumption with ``emit(RunnerEvent("usage", {"tokens": 120}))`` or in its
reply (``RunnerReply(content, usage={...})``); the meter ``wall_ms`` is measured by the
service itself (the turn is cancelled when its wall-time allowance runs out).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from memtier.errors import ConfigurationError, ConversationError, ErrorCode

__all__ = ["MAX_METERS", "USAGE_EVENT", "WALL_MS", "RunLimits", "TurnBudget"]

METER_RE: Final = re.compile(r"^[a-z][a-z0-9_]{0,31}\Z")
MAX_METERS: Final = 16
MAX_LIMIT: Final = 2**53  # JSON- and Lua-exact integers
WALL_MS: Final = "wall_ms"  # measured by the service
USAGE_EVENT: Final = "usage"  # runner event type that reports consumption


def _caps(name: str, caps: Mapping[str, int]) -> dict[str, int]:
    if not isinstance(caps, Mapping):
        raise ConfigurationError(f"RunLimits.{name} must map meter names to integers")
    out: dict[str, int] = {}
    for meter, cap in caps.items():
        if not isinstance(meter, str) or not METER_RE.match(meter):
            raise ConfigurationError(f"RunLimits meter {meter!r} must match {METER_RE.pattern}")
        if isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= MAX_LIMIT:
            raise ConfigurationError(f"RunLimits.{name}[{meter!r}] must be within 1..2**53")
        out[meter] = cap
    return out


@dataclass(frozen=True)
class RunLimits:
    """``RunLimits(per_turn={"tokens": 8000}, per_thread={"tokens": 100000, "wall_ms": ...})``.

    Meter names follow ``[a-z][a-z0-9_]{0,31}``; at most 16 meters; caps 1..2**53.
    """

    per_turn: Mapping[str, int] = field(default_factory=dict)
    per_thread: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "per_turn", _caps("per_turn", self.per_turn))
        object.__setattr__(self, "per_thread", _caps("per_thread", self.per_thread))
        if len(self.meters) > MAX_METERS:
            raise ConfigurationError(f"RunLimits: at most {MAX_METERS} meters")

    @property
    def meters(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.per_turn) | set(self.per_thread)))

    def claim_args(self) -> tuple[str | int, ...]:
        """run_claim's meter ARGV: the count, then (meter, per-thread cap) pairs."""
        pairs = sorted(self.per_thread.items())
        return (len(pairs), *(x for pair in pairs for x in pair))

    def budget(self, usage: Mapping[str, int]) -> TurnBudget:
        """The allowance of a turn that starts with the thread's counters at ``usage``."""
        allowance: dict[str, int] = {}
        for meter in self.meters:
            caps = [self.per_turn.get(meter), None]
            if meter in self.per_thread:
                caps[1] = self.per_thread[meter] - usage.get(meter, 0)
            allowance[meter] = max(0, min(c for c in caps if c is not None))
        return TurnBudget(allowance)


@dataclass
class TurnBudget:
    """What one turn may still consume, and what it consumed (always within the allowance)."""

    allowance: dict[str, int]
    used: dict[str, int] = field(default_factory=dict)
    exceeded: str | None = None  # the meter a refused report would have passed

    def remaining(self) -> dict[str, int]:
        return {m: a - self.used.get(m, 0) for m, a in self.allowance.items()}

    def consume(self, report: Mapping[str, Any]) -> None:
        """Add a consumption report; ``limit_exceeded`` (nothing added) if it passes a meter."""
        amounts: dict[str, int] = {}
        for meter, amount in report.items():
            if meter not in self.allowance:
                continue  # not a limited meter: recorded as event data only
            if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
                raise ConversationError(
                    ErrorCode.INVALID_REQUEST,
                    f"usage of {meter!r} must be a non-negative integer",
                )
            amounts[meter] = amount
        for meter, amount in amounts.items():
            if self.used.get(meter, 0) + amount > self.allowance[meter]:
                self.exceeded = self.exceeded or meter
                raise ConversationError(
                    ErrorCode.LIMIT_EXCEEDED,
                    f"run limit {meter!r} would be passed (allowance {self.allowance[meter]})",
                    limit=f"run:{meter}",
                )
        for meter, amount in amounts.items():
            self.used[meter] = self.used.get(meter, 0) + amount

    def charge_wall(self, elapsed_ms: int) -> None:
        """The measured wall time, capped at its allowance (the turn was stopped there)."""
        if WALL_MS in self.allowance:
            allowed = self.allowance[WALL_MS]
            if elapsed_ms > allowed:
                self.exceeded = self.exceeded or WALL_MS
            self.used[WALL_MS] = min(elapsed_ms, allowed)
