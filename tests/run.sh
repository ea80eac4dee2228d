#!/usr/bin/env bash
# The test command (README): installs what is missing, then lint, types, tests.
#   bash tests/run.sh [pytest args...]
# Meant for root on a fresh Debian with Python 3.11 (and for CI via .ci/run).
# Real Redis servers are started by the test fixtures (tests/servers.py), not here.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf '== run.sh: %s\n' "$*"; }

SUDO=()
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
fi

apt_install() {
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -q --no-install-recommends "$@"
}

# --- system packages -------------------------------------------------------
required=()
command -v redis-server >/dev/null 2>&1 || required+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || required+=(redis-tools)
python3 -m pip --version >/dev/null 2>&1 || required+=(python3-pip)
command -v strace >/dev/null 2>&1 || required+=(strace)  # syscall fault rows (tests/faults)
command -v unshare >/dev/null 2>&1 || required+=(util-linux)  # private tmpfs mounts (tests/faults)
optional=()
command -v promtool >/dev/null 2>&1 || optional+=(prometheus)  # promtool, for deploy/ tests

if [ ${#required[@]} -gt 0 ] || [ ${#optional[@]} -gt 0 ]; then
    say "apt-get install ${required[*]} ${optional[*]}"
    if ! "${SUDO[@]}" apt-get update -q; then
        [ ${#required[@]} -eq 0 ] || { say "apt-get update failed"; exit 1; }
        say "WARNING: apt-get update failed; continuing without ${optional[*]}"
    elif ! apt_install "${required[@]}" "${optional[@]}"; then
        if [ ${#required[@]} -gt 0 ]; then
            say "retrying without the optional ${optional[*]}"
            apt_install "${required[@]}"
        else
            say "WARNING: could not install ${optional[*]}; the tests that need promtool will fail"
        fi
    fi
else
    say "system packages present (redis-server, redis-cli, strace, unshare, promtool)"
fi
command -v redis-server >/dev/null && command -v redis-cli >/dev/null || {
    say "redis-server/redis-cli still missing"; exit 1; }
say "$(redis-server --version | cut -d' ' -f1-3)"

# --- python packages -------------------------------------------------------
pip_flags=(-q)
if python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
    pip_flags+=(--break-system-packages)  # Debian's own Python (PEP 668); we are its test box
fi
say "pip install -e '.[test]'"
python3 -m pip install "${pip_flags[@]}" -e '.[test]'

# --- lint and types --------------------------------------------------------
lint_paths=()
for path in memtier tests bench; do
    [ -e "$path" ] && lint_paths+=("$path")
done
say "ruff check ${lint_paths[*]}"
python3 -m ruff check "${lint_paths[@]}"
say "mypy (pyproject.toml config)"
python3 -m mypy

# --- tests -----------------------------------------------------------------
say "pytest $*"
status=0
python3 -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    say "pytest collected no tests: failing"
    exit 5
fi
say "pytest exit code $status"
exit "$status"
