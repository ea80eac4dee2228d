#!/usr/bin/env bash
# Quick start: install memtier (with the embedded Redis) into a virtualenv and run the demo.
#   bash deploy/quickstart.sh [memtier demo options...]
# The virtualenv is the project's .venv/ (created once, then reused); the system Python is
# never touched.  With MEMTIER_REDIS_URL set (redis://... or redis+cluster://...), the demo
# uses that server, in a namespace of its own; without it, the embedded in-process Redis
# (fakeredis), and it says so.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=$(pwd)/.venv
PY=$VENV/bin/python

if ! "$PY" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' >/dev/null 2>&1; then
    if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
        echo "== quickstart: installing python3-venv (apt-get, log in /tmp/memtier-quickstart-apt.log)"
        SUDO=()
        if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO=(sudo); fi
        { "${SUDO[@]}" apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq python3-venv
        } >/tmp/memtier-quickstart-apt.log 2>&1
    fi
    echo "== quickstart: python3 -m venv .venv"
    python3 -m venv "$VENV"
fi
echo "== quickstart: pip install -e '.[embedded]' into .venv"
if ! "$PY" -m pip install -q --disable-pip-version-check -e '.[embedded]' >"$VENV/pip.log" 2>&1; then
    tail -n 20 "$VENV/pip.log"
    echo "== quickstart: pip install failed (see $VENV/pip.log)"
    exit 1
fi
if [ -n "${MEMTIER_REDIS_URL:-}" ]; then
    echo "== quickstart: memtier demo on MEMTIER_REDIS_URL"
else
    unset MEMTIER_REDIS_URL  # set but empty counts as unset
    echo "== quickstart: MEMTIER_REDIS_URL is unset: memtier demo on the embedded in-process Redis"
fi
exec "$PY" -m memtier demo "$@"
