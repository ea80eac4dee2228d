#!/usr/bin/env bash
# The benchmark command (README, docs/performance.md), for a fresh Debian machine as root:
# installs what is missing (redis-server and redis-benchmark from Debian's redis-server and
# redis-tools, quietly, with service starts denied; memtier with its `bench` extra -- the
# peer libraries and pyinstrument -- into a virtualenv of its own, .venv-bench/, kept apart
# from the test environment's .venv/), then runs
#   python -m bench.run [--quick | --tiny] [options...]
# which starts its own redis-server on a free loopback port and stops it at the end.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=$(pwd)/.venv-bench
PY=$VENV/bin/python

SUDO=()
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO=(sudo); fi
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-benchmark >/dev/null 2>&1 || missing+=(redis-tools)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
    log=/tmp/memtier-bench-apt.log
    echo "== bench: apt-get install ${missing[*]} (log: $log)"
    made_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then  # no redis-server daemon started by the install
        printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee /usr/sbin/policy-rc.d >/dev/null
        "${SUDO[@]}" chmod 755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    rc=0
    { "${SUDO[@]}" apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq "${missing[@]}"
    } >"$log" 2>&1 || rc=$?
    [ "$made_policy" -eq 0 ] || "${SUDO[@]}" rm -f /usr/sbin/policy-rc.d
    [ "$rc" -eq 0 ] || { echo "== bench: apt-get failed (see $log)"; exit 1; }
fi
if ! "$PY" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' >/dev/null 2>&1; then
    echo "== bench: python3 -m venv .venv-bench"
    python3 -m venv "$VENV"
fi
echo "== bench: pip install -e '.[bench]' into .venv-bench"
if ! "$PY" -m pip install -q --disable-pip-version-check -e '.[bench]' >"$VENV/pip.log" 2>&1; then
    tail -n 20 "$VENV/pip.log"
    echo "== bench: pip install failed (see $VENV/pip.log)"
    exit 1
fi
exec "$PY" -m bench.run "$@"
