"""A/B of two ``snapshot_page`` scripts on the same server, same pages, interleaved.

``python -m bench.page_ab --other /path/to/other/tree/lua [--quick] [--sessions N]``

On a private ``redis-server`` (``SLOWLOG`` threshold 0), fills one namespace with ``N``
sessions of 4 realistic 300 B turns, cuts its index into the flush's pages
(:data:`~memtier.memory.persistence.flush.PAGE_SESSIONS` /
:data:`~memtier.memory.persistence.flush.PAGE_BYTES`), loads this tree's
``snapshot_page`` and the other tree's, and calls both on every page in alternating
order, ``--repeats`` times.  Reports each script's SLOWLOG duration per page call
(median, p10, p90: microseconds inside Redis) and checks that both give the same reply
for every page (a cut of Lua work, not of what is read).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from bench.probe import RESULTS_DIR, exit_on_sigterm, loadavg, machine_meta, spread, write_json
from bench.server import BenchRedis
from bench.workloads import KeyPool, chat_text, populate
from memtier import ConversationStore, MemtierConfig

__all__ = ["main"]


def _pages(store: ConversationStore, client: Any) -> list[tuple[Any, list[str]]]:
    from memtier.memory.persistence.flush import PAGE_BYTES, PAGE_SESSIONS

    out: list[tuple[Any, list[str]]] = []
    for part in store.core.keyspace.all_partitions():
        batch: list[str] = []
        size = 0
        for raw_member, raw_bytes in client.hscan_iter(part.index, count=1000):
            member, nbytes = raw_member.decode(), int(raw_bytes)
            if batch and (len(batch) >= PAGE_SESSIONS or size + nbytes > PAGE_BYTES):
                out.append((part, batch))
                batch, size = [], 0
            batch.append(member)
            size += nbytes
        if batch:
            out.append((part, batch))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.page_ab", description=__doc__.split("\n")[0])
    p.add_argument("--other", type=Path, required=True, help="the other tree's lua/ directory")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sessions", type=int, default=0, help="sessions (4,000)")
    p.add_argument("--repeats", type=int, default=0, help="calls of each script per page (5)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    p.add_argument("--tag", default="")
    args = p.parse_args(argv)
    exit_on_sigterm()
    from memtier.memory.persistence.flush import snapshot_page_call
    from memtier.scripts import load_registry

    sessions = args.sessions or (200 if args.quick else 4000)
    repeats = args.repeats or (1 if args.quick else 5)
    extra = {"slowlog-log-slower-than": "0", "slowlog-max-len": "1000000"}
    with BenchRedis(extra=extra) as server:
        client = server.client()
        config = MemtierConfig.load(
            redis_url=server.url,
            namespace="pageab",
            conversation={"max_active_sessions": 1_000_000, "max_aggregate_bytes": 64 * 1024**3},
        )
        store = ConversationStore.from_config(config, recover=False)
        failed = populate(store, KeyPool(72, sessions).keys, chat_text(300), turns=4, batch=1000)
        mine = store.scripts["snapshot_page"].source
        other = load_registry("memory", root=args.other)["snapshot_page"].source
        shas = {"this": client.script_load(mine), "other": client.script_load(other)}
        pages = _pages(store, client)
        durations: dict[str, list[int]] = {"this": [], "other": []}
        mismatches = 0
        for r in range(repeats):
            for i, (part, members) in enumerate(pages):
                call = snapshot_page_call(store.core, part, members)
                order = ("this", "other") if (i + r) % 2 == 0 else ("other", "this")
                replies = {}
                for name in order:
                    client.slowlog_reset()
                    replies[name] = client.evalsha(
                        shas[name], len(call.keys), *call.keys, *call.args
                    )
                    (entry,) = [
                        e for e in client.slowlog_get(10) if shas[name].encode() in e["command"]
                    ]
                    durations[name].append(int(entry["duration"]))
                # the clock readings (first two elements) differ between two calls
                if replies["this"][2:] != replies["other"][2:]:
                    mismatches += 1
        meta = machine_meta(client)
        meta["server_pid"] = server.pid()
        store.close()
        client.close()
    summary = {
        name: {
            **spread(values),
            "p10_us": sorted(values)[len(values) // 10],
            "p90_us": sorted(values)[len(values) * 9 // 10],
        }
        for name, values in durations.items()
    }
    ratio = statistics.median(durations["this"]) / statistics.median(durations["other"])
    data = {
        "meta": {
            **meta,
            "tool": "bench.page_ab",
            "sessions": sessions,
            "pages": len(pages),
            "repeats": repeats,
            "other": str(args.other),
            "populate_failures": failed,
            "load_at_end": loadavg(),
        },
        "summary": summary,
        "this_over_other_median": ratio,
        "reply_mismatches": mismatches,
    }
    out = write_json(args.out / f"page-ab{args.tag}{'-quick' if args.quick else ''}.json", data)
    for name, s in summary.items():
        print(
            f"{name:>6}: {s['median']:.0f} us per page call (p10 {s['p10_us']}, p90"
            f" {s['p90_us']}), {s['n']} calls over {len(pages)} pages"
        )
    print(f"this / other (median): x{ratio:.3f}; reply mismatches: {mismatches}; wrote {out}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
