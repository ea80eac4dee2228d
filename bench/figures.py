"""The two figures of docs/performance.md, drawn from a results JSON of ``bench.run``.

``python -m bench.figures bench/results/latest-full.json --out docs/figures``

* ``scale-latency.png`` -- p50 and p99 latency (median over rounds, min-max bars) of
  memtier ``append``, memtier ``context`` and the raw minimal script, against the live
  sessions of each scale level (1k -> 1M in the full run), log-log.
* ``targets.png`` -- every target of the run as "fraction of its goal" on a log axis:
  the goal is the line at 1 (right of it = met), the bar is the spread over rounds and the
  diamond is the floor (the required Redis commands from a C client) where there is one.
  Each row is labelled with the raw figure and the goal as the table prints them.  A
  target with no data is drawn as "not measured", never as a value.

matplotlib (a ``bench`` and ``test`` extra) draws without a display (the Agg backend).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.report import shown_value

__all__ = ["TargetPoint", "draw_scale", "draw_targets", "goal_of", "main", "target_points"]

SCALE_SERIES = (
    ("append", "memtier append"),
    ("context", "memtier context (last 20)"),
    ("reference", "raw minimal script"),
)
_GOAL = re.compile(r"(>=|<=|==|<|>)\s*([0-9]+(?:\.[0-9]+)?)")
# A lower-is-better figure of 0 (no blocked append at all) is "infinitely" inside its goal:
# drawn at this multiple of the goal, and labelled with its real value.
_MAX_SCORE = 20.0
_MIN_SCORE = 0.012  # a figure of 0 against a ">=" goal (log axis): drawn at the left edge


def goal_of(goal: str) -> tuple[str, float] | None:
    """``(">=" | "<=" | ..., threshold)`` of a goal text such as ``">= 0.8x"``."""
    m = _GOAL.search(goal)
    if m is None:
        return None
    return m.group(1), float(m.group(2))


@dataclass(frozen=True)
class TargetPoint:
    """One row of the targets figure; ``score`` None = not measured (drawn as such)."""

    name: str
    label: str
    score: float | None  # value as a fraction of the goal: >= 1 is inside the goal
    low: float | None
    high: float | None
    floor: float | None
    met: bool | None


def _score(op: str, threshold: float, value: float | None) -> float | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if op in (">=", ">"):
        return max(value / threshold, _MIN_SCORE) if threshold > 0 else None
    # lower is better ("<=", "<", "=="): the goal over the value
    if value <= 0:
        return _MAX_SCORE
    return min(threshold / value, _MAX_SCORE)


def target_points(data: dict[str, Any]) -> list[TargetPoint]:
    """Every target of a results JSON as a figure row (goals that are not a bound: skipped)."""
    out: list[TargetPoint] = []
    for t in data.get("targets", []):
        parsed = goal_of(str(t.get("goal", "")))
        if parsed is None:
            continue
        op, thr = parsed
        value = t.get("value")
        measured = value is not None and t.get("met") is not None
        score = _score(op, thr, value) if measured else None
        lo = _score(op, thr, t.get("low")) if measured else None
        hi = _score(op, thr, t.get("high")) if measured else None
        if lo is not None and hi is not None and lo > hi:
            lo, hi = hi, lo
        if value is None:
            label = f"not measured (goal {t['goal']})"
        else:
            spread = ""
            if t.get("low") is not None and t.get("high") is not None and t["low"] != t["high"]:
                spread = f" [{t['low']:.2f}-{t['high']:.2f}]"
            label = f"{shown_value(value, t['goal'])}{spread}, goal {t['goal']}"
            if not measured:
                label = f"not measured ({t.get('detail', '')[:60]})"
        out.append(
            TargetPoint(
                name=str(t["name"]),
                label=label,
                score=score,
                low=lo,
                high=hi,
                floor=_score(op, thr, t.get("floor")) if t.get("floor") is not None else None,
                met=t.get("met") if measured else None,
            )
        )
    return out


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _caption(data: dict[str, Any]) -> str:
    meta = data.get("meta", {})
    return (
        f"{meta.get('profile', '?')} run of {meta.get('started', '?')}, "
        f"commit {meta.get('git_commit', '?')}, {meta.get('cpus', '?')} CPUs"
    )


def _sessions(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def draw_scale(data: dict[str, Any], path: Path) -> dict[str, list[tuple[int, float]]]:
    """Draw p50/p99 against live sessions; returns the plotted series (name -> points)."""
    results = {r["key"]: r for r in data.get("results", [])}
    levels: Sequence[int] = data.get("meta", {}).get("settings", {}).get("scale_levels", [])
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.8))
    series: dict[str, list[tuple[int, float]]] = {}
    colors = {"append": "tab:blue", "context": "tab:green", "reference": "tab:gray"}
    for op, label in SCALE_SERIES:
        for q, style in (("p50", "-o"), ("p99", "--s")):
            pts: list[tuple[int, float]] = []
            lows: list[float] = []
            highs: list[float] = []
            for level in levels:
                row = results.get(f"scale.{op}.{q}.{level}")
                summary = row.get("summary") if row else None
                if not summary or summary.get("median") is None:
                    continue
                med = float(summary["median"])
                pts.append((int(level), med))
                lows.append(med - float(summary.get("min") or med))
                highs.append(float(summary.get("max") or med) - med)
            if not pts:
                continue
            series[f"{op}.{q}"] = pts
            ax.errorbar(
                [p[0] for p in pts],
                [p[1] for p in pts],
                yerr=[lows, highs],
                fmt=style,
                color=colors[op],
                capsize=3,
                label=f"{label} {q}",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(list(levels))
    ax.set_xticklabels([_sessions(lv) for lv in levels])
    ax.minorticks_off()
    ax.set_xlabel("live sessions in the namespace")
    ax.set_ylabel("latency per call, us (median over rounds, min-max)")
    ax.set_title("Latency against live sessions", fontsize=11)
    if series:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.text(0.5, 0.5, "scale section not measured", ha="center", transform=ax.transAxes)
    ax.grid(True, which="both", alpha=0.3)
    fig.text(0.01, 0.01, _caption(data), fontsize=7, color="dimgray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return series


def draw_targets(data: dict[str, Any], path: Path) -> list[TargetPoint]:
    """Draw every target against its goal line; returns the rows drawn, top to bottom."""
    points = target_points(data)
    plt = _pyplot()
    height = max(2.5, 0.42 * len(points) + 1.2)
    fig, ax = plt.subplots(figsize=(12, height))
    ys = list(range(len(points)))[::-1]
    for y, p in zip(ys, points, strict=True):
        if p.score is None:
            ax.text(1.0, y, "  " + p.label[:70], va="center", fontsize=7, color="dimgray")
            continue
        color = "tab:green" if p.met else "tab:red"
        if p.low is not None and p.high is not None:
            ax.plot([p.low, p.high], [y, y], color=color, lw=4, alpha=0.35, solid_capstyle="butt")
        ax.plot([p.score], [y], "o", color=color)
        if p.floor is not None:
            ax.plot([p.floor], [y], "D", color="black", ms=5, fillstyle="none")
        right = max(p.score, p.high or p.score, p.floor or p.score)
        ax.text(right * 1.12, y, p.label, va="center", fontsize=7)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xscale("log")
    drawn = [v for p in points for v in (p.score, p.low, p.high, p.floor) if v is not None]
    left = min([0.1, *drawn]) / 1.5
    right = max([2.0, *drawn]) * 8  # room for the labels right of each row
    ax.set_xlim(left, right)
    ax.set_yticks(ys)
    ax.set_yticklabels([textwrap.fill(p.name, 44) for p in points], fontsize=7)
    ax.set_ylim(-0.7, len(points) - 0.3)
    ax.set_xlabel(
        "fraction of the goal (log; the line is the goal, right of it = met)\n"
        "dot = median, bar = min-max over rounds, diamond = floor (C client, required commands)",
        fontsize=8,
    )
    ax.set_title("Targets of issue 12: this run against each goal", fontsize=11)
    ax.grid(True, axis="x", which="both", alpha=0.3)
    fig.text(0.01, 0.005, _caption(data), fontsize=7, color="dimgray")
    fig.tight_layout(rect=(0.015, 0.02, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return points


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.figures", description=__doc__.split("\n")[0])
    p.add_argument("results", type=Path, help="a results JSON written by python -m bench.run")
    p.add_argument("--out", type=Path, default=Path("docs/figures"), help="output directory")
    args = p.parse_args(argv)
    data = json.loads(args.results.read_text(encoding="utf-8"))
    scale_png = args.out / "scale-latency.png"
    targets_png = args.out / "targets.png"
    series = draw_scale(data, scale_png)
    points = draw_targets(data, targets_png)
    measured = sum(1 for pt in points if pt.score is not None)
    print(
        f"wrote {scale_png} ({len(series)} series) and {targets_png} ({measured}/{len(points)}"
        " targets measured)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
