"""Shared plumbing of the probes (bench.bisect_append, bench.callpath, bench.flushprobe).

Each probe starts its own ``redis-server`` (:class:`bench.server.BenchRedis`: free loopback
port, temp dir, stopped by pid on exit), and records what it measured together with the
commit, the server version and the machine's load, because this 2-core machine is shared:
a figure without the load it was taken under cannot be compared with another.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

__all__ = [
    "RESULTS_DIR",
    "exit_on_sigterm",
    "git_commit",
    "loadavg",
    "machine_meta",
    "redis_cpu_seconds",
    "spread",
    "write_json",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent


def exit_on_sigterm() -> None:
    """SIGTERM (and SIGINT, ignored in background jobs) raise SystemExit, so that the
    ``with BenchRedis()`` blocks stop the server and temp directories are removed."""

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def git_commit(tree: Path | None = None) -> str:
    """The commit of ``tree`` (this ``bench``'s tree by default), with ``+dirty`` when the
    work tree differs from it."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=tree or ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=tree or ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def loadavg() -> dict[str, float]:
    """1-minute load average and runnable tasks now (``/proc/loadavg``), per core too."""
    try:
        fields = Path("/proc/loadavg").read_text().split()
    except OSError:
        return {}
    running = float(fields[3].split("/")[0])
    cores = float(os.cpu_count() or 1)
    return {
        "load1": float(fields[0]),
        "runnable": running,
        "load1_per_core": float(fields[0]) / cores,
    }


def machine_meta(client: redis.Redis | None = None) -> dict[str, Any]:
    import memtier

    # The tree measured is the one memtier was imported from: ``python -m`` puts the
    # current directory ahead of PYTHONPATH, so an A/B run from the wrong directory shows
    # here (docs/performance.md, "Notes and limits of the method").
    memtier_tree = Path(memtier.__file__).resolve().parent.parent
    meta: dict[str, Any] = {
        "commit": git_commit(),
        "memtier_tree": str(memtier_tree),
        "memtier_commit": git_commit(memtier_tree),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_at_start": loadavg(),
        "redis_py": redis.__version__,
    }
    try:
        import hiredis  # type: ignore[import-not-found,unused-ignore]

        meta["hiredis"] = getattr(hiredis, "__version__", "yes")
    except ImportError:
        meta["hiredis"] = None
    if client is not None:
        meta["redis_server"] = str(client.info("server").get("redis_version", ""))
    return meta


def redis_cpu_seconds(client: redis.Redis) -> float:
    """redis-server's CPU time so far (user + system, ``INFO cpu``), seconds."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median and min-max of one figure over repeats (NaN-free: empty gives zeros)."""
    vals = [float(v) for v in values if v == v]
    if not vals:
        return {"median": 0.0, "min": 0.0, "max": 0.0, "p10": 0.0, "n": 0}
    ordered = sorted(vals)
    return {
        "median": statistics.median(vals),
        "min": ordered[0],
        "max": ordered[-1],
        # the quiet-moment estimate: load on a shared machine only ever adds time
        "p10": ordered[int((len(ordered) - 1) * 0.1)],
        "n": len(vals),
    }


def fmt(s: dict[str, float], digits: int = 1) -> str:
    """``median [min-max]``."""
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def write_json(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    return path


def parse_round_args(
    p: argparse.ArgumentParser, argv: list[str] | None, name: str
) -> argparse.Namespace:
    """``p``'s arguments (it has ``--rounds`` and ``--ops``) plus the two every
    round-and-ops probe shares: ``--out FILE|DIR`` (a directory: ``<name>.json`` in it, or
    ``<name>-quick.json``) and ``--quick`` (1 round of 30 operations: what its smoke test
    runs)."""
    p.add_argument("--out", type=Path, default=RESULTS_DIR / f"{name}.json")
    p.add_argument("--quick", action="store_true", help="1 round of 30: what the smoke test runs")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.ops = 1, 30
    if args.out.is_dir():  # a directory: the probe's own file name in it
        args.out = args.out / (f"{name}-quick.json" if args.quick else f"{name}.json")
    return args
