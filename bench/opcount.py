"""Where the client's Python work per operation goes: bytecodes executed, per function.

``python -m bench.opcount [--rows a,b] [--ops N] [--top K] [--out FILE|DIR] [--quick]``

``bench.icount`` counts every instruction of the client process; this says which Python
functions run the bytecode part of them.  On a private ``redis-server`` (free loopback
port, temp dir, stopped by pid), each row sets up its sessions, then runs ``N``
operations under ``sys.settrace`` with opcode events on, counting the bytecodes each
function executes (the event loop's own functions included on asyncio rows).  Like
instruction counts, these counts do not depend on the machine's load: the same code and
inputs give the same counts.  A bytecode is not a fixed cost (a call or a C method behind
one may cost hundreds of instructions), so read them for where Python time goes, and
``bench.icount`` for how much the whole costs.

Rows: ``append``, ``context`` (sync) and ``aio.append``, ``aio.context`` (asyncio), as in
``bench.icount``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import redis
import redis.asyncio

from bench.probe import ROOT, exit_on_sigterm, machine_meta, parse_round_args, write_json
from bench.server import HOST, BenchRedis
from bench.workloads import KeyPool, bench_config, chat_text
from memtier import AsyncConversationStore, AvatarMessage, ConversationStore

__all__ = ["ROWS", "main"]

ROWS = ("append", "context", "aio.append", "aio.context")
SESSIONS = 20
SETUP_TURNS = 25  # per session before the counted operations (context reads 20)

Counts = collections.Counter[tuple[str, str]]


_LIBRARY = re.compile(r"/lib/python3\.\d+/(?:site-packages/)?(.*)$")


def _where(path: str) -> str:
    """``path`` as read in a table: the package path of a library or stdlib module, the
    repository path of memtier's own."""
    library = _LIBRARY.search(path)
    if library is not None:
        return library.group(1)
    root = str(ROOT) + "/"
    return path[len(root) :] if path.startswith(root) else path


def _tracer(counts: Counts) -> Callable[[FrameType, str, Any], Any]:
    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            counts[(code.co_filename, code.co_name)] += 1
        return trace

    return trace


def _sync_row(row: str, port: int, ops: int, counts: Counts) -> None:
    client = redis.Redis(host=HOST, port=port)
    store = ConversationStore(client, bench_config(f"oc{ROWS.index(row)}"))
    keys, text = KeyPool(5, SESSIONS), chat_text(300)
    for _ in range(SESSIONS * SETUP_TURNS):
        store.append(keys.next(), AvatarMessage(text=text))
    messages = [AvatarMessage(text=text) for _ in range(ops)]
    sys.settrace(_tracer(counts))
    try:
        for message in messages:
            if row == "append":
                store.append(keys.next(), message)
            else:
                store.context(keys.next(), limit=20)
    finally:
        sys.settrace(None)
    client.close()


async def _async_row(row: str, port: int, ops: int, counts: Counts) -> None:
    client = redis.asyncio.Redis(host=HOST, port=port)
    store = AsyncConversationStore(client, bench_config(f"oc{ROWS.index(row)}"))
    keys, text = KeyPool(5, SESSIONS), chat_text(300)
    for _ in range(SESSIONS * SETUP_TURNS):
        await store.append(keys.next(), AvatarMessage(text=text))
    messages = [AvatarMessage(text=text) for _ in range(ops)]
    sys.settrace(_tracer(counts))  # this task's frames; the loop's run in its own calls
    try:
        for message in messages:
            if row == "aio.append":
                await store.append(keys.next(), message)
            else:
                await store.context(keys.next(), limit=20)
    finally:
        sys.settrace(None)
    await client.aclose()


def _count_row(row: str, port: int, ops: int) -> Counts:
    counts: Counts = collections.Counter()
    if row.startswith("aio."):
        loop = asyncio.new_event_loop()
        try:
            # The trace function is per thread: set inside the task, it also sees the
            # event loop's callbacks that run between the task's steps.
            loop.run_until_complete(_async_row(row, port, ops, counts))
        finally:
            loop.close()
    else:
        _sync_row(row, port, ops, counts)
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.opcount", description=__doc__)
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated, of: " + ", ".join(ROWS))
    p.add_argument("--ops", type=int, default=300)
    p.add_argument("--rounds", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--top", type=int, default=30, help="functions listed per row")
    args = parse_round_args(p, argv, "opcount")
    if args.quick:
        args.rows, args.ops = "append,aio.append", 20
    rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        p.error(f"unknown rows: {', '.join(unknown)}")
    exit_on_sigterm()
    started = time.time()
    out: dict[str, Any] = {}
    with BenchRedis() as server:
        meta = machine_meta(redis.Redis(host=HOST, port=server.port)) | {"server_pid": server.pid()}
        for row in rows:
            counts = _count_row(row, server.port, args.ops)
            by_file: collections.Counter[str] = collections.Counter()
            for (path, _), n in counts.items():
                by_file[_where(path)] += n
            top = [
                {"function": f"{_where(path)}:{name}", "per_op": n / args.ops}
                for (path, name), n in counts.most_common(args.top)
            ]
            out[row] = {
                "per_op": sum(counts.values()) / args.ops,
                "by_file": {f: n / args.ops for f, n in by_file.most_common(args.top)},
                "top": top,
            }
            print(f"\n{row}: {out[row]['per_op']:,.0f} bytecodes per op")
            for entry in top:
                print(f"  {entry['per_op']:8,.1f}  {entry['function']}")
    data = {
        "probe": "opcount",
        "ops": args.ops,
        "seconds": round(time.time() - started, 1),
        "meta": meta,
        "rows": out,
    }
    print(f"wrote {write_json(args.out, data)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
