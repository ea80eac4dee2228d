"""Bisect ``append_turn`` by section: Redis CPU per call of the script cut after each section.

``python -m bench.bisect_append [--quick] [--calls N] [--repeats K] [--out DIR]``

Builds variants of memtier's own ``append_turn`` (the expanded text memtier loads) that
return early after each numbered section (``-- 0. Clocks`` ... ``-- 7.``), plus an empty
script, a script that only converts the 23 ARGV (``tonumber``), one that only defines the
included helper functions, and the benchmark's minimal script as the floor.  Each variant
runs ``N`` calls with realistic ARGV -- ``MemoryCore.prepare_turn`` + ``append_call`` of a
300 B turn, fresh uuid4 turn ids, over sessions that exist in a populated partition -- on a
private ``redis-server`` this tool starts (free loopback port, temp dir, stopped by pid).

Server cost per call is read from ``INFO commandstats`` (``usec_per_call`` of ``evalsha``
and the commands it ran) and from ``SLOWLOG`` (threshold 0: every call's duration, so a
median per variant that one preempted call cannot move), both reset before every variant.
Repeats interleave the variants (order rotated each repeat) so the load of this shared
machine falls on all of them alike; the load average is recorded per repeat.

Early returns keep what the full script would persist about the opportunistic sweep (a
cut after section 3, 4 or 5 writes ``sw`` when it swept, as the refusals there do), so the
sweep runs as often as in the full script and not on every call.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench.probe import RESULTS_DIR, exit_on_sigterm, fmt, loadavg, machine_meta, spread, write_json
from bench.server import BenchRedis
from bench.workloads import MINIMAL_SCRIPT, KeyPool, bench_config, chat_text, populate
from memtier import AvatarMessage, ConversationStore

__all__ = ["Variant", "build_variants", "main"]

STUB = "do return { 0 } end\n"
# Cuts inside the sweep/refusal region keep the sweep's schedule (see the module doc).
SWEEP_STUB = "if sweep_done then rcall('HSET', meta_key, 'sw', next_sweep) end\n" + STUB
ADMIN = frozenset({"config", "slowlog", "info", "script", "ping", "evalsha", "hello", "client"})
PIPELINE = 200
# SLOWLOG entries per call: the EVALSHA and every command the script ran (Redis logs
# those too); room for all of them, so that every call's duration is read.
SLOWLOG_PER_CALL = 16


@dataclass(frozen=True)
class Variant:
    name: str
    label: str
    source: str
    minimal: bool = False  # the benchmark's minimal script (its own keys and ARGV)


def _find(src: str, needle: str, start: int = 0) -> int:
    at = src.find(needle, start)
    if at < 0:
        raise SystemExit(f"bisect_append: marker {needle!r} not found in append_turn")
    return at


def build_variants(source: str) -> list[Variant]:
    """The chain of cuts of ``source`` (memtier's expanded ``append_turn``), in order."""
    shebang = source.split("\n", 1)[0] + "\n"
    body = _find(source, "local s_key, t_key, i_key = KEYS[1], KEYS[2], KEYS[3]")
    locals_end = _find(source, "\n", _find(source, "local ttl_refresh_ms = tonumber(ARGV[23])")) + 1
    out = [
        Variant("empty", "empty script (same 9 KEYS + 23 ARGV sent)", shebang + "return 0\n"),
        Variant(
            "argv",
            "only the ARGV locals (17 tonumber)",
            shebang + source[body:locals_end] + STUB,
        ),
        Variant("include", "only the included helper definitions", source[:body] + STUB),
    ]
    starts = [_find(source, f"\n-- {k}. ", body) + 1 for k in range(8)]
    out.append(Variant("checks", "cut after the argument checks", source[: starts[0]] + STUB))
    for k in range(7):
        stub = SWEEP_STUB if 3 <= k <= 5 else STUB
        out.append(Variant(f"s{k}", f"cut after section {k}", source[: starts[k + 1]] + stub))
    out.append(Variant("full", "full append_turn", source))
    return out


def _section_titles(source: str) -> dict[str, str]:
    titles = {}
    for m in re.finditer(r"^-- (\d)\. (.*)$", source, re.MULTILINE):
        titles[f"s{m.group(1)}"] = m.group(2).strip()
    return titles


class Driver:
    """Runs one variant N times on the private server and reads its server cost."""

    def __init__(self, server: BenchRedis, store: ConversationStore, sessions: int) -> None:
        self.server = server
        self.client: redis.Redis = server.client()
        self.store = store
        self.keys = KeyPool(91, sessions).keys
        self.text = chat_text(300)
        self.minimal_i = 0
        self.pid = server.pid()

    def calls(self, n: int) -> list[tuple[Any, ...]]:
        core = self.store.core
        out = []
        for i in range(n):
            prepared = core.prepare_turn(
                self.keys[i % len(self.keys)], AvatarMessage(text=self.text)
            )
            call = core.append_call(prepared)
            out.append((*call.keys, *call.args))
        return out

    def minimal_calls(self, n: int) -> list[tuple[Any, ...]]:
        out = []
        for _ in range(n):
            i = self.minimal_i = self.minimal_i + 1
            sid = f"{i % 1000:012d}"
            out.append(
                ("{bq}:q:" + sid, "{bq}:t:" + sid, "{bq}:meta", "{bq}:lru", self.text, f"m{sid}")
            )
        return out

    def _cpu_s(self) -> float:
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def run(self, sha: str, numkeys: int, calls: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
        client = self.client
        client.config_resetstat()
        client.slowlog_reset()
        cpu0, t0 = self._cpu_s(), time.perf_counter()
        nonzero = 0
        pipe = client.pipeline(transaction=False)
        for start in range(0, len(calls), PIPELINE):
            for args in calls[start : start + PIPELINE]:
                pipe.evalsha(sha, numkeys, *args)
            for reply in pipe.execute():
                first = reply[0] if isinstance(reply, list) else reply
                nonzero += int(first) != 0 and numkeys != 4
        wall, cpu = time.perf_counter() - t0, self._cpu_s() - cpu0
        stats = client.info("commandstats")
        slow = client.slowlog_get(len(calls) * SLOWLOG_PER_CALL + 100)
        per: dict[str, dict[str, float]] = {}
        for name, row in stats.items():
            cmd = str(name).removeprefix("cmdstat_")
            per[cmd] = {"calls": int(row["calls"]), "usec": int(row["usec"])}
        ev = per.get("evalsha", {"calls": 0, "usec": 0})
        n = max(1, int(ev["calls"]))
        inner = {c: v for c, v in per.items() if c.split("|", 1)[0] not in ADMIN}
        durations = sorted(
            int(e["duration"]) for e in slow if bytes(e.get("command", b"")).startswith(b"EVALSHA")
        )
        return {
            "calls": int(ev["calls"]),
            "usec_per_call": ev["usec"] / n,
            "inner_usec_per_call": sum(v["usec"] for v in inner.values()) / n,
            "inner_cmds_per_call": sum(v["calls"] for v in inner.values()) / n,
            "inner": {
                c: {"calls_per_call": v["calls"] / n, "usec_per_call": v["usec"] / n}
                for c, v in sorted(inner.items())
            },
            "slowlog_n": len(durations),
            "slowlog_p50_us": durations[len(durations) // 2] if durations else 0,
            "slowlog_trimmed_mean_us": _trimmed_mean(durations),
            "slowlog_p90_us": durations[int(len(durations) * 0.9)] if durations else 0,
            "slowlog_max_us": durations[-1] if durations else 0,
            "nonzero_replies": nonzero,
            "wall_s": wall,
            "server_cpu_s": cpu,
        }


def _trimmed_mean(ordered: Sequence[int], cut: float = 0.1) -> float:
    """Mean of the middle 80 % of the durations: sub-microsecond resolution (SLOWLOG has
    whole microseconds), and the calls preempted by another process are dropped."""
    if not ordered:
        return 0.0
    k = int(len(ordered) * cut)
    middle = ordered[k : len(ordered) - k] or ordered
    return sum(middle) / len(middle)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.bisect_append", description=__doc__.split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="seconds: what the smoke test runs")
    p.add_argument("--calls", type=int, default=0, help="calls per variant per repeat (5000)")
    p.add_argument("--repeats", type=int, default=0, help="repeats, variants interleaved (7)")
    p.add_argument("--sessions", type=int, default=0, help="existing sessions rotated over (1000)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    exit_on_sigterm()
    calls = args.calls or (100 if args.quick else 5000)
    repeats = args.repeats or (2 if args.quick else 7)
    sessions = args.sessions or (20 if args.quick else 1000)
    history = 3 if args.quick else 20
    with BenchRedis(
        extra={
            "slowlog-log-slower-than": "0",
            "slowlog-max-len": str(calls * SLOWLOG_PER_CALL + 200),
        }
    ) as server:
        client = server.client()
        store = ConversationStore(client, bench_config("bisect"))
        source = store.scripts["append_turn"].source
        variants = build_variants(source)
        variants.append(
            Variant(
                "minimal",
                "minimal script (bench/minimal_append-4.lua)",
                MINIMAL_SCRIPT.read_text(encoding="utf-8"),
                minimal=True,
            )
        )
        shas = {v.name: str(client.script_load(v.source)) for v in variants}
        driver = Driver(server, store, sessions)
        failed = populate(store, driver.keys, driver.text, turns=history)
        meta = machine_meta(client)
        meta.update(
            tool="bench.bisect_append",
            calls=calls,
            repeats=repeats,
            sessions=sessions,
            history_turns=history,
            populate_failures=failed,
            server_pid=server.pid(),
            section_titles=_section_titles(source),
            payload_bytes=300,
        )
        runs: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
        loads = []
        print(
            f"bisect append_turn: {len(variants)} variants x {repeats} repeats x {calls} calls,"
            f" {sessions} sessions of {history} turns; load {loadavg()}",
            flush=True,
        )
        for r in range(repeats):
            loads.append({"repeat": r, **loadavg()})
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            for v in order:
                batch = driver.minimal_calls(calls) if v.minimal else driver.calls(calls)
                result = driver.run(shas[v.name], 4 if v.minimal else 9, batch)
                result["repeat"] = r
                runs[v.name].append(result)
            print(f"  repeat {r + 1}/{repeats} done; load {loads[-1]}", flush=True)
        loads.append({"repeat": repeats, **loadavg()})
        client.close()
    summary = _summarize(variants, runs)
    data = {"meta": {**meta, "load_per_repeat": loads}, "summary": summary, "runs": runs}
    out = write_json(args.out / f"bisect-append{'-quick' if args.quick else ''}.json", data)
    _print(summary)
    print(f"wrote {out}")
    return 0


def _summarize(
    variants: list[Variant], runs: dict[str, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    rows = []
    prev: str | None = None
    chain = [v.name for v in variants if v.name not in ("empty", "argv", "include", "minimal")]
    for v in variants:
        rs = runs[v.name]
        row: dict[str, Any] = {
            "variant": v.name,
            "label": v.label,
            "usec_per_call": spread([x["usec_per_call"] for x in rs]),
            "slowlog_p50_us": spread([x["slowlog_p50_us"] for x in rs]),
            "slowlog_trimmed_mean_us": spread([x["slowlog_trimmed_mean_us"] for x in rs]),
            "slowlog_p90_us": spread([x["slowlog_p90_us"] for x in rs]),
            "inner_usec_per_call": spread([x["inner_usec_per_call"] for x in rs]),
            "inner_cmds_per_call": spread([x["inner_cmds_per_call"] for x in rs]),
            "nonzero_replies": sum(x["nonzero_replies"] for x in rs),
        }
        base = {"argv": "empty", "include": "empty"}.get(v.name)
        if v.name in chain:
            base, prev = prev, v.name
        if base is not None:
            pairs = zip(runs[base], rs, strict=True)  # same repeat: same machine state
            row["delta_vs"] = base
            row["delta_usec_per_call"] = spread(
                [b["usec_per_call"] - a["usec_per_call"] for a, b in pairs]
            )
            row["delta_trimmed_us"] = spread(
                [
                    b["slowlog_trimmed_mean_us"] - a["slowlog_trimmed_mean_us"]
                    for a, b in zip(runs[base], rs, strict=True)
                ]
            )
        rows.append(row)
    return rows


def _print(summary: list[dict[str, Any]]) -> None:
    print(
        "\n| variant | SLOWLOG trimmed mean us | delta vs previous | SLOWLOG p50 us"
        " | commandstats usec/call | inner cmds us (calls) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for row in summary:
        delta = ""
        if "delta_vs" in row:
            delta = f"{fmt(row['delta_trimmed_us'])} (vs {row['delta_vs']})"
        inner = row["inner_usec_per_call"]["median"]
        cmds = row["inner_cmds_per_call"]["median"]
        print(
            f"| {row['label']} | {fmt(row['slowlog_trimmed_mean_us'])} | {delta}"
            f" | {fmt(row['slowlog_p50_us'], 0)} | {fmt(row['usec_per_call'])}"
            f" | {inner:.1f} ({cmds:.1f}) |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
