"""The context read's client-side decode, old and new, interleaved in one process.

``python -m bench.ctxdecode [--quick] [--out DIR]``: no server.  Decodes the reply of a
context read of 20 turns (``MemoryCore.decode_context``) in three workloads -- ``same``
(one reply read again and again), ``slide`` (each read one new turn, as a conversation
reads itself) and ``distinct`` (every record new: the cache only costs) -- against the
general path (``decode_record`` per record, then ``project``: the decoder before the
fast path, still the fallback), for 300 B and 4 KiB turns of each kind.  Rounds
interleave the variants; client CPU us per read, median [min-max] over rounds.
Writes ``ctxdecode[-quick].json``.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.probe import RESULTS_DIR, loadavg, spread, write_json
from bench.workloads import chat_text
from memtier.config import MemtierConfig
from memtier.memory.core import MemoryCore
from memtier.memory.models import ConversationKey
from memtier.memory.turncodec import StoredTurn

_KINDS = ("avatar", "agent", "tool", "action")
_T0 = 1_790_000_000_000
__all__ = ["main"]

_HEAD = [0, b"ses_probe", 0, 0, 0, 0, 0, 0, b""]


def _record(seq: int, kind: str, text: str) -> bytes:
    fields = {
        "avatar": {"text": text},
        "agent": {"text": text},
        "tool": {"tool": "search", "summary": text},
        "action": {"action": "walk", "outcome": text},
    }[kind]
    nbytes = len(text.encode())
    tool = kind == "tool"
    turn = StoredTurn(seq, _T0 + seq, _T0 + seq, nbytes, tool, kind, f"p{seq}", fields)
    return replace(turn, redactor_version=1).encode()


def _replies(workload: str, text: str) -> list[list[Any]]:
    reads = 1 if workload == "same" else 300
    step = 1 if workload == "slide" else 20
    pool = [_record(j + 1, _KINDS[j % 4], text) for j in range(reads * step + 20)]
    return [[_HEAD, pool[r * step : r * step + 20]] for r in range(reads)]


def _variants(text: str) -> dict[str, Callable[[], Any]]:
    key = ConversationKey(uuid.UUID(int=7), "public")
    out: dict[str, Callable[[], Any]] = {}
    for workload in ("same", "slide", "distinct"):
        core = MemoryCore(MemtierConfig.load())
        replies = _replies(workload, text)
        counter = iter(range(10**12))

        def fast(
            core: MemoryCore = core, replies: list[list[Any]] = replies, counter: Any = counter
        ) -> Any:
            return core.decode_context(key, replies[next(counter) % len(replies)])

        def general(
            core: MemoryCore = core, replies: list[list[Any]] = replies, counter: Any = counter
        ) -> Any:
            _head, raws = replies[next(counter) % len(replies)]
            return core._general_context(key, "ses_probe", "", raws)

        out[f"{workload} fast"] = fast
        out[f"{workload} general (before)"] = general
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.ctxdecode", description=__doc__.split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="seconds: what the smoke test runs")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON")
    args = p.parse_args(argv)
    rounds, reads = (3, 50) if args.quick else (15, 400)
    results: dict[str, Any] = {}
    for size in (300, 4096):
        variants = _variants(chat_text(size))
        per: dict[str, list[float]] = {name: [] for name in variants}
        for fn in variants.values():  # warm-up: the caches of the fast path filled
            for _ in range(reads):
                fn()
        for r in range(rounds):
            names = list(variants)
            for name in names[r % len(names) :] + names[: r % len(names)]:
                t0 = time.process_time()
                for _ in range(reads):
                    variants[name]()
                per[name].append((time.process_time() - t0) / reads * 1e6)
        results[f"{size}B"] = {name: spread(v) for name, v in per.items()}
        print(f"decode_context of 20 turns (all four kinds), {size} B, client CPU us per read:")
        for name, v in results[f"{size}B"].items():
            print(f"  {name:26s} {v['median']:7.1f} [{v['min']:.1f}-{v['max']:.1f}]")
    meta = {
        "tool": "bench.ctxdecode",
        "rounds": rounds,
        "reads_per_round": reads,
        "load": loadavg(),
    }
    out = write_json(
        args.out / f"ctxdecode{'-quick' if args.quick else ''}.json",
        {"meta": meta, "us_per_read": results},
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
