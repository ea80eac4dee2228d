#!/usr/bin/env bash
# The benchmark command (README, docs/performance.md), for a fresh Debian machine as root:
# installs what is missing (redis-server and redis-benchmark from Debian's redis-server and
# redis-tools; memtier with its `bench` extra: the peer libraries and pyinstrument), then runs
#   python -m bench.run [--quick | --tiny] [options...]
# which starts its own redis-server on a free loopback port and stops it at the end.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-benchmark >/dev/null 2>&1 || missing+=(redis-tools)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
if [ ${#missing[@]} -gt 0 ]; then
    echo "== bench: apt-get install ${missing[*]}"
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi
pip_flags=(-q)
if python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
    pip_flags+=(--break-system-packages)  # Debian's own Python (PEP 668)
fi
echo "== bench: pip install -e '.[bench]'"
python3 -m pip install "${pip_flags[@]}" -e '.[bench]'
exec python3 -m bench.run "$@"
