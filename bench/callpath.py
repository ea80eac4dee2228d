"""Where the client-side microseconds of one append and one context read go.

``python -m bench.callpath [--quick] [--ops N] [--rounds K] [--out DIR]``

On a private ``redis-server`` (free loopback port, temp dir, stopped by pid), in rounds
whose order rotates (so the load of this shared machine falls on every row alike), each
row performs ``N`` operations on one connection and reports microseconds per operation.
The rows peel the call path one layer at a time, so the difference between two adjacent
rows (computed per round) is the cost of one layer:

* the minimal script (``bench/minimal_append-4.lua``) by ``client.evalsha``, by redis-py's
  low-level ``Connection.send_command``, and by a **lean** call: the command packed once
  and written with ``send_packed_command`` + ``read_response`` (hiredis) on a connection
  taken from the client's pool;
* memtier's ``append_turn`` with ARGV prepared beforehand (fresh uuid4 turn ids, so every
  call stores): lean pre-packed, packed per call, ``Connection.send_command``,
  ``client.evalsha``, memtier's ``LuaScript`` wrapper (metrics, NOSCRIPT), then the store's
  shell (guard, retry, event metrics) and finally ``store.append`` (model, prepare,
  redaction, ids, ARGV, decode);
* the context read: raw ``LRANGE`` 20 + orjson, the former ``read_context`` script (turns
  through Lua) lean and by ``client.evalsha``, memtier's read transaction (``MULTI``,
  ``context_head``, ``LRANGE``, ``EXEC``) lean pre-packed, and ``store.context(limit=20)``;
* the client-only stages timed alone (no I/O).

Then a pyinstrument profile of ``store.append`` and ``store.context`` loops (text trees
under ``--out``, folded into self time per function in the JSON), and py-spy if it is
installed and may sample this process.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import redis

from bench import pyprofile
from bench.probe import RESULTS_DIR, exit_on_sigterm, fmt, loadavg, machine_meta, spread, write_json
from bench.server import BenchRedis
from bench.workloads import MINIMAL_SCRIPT, KeyPool, bench_config, chat_text, populate
from memtier import AvatarMessage, ConversationStore

__all__ = ["main"]

SPY_RATE = 250  # py-spy samples per second (blocking: each sample pauses the process)
Row = Callable[[int], tuple[float, float]]  # n -> (wall s, this process's CPU s) for n ops


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(t: tuple[float, float]) -> tuple[float, float]:
    return time.perf_counter() - t[0], time.process_time() - t[1]


class Rig:
    """The server, the store, and pre-built calls for every row."""

    def __init__(self, server: BenchRedis, ops: int) -> None:
        self.client: redis.Redis = server.client()
        self.store = ConversationStore(self.client, bench_config("callpath"))
        self.core = self.store.core
        self.text = chat_text(300)
        self.append_pool = KeyPool(61, 1000)
        self.read_pool = KeyPool(62, 32)
        populate(self.store, self.read_pool.keys, self.text, turns=100)
        for key in self.append_pool.keys:  # every append below goes to an existing session
            self.store.append(key, AvatarMessage(text=self.text))
        self.script = self.store.scripts["append_turn"]
        self.read_script = self.store.scripts["read_context"]
        self.head_script = self.store.scripts["context_head"]
        for loaded in (self.script, self.read_script, self.head_script):
            self.client.script_load(loaded.source)
        self.min_sha = str(self.client.script_load(MINIMAL_SCRIPT.read_text(encoding="utf-8")))
        self.conn: Any = self.client.connection_pool.get_connection()
        self.ops = ops
        self.i = 0
        self.lists = [f"{{cp}}:r:{i}" for i in range(32)]
        entry = orjson.dumps({"role": "user", "content": self.text})
        for list_key in self.lists:
            self.client.delete(list_key)
            self.client.rpush(list_key, *([entry] * 100))

    def close(self) -> None:
        self.client.connection_pool.release(self.conn)
        self.client.close()

    # --- pre-built arguments (never inside a timed loop) ----------------------------------
    def minimal_args(self, n: int) -> list[tuple[Any, ...]]:
        out = []
        for _ in range(n):
            self.i += 1
            sid = f"{self.i % 1000:012d}"
            keys = ("{cq}:q:" + sid, "{cq}:t:" + sid, "{cq}:meta", "{cq}:lru")
            out.append((self.min_sha, 4, *keys, self.text, "m" + sid))
        return out

    def append_calls(self, n: int) -> list[Any]:
        core, pool = self.core, self.append_pool
        return [
            core.append_call(core.prepare_turn(pool.next(), AvatarMessage(text=self.text)))
            for _ in range(n)
        ]

    def append_args(self, n: int) -> list[tuple[Any, ...]]:
        sha, nk = self.script.sha, self.script.num_keys
        return [(sha, nk, *c.keys, *c.args) for c in self.append_calls(n)]

    def read_args(self, n: int) -> list[tuple[Any, ...]]:
        sha, nk = self.read_script.sha, self.read_script.num_keys
        out = []
        for _ in range(n):
            c = self.core.script_context_call(self.read_pool.next(), 20)
            out.append((sha, nk, *c.keys, *c.args))
        return out

    def read_transactions(self, n: int) -> list[Any]:
        """The context read as memtier's lean path sends it, packed: MULTI, the session
        check (HMGET, TIME, HGET: its plain form), LRANGE, EXEC."""
        out = []
        for _ in range(n):
            tx = self.core.context_call(self.read_pool.next(), 20)
            assert tx.plain is not None
            commands = [("MULTI",), *tx.plain.commands, *tx.reads, ("EXEC",)]
            out.append((self.conn.pack_commands(commands), len(commands)))
        return out


def _timed(prepare: Callable[[int], Any], body: Callable[[Any], None]) -> Row:
    def row(n: int) -> tuple[float, float]:
        data = prepare(n)
        t0 = _clock()
        body(data)
        return _since(t0)

    return row


def build_rows(rig: Rig) -> dict[str, tuple[str, Row]]:
    client, conn, store = rig.client, rig.conn, rig.store
    script = rig.script
    pack = conn.pack_command

    def evalsha_all(args: list[tuple[Any, ...]]) -> None:
        for a in args:
            client.evalsha(*a)

    def send_command_all(args: list[tuple[Any, ...]]) -> None:
        for a in args:
            conn.send_command("EVALSHA", *a)
            conn.read_response()

    def lean_packed(packed: list[Any]) -> None:
        for p in packed:
            conn.send_packed_command(p)
            conn.read_response()

    def lean_pack_each(args: list[tuple[Any, ...]]) -> None:
        for a in args:
            conn.send_packed_command(pack("EVALSHA", *a))
            conn.read_response()

    def lean_pool_each(args: list[tuple[Any, ...]]) -> None:
        pool = client.connection_pool
        for a in args:
            c: Any = pool.get_connection()
            try:
                c.send_packed_command(c.pack_command("EVALSHA", *a))
                c.read_response()
            finally:
                pool.release(c)

    def prepacked(make: Callable[[int], list[tuple[Any, ...]]]) -> Callable[[int], list[Any]]:
        return lambda n: [pack("EVALSHA", *a) for a in make(n)]

    def luascript_all(calls: list[Any]) -> None:
        for c in calls:
            script(client, c.keys, c.args)

    rows: dict[str, tuple[str, Row]] = {
        "min.evalsha": ("minimal script: client.evalsha", _timed(rig.minimal_args, evalsha_all)),
        "min.send_command": (
            "minimal script: Connection.send_command + read_response",
            _timed(rig.minimal_args, send_command_all),
        ),
        "min.lean": (
            "minimal script: lean (packed once, send_packed_command + read_response)",
            _timed(prepacked(rig.minimal_args), lean_packed),
        ),
        "append.lean": (
            "append_turn: lean, pre-packed",
            _timed(prepacked(rig.append_args), lean_packed),
        ),
        "append.lean_pack": (
            "append_turn: lean, packed per call",
            _timed(rig.append_args, lean_pack_each),
        ),
        "append.lean_pool": (
            "append_turn: lean, packed per call, pool get/release per call",
            _timed(rig.append_args, lean_pool_each),
        ),
        "append.send_command": (
            "append_turn: Connection.send_command + read_response",
            _timed(rig.append_args, send_command_all),
        ),
        "append.evalsha": ("append_turn: client.evalsha", _timed(rig.append_args, evalsha_all)),
        "append.luascript": (
            "append_turn: memtier LuaScript.__call__ (metrics, NOSCRIPT)",
            _timed(rig.append_calls, luascript_all),
        ),
    }
    retrying = getattr(store, "_retrying", None)
    if callable(retrying):  # private plumbing (being restructured): measured when present

        def shell_all(calls: list[Any]) -> None:
            for c in calls:
                retrying("append", c)

        rows["append.shell"] = (
            "append_turn: store shell (guard + retry + event metrics + script)",
            _timed(rig.append_calls, shell_all),
        )

    def store_append(n: int) -> tuple[float, float]:
        pool, text = rig.append_pool, rig.text
        t0 = _clock()
        for _ in range(n):
            store.append(pool.next(), AvatarMessage(text=text))
        return _since(t0)

    rows["append.store"] = ("store.append (all of it)", store_append)

    # --- reads --------------------------------------------------------------------------------
    loads = orjson.loads

    def lrange(n: int) -> tuple[float, float]:
        keys = rig.lists
        t0 = _clock()
        for j in range(n):
            items = [loads(x) for x in client.lrange(keys[j % 32], -20, -1)]
            assert len(items) == 20
        return _since(t0)

    def lean_read(packed: list[Any]) -> None:
        for p in packed:
            conn.send_packed_command(p)
            conn.read_response()

    def lean_transaction(packed: list[tuple[Any, int]]) -> None:
        for p, count in packed:
            conn.send_packed_command(p)
            for _ in range(count - 1):  # +OK of MULTI, +QUEUED of each command
                conn.read_response()
            replies = conn.read_response()
            assert len(replies[-1]) == 20

    def store_context(n: int) -> tuple[float, float]:
        pool = rig.read_pool
        t0 = _clock()
        for _ in range(n):
            store.context(pool.next(), limit=20)
        return _since(t0)

    rows.update(
        {
            "read.lrange": ("raw LRANGE 20 + orjson: client.lrange", lrange),
            "read.lean": (
                "read_context: lean, pre-packed (no decoding)",
                _timed(prepacked(rig.read_args), lean_read),
            ),
            "read.tx_lean": (
                "context transaction (MULTI, HMGET, TIME, HGET, LRANGE, EXEC): lean,"
                " pre-packed (no decoding)",
                _timed(rig.read_transactions, lean_transaction),
            ),
            "read.evalsha": (
                "read_context: client.evalsha (no decoding)",
                _timed(rig.read_args, evalsha_all),
            ),
            "read.store": ("store.context(limit=20) (all of it)", store_context),
        }
    )
    return rows


# Layers: (name, upper row, lower row): upper - lower = the cost of that layer.
LAYERS = [
    ("redis-py command machinery, minimal script", "min.evalsha", "min.send_command"),
    ("packing per call, minimal script", "min.send_command", "min.lean"),
    (
        "append_turn vs minimal script, both lean (server + bigger request)",
        "append.lean",
        "min.lean",
    ),
    ("packing 32 args per call", "append.lean_pack", "append.lean"),
    ("pool get/release per call", "append.lean_pool", "append.lean_pack"),
    ("Connection.send_command vs pack+send_packed", "append.send_command", "append.lean_pack"),
    ("redis-py command machinery (client.evalsha)", "append.evalsha", "append.send_command"),
    ("memtier LuaScript wrapper", "append.luascript", "append.evalsha"),
    ("store shell: guard + retry + event metrics", "append.shell", "append.luascript"),
    ("store.append's own work: model, prepare, ids, ARGV, decode", "append.store", "append.shell"),
    ("store.append total vs client.evalsha of the minimal script", "append.store", "min.evalsha"),
    ("store.append total vs the lean minimal call", "append.store", "min.lean"),
    ("read_context vs LRANGE (server Lua + machinery)", "read.evalsha", "read.lrange"),
    ("redis-py machinery, read_context", "read.evalsha", "read.lean"),
    (
        "read_context (turns through Lua) vs the transaction, both lean",
        "read.lean",
        "read.tx_lean",
    ),
    ("the lean transaction vs raw LRANGE + orjson", "read.tx_lean", "read.lrange"),
    ("store.context's own work: decode, models, guard/retry", "read.store", "read.tx_lean"),
    ("store.context total vs raw LRANGE + orjson", "read.store", "read.lrange"),
]


def stage_rows(rig: Rig, n: int) -> dict[str, float]:
    """Client-only stages (us per op): the best of 5 loops of ``n / 5`` each."""
    from memtier.memory import core as core_mod
    from memtier.redaction import redact

    core, text = rig.core, rig.text
    key = rig.append_pool.keys[0]
    turn = AvatarMessage(text=text)
    prepared = core.prepare_turn(key, turn)
    call = core.append_call(prepared)
    reply = rig.script(rig.client, call.keys, call.args)
    ctx_reply = rig.store.executor.execute(core.context_call(rig.read_pool.keys[0], 20))
    args = (rig.script.sha, rig.script.num_keys, *call.keys, *call.args)
    stages: dict[str, Callable[[], Any]] = {
        "AvatarMessage(text=...)": lambda: AvatarMessage(text=text),
        "core.prepare_turn (validate, redact, bound, JSON)": lambda: core.prepare_turn(key, turn),
        "  redaction.redact() alone": lambda: redact(text),
        "  uuid.uuid4().hex": lambda: uuid.uuid4().hex,
        "core.append_call (keys + ARGV)": lambda: core.append_call(prepared),
        "  new_session_id()": core_mod.new_session_id,
        "Connection.pack_command of the 32 args": lambda: rig.conn.pack_command("EVALSHA", *args),
        "core.decode_append (receipt)": lambda: core.decode_append(prepared, reply),
        "core.context_call": lambda: core.context_call(key, 20),
        "core.decode_context (20 turns)": lambda: core.decode_context(
            rig.read_pool.keys[0], ctx_reply
        ),
    }
    out = {}
    chunk = max(1, n // 5)
    for label, fn in stages.items():
        best = float("inf")
        for _ in range(5):  # the best of 5: load on this shared machine only adds time
            t0 = time.perf_counter()
            for _ in range(chunk):
                fn()
            best = min(best, (time.perf_counter() - t0) / chunk * 1e6)
        out[label] = best
    return out


def _py_spy(out_dir: Path, quick: bool) -> dict[str, Any]:
    """py-spy, where installed: a short record of a child running the append loop."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        return {"status": "not installed"}
    target = out_dir / "pyspy-callpath-append.txt"
    ops = 300 if quick else 10000
    cmd = [
        exe,
        "record",
        "--nonblocking",
        "--format",
        "raw",
        "--rate",
        str(SPY_RATE),
        "-o",
        str(target),
        "--",
    ]
    cmd += [sys.executable, "-m", "bench.callpath", "--spy-child", "--ops", str(ops)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        return {"status": "failed", "stderr": proc.stderr[-800:]}
    # One loop of appends then one of context reads: CPU shares of both together, and of
    # each (stacks through ConversationStore.append / .context).
    return {
        "status": "ok",
        "path": str(target),
        "cpu_only": "py-spy without --idle: samples only while on a CPU (no socket waits)",
        "append": pyprofile.fold_collapsed(
            target, "ConversationStore.append", NAMED, rate_hz=SPY_RATE, ops=ops
        ),
        "context": pyprofile.fold_collapsed(
            target, "ConversationStore.context", NAMED, rate_hz=SPY_RATE, ops=ops
        ),
    }


def _spy_loop(rig: Rig, ops: int) -> None:
    """The loop py-spy's samples are kept from (``fold_collapsed`` marker)."""
    for _ in range(ops):
        rig.store.append(rig.append_pool.next(), AvatarMessage(text=rig.text))
    for _ in range(ops):
        rig.store.context(rig.read_pool.next(), limit=20)


def _spy_child(ops: int) -> int:
    with BenchRedis() as server:
        rig = Rig(server, ops)
        _spy_loop(rig, ops)
        rig.close()
    return 0


NAMED = [
    "ConversationStore.append",
    "ConversationStore.context",
    "MemoryCore.prepare_turn",
    "MemoryCore.append_call",
    "MemoryCore.decode_append",
    "MemoryCore.decode_context",
    "MemoryCore.context_call",
    "sanitize",
    "redact",
    "uuid4",
    "new_session_id",
    "retry_sync",
    "LuaScript.__call__",
    "Redis.execute_command",
    "Connection.pack_command",
    "Connection.send_packed_command",
    "Connection.read_response",
    "_HiredisParser.read_response",
    "count_script_events",
    "Histogram.observe",
    "ConnectionPool.get_connection",
    "ConnectionPool.release",
]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.callpath", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="seconds: what the smoke test runs")
    p.add_argument("--ops", type=int, default=0, help="operations per row per round (200)")
    p.add_argument("--rounds", type=int, default=0, help="rounds, rows interleaved (41)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for JSON + profiles")
    p.add_argument("--no-py-spy", action="store_true", help="do not try py-spy")
    p.add_argument("--spy-child", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    exit_on_sigterm()
    ops = args.ops or (50 if args.quick else 200)
    if args.spy_child:
        return _spy_child(ops)
    rounds = args.rounds or (2 if args.quick else 41)
    tag = "-quick" if args.quick else ""
    args.out.mkdir(parents=True, exist_ok=True)
    with BenchRedis() as server:
        rig = Rig(server, ops)
        meta = machine_meta(rig.client)
        meta.update(
            tool="bench.callpath",
            ops=ops,
            rounds=rounds,
            payload_bytes=300,
            server_pid=server.pid(),
        )
        rows = build_rows(rig)
        for _, row in rows.values():  # warm-up: scripts loaded, pools sized, caches hot
            row(min(ops, 50))
        per_round: dict[str, list[float]] = {k: [] for k in rows}
        cpu_round: dict[str, list[float]] = {k: [] for k in rows}
        loads = []
        names = list(rows)
        print(f"callpath: {len(rows)} rows x {rounds} rounds x {ops} ops; load {loadavg()}")
        for r in range(rounds):
            loads.append({"round": r, **loadavg()})
            for name in names[r % len(names) :] + names[: r % len(names)]:
                wall, cpu = rows[name][1](ops)
                per_round[name].append(wall / ops * 1e6)
                cpu_round[name].append(cpu / ops * 1e6)
            print(f"  round {r + 1}/{rounds}; load {loads[-1]}", flush=True)
        stages = stage_rows(rig, ops * 2)
        profiles: dict[str, Any] = {}
        if pyprofile.available():
            n = ops * 2
            profiles["append"] = pyprofile.profile_loop(
                lambda: rig.store.append(rig.append_pool.next(), AvatarMessage(text=rig.text)),
                n,
                args.out / f"profile-callpath-append{tag}.txt",
                NAMED,
            )
            profiles["context"] = pyprofile.profile_loop(
                lambda: rig.store.context(rig.read_pool.next(), limit=20),
                n,
                args.out / f"profile-callpath-context{tag}.txt",
                NAMED,
            )
        rig.close()
    spy = {"status": "skipped"} if args.no_py_spy else _py_spy(args.out, args.quick)
    summary: dict[str, dict[str, Any]] = {
        k: {"label": rows[k][0], **spread(v)} for k, v in per_round.items()
    }
    cpu_spread = {k: spread(v) for k, v in cpu_round.items()}
    layers = []
    for label, upper, lower in LAYERS:
        if upper in per_round and lower in per_round:
            diffs = [a - b for a, b in zip(per_round[upper], per_round[lower], strict=True)]
            layers.append(
                {
                    "layer": label,
                    "upper": upper,
                    "lower": lower,
                    "us": spread(diffs),
                    # difference of the quiet rounds (10th percentile of each row): what
                    # each layer costs when little else competes for the CPU
                    "us_p10": summary[upper]["p10"] - summary[lower]["p10"],
                    "us_min": summary[upper]["min"] - summary[lower]["min"],
                    # the client's own CPU (user + system) per op: what load cannot inflate
                    "cpu_us": spread(
                        [a - b for a, b in zip(cpu_round[upper], cpu_round[lower], strict=True)]
                    ),
                }
            )
    data = {
        "meta": {**meta, "load_per_round": loads, "py_spy": spy},
        "rows_us_per_op": summary,
        "rounds_us_per_op": per_round,
        "client_cpu_us_per_op": cpu_spread,
        "rounds_client_cpu_us_per_op": cpu_round,
        "layers_us_per_op": layers,
        "stages_us_per_op": stages,
        "profiles": profiles,
    }
    out = write_json(args.out / f"callpath{tag}.json", data)
    _print(summary, cpu_spread, layers, stages, profiles)
    print(f"wrote {out}")
    return 0


def _print(
    summary: dict[str, Any],
    cpu: dict[str, Any],
    layers: list[dict[str, Any]],
    stages: dict[str, float],
    profiles: dict[str, Any],
) -> None:
    print("\n| row | wall us/op: min, p10 | median [min-max] | client CPU us/op |")
    print("|---|---:|---:|---:|")
    for key, row in summary.items():
        print(
            f"| {row['label']} | {row['min']:.1f}, {row['p10']:.1f} | {fmt(row)}"
            f" | {fmt(cpu[key])} |"
        )
    print("\n| layer (upper - lower) | wall: min-min, p10-p10 | per round | client CPU |")
    print("|---|---:|---:|---:|")
    for layer in layers:
        print(
            f"| {layer['layer']} | {layer['us_min']:.1f}, {layer['us_p10']:.1f}"
            f" | {fmt(layer['us'])} | {fmt(layer['cpu_us'])} |"
        )
    print("\n| client-only stage | us per op |\n|---|---:|")
    for label, us in stages.items():
        print(f"| {label} | {us:.1f} |")
    for name, prof in profiles.items():
        print(f"\npyinstrument {name}: {prof['total_us']:.1f} us per op; self time, top 15:")
        for fn, us in prof["self"][:15]:
            print(f"  {us:7.1f}  {fn}")
        with contextlib.suppress(KeyError):
            print(
                "  inclusive: "
                + ", ".join(f"{k} {v:.1f}" for k, v in prof["inclusive"].items() if v)
            )


if __name__ == "__main__":
    raise SystemExit(main())
