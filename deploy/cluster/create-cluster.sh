#!/usr/bin/env bash
# create-cluster.sh -- start a local Redis Cluster for memtier: 6 nodes, i.e.
# 3 primaries + 3 replicas, from node.conf.template, then join them with
# `redis-cli --cluster create ... --cluster-replicas 1`.
#
# usage:
#   create-cluster.sh start [-d DIR] [-H HOST] [PORT x6]   (default ports 7000-7005)
#   create-cluster.sh stop  [-d DIR]
#
#   -d DIR   where each node gets DIR/<port>/ (config, AOF, RDB, log, pid);
#            default ./memtier-cluster
#   -H HOST  address every node binds to and announces; default 127.0.0.1.
#            Each node also uses PORT + 10000 for the cluster bus.
#
# After `start`, point memtier at any one node:
#   MEMTIER_REDIS_URL=redis+cluster://127.0.0.1:7000 memtier serve ...
# `stop` shuts every node down (SHUTDOWN, which fsyncs the AOF); the data stays
# in DIR, but a restarted node rejoins with its own nodes-<port>.conf only if
# started from the same DIR -- for a fresh cluster, remove DIR.
#
# Environment: REDIS_SERVER and REDIS_CLI override the binaries' paths.
# This is an example for one machine (development, CI); production clusters
# put each node on its own host (see README.md).

set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TEMPLATE="$HERE/node.conf.template"
REDIS_SERVER="${REDIS_SERVER:-redis-server}"
REDIS_CLI="${REDIS_CLI:-redis-cli}"
NODES=6      # 3 primaries x (1 primary + 1 replica)
WAIT_TRIES=300  # x 0.1 s = 30 s: bound on every wait below

die() {
    echo "create-cluster.sh: $*" >&2
    exit 1
}

usage() {
    sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit "${1:-2}"
}

# cli HOST PORT ARGS...: one redis-cli call to one node.
cli() {
    local host="$1" port="$2"
    shift 2
    "$REDIS_CLI" -h "$host" -p "$port" "$@"
}

# waited COMMAND...: poll COMMAND until it succeeds, at most WAIT_TRIES times (status 1
# when it never did).
waited() {
    local i
    for ((i = 0; i < WAIT_TRIES; i++)); do
        if "$@" >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}

# wait_for DESCRIPTION COMMAND...: waited, or die naming what never happened.
wait_for() {
    local what="$1"
    shift
    waited "$@" || die "timed out waiting for $what"
}

node_answers() { [[ "$(cli "$1" "$2" ping 2>/dev/null)" == "PONG" ]]; }

# Redis deletes its pid file as the last step of a clean shutdown; a stale file
# left by a killed node names a pid that no longer runs.
node_gone() { [[ ! -e "$1" ]] || ! kill -0 "$(cat "$1" 2>/dev/null)" 2>/dev/null; }

cluster_ok() { cli "$1" "$2" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; }

# This node sees every replica as a replica (roles spread by gossip after
# `--cluster create`, a moment after the slots).
replicas_known() {
    local n
    n="$(cli "$1" "$2" cluster nodes 2>/dev/null | awk '$3 ~ /slave/' | wc -l)"
    ((n == NODES / 2))
}

start() {
    local dir="./memtier-cluster" host="127.0.0.1" opt
    OPTIND=1
    while getopts "d:H:h" opt; do
        case "$opt" in
            d) dir="$OPTARG" ;;
            H) host="$OPTARG" ;;
            h) usage 0 ;;
            *) usage ;;
        esac
    done
    shift $((OPTIND - 1))
    local ports=("$@")
    if ((${#ports[@]} == 0)); then
        ports=(7000 7001 7002 7003 7004 7005)
    fi
    ((${#ports[@]} == NODES)) || die "need exactly $NODES ports (3 primaries + 3 replicas), got ${#ports[@]}"
    [[ -r "$TEMPLATE" ]] || die "template not found: $TEMPLATE"
    command -v "$REDIS_SERVER" >/dev/null || die "redis-server not found (set REDIS_SERVER)"
    command -v "$REDIS_CLI" >/dev/null || die "redis-cli not found (set REDIS_CLI)"

    local port
    for port in "${ports[@]}"; do
        if ! [[ "$port" =~ ^[0-9]+$ ]] || ((port < 1 || port > 55535)); then
            die "bad port '$port' (1-55535: the cluster bus uses port + 10000)"
        fi
    done

    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    printf '%s\n' "$host" "${ports[@]}" >"$dir/nodes.list"

    local node_dir
    for port in "${ports[@]}"; do
        node_dir="$dir/$port"
        mkdir -p "$node_dir"
        sed -e "s|{{BIND}}|$host|g" -e "s|{{PORT}}|$port|g" -e "s|{{DIR}}|$node_dir|g" \
            "$TEMPLATE" >"$node_dir/node.conf"
        # Daemonized here (the template runs in the foreground, for supervisors).
        "$REDIS_SERVER" "$node_dir/node.conf" --daemonize yes \
            --pidfile "$node_dir/redis.pid" --logfile "$node_dir/redis.log" ||
            die "node $port did not start (see $node_dir/redis.log)"
    done
    for port in "${ports[@]}"; do
        wait_for "node $host:$port to answer PING" node_answers "$host" "$port"
    done

    local addrs=()
    for port in "${ports[@]}"; do
        addrs+=("$host:$port")
    done
    # The first three become primaries, the last three their replicas.
    "$REDIS_CLI" --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes

    for port in "${ports[@]}"; do
        wait_for "node $host:$port to report cluster_state:ok" cluster_ok "$host" "$port"
        wait_for "node $host:$port to see $((NODES / 2)) replicas" replicas_known "$host" "$port"
    done
    echo "cluster ready: MEMTIER_REDIS_URL=redis+cluster://$host:${ports[0]}"
}

stop() {
    local dir="./memtier-cluster" opt
    OPTIND=1
    while getopts "d:h" opt; do
        case "$opt" in
            d) dir="$OPTARG" ;;
            h) usage 0 ;;
            *) usage ;;
        esac
    done
    [[ -r "$dir/nodes.list" ]] || die "no cluster recorded in $dir (nodes.list missing)"
    local lines host port pid
    mapfile -t lines <"$dir/nodes.list"
    host="${lines[0]}"
    for port in "${lines[@]:1}"; do
        if ! cli "$host" "$port" shutdown >/dev/null 2>&1; then
            # Not answering: stop it by its own pid file, if it still runs.
            if [[ -r "$dir/$port/redis.pid" ]]; then
                pid="$(cat "$dir/$port/redis.pid")"
                kill "$pid" 2>/dev/null || true
            fi
        fi
    done
    for port in "${lines[@]:1}"; do
        if ! waited node_gone "$dir/$port/redis.pid"; then
            # SHUTDOWN accepted but the node still runs after 30 s (an AOF fsync or a
            # replica catch-up on a loaded machine): SIGTERM by its own pid file, which
            # is the same clean shutdown, then wait once more.
            pid="$(cat "$dir/$port/redis.pid" 2>/dev/null || true)"
            [[ -n "$pid" ]] && kill "$pid" 2>/dev/null || true
            wait_for "node $port to exit" node_gone "$dir/$port/redis.pid"
        fi
    done
    echo "cluster in $dir stopped"
}

case "${1:-}" in
    start) shift; start "$@" ;;
    stop) shift; stop "$@" ;;
    -h | --help | help) usage 0 ;;
    *) usage ;;
esac
