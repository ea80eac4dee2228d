"""Smoke tests of the measurement probes (issue 12): each runs in its quickest mode.

``bench.bisect_append``, ``bench.callpath`` and ``bench.flushprobe`` start their own
redis-server, measure, write strict JSON and stop the server they started.  These tests
run each for seconds so that none can rot, and check the shape of what they report --
never a figure (speeds are the probes' output on a shared, noisy machine, not a test).
The cut variants of ``append_turn`` are also checked without a server: every cut is a
prefix of memtier's own script at a section boundary, and compiles.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from redispy import LEAN_CLUSTER
from servers import require_real_redis

ROOT = Path(__file__).resolve().parent.parent


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


def _run(module: str, out: Path, *extra: str, name: str | None = None) -> dict[str, Any]:
    """Run ``module --quick`` and read its ``<name>-quick.json`` (name: the module's)."""
    require_real_redis("redis-server")
    proc = subprocess.run(
        [sys.executable, "-m", module, "--quick", "--out", str(out), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    name = name or module.rsplit(".", 1)[1].replace("_", "-")
    data: dict[str, Any] = json.loads((out / f"{name}-quick.json").read_text())  # strict JSON
    pid = data["meta"]["server_pid"]
    assert isinstance(pid, int) and not _alive(pid), "the probe left its redis-server running"
    assert data["meta"]["commit"] and data["meta"]["redis_server"]
    return data


def test_cut_variants_are_prefixes_at_section_boundaries_and_compile() -> None:
    import fakeredis
    from lupa import lua51  # Redis runs Lua 5.1 (fakeredis uses this one too)

    from bench.bisect_append import STUB, build_variants
    from bench.workloads import bench_config
    from memtier import ConversationStore

    store = ConversationStore(fakeredis.FakeRedis(), bench_config("cuts"))
    source = store.scripts["append_turn"].source
    variants = build_variants(source)
    names = [v.name for v in variants]
    assert names == ["empty", "argv", "include", "checks", *(f"s{k}" for k in range(7)), "full"]
    assert variants[-1].source == source
    cuts = variants[3:-1]
    lengths = []
    for v in cuts:
        assert v.source.endswith(STUB), v.name
        body = v.source[: v.source.rindex(STUB)]
        body = body.removesuffix(
            "if sweep_done then rcall('HSET', meta_key, 'sw', next_sweep) end\n"
        )
        assert source.startswith(body), v.name
        lengths.append(len(body))
        k = int(v.name[1:]) + 1 if v.name.startswith("s") else 0
        assert source[len(body) :].startswith(f"-- {k}. "), v.name  # cut at the next section
    assert lengths == sorted(lengths) and len(set(lengths)) == len(lengths)
    lua = lua51.LuaRuntime()
    compiles = lua.eval("function(s) local f, e = loadstring(s); return {f ~= nil, e} end")
    for v in variants:
        text = v.source.split("\n", 1)[1]  # the shebang line is Redis's, not Lua's
        ok, err = compiles(text)[1], compiles(text)[2]
        assert ok is True, (v.name, err)


@pytest.mark.real
def test_bisect_append_quick(tmp_path: Path) -> None:
    data = _run("bench.bisect_append", tmp_path)
    rows = {r["variant"]: r for r in data["summary"]}
    assert set(rows) >= {"empty", "argv", "checks", "s0", "s6", "full", "minimal"}
    repeats = data["meta"]["repeats"]
    assert len(data["meta"]["load_per_repeat"]) == repeats + 1
    for name, runs in data["runs"].items():
        assert len(runs) == repeats, name
        for run in runs:
            # every call ran as EVALSHA and was timed by SLOWLOG (threshold 0; room for
            # the commands the script ran, which Redis logs too)
            assert run["calls"] == data["meta"]["calls"], (name, run)
            assert run["slowlog_n"] == data["meta"]["calls"], (name, run)
            assert run["slowlog_trimmed_mean_us"] > 0, (name, run)
    assert rows["full"]["nonzero_replies"] == 0  # every full append stored its turn
    assert rows["s1"]["delta_vs"] == "s0" and "delta_trimmed_us" in rows["s1"]
    # Sections that run Redis commands show them; the empty script runs none.
    assert rows["empty"]["inner_cmds_per_call"]["median"] == 0
    assert rows["full"]["inner_cmds_per_call"]["median"] >= 5


@pytest.mark.real
def test_callpath_quick(tmp_path: Path) -> None:
    data = _run("bench.callpath", tmp_path, "--no-py-spy")
    rows = data["rows_us_per_op"]
    for key in (
        "min.evalsha",
        "min.lean",
        "append.lean",
        "append.evalsha",
        "append.store",
        "read.lrange",
        "read.store",
    ):
        assert rows[key]["n"] == data["meta"]["rounds"] and rows[key]["median"] > 0, key
    assert {layer["upper"] for layer in data["layers_us_per_op"]} >= {"append.store"}
    assert data["stages_us_per_op"]["core.decode_context (20 turns)"] > 0
    assert data["meta"]["py_spy"] == {"status": "skipped"}


@pytest.mark.real
def test_readserver_quick(tmp_path: Path) -> None:
    data = _run("bench.readserver", tmp_path)
    for size in ("300B", "4096B"):
        result = data["sizes"][size]
        for way, outer in (("transaction", "exec"), ("read_context", "evalsha")):
            assert result[way]["outer_command"] == outer
            assert result[way]["us_per_read"]["median"] > 0, (size, way)
        # the transaction ran MULTI, the script, LRANGE and EXEC once per read
        calls = result["transaction"]["calls_per_read"]
        for command in ("multi", "evalsha", "lrange", "exec"):
            assert calls[command] == 1.0, (size, command, calls)
        assert "exec" not in result["read_context"]["calls_per_read"]
        # the candidate without Lua: the same reads as plain commands, no script
        assert result["plain"]["outer_command"] == "exec"
        assert result["plain"]["us_per_read"]["median"] > 0, size
        calls = result["plain"]["calls_per_read"]
        for command in ("multi", "hmget", "time", "hget", "lrange", "exec"):
            assert calls[command] == 1.0, (size, command, calls)
        assert "evalsha" not in calls
        assert result["plain_over_transaction"]["median"] > 0


@pytest.mark.real
def test_flushprobe_quick(tmp_path: Path) -> None:
    data = _run("bench.flushprobe", tmp_path)
    sessions = data["meta"]["sessions"]
    assert data["meta"]["populate_failures"] == 0
    assert len(data["flushes"]) >= 2 and len(data["disk"]) == 2
    for flush in data["flushes"]:
        assert flush["sessions"] == sessions and not flush["skipped"], flush
        assert flush["page_calls"] >= 1 and flush["page_max_us"] > 0, flush
    assert data["summary"]["disk_bytes_per_s"]["median"] > 0


@pytest.mark.real
def test_flushprobe_bounds_quick(tmp_path: Path) -> None:
    """``--bounds``: one flush per bound and round, each with the hold-floor caller."""
    bounds = ["--bounds", "64/32768,4/2048", "--rounds", "1"]
    data = _run("bench.flushprobe", tmp_path, *bounds, name="flushprobe-bounds")
    runs = data["runs"]
    assert sorted((r["page_sessions"], r["page_bytes"]) for r in runs) == [(4, 2048), (64, 32768)]
    for run in runs:
        assert run["sessions"] == data["meta"]["sessions"] and not run["skipped"], run
        assert run["page_calls"] >= 1 and run["page_max_us"] > 0, run
        assert run["hold_floor_calls"] >= 1, run
    small, large = sorted(runs, key=lambda r: r["page_bytes"])
    assert small["page_calls"] > large["page_calls"]  # the bound was applied
    assert set(data["summary"]) == {"64/32768", "4/2048"}


@pytest.mark.real
def test_page_ab_quick(tmp_path: Path) -> None:
    """Both scripts ran on every page and gave the same replies."""
    data = _run("bench.page_ab", tmp_path, "--other", str(ROOT / "lua"))
    assert data["reply_mismatches"] == 0
    assert data["summary"]["this"]["n"] == data["summary"]["other"]["n"] == data["meta"]["pages"]


@pytest.mark.real
def test_threads_lua_ab_quick(tmp_path: Path) -> None:
    """Both trees' thread scripts ran, every runner saw its thread's whole history."""
    other = tmp_path / "lua"  # this tree's scripts under other SHAs: the same behaviour
    shutil.copytree(ROOT / "lua", other)
    for script in (other / "threads").glob("*.lua"):
        script.write_text(script.read_text(encoding="utf-8") + "-- the A/B's copy\n")
    data = _run("bench.threads_lua_ab", tmp_path, "--other", str(other))
    assert data["wrong_histories"] == []
    for name in ("run_claim", "events_append", "run_commit"):
        for tree in ("this", "other"):
            assert data["summary_us"][f"{name}.{tree}"]["n"] > 0, (name, tree)
        assert data["this_over_other_median"][name] > 0
    assert data["inner_commands_per_continue"]["XADD"] == 5  # 2 opening, 1 event, 2 closing


@pytest.mark.cluster
@pytest.mark.redis_py(LEAN_CLUSTER)  # both probes time the lean Cluster path
@pytest.mark.parametrize("module", ["bench.clusterlean", "bench.aioclusterlean"])
def test_clusterlean_quick(tmp_path: Path, module: str) -> None:
    """The sync and the asyncio lean-cluster probes."""
    require_real_redis("redis-server", "redis-cli")
    data = _run(module, tmp_path)
    assert all(not _alive(pid) for pid in data["meta"]["server_pids"]), "a node still runs"
    assert len(data["meta"]["server_pids"]) == data["meta"]["primaries"] == 3
    rows = data["rows_us_per_op"]
    for key in (
        "raw_evalsha_minimal",
        "append_lean",
        "append_generic",
        "raw_lrange_orjson",
        "context_lean",
        "context_generic",
    ):
        assert rows[key]["n"] == data["meta"]["rounds"] and rows[key]["median"] > 0, key
    assert set(data["ratios_same_round"]) >= {
        "append_lean_vs_raw_evalsha",
        "context_lean_vs_generic",
    }
    # the lean store went the lean way on every script call, the generic one never
    assert data["meta"]["lean_calls"] > 0 and data["meta"]["generic_lean_calls"] == 0


@pytest.mark.real
def test_aiopipe_probe_quick(tmp_path: Path) -> None:
    data = _run("bench.aiopipe_probe", tmp_path)
    rounds = data["meta"]["rounds"]
    for key in ("raw", "exec.pipelined", "exec.generic", "append.pipelined", "append.generic"):
        assert data["rates_op_s"][key]["n"] == rounds and data["rates_op_s"][key]["median"] > 0
    assert set(data["ratio_vs_raw"]) == {
        "exec.pipelined",
        "exec.generic",
        "append.pipelined",
        "append.generic",
    }
    assert data["calls_per_batch_exec_pipelined"] >= 1.0  # the pipelined rows were pipelined


def test_ctxdecode_quick(tmp_path: Path) -> None:
    """The decode probe (no server): every workload, old and new path, both sizes."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.ctxdecode", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "ctxdecode-quick.json").read_text())  # strict JSON
    for size in ("300B", "4096B"):
        rows = data["us_per_read"][size]
        for workload in ("same", "slide", "distinct"):
            for way in ("fast", "general (before)"):
                row = rows[f"{workload} {way}"]
                assert row["n"] == data["meta"]["rounds"] and row["median"] > 0, (size, workload)


def test_coldcache_quick(tmp_path: Path) -> None:
    data = _run("bench.coldcache", tmp_path)
    rows = data["rows"]
    assert set(rows) == {"hot", "after_sleep", "after_round_trip"}
    for name, row in rows.items():
        assert row["n"] == data["meta"]["rounds"] and row["median"] > 0, name
    assert set(data["ratio_to_hot"]) == {"after_sleep", "after_round_trip"}


@pytest.mark.real
def test_pagehold_quick(tmp_path: Path) -> None:
    data = _run("bench.pagehold", tmp_path)
    assert data["meta"]["sessions"] == 300 and len(data["runs"]) == 1
    run = data["runs"][0]
    # Every page call was sampled and classified -- those sent alone and those in an
    # Overlap with the page work -- and a page that held the shard past the SLOWLOG
    # threshold has its hold (the flush of 300 sessions makes dozens of pages).
    assert run["sessions_flushed"] >= 300  # (and the writers' own sessions)
    assert run["calls"] >= 10 and run["calls"] > run["page_calls_alone"]
    assert run["calls_undisturbed"] + run["calls_disturbed"] == run["calls"]
    longest = max(run["longest_undisturbed_call_s"], run["longest_disturbed_call_s"])
    assert longest * 1000 == pytest.approx(run["server_max_page_ms"], abs=0.001)
    assert isinstance(data["undisturbed_within_target"], bool)


def test_evictionsim_runs_and_tells_the_policies_apart() -> None:
    """``bench.evictionsim`` (no server): its table prints, and its model shows the loop
    the random policy exists for -- a rotation over one key more than fit never hits
    under LRU and mostly hits under memtier's ``evict_random``.  Hit rates of a seeded
    model, not speeds."""
    from bench.evictionsim import hit_rate, rotation

    assert hit_rate("lru", 10, rotation(11), 2_000) == 0.0
    assert hit_rate("random", 10, rotation(11), 2_000) > 0.5
    out = subprocess.run(
        [sys.executable, "-m", "bench.evictionsim", "--steps", "2000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert out.startswith("| pattern | slots | LRU hit rate | random hit rate |")
    assert out.count("\n") == 11


def test_threadlength_quick(tmp_path: Path) -> None:
    data = _run("bench.threadlength", tmp_path)
    stages = data["stages"]
    assert [s["turns_per_thread_at_start"] for s in stages] == data["meta"]["stages"]
    assert len(stages) >= 2
    for stage in stages:
        assert set(stage["rows"]) == {"continue", "raw"}
        for name, row in stage["rows"].items():
            for metric in ("wall_us", "cpu_us", "server_cpu_us"):
                assert row[metric]["n"] == data["meta"]["rounds"], (name, metric)
            assert row["wall_us"]["median"] > 0 and row["cpu_us"]["median"] > 0, name
        assert stage["continue_vs_raw"]["median"] > 0
    assert {"cpu_us_per_1000_entries", "server_cpu_us_per_1000_entries"} <= set(data)


def test_threadregen_quick(tmp_path: Path) -> None:
    data = _run("bench.threadregen", tmp_path)
    assert set(data["rows"]) == {"head", "regenerate"}
    for name, row in data["rows"].items():
        for metric in ("wall_us", "cpu_us", "server_cpu_us", "longest_command_us"):
            assert row[metric]["n"] == data["meta"]["rounds"], (name, metric)
        assert row["wall_us"]["median"] > 0 and row["longest_command_us"]["median"] > 0, name


@pytest.mark.real
def test_clientsplit_quick(tmp_path: Path) -> None:
    data = _run("bench.clientsplit", tmp_path)
    assert data["trips"] == {"append": 1, "context": 1, "continue": 3}
    cpu = data["cpu_us_per_op"]
    for op in ("raw", "append", "context", "continue"):
        for part in ("real", "pure", "penalty"):
            assert cpu[f"{op}.{part}"]["n"] == 1, (op, part)
        # the pure row ran (recorded replies) and cost something, as the real one did
        assert cpu[f"{op}.pure"]["median"] > 0 and cpu[f"{op}.real"]["median"] > 0
    for trip in ("trip", "append.trip", "context.trip"):  # the minimal script's, the ops' own
        assert cpu[trip]["n"] == 1 and cpu[trip]["median"] > 0, trip
    rounds = data["rounds_cpu_us_per_op"]
    parts = zip(rounds["append.real"], rounds["append.pure"], rounds["append.trip"], strict=True)
    assert rounds["append.penalty"] == [r - p - t for r, p, t in parts]
    parts = zip(rounds["continue.real"], rounds["continue.pure"], rounds["trip"], strict=True)
    assert rounds["continue.penalty"] == [r - p - 3 * t for r, p, t in parts]


@pytest.mark.real
def test_roundtrip_quick(tmp_path: Path) -> None:
    from bench.roundtrip import SPUN, UNIX

    data = _run("bench.roundtrip", tmp_path)
    names = [f"{b}.{m}" for b in SPUN for m in ("sleep", "spin")] + list(UNIX)
    wall, cpu = data["rounds"]["wall_us_per_call"], data["rounds"]["cpu_us_per_call"]
    assert set(wall) == set(names) and set(cpu) == {*names, "append.pure"}
    for name in names:
        assert len(wall[name]) == 1 and wall[name][0] > 0 and cpu[name][0] > 0, name
    # every spin row waited for each of its replies by spinning (one read per call)
    assert data["rounds"]["spun"] == {f"{b}.spin": [30] for b in SPUN}
    assert data["spin_reads"]["found"] + data["spin_reads"]["fell_back"] == 50 * len(SPUN)
    derived = data["rounds"]["derived"]  # each of the same round's rows
    assert derived["wake_us"] == [wall["trip.sleep"][0] - wall["trip.spin"][0]]
    pure, ping, both = cpu["append.pure"][0], cpu["ping.sleep"][0], cpu["pure+ping.sleep"][0]
    assert derived["excess_cpu.sleep"] == [both - pure - ping]
    assert derived["unix_vs_tcp.append"] == [wall["append.sleep"][0] / wall["append.unix"][0]]
    assert "cpuidle_driver" in data["meta"] and "kernel_cmdline" in data["meta"]


def test_roundtrip_spin_wait_is_bounded_and_sees_data() -> None:
    import socket
    import time

    from bench.roundtrip import SpinCount, spin_wait

    a, b = socket.socketpair()
    try:
        count = SpinCount()
        started = time.perf_counter()
        spin_wait(a.fileno(), 0.005, count)  # nothing to read: gives up after its budget
        assert time.perf_counter() - started >= 0.005
        assert (count.found, count.fell_back) == (0, 1)
        b.send(b"x")
        spin_wait(a.fileno(), 5.0, count)  # data waiting: returns at once
        assert (count.found, count.fell_back) == (1, 1)
    finally:
        a.close()
        b.close()


def test_pacing_quick(tmp_path: Path) -> None:
    data = _run("bench.pacing", tmp_path)
    us, calls = data["rounds"]["redis_us_per_call"], data["rounds"]["evalsha_calls"]
    gaps = (0, 100, 200)
    rows = {f"{kind}.gap{g}" for g in gaps for kind in ("append", "minimal")} | {"append.store"}
    assert set(us) == rows and set(calls) == rows
    for name in rows:  # each row counted exactly its own calls, and they cost something
        assert calls[name] == [30], name
        assert us[name][0] > 0, name
    for g in gaps:  # the ratio is of the same round's two rows at the same pacing
        assert data["rounds"]["ratio"][f"ratio.gap{g}"] == [
            us[f"append.gap{g}"][0] / us[f"minimal.gap{g}"][0]
        ]


def test_pacing_busy_work_lasts_at_least_its_gap() -> None:
    import time

    from bench.pacing import busy

    for gap_us in (0, 50, 400):
        started = time.perf_counter()
        busy(gap_us)
        assert time.perf_counter() - started >= gap_us / 1e6


def test_git_commit_marks_a_tree_with_uncommitted_changes(tmp_path: Path) -> None:
    """Results name the tree they measured: the short commit of a clean tree, with
    "+dirty" once a tracked file differs from it (an untracked file is not a change)."""
    from bench.probe import git_commit

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git("add", "a.txt")
    git("commit", "-q", "-m", "one")
    sha = git("rev-parse", "--short", "HEAD")
    assert git_commit(tmp_path) == sha
    (tmp_path / "new.txt").write_text("untracked\n")
    assert git_commit(tmp_path) == sha
    (tmp_path / "a.txt").write_text("two\n")
    assert git_commit(tmp_path) == sha + "+dirty"


def test_itemsprofile_quick(tmp_path: Path) -> None:
    data = _run("bench.itemsprofile", tmp_path)
    for name in ("wall_us_per_op", "client_cpu_us_per_op", "redis_us_per_op"):
        assert data["rounds"][name] and all(v > 0 for v in data["rounds"][name]), name
    # the client's work and the server's are each a part of the wall time of a call
    assert data["rounds"]["redis_us_per_op"][0] < data["rounds"]["wall_us_per_op"][0]
    stages = data["stages_us_per_op"]
    assert set(stages) == {
        "items_to_turns",
        "prepare_turn",
        "of_which_redaction",
        "append_call",
        "decode_append",
    }
    assert all(us > 0 for us in stages.values())
    top = data["profile_top"]
    assert top and all(row["own_us_per_op"] >= 0 and row["calls_per_op"] > 0 for row in top)
    assert any("prepare_turn" in row["function"] for row in top)


def test_client_cpu_quick(tmp_path: Path) -> None:
    data = _run("bench.client_cpu", tmp_path)
    names = {
        f"{p}{op}.{m}"
        for p in ("", "aio.")
        for op in ("append", "context")
        for m in ("cpu", "wall")
    }
    assert set(data["us_per_op"]) == names
    for name in names:
        assert data["rounds"][0][name] > 0, name
        # CPU time of this process is a part of the wall time the same loop took
        if name.endswith(".cpu"):
            wall = name[: -len(".cpu")] + ".wall"
            assert data["rounds"][0][name] <= data["rounds"][0][wall] * 1.05, name


def test_icount_quick(tmp_path: Path) -> None:
    """callgrind's count of the client's instructions per asyncio append (valgrind is on
    this machine kind; tests/run.sh installs it where it is not)."""
    data = _run("bench.icount", tmp_path)
    (count,) = data["instructions_per_op"]["aio.append"]
    # An asyncio append runs the redaction, the plan, the packing and the event loop:
    # far more than a few thousand instructions, far less than tens of millions.
    assert 50_000 < count < 5_000_000
    assert data["meta"]["valgrind"].startswith("valgrind-")


def test_opcount_quick(tmp_path: Path) -> None:
    data = _run("bench.opcount", tmp_path)
    for row in ("append", "aio.append"):
        counted = data["rows"][row]
        # memtier's own append runs in both; the asyncio row also counts the event loop
        assert 300 < counted["per_op"] < 100_000, row
        assert any(f.startswith("memtier/memory/core.py:prepare_turn") for f in _functions(counted))
        assert sum(counted["by_file"].values()) <= counted["per_op"] + 1e-6
    assert any("asyncio/" in f for f in _functions(data["rows"]["aio.append"]))
    assert not any("asyncio/" in f for f in _functions(data["rows"]["append"]))


def _functions(counted: dict[str, Any]) -> list[str]:
    return [entry["function"] for entry in counted["top"]]


def test_flushoverlap_quick(tmp_path: Path) -> None:
    data = _run("bench.flushoverlap", tmp_path)
    rows = {f"{p}.{m}" for p in ("lean", "generic") for m in ("early", "thread", "sequential")}
    rounds = data["rounds"]
    assert set(rounds["mib_per_s"]) == rows == set(rounds["cpu_s"]) == set(rounds["wall_s"])
    for name in rows:  # one flush each, and each wrote the namespace's bytes
        assert len(rounds["wall_s"][name]) == 1 and rounds["wall_s"][name][0] > 0, name
        assert rounds["mib_per_s"][name][0] > 0 and rounds["cpu_s"][name][0] > 0, name


def test_restoreprobe_quick(tmp_path: Path) -> None:
    data = _run("bench.restoreprobe", tmp_path)
    modes = {"read_ahead", "sequential", "async_batched", "async_tasks"}
    rounds = data["rounds"]
    assert set(rounds) == {"mib_per_s", "wall_s", "cpu_s", "redis_cpu_s"}
    for what, by_mode in rounds.items():  # one restore each, of the whole generation
        assert set(by_mode) == modes == set(data[what]), what
        assert all(len(v) == 1 for v in by_mode.values()), what
        # (the server's CPU of 30 small restores may round to 0 in its tick accounting)
        assert all(v[0] >= 0 if what == "redis_cpu_s" else v[0] > 0 for v in by_mode.values())
    assert data["generation_bytes"] > 0


@pytest.mark.cluster
def test_restoreprobe_cluster_quick(tmp_path: Path) -> None:
    data = _run("bench.restoreprobe", tmp_path, "--cluster", name="restoreprobe-cluster")
    modes = {"pipelined", "call_by_call", "async_batched", "async_tasks", "async_one_by_one"}
    for what, by_mode in data["rounds"].items():
        assert set(by_mode) == modes == set(data[what]), what
        assert all(len(v) == 1 and v[0] >= 0 for v in by_mode.values()), what
    assert all(v[0] > 0 for v in data["rounds"]["mib_per_s"].values())
    pids = data["meta"]["server_pids"]
    assert len(pids) == 3 and not any(_alive(pid) for pid in pids)  # every node stopped
