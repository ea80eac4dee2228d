"""Benchmark sections of the background work and the threads service.

* :func:`run_workers` -- compaction throughput, a flush against the disk's own sequential
  write rate, the longest append blocked while a flush runs, the recovery validation
  rate, a full restore against a flush of the same sessions (each with its baseline from
  the same run).
* :func:`run_threads` -- the threads service: create, continue (echo runner), replay
  pages, export, next to the raw minimal-script append.
"""

from __future__ import annotations

import math
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.framework import Harness, Measure, Result, timed
from bench.server import BenchRedis

__all__ = ["run_threads", "run_workers"]

THREAD_POOL = 200  # threads the continue benchmark rotates over
HISTORY_TURNS = 40  # turns of the thread that replay and export read
# The continue floor's threads: each holds FLOOR_TURNS turns (2 entries each), about the
# middle of what the continue row's threads hold during a full run (0 -> ~60 entries).
FLOOR_THREADS = 50
FLOOR_TURNS = 20
FLOOR_SCRIPTS = tuple(
    Path(__file__).with_name(name)
    for name in ("floor_claim-6.lua", "floor_emit-3.lua", "floor_commit-6.lua")
)
# memtier's own continue scripts replayed with no client work: (threads, turns on each
# first, continues per round) by profile; the threads grow by rounds x continues / threads
# turns over the group (full: 20 -> 44 entries, about the continue row's middle).
_REPLAY_SIZES = {"tiny": (20, 2, 20), "quick": (200, 10, 300), "full": (200, 10, 300)}


# (flush sessions, flush rounds, disk-rate bytes, compaction sessions, writer baseline s)
_WORKER_SIZES = {
    "tiny": (300, 1, 16 * 2**20, 10, 0.5),
    "quick": (10_000, 1, 64 * 2**20, 100, 2.0),
    "full": (100_000, 3, 256 * 2**20, 1_000, 3.0),
}


def run_workers(h: Harness, server: BenchRedis) -> None:
    """Compaction, flush against the disk's own write rate, appends blocked, recovery.

    Uses ``bench.workerbench``: each flush round
    first measures the disk's sequential write + fsync rate into the same directory,
    then flushes N sessions while two other processes append (and, before it, append
    without a flush for the baseline latency).
    """
    from bench import workerbench as bs

    sessions, rounds, disk_bytes, compact_n, baseline_s = _WORKER_SIZES[h.settings.profile]
    mib = 2**20
    disk: list[float] = []
    flush: list[float] = []
    blocked_ms: list[float] = []
    unpaired: list[str] = []  # rounds where one of the two windows had no append
    during_max_ms: list[float] = []
    base_max_ms: list[float] = []
    page_ms: list[float] = []  # the longest page round trip the flusher saw
    hold_ms: list[float] = []  # the longest page inside Redis (SLOWLOG): the shard held
    hold_p99_ms: list[float] = []
    floor_hold_ms: list[float] = []  # the same for a `return 1` script, same flush
    preempted: list[float] = []  # redis-server preempted during the flush (/proc)
    floor: list[float] = []  # the flush's bytes over the floor's seconds, MiB/s
    floor_disk: list[float] = []
    vs_floor: list[float] = []  # floor seconds / flush seconds
    extras: list[dict[str, Any]] = []
    recovery: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="memtier-bench-flush-") as tmp:
        for r in range(rounds):
            store_dir = Path(tmp) / f"round{r}"
            store_dir.mkdir()
            rate = bs.sequential_write_rate(store_dir, disk_bytes)
            res = bs.bench_flush_blocking(
                server.url,
                sessions=sessions,
                storage_path=store_dir,
                namespace=f"bflush{r}",
                writers=2,
                baseline_s=baseline_s,
                server_pid=server.pid() if hasattr(server, "pid") else None,
            )
            disk.append(rate["bytes_per_s"] / mib)
            flush.append(res["flush_bytes_per_s"] / mib)
            during_ms = res["during_flush"]["max_s"] * 1000
            base_ms = res["baseline"]["max_s"] * 1000
            # No append finished in a window (nan: the writers started late on a loaded
            # machine): that round has no figure -- max(0, nan) would read as 0 ms, met.
            if math.isfinite(during_ms) and math.isfinite(base_ms):
                during_max_ms.append(during_ms)
                base_max_ms.append(base_ms)
                blocked_ms.append(max(0.0, during_ms - base_ms))
            else:
                unpaired.append(
                    f"round {r}: {res['baseline']['n']} appends without the flush, "
                    f"{res['during_flush']['n']} during it"
                )
            page_ms.append(res["longest_page_call_s"] * 1000)
            if res.get("server_preempted") is not None:
                preempted.append(res["server_preempted"])
            if res.get("server_max_page_us"):  # None without CONFIG, 0 with no page logged
                hold_ms.append(res["server_max_page_us"] / 1000)
                hold_p99_ms.append(res.get("server_page_p99_us", 0) / 1000)
                # 0 = no call of it above the SLOWLOG threshold: the floor is below that
                floor_hold_ms.append(
                    max(res.get("hold_floor_max_us") or 0, 0) / 1000
                    or res.get("slowlog_threshold_us", 0) / 1000
                )
            if res.get("floor_s") and res.get("flush_s"):
                floor.append(res["flush_bytes"] / res["floor_s"] / mib)
                floor_disk.append(disk[-1])
                vs_floor.append(res["floor_s"] / res["flush_s"])
            extras.append(
                {k: v for k, v in res.items() if not isinstance(v, dict)}
                | {"baseline": res["baseline"], "during_flush": res["during_flush"]}
            )
            h.log(
                f"  flush round {r}: {res['sessions']:,} sessions, "
                f"{flush[-1]:,.1f} MiB/s vs disk {disk[-1]:,.1f} MiB/s; longest append "
                f"{during_ms:.1f} ms during, {base_ms:.1f} ms without; "
                f"longest page call {page_ms[-1]:.1f} ms"
                + (
                    f", inside Redis {hold_ms[-1]:.1f} ms (hold floor {floor_hold_ms[-1]:.1f} ms)"
                    if hold_ms and len(hold_ms) == r + 1
                    else ""
                )
            )
            if r == rounds - 1:
                files = sorted(
                    (p for p in store_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
                )
                if files:
                    recovery = bs.bench_recovery_validation(files[-1], f"bflush{r}")
    sec = "workers"
    h.add(
        Result(
            "workers.disk",
            sec,
            "disk sequential write + fsync (same directory)",
            "MiB/s",
            values=disk,
        )
    )
    h.add(
        Result(
            "workers.flush",
            sec,
            f"flush of {sessions:,} sessions to a new generation",
            "MiB/s",
            values=flush,
            baseline="workers.disk",
            ratios=[f / d for f, d in zip(flush, disk, strict=True) if d > 0],
            extra={"rounds": extras},
        )
    )
    if floor:
        h.add(
            Result(
                "workers.flush_floor",
                sec,
                "flush floor: the same snapshot_page calls, replies written raw + fsync",
                "MiB/s",
                values=floor,
                baseline="workers.disk",
                ratios=[f / d for f, d in zip(floor, floor_disk, strict=True) if d > 0],
                note="the flush's bytes over the floor's seconds; run right after the flush,"
                f" without the writers; flush / floor x{statistics.median(vs_floor):.2f}"
                f" [{min(vs_floor):.2f}-{max(vs_floor):.2f}] (floor s / flush s)",
                extra={"flush_vs_floor": vs_floor},
            )
        )
    h.add(
        Result(
            "workers.append_max_noflush",
            sec,
            "longest append (2 other processes), no flush",
            "ms",
            values=base_max_ms,
            higher_is_better=False,
            status="ok" if base_max_ms else "unavailable",
            note="no round had appends in both windows" if not base_max_ms else "",
        )
    )
    h.add(
        Result(
            "workers.append_max_flush",
            sec,
            "longest append (2 other processes) during the flush",
            "ms",
            values=during_max_ms,
            higher_is_better=False,
            status="ok" if during_max_ms else "unavailable",
            note="no round had appends in both windows" if not during_max_ms else "",
            baseline="workers.append_max_noflush",
            ratios=[a / b for a, b in zip(during_max_ms, base_max_ms, strict=True) if b > 0],
        )
    )
    h.add(
        Result(
            "workers.flush_blocked",
            sec,
            "appends blocked by the flush: longest during minus longest without",
            "ms",
            values=blocked_ms,
            higher_is_better=False,
            status="ok" if blocked_ms else "unavailable",
            note="target < 5 ms; noisy: one scheduler hiccup on 2 shared cores moves it"
            + (f"; not measured in {'; '.join(unpaired)}" if unpaired else ""),
        )
    )
    h.add(
        Result(
            "workers.flush_page_call",
            sec,
            "longest single snapshot_page round trip seen by the flusher",
            "ms",
            values=page_ms,
            higher_is_better=False,
            note="client wall time of the page calls not overlapped with page work:"
            " the round trip, reply parsing and the flusher's own scheduling, not only"
            " the shard's hold (workers.flush_page_hold)",
        )
    )
    h.add(
        Result(
            "workers.flush_page_hold",
            sec,
            "longest single snapshot_page call inside Redis (SLOWLOG: the shard held)",
            "ms",
            values=hold_ms,
            higher_is_better=False,
            status="ok" if hold_ms else "unavailable",
            note=(
                f"p99 of the pages {statistics.median(hold_p99_ms):.2f} ms"
                f" [{min(hold_p99_ms):.2f}-{max(hold_p99_ms):.2f}]"
                + (
                    f"; redis-server preempted {statistics.median(preempted):,.0f} times"
                    " during the flush (/proc, median of the rounds)"
                    if preempted
                    else ""
                )
                if hold_ms
                else "no SLOWLOG (CONFIG not allowed?)"
            ),
        )
    )
    h.add(
        Result(
            "workers.flush_hold_floor",
            sec,
            "hold floor: longest `return 1` script call inside Redis during the same flush",
            "ms",
            values=floor_hold_ms,
            higher_is_better=False,
            status="ok" if floor_hold_ms else "unavailable",
            note="a script of fixed, few-us cost called every ms by one more process under"
            " the same load: what it shows above that is the machine (redis-server"
            " preempted), not work; it runs few us per call, so it is hit less often"
            " than a page and is a lower bound of what preemption adds to one; a round where"
            " no call of it passed the SLOWLOG threshold counts as that threshold (0.1 ms)",
        )
    )
    if recovery is not None:
        h.add(
            Result(
                "workers.recovery",
                sec,
                "recovery validation (pass 1) of the generation",
                "MiB/s",
                values=[recovery["bytes_per_s"] / mib],
                baseline="workers.disk",
                ratios=[recovery["bytes_per_s"] / mib / statistics.median(disk)],
                note=f"{recovery['sessions_per_s']:,.0f} sessions/s",
                extra=recovery,
            )
        )
    restore = bs.bench_flush_restore(server.url, sessions=sessions, turns=2, namespace="brestore")
    h.log(
        f"  flush then restore of {restore['sessions']:,} sessions:"
        f" flush {restore['flush_sessions_per_s']:,.0f} sessions/s,"
        f" restore {restore['restore_sessions_per_s']:,.0f} sessions/s"
    )
    h.add(
        Result(
            "workers.flush_for_restore",
            sec,
            f"flush of {sessions:,} sessions (no other load; the restore's baseline)",
            "MiB/s",
            values=[restore["flush_bytes_per_s"] / mib],
            note=f"{restore['flush_sessions_per_s']:,.0f} sessions/s",
        )
    )
    h.add(
        Result(
            "workers.restore",
            sec,
            "full restore of that generation into the emptied namespace (both passes)",
            "MiB/s",
            values=[restore["restore_bytes_per_s"] / mib],
            baseline="workers.flush_for_restore",
            ratios=[restore["restore_bytes_per_s"] / restore["flush_bytes_per_s"]],
            note=f"{restore['restore_sessions_per_s']:,.0f} sessions/s",
            extra=restore,
        )
    )
    comp = bs.bench_compaction(server.url, sessions=compact_n, namespace="bcompact")
    h.add(
        Result(
            "workers.compaction",
            sec,
            f"compaction by one worker ({compact_n:,} sessions)",
            "sessions/s",
            values=[comp["sessions_per_s"]],
            extra=comp,
            note="sessions of 40 turns, one job each",
        )
    )


def run_threads(h: Harness, server: BenchRedis, baseline: Measure) -> None:
    """Threads service: create, continue (echo runner), replay pages, export.

    Same group as the raw minimal-script append (``baseline``), so each figure has a
    same-run ratio to the physical limit of one script call from Python.
    """
    from bench.workloads import bench_config, chat_text
    from memtier.threads.models import Ownership
    from memtier.threads.service import ConversationService

    client = server.client()
    service = ConversationService(client, bench_config("bthreads"))
    owner = Ownership("bench", "user1")
    text = chat_text(300)
    pool = [service.create(owner, title=f"t{i}").id for i in range(THREAD_POOL)]
    history = service.create(owner, title="history").id
    for _ in range(HISTORY_TURNS):
        service.continue_(owner, history, text)
    state = {"c": 0, "n": 0}

    def create(n: int) -> None:
        i = state["n"]
        for j in range(i, i + n):  # a fresh owner per 1,000 creates: under THREADS_PER_OWNER
            service.create(Ownership("bench", f"c{j // 1000}"))
        state["n"] = i + n

    def continue_(n: int) -> None:
        i = state["c"]
        for j in range(i, i + n):
            service.continue_(owner, pool[j % THREAD_POOL], text)
        state["c"] = i + n

    def replay(n: int) -> None:
        for _ in range(n):
            page = service.replay(owner, history)
            assert page.records

    def export(n: int) -> None:
        for _ in range(n):
            result = service.export(owner, history)
            assert result.events

    floor, python_floor = continue_floor_measures(server, service, text)
    own_scripts = continue_scripts_measure(h, server, service, text)
    h.group(
        "threads",
        [
            baseline,
            floor,
            python_floor,
            own_scripts,
            Measure("threads.create", "threads create", timed(create)),
            Measure("threads.continue", "threads continue, echo runner [300B]", timed(continue_)),
            Measure(
                "threads.replay",
                f"threads replay, first page of {HISTORY_TURNS} turns",
                timed(replay),
                unit="pages/s",
            ),
            Measure(
                "threads.export",
                f"threads export of {HISTORY_TURNS} turns",
                timed(export),
                unit="exports/s",
            ),
        ],
        ratios={
            k: baseline.key
            for k in (
                floor.key,
                python_floor.key,
                own_scripts.key,
                "threads.create",
                "threads.continue",
                "threads.replay",
                "threads.export",
            )
        },
    )
    client.close()


def continue_floor_measures(server: BenchRedis, service: Any, text: str) -> tuple[Measure, Measure]:
    """The floors of a continue: the Redis commands its three scripts require (claim with
    the history, one runner event, commit), one script each with no Lua logic
    (``bench/floor_{claim-6,emit-3,commit-6}.lua``), sent by ``redis-benchmark -c 1``
    (the C floor) and, the same three calls, from Python on a pre-encoded socket, packed
    before the clock starts, one round trip each (the Python floor: what three round
    trips from a Python process cost when the client does no work at all).

    Its threads are real ones (``FLOOR_THREADS`` threads of ``FLOOR_TURNS`` turns, written
    by ``service``), named so that redis-benchmark's ``__rand_int__`` picks one per call;
    the rows and entries it writes have the sizes of a real turn's.  ``run(n)`` is the time
    of ``n`` calls of each script: ``n`` continues.
    """
    import orjson

    from bench.workloads import RawSocket, _resp, redis_benchmark
    from memtier.threads.ledger import message_event
    from memtier.threads.models import Ownership
    from memtier.threads.records import entry_row

    owner = Ownership("bench", "floor")
    for i in range(FLOOR_THREADS):
        tid = f"{i:012d}"
        service.create(owner, thread_id=tid)
        for _ in range(FLOOR_TURNS):
            service.continue_(owner, tid, text)
    keys = service.core.keyspace.owner(owner.tenant_id, owner.user_id).thread("__rand_int__")
    client = server.client()
    shas = [str(client.script_load(path.read_text(encoding="utf-8"))) for path in FLOOR_SCRIPTS]
    client.close()
    n_entries = 2 * FLOOR_TURNS
    rid = "req_" + "f" * 28 + "__rand_int__"
    reply = f"echo ({n_entries} earlier entries): {text}"

    def dumps(value: Any) -> str:
        return orjson.dumps(value).decode()

    record = dumps({"s": "running", "tok": "t" * 32, "fp": "f" * 64, "at": 1_700_000_000_000})
    done = dumps(
        {
            "s": "done",
            "tok": "t" * 32,
            "fp": "f" * 64,
            "at": 1_700_000_000_000,
            "res": {"status": "completed", "leafId": "e42", "entryIds": ["e41", "e42"]},
        }
    )
    claim = [
        "EVALSHA",
        shas[0],
        "6",
        keys.thread,
        keys.runs,
        keys.lease,
        keys.parents,
        keys.events,
        keys.entries,
        rid,
        "t" * 32,
        record,
        dumps({"requestId": rid, "leafId": f"e{n_entries}"}),
        dumps(message_event(f"e{n_entries + 1}", text, False)),
        # the entries the client does not hold yet: a turn on the head after its own
        # last one holds every entry but that turn's two (memtier.threads.historycache)
        *(f"e{i}" for i in range(n_entries - 1, n_entries + 1)),
    ]
    emit = [
        "EVALSHA",
        shas[1],
        "3",
        keys.thread,
        keys.events,
        keys.lease,
        rid,
        "echo.reply",
        dumps({"chars": len(reply)}),
    ]
    user_id, asst_id = f"e{n_entries + 1}", f"e{n_entries + 2}"
    commit = [
        "EVALSHA",
        shas[2],
        "6",
        keys.thread,
        keys.entries,
        keys.parents,
        keys.runs,
        keys.lease,
        keys.events,
        rid,
        done,
        user_id,
        f"e{n_entries}",
        dumps(entry_row(user_id, f"e{n_entries}", "user", text, 1_700_000_000_000, rid, False)),
        asst_id,
        dumps(entry_row(asst_id, user_id, "assistant", reply, 1_700_000_000_000, rid, False)),
        " ".join(f"e{i}" for i in range(1, n_entries + 3)),
        dumps(message_event(asst_id, reply, False)),
        dumps({"requestId": rid, "leafId": asst_id, "entryIds": [user_id, asst_id]}),
    ]
    port = server.port

    def run(n: int) -> float:
        return sum(redis_benchmark(port, n, args, FLOOR_THREADS) for args in (claim, emit, commit))

    def packed_for(thread: int) -> list[bytes]:
        tid = f"{thread:012d}"  # what redis-benchmark's -r puts in place of __rand_int__
        return [_resp(*(a.replace("__rand_int__", tid) for a in c)) for c in (claim, emit, commit)]

    packed_by_thread = [packed_for(i) for i in range(FLOOR_THREADS)]
    raw = RawSocket(port)

    def run_python(n: int) -> float:
        calls = [one for i in range(n) for one in packed_by_thread[i % FLOOR_THREADS]]
        return raw.timed_calls(calls, "a continue floor script")

    python_floor = Measure(
        "threads.floor.continue.python",
        f"floor: the same 3 scripts from Python, pre-encoded socket [300B, {n_entries} entries]",
        run_python,
        note="not the public API: three round trips from a Python process with no client "
        "work; op/s of whole continues",
    )
    return Measure(
        "threads.floor.continue.redis-benchmark",
        f"floor: continue's required commands, 3 scripts, redis-benchmark -c 1 [300B, "
        f"{n_entries} entries]",
        run,
        note="C client, no Lua logic: claim (17 commands; the two history entries the "
        "client has not seen, by one HMGET), one event (6), commit (11); op/s of whole "
        "continues",
    ), python_floor


_STREAM_ID = re.compile(rb"\d{10,}-\d+")  # an XADD id: the server's clock in ms, a sequence


def _without_clock(reply: Any) -> Any:
    """``reply`` with stream entry ids (``<ms>-<seq>``: the server's clock) made equal."""
    if isinstance(reply, list):
        return [_without_clock(part) for part in reply]
    if isinstance(reply, bytes) and _STREAM_ID.fullmatch(reply):
        return b"<stream id>"
    return reply


def continue_scripts_measure(h: Harness, server: BenchRedis, service: Any, text: str) -> Measure:
    """memtier's own three scripts of a continue, from Python with no client work: the
    claim, emit and commit requests of real continues (echo runner, 300 B), recorded as
    they went over the wire, sent again from a pre-encoded socket, one round trip each.
    Between this row and the Python floor (the floor's scripts, no Lua logic) is memtier's
    Lua; between this row and the continue row is memtier's client work.

    A request carries its request id, lease token and history base, so it is valid once,
    in its order, on the state it was recorded on.  The threads' keys are saved (``DUMP``)
    first; then one chain of continues is recorded for every round of the group (warm-up
    included), and the keys are restored before the group starts (so no round's time or
    Redis CPU includes the restore).  Round k sends chain k, which starts where chain k-1
    left the threads.  Every reply is compared with the recorded one (stream ids,
    which carry the server's clock, aside): a divergence raises, so the row reports an
    error rather than a figure for some other work.
    """
    from bench.workloads import RawSocket, RecordedCall, lean_calls_recorded
    from memtier.threads.models import Ownership

    s = h.settings
    n_threads, turns, per_round = _REPLAY_SIZES[s.profile]
    rounds = s.warmup_rounds + s.rounds
    owner = Ownership("bench", "replay")
    tids = [service.create(owner, title=f"r{i}").id for i in range(n_threads)]
    for _ in range(turns):
        for tid in tids:
            service.continue_(owner, tid, text)
    pattern = service.core.keyspace.owner(owner.tenant_id, owner.user_id).pattern()
    limit = 8 * n_threads + 8  # six keys per thread, the owner's index: a bounded save

    def owner_keys(client: Any) -> list[bytes]:
        keys = list(client.scan_iter(match=pattern, count=1000))
        if len(keys) > limit:
            raise RuntimeError(f"{len(keys)} keys under {pattern}: more than {limit}")
        return keys

    with server.client() as client:
        saved = [(key, client.pttl(key), client.dump(key)) for key in owner_keys(client)]
    chains: list[list[RecordedCall]] = []
    for r in range(rounds):
        chain: list[RecordedCall] = []
        with lean_calls_recorded(chain):
            for j in range(per_round):
                service.continue_(owner, tids[(r * per_round + j) % n_threads], text)
        if len(chain) != 3 * per_round or any(c.replies != 1 for c in chain):
            raise RuntimeError(f"a continue made {len(chain) / per_round:g} lean calls, not 3")
        chains.append(chain)
    with server.client() as client:  # the keys as the first chain found them
        for key in owner_keys(client):
            client.delete(key)
        for key, ttl, value in saved:
            client.restore(key, max(ttl, 0), value, replace=True)
    raw = RawSocket(server.port)
    sent = {"rounds": 0}

    def run(n: int) -> float:
        k = sent["rounds"]
        try:
            elapsed = replay_round(k, n)
        except BaseException:
            raw.close()  # a refused round ends the row: the harness sends it no more
            raise
        if k == len(chains) - 1:
            raw.close()  # the last recorded round: nothing is sent after it
        return elapsed

    def replay_round(k: int, n: int) -> float:
        if k >= len(chains) or n != per_round:
            raise RuntimeError(f"round {k} of {n} continues: {len(chains)} of {per_round} recorded")
        sent["rounds"] = k + 1
        chain = chains[k]
        started = time.perf_counter()
        replies = [raw.call(call.request) for call in chain]
        elapsed = time.perf_counter() - started
        for i, (call, reply) in enumerate(zip(chain, replies, strict=True)):
            if _without_clock(reply) != _without_clock(call.reply):
                raise RuntimeError(
                    f"replayed call {i} of round {k} replied {reply!r}, recorded {call.reply!r}"
                )
        return elapsed

    first, last = 2 * turns, 2 * (turns + -(-rounds * per_round // n_threads))
    return Measure(
        "threads.continue.scripts.python",
        f"memtier's 3 scripts from Python, pre-encoded socket [300B, {first}-{last} entries]",
        run,
        fixed_ops=per_round,
        note="not the public API: the claim, emit and commit of real continues, recorded "
        "and sent again on the threads' saved keys; no client work; op/s of whole continues",
    )
