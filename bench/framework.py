"""Rounds, spreads and ratios: how every figure of the benchmark is produced.

A *group* is a set of measures compared with each other.  Each round runs every
measure of the group once (the order rotates every round), so a baseline and
its candidates see the same machine state; the ratio of a candidate to its
baseline is computed per round and reported as median and min..max over the
rounds.  Warm-up rounds run first and are discarded; they also calibrate how
many operations one round of each measure runs (about ``round_seconds`` worth,
within ``min_ops``..``max_ops``), so slow peers and fast baselines both get
rounds of similar length.

Around each measured round the harness reads ``INFO commandstats`` (outside the
timed region) to attribute server time and commands to the measure: ``srv
us/op`` is the Redis CPU time per operation (for scripts it includes every
command the script ran) and ``cmds/op`` the commands executed per operation,
counting those run inside scripts.  Both are per item when an operation covers
several (per session of a metadata walk, per append of a multi-process round).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Harness",
    "Measure",
    "Result",
    "Settings",
    "percentile",
    "summarize",
]

# Commands the harness itself sends between rounds; never attributed to a measure.
_OWN_COMMANDS = frozenset({"info", "config|resetstat", "config", "ping", "memory|usage", "dbsize"})


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0..100) of already sorted values."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and quartiles of the per-round values."""
    if not values:
        return {"n": 0, "median": math.nan, "min": math.nan, "max": math.nan}
    ordered = sorted(values)
    out = {
        "n": float(len(ordered)),
        "median": float(statistics.median(ordered)),
        "min": float(ordered[0]),
        "max": float(ordered[-1]),
    }
    if len(ordered) >= 4:
        q = statistics.quantiles(ordered, n=4)
        out["q1"], out["q3"] = float(q[0]), float(q[2])
    return out


@dataclass
class Settings:
    """Sizes of one run (``--tiny``, ``--quick`` or the full run)."""

    profile: str
    warmup_rounds: int
    rounds: int
    round_seconds: float
    min_ops: int
    max_ops: int
    scale_levels: tuple[int, ...]
    scale_samples: int  # latency samples per operation per level
    metadata_sessions: int
    procs: int
    proc_ops: int  # appends per process per round
    memory_sessions: int
    memory_turns: int
    eviction_ops: int
    profile_ops: int

    @classmethod
    def named(cls, name: str) -> Settings:
        if name == "tiny":  # the smoke test: seconds, proves the harness runs end to end
            return cls(name, 1, 2, 0.05, 20, 200, (100, 500), 50, 300, 2, 20, 50, 4, 50, 200)
        if name == "quick":  # a few minutes
            return cls(
                name,
                1,
                5,
                0.4,
                100,
                20_000,
                (1_000, 10_000, 100_000),
                1_000,
                10_000,
                8,
                250,
                1_000,
                20,
                1_000,
                3_000,
            )
        if name == "full":
            return cls(
                name,
                1,
                7,
                1.0,
                200,
                50_000,
                (1_000, 100_000, 1_000_000),
                3_000,
                10_000,
                8,
                250,
                2_000,
                20,
                3_000,
                10_000,
            )
        raise ValueError(f"unknown size {name!r}")


@dataclass
class Measure:
    """One throughput benchmark: ``run(n)`` performs ``n`` operations, returns seconds."""

    key: str
    label: str
    run: Callable[[int], float]
    unit: str = "op/s"
    items_per_op: float = 1.0  # e.g. sessions returned by one metadata page walk
    fixed_ops: int | None = None  # rounds of exactly this many ops (no calibration)
    note: str = ""
    server_stats: bool = True  # False when other processes share the server meanwhile


@dataclass
class Result:
    """One row of the results table (and one object of the JSON output)."""

    key: str
    section: str
    label: str
    unit: str
    values: list[float] = field(default_factory=list)
    baseline: str | None = None
    ratios: list[float] | None = None
    status: str = "ok"  # ok | unavailable | error
    note: str = ""
    higher_is_better: bool = True
    server_us_per_op: float | None = None
    cmds_per_op: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def summary(self) -> dict[str, float]:
        return summarize(self.values)

    @property
    def ratio_summary(self) -> dict[str, float] | None:
        return summarize(self.ratios) if self.ratios else None

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "section": self.section,
            "label": self.label,
            "unit": self.unit,
            "status": self.status,
            "note": self.note,
            "values": self.values,
            "summary": self.summary if self.values else None,
            "baseline": self.baseline,
            "ratios": self.ratios,
            "ratio_summary": self.ratio_summary,
            "higher_is_better": self.higher_is_better,
            "server_us_per_op": self.server_us_per_op,
            "cmds_per_op": self.cmds_per_op,
            "extra": self.extra,
        }


def command_stats(client: Any) -> dict[str, tuple[int, int]]:
    """``{command: (calls, usec)}`` from ``INFO commandstats``."""
    raw = client.info("commandstats")
    out: dict[str, tuple[int, int]] = {}
    for name, stats in raw.items():
        cmd = str(name).removeprefix("cmdstat_")
        if cmd in _OWN_COMMANDS:
            continue
        out[cmd] = (int(stats["calls"]), int(stats["usec"]))
    return out


def stats_delta(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> tuple[int, int]:
    """Total (calls, usec) executed between two snapshots."""
    calls = usec = 0
    for cmd, (c, u) in after.items():
        c0, u0 = before.get(cmd, (0, 0))
        calls += c - c0
        usec += u - u0
    return calls, usec


# Commands whose INFO commandstats usec already includes every command they ran (Redis 7:
# a script's or a transaction's time covers its nested calls, which are counted again
# under their own names).
_CONTAINERS = frozenset({"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro", "exec"})


def top_level_usec(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> int:
    """Server usec of one round without counting a script's inner commands twice.

    When a script or transaction ran, its own usec (which includes what it ran) is the
    round's server time; otherwise the sum over all commands.  Exact for measures that
    send only scripts (memtier's append, the minimal and floor scripts) or only plain
    commands; a round that mixes top-level plain commands with scripts is undercounted
    by the plain ones.
    """
    usec = cusec = calls = 0
    for cmd, (c, u) in after.items():
        c0, u0 = before.get(cmd, (0, 0))
        usec += u - u0
        if cmd in _CONTAINERS:
            calls += c - c0
            cusec += u - u0
    return cusec if calls else usec


class Harness:
    """Collects results; runs groups of measures in interleaved rounds."""

    def __init__(self, settings: Settings, admin: Any, log: Callable[[str], None]) -> None:
        self.settings = settings
        self.admin = admin  # a redis-py client used only between timed regions
        self.log = log
        self.results: list[Result] = []

    def add(self, result: Result) -> Result:
        self.results.append(result)
        return result

    def get(self, key: str) -> Result | None:
        for result in self.results:
            if result.key == key:
                return result
        return None

    def unavailable(self, section: str, key: str, label: str, why: str, unit: str = "") -> Result:
        return self.add(Result(key, section, label, unit, status="unavailable", note=why))

    def add_error(self, section: str, exc: BaseException) -> Result:
        why = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
        return self.add(
            Result(
                f"error.{section}",
                section,
                f"section {section} failed",
                "",
                status="error",
                note=why,
            )
        )

    def _calibrate(self, measure: Measure, elapsed: float, ops: int) -> int:
        s = self.settings
        if measure.fixed_ops is not None:
            return measure.fixed_ops
        rate = ops / max(elapsed, 1e-9)
        return int(min(s.max_ops, max(s.min_ops, rate * s.round_seconds)))

    def group(
        self,
        section: str,
        measures: Sequence[Measure],
        ratios: dict[str, str] | None = None,
    ) -> list[Result]:
        """Run ``measures`` in interleaved rounds; ``ratios`` maps candidate -> baseline key."""
        s = self.settings
        ratios = ratios or {}
        results = {
            m.key: Result(m.key, section, m.label, m.unit, note=m.note, baseline=ratios.get(m.key))
            for m in measures
        }
        ops = {m.key: m.fixed_ops or s.min_ops for m in measures}
        server: dict[str, list[float]] = {m.key: [0, 0, 0] for m in measures}  # calls, usec, items
        # Redis CPU per item of each measured round: the spread of ``srv us/op`` and a
        # same-round ratio of server cost (the "Redis CPU per append" target).
        server_rounds: dict[str, list[float]] = {m.key: [] for m in measures}
        top_rounds: dict[str, list[float]] = {m.key: [] for m in measures}  # no double count
        failed: dict[str, str] = {}
        order = list(measures)
        for rnd in range(s.warmup_rounds + s.rounds):
            warm = rnd < s.warmup_rounds
            shift = rnd % len(order)
            for m in order[shift:] + order[:shift]:
                if m.key in failed:
                    continue
                n = ops[m.key]
                try:
                    before = command_stats(self.admin) if m.server_stats and not warm else None
                    elapsed = m.run(n)
                    after = command_stats(self.admin) if before is not None else None
                except Exception as exc:  # a peer may break; report it, keep going
                    failed[m.key] = f"{type(exc).__name__}: {exc}"[:300]
                    self.log(f"  ! {m.key} failed: {failed[m.key]}")
                    continue
                if warm:
                    ops[m.key] = self._calibrate(m, elapsed, n)
                    continue
                results[m.key].values.append(n * m.items_per_op / max(elapsed, 1e-9))
                if before is not None and after is not None:
                    calls, usec = stats_delta(before, after)
                    acc = server[m.key]
                    acc[0] += calls
                    acc[1] += usec
                    acc[2] += n * m.items_per_op  # per item: per session, per append
                    server_rounds[m.key].append(usec / max(n * m.items_per_op, 1e-9))
                    top_rounds[m.key].append(
                        top_level_usec(before, after) / max(n * m.items_per_op, 1e-9)
                    )
        for m in measures:
            res = results[m.key]
            if m.key in failed:
                res.status, res.note = "error", failed[m.key]
                res.values = []
            total_calls, total_usec, items = server[m.key]
            if items:
                res.server_us_per_op = total_usec / items
                res.cmds_per_op = total_calls / items
            res.extra["ops_per_round"] = ops[m.key]
            if server_rounds[m.key] and m.key not in failed:
                res.extra["server_us_per_round"] = server_rounds[m.key]
                res.extra["server_top_us_per_round"] = top_rounds[m.key]
        for cand, base in ratios.items():
            rc, rb = results.get(cand), results.get(base)
            if rc is None or rb is None or not rc.values or not rb.values:
                continue
            rc.ratios = [a / b for a, b in zip(rc.values, rb.values, strict=False) if b > 0]
        for m in measures:
            self.add(results[m.key])
            r = results[m.key]
            if r.values:
                ratio = f"  x{r.ratio_summary['median']:.2f}" if r.ratio_summary else ""
                self.log(f"  {r.label:<58} {r.summary['median']:>12,.0f} {r.unit}{ratio}")
        return [results[m.key] for m in measures]


def timed(fn: Callable[[int], None]) -> Callable[[int], float]:
    """Wrap ``fn(n)`` so it returns its own elapsed wall time (perf_counter)."""

    def run(n: int) -> float:
        started = time.perf_counter()
        fn(n)
        return time.perf_counter() - started

    return run


def paired_ratio(cand: Result, base: Result) -> list[float]:
    """Per-round ratios of two results of the same group (rounds were interleaved)."""
    return [a / b for a, b in zip(cand.values, base.values, strict=False) if b > 0]
