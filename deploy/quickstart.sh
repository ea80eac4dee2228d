#!/usr/bin/env bash
# Quick start: install memtier (with the embedded Redis) and run the demo.
#   bash deploy/quickstart.sh [memtier demo options...]
# With MEMTIER_REDIS_URL set (redis://... or redis+cluster://...), the demo uses that server;
# without it, the embedded in-process Redis (fakeredis), and it says so.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "== quickstart: installing python3-pip"
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-pip
fi
pip_flags=(-q)
if python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
    pip_flags+=(--break-system-packages)  # Debian's own Python (PEP 668)
fi
echo "== quickstart: pip install '.[embedded]'"
python3 -m pip install "${pip_flags[@]}" '.[embedded]'
exec python3 -m memtier demo "$@"
