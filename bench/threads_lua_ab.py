"""A/B of two trees' thread scripts on the same server, same threads, interleaved.

``python -m bench.threads_lua_ab --other /path/to/other/tree/lua [--quick] [--turns N]``

On a private ``redis-server`` (``SLOWLOG`` threshold 0), two
:class:`~memtier.threads.service.ConversationService` instances share one client: one
runs this tree's ``lua/threads`` scripts, the other the ``--other`` tree's (their ARGV
and replies must be the same).  ``--threads`` threads get ``--turns`` turns each first,
alternating between the two services; then each round runs ``--ops`` continues (echo
runner, 300 B), the service alternating call by call (so each thread's history cache
is always its own service's), and reads every script call's ``SLOWLOG`` duration.
Reports each script's median per tree (microseconds inside Redis), the inner commands
per continue, and checks that every continue of both completed with the history the
thread holds (a cut of Lua work, not of what the runner is given).
"""

from __future__ import annotations

import argparse
import collections
import statistics
from pathlib import Path
from typing import Any

from bench.probe import RESULTS_DIR, exit_on_sigterm, loadavg, machine_meta, spread, write_json
from bench.server import BenchRedis
from bench.workloads import bench_config, chat_text

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.threads_lua_ab", description=__doc__.split("\n")[0]
    )
    p.add_argument("--other", type=Path, required=True, help="the other tree's lua/ directory")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--threads", type=int, default=0, help="threads (200)")
    p.add_argument("--turns", type=int, default=-1, help="turns on each thread first (15)")
    p.add_argument("--ops", type=int, default=0, help="continues per round (400)")
    p.add_argument("--rounds", type=int, default=0, help="rounds (6)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    p.add_argument("--tag", default="")
    args = p.parse_args(argv)
    exit_on_sigterm()
    from memtier.scripts import load_registry, lua_root
    from memtier.threads.models import Ownership
    from memtier.threads.runner import EchoRunner, RunnerReply, RunnerTurn
    from memtier.threads.service import ConversationService

    threads = args.threads or (10 if args.quick else 200)
    turns = args.turns if args.turns >= 0 else (2 if args.quick else 15)
    ops = args.ops or (20 if args.quick else 400)
    rounds = args.rounds or (1 if args.quick else 6)
    text = chat_text(300)
    owner = Ownership("bench", "ab")
    wrong: list[str] = []

    echo = EchoRunner()

    def runner(turn: RunnerTurn) -> RunnerReply:
        # the echo runner (one event, one reply), checked: every turn sees the thread's
        # whole history, two entries per earlier turn, in order
        tid = turn.thread.id
        ids = [entry.id for entry in turn.history]
        if ids != [f"e{n}" for n in range(1, 2 * done[tid] + 1)]:
            wrong.append(f"{tid}: {len(ids)} entries, expected {2 * done[tid]}")
        return echo(turn)

    done: collections.Counter[str] = collections.Counter()
    extra = {"slowlog-log-slower-than": "0", "slowlog-max-len": "1000000"}
    with BenchRedis(extra=extra) as server:
        client = server.client()
        trees = {"this": lua_root(), "other": args.other}
        services = {}
        names: dict[bytes, tuple[str, str]] = {}
        for tree, root in trees.items():
            service = ConversationService(client, bench_config("threadsab"), runner=runner)
            service.scripts = load_registry("threads", root=root)
            services[tree] = service
            for name in service.scripts.names():
                names[service.scripts[name].sha.encode()] = (tree, name)
        if len(names) != 2 * len(services["this"].scripts.names()):
            raise SystemExit("the two trees share a script (same SHA): nothing to compare")
        pool = [services["this"].create(owner, title=f"t{i}").id for i in range(threads)]

        def turn(tree: str, thread_id: str) -> None:
            services[tree].continue_(owner, thread_id, text)
            done[thread_id] += 1

        for r in range(turns):
            for i, tid in enumerate(pool):
                turn(("this", "other")[(i + r) % 2], tid)
        durations: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
        inner: collections.Counter[str] = collections.Counter()
        for r in range(rounds):
            client.slowlog_reset()
            for j in range(ops):
                turn(("this", "other")[(j + r) % 2], pool[j % threads])
            for entry in client.slowlog_get(1_000_000):
                command: list[Any] = entry["command"].split()
                if command[0].upper() == b"EVALSHA" and command[1] in names:
                    durations[names[command[1]]].append(int(entry["duration"]))
                elif command[0].upper() not in (b"SLOWLOG", b"EVALSHA"):
                    inner[command[0].decode().upper()] += 1
        meta = machine_meta(client)
        meta["server_pid"] = server.pid()
        for service in services.values():
            service.close()
        client.close()
    scripts = sorted({name for _, name in durations})
    summary = {
        f"{name}.{tree}": spread(durations[(tree, name)])
        for name in scripts
        for tree in trees
        if durations[(tree, name)]
    }
    ratios = {
        name: statistics.median(durations[("this", name)])
        / statistics.median(durations[("other", name)])
        for name in scripts
        if durations[("this", name)] and durations[("other", name)]
    }
    continues = ops * rounds
    data = {
        "meta": {
            **meta,
            "tool": "bench.threads_lua_ab",
            "threads": threads,
            "turns_first": turns,
            "ops": ops,
            "rounds": rounds,
            "other": str(args.other),
            "load_at_end": loadavg(),
        },
        "summary_us": summary,
        "this_over_other_median": ratios,
        "inner_commands_per_continue": {k: v / continues for k, v in inner.most_common()},
        "wrong_histories": wrong[:20],
    }
    name = f"threads-lua-ab{args.tag}{'-quick' if args.quick else ''}.json"
    out = write_json(args.out / name, data)
    for key, s in summary.items():
        print(f"{key:>24}: {s['median']:.0f} us per call, {s['n']} calls")
    for key, ratio in ratios.items():
        print(f"{key:>24}: this / other (median) x{ratio:.3f}")
    print(f"wrong histories: {len(wrong)}; wrote {out}")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
