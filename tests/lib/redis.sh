# Throwaway redis-server for integration scripts. Source this file, then:
#   redis_start [extra redis-server args...]  sets REDIS_PORT REDIS_URL REDIS_PID
#                                             REDIS_DIR REDIS_SOCK (unix socket)
#   redis_cli ARGS...                          redis-cli against it
#   redis_restart                              kill -9 and start empty on the same port
#   redis_stop                                 stop it and remove its dir
# Call redis_stop from your EXIT trap, e.g.  trap 'redis_stop' EXIT
# The server runs without persistence in its own temp dir, bound to 127.0.0.1.

_redis_free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# _redis_launch PORT ARGS...: starts the server, waits (5 s max) for PONG.
_redis_launch() {
    local port=$1; shift
    redis-server --port "$port" --bind 127.0.0.1 --dir "$REDIS_DIR" --save '' \
        --appendonly no --daemonize no --unixsocket "$REDIS_DIR/redis.sock" \
        --unixsocketperm 700 --logfile "$REDIS_DIR/redis.log" "$@" </dev/null &
    REDIS_PID=$!
    local deadline=$((SECONDS + 5))
    while ((SECONDS < deadline)); do
        if ! kill -0 "$REDIS_PID" 2>/dev/null; then
            return 1 # died (port taken?)
        fi
        [[ $(redis-cli -p "$port" ping 2>/dev/null) == PONG ]] && return 0
        sleep 0.05
    done
    kill -9 "$REDIS_PID" 2>/dev/null
    return 1
}

redis_start() {
    command -v redis-server >/dev/null || { echo "SKIP: redis-server not installed"; return 77; }
    REDIS_DIR=$(mktemp -d "${TMPDIR:-/tmp}/xfer-redis.XXXXXX") || return 1
    REDIS_ARGS=("$@")
    local try
    for try in 1 2 3 4 5; do
        REDIS_PORT=$(_redis_free_port)
        if _redis_launch "$REDIS_PORT" "$@"; then
            REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
            REDIS_SOCK="$REDIS_DIR/redis.sock"
            export REDIS_PORT REDIS_URL REDIS_PID REDIS_DIR REDIS_SOCK
            return 0
        fi
    done
    echo "redis_start: could not start redis-server (log: $REDIS_DIR/redis.log)" >&2
    return 1
}

redis_cli() {
    redis-cli -p "$REDIS_PORT" "$@"
}

redis_restart() {
    [[ -n ${REDIS_PID:-} ]] && kill -9 "$REDIS_PID" 2>/dev/null && wait "$REDIS_PID" 2>/dev/null
    _redis_launch "$REDIS_PORT" "${REDIS_ARGS[@]}"
}

redis_stop() {
    if [[ -n ${REDIS_PID:-} ]]; then
        kill "$REDIS_PID" 2>/dev/null && kill -CONT "$REDIS_PID" 2>/dev/null # a frozen one too
        local deadline=$((SECONDS + 5))
        while kill -0 "$REDIS_PID" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.05; done
        kill -9 "$REDIS_PID" 2>/dev/null
        wait "$REDIS_PID" 2>/dev/null
        REDIS_PID=
    fi
    [[ -n ${REDIS_DIR:-} && -d $REDIS_DIR ]] && rm -rf "$REDIS_DIR"
    REDIS_DIR=
    return 0
}

# ---- Sentinel set (primary + replica + sentinels on loopback) -------------
#   redis_sentinel_up [N]   redis_start (the primary), a replica of it, and N
#                           sentinels (default 3, quorum 2, down-after 500 ms)
#                           monitoring it as master "xfer"; waits until every
#                           sentinel sees the replica and the others. Sets
#                           SENTINEL_URL SENT_PORTS[] SENT_PIDS[] REPLICA_PORT
#                           REPLICA_PID.
#   redis_sentinel_primary  "host port" of the primary a sentinel names now
#   redis_sentinel_down     stops the replica and the sentinels (then redis_stop)
declare -a SENT_PORTS=() SENT_PIDS=()

# _redis_spawn PORT LOGNAME ARGS...: a server like _redis_launch, pid in _SPAWNED.
_redis_spawn() {
    local port=$1 log=$2; shift 2
    redis-server --port "$port" --bind 127.0.0.1 --dir "$REDIS_DIR" --save '' --appendonly no \
        --daemonize no --logfile "$REDIS_DIR/$log.log" "$@" </dev/null &
    _SPAWNED=$!
}

_redis_wait_info() { # port section pattern: polls INFO (10 s max)
    local deadline=$((SECONDS + 10))
    while ((SECONDS < deadline)); do
        redis-cli -p "$1" info "$2" 2>/dev/null | tr -d '\r' | grep -qE "$3" && return 0
        sleep 0.05
    done
    return 1
}

redis_sentinel_up() {
    local n=${1:-3} i
    redis_start || return $?
    REPLICA_PORT=$(_redis_free_port)
    _redis_spawn "$REPLICA_PORT" replica --dbfilename replica.rdb --replicaof 127.0.0.1 "$REDIS_PORT"
    REPLICA_PID=$_SPAWNED
    _redis_wait_info "$REPLICA_PORT" replication '^master_link_status:up' ||
        { echo "replica did not sync" >&2; return 1; }
    local hosts=()
    for ((i = 0; i < n; i++)); do
        SENT_PORTS[i]=$(_redis_free_port)
        cat >"$REDIS_DIR/sentinel$i.conf" <<CONF
port ${SENT_PORTS[i]}
bind 127.0.0.1
dir $REDIS_DIR
logfile $REDIS_DIR/sentinel$i.log
sentinel monitor xfer 127.0.0.1 $REDIS_PORT 2
sentinel down-after-milliseconds xfer 500
sentinel failover-timeout xfer 5000
CONF
        redis-server "$REDIS_DIR/sentinel$i.conf" --sentinel </dev/null &
        SENT_PIDS[i]=$!
        hosts+=("127.0.0.1:${SENT_PORTS[i]}")
    done
    local deadline=$((SECONDS + 20)) p ok
    while ((SECONDS < deadline)); do
        ok=1
        for p in "${SENT_PORTS[@]}"; do
            redis-cli -p "$p" sentinel master xfer 2>/dev/null | tr -d '\r' |
                awk -v want=$((n - 1)) '/^num-slaves$/{getline; s=$1} /^num-other-sentinels$/{getline; o=$1}
                    END{exit !(s >= 1 && o >= want)}' || ok=0
        done
        ((ok)) && break
        sleep 0.1
    done
    ((ok)) || { echo "sentinels did not discover each other and the replica" >&2; return 1; }
    SENTINEL_URL="redis-sentinel://$(IFS=,; echo "${hosts[*]}")/xfer"
    export SENTINEL_URL REPLICA_PORT
}

redis_sentinel_primary() {
    local p
    for p in "${SENT_PORTS[@]}"; do
        redis-cli -p "$p" sentinel get-master-addr-by-name xfer 2>/dev/null | tr '\n' ' ' && return 0
    done
    return 1
}

redis_sentinel_down() {
    local pid
    for pid in "${SENT_PIDS[@]}" ${REPLICA_PID:-}; do
        kill -9 "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    SENT_PIDS=() REPLICA_PID=
    return 0
}

# ---- Redis Cluster (three primaries, one replica each) --------------------
#   redis_cluster_up [IP [ARGS...]]  six servers bound to 127.0.0.1 (and IP,
#                           announced to clients and peers when given; ARGS go
#                           to every redis-server), joined with
#                           redis-cli --cluster create --cluster-replicas 1;
#                           waits for cluster_state:ok. Sets CLUSTER_URL
#                           CLUSTER_IP CLUSTER_PORTS[] CLUSTER_PIDS[].
#   redis_cluster_cli I ARGS...   redis-cli -c against server I
#   redis_cluster_owner SLOT      index of the primary serving SLOT
#   redis_cluster_kill I          SIGKILL server I
#   redis_cluster_down            stops all six and removes their dirs
declare -a CLUSTER_PORTS=() CLUSTER_PIDS=()
CLUSTER_DIR=

redis_cluster_up() {
    command -v redis-server >/dev/null || { echo "SKIP: redis-server not installed"; return 77; }
    CLUSTER_IP=${1:-127.0.0.1}
    shift
    local extra=("$@")
    CLUSTER_DIR=$(mktemp -d "${TMPDIR:-/tmp}/xfer-cluster.XXXXXX") || return 1
    local i bind=127.0.0.1 addrs=() announce=()
    [[ $CLUSTER_IP != 127.0.0.1 ]] && bind="127.0.0.1 $CLUSTER_IP" announce=(--cluster-announce-ip "$CLUSTER_IP")
    for i in 0 1 2 3 4 5; do
        CLUSTER_PORTS[i]=$(_redis_free_port)
        mkdir -p "$CLUSTER_DIR/$i"
        redis-server --port "${CLUSTER_PORTS[i]}" --bind "$bind" --protected-mode no \
            --cluster-enabled yes --cluster-port "$(_redis_free_port)" \
            --cluster-config-file nodes.conf --cluster-node-timeout 1000 \
            --cluster-replica-validity-factor 0 "${announce[@]}" --dir "$CLUSTER_DIR/$i" \
            --save '' --appendonly no --logfile "$CLUSTER_DIR/$i/redis.log" "${extra[@]}" </dev/null &
        CLUSTER_PIDS[i]=$!
        addrs+=("$CLUSTER_IP:${CLUSTER_PORTS[i]}")
    done
    for i in 0 1 2 3 4 5; do
        local deadline=$((SECONDS + 5))
        until [[ $(redis-cli -p "${CLUSTER_PORTS[i]}" ping 2>/dev/null) == PONG ]]; do
            ((SECONDS < deadline)) || { echo "cluster server $i did not start" >&2; return 1; }
            sleep 0.05
        done
    done
    redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
        >"$CLUSTER_DIR/create.log" 2>&1 || { cat "$CLUSTER_DIR/create.log" >&2; return 1; }
    local deadline=$((SECONDS + 20)) ok
    while ((SECONDS < deadline)); do
        ok=1
        for i in 0 1 2 3 4 5; do
            redis-cli -p "${CLUSTER_PORTS[i]}" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || ok=0
        done
        ((ok)) && break
        sleep 0.1
    done
    ((ok)) || { echo "cluster not ok in 20 s" >&2; return 1; }
    CLUSTER_URL="redis-cluster://$(IFS=,; echo "${addrs[*]:0:3}")"
    export CLUSTER_URL CLUSTER_IP
}

redis_cluster_cli() {
    local i=$1; shift
    redis-cli -c -p "${CLUSTER_PORTS[i]}" "$@"
}

redis_cluster_owner() { # slot -> index of its primary, as a live node sees it
    local slot=$1 i port=
    for i in 0 1 2 3 4 5; do
        kill -0 "${CLUSTER_PIDS[i]}" 2>/dev/null || continue
        port=$(redis-cli -p "${CLUSTER_PORTS[i]}" cluster nodes 2>/dev/null | awk -v s="$slot" '
            $3 ~ /master/ && $3 !~ /fail/ { for (k = 9; k <= NF; k++) { if ($k ~ /^\[/) continue
                n = split($k, r, "-"); lo = r[1] + 0; hi = (n > 1 ? r[2] : r[1]) + 0
                if (lo <= s && s <= hi) { split($2, a, "[:@]"); print a[2]; exit } } }')
        [[ -n $port ]] && break
    done
    for i in 0 1 2 3 4 5; do [[ ${CLUSTER_PORTS[i]} == "$port" ]] && { echo "$i"; return 0; }; done
    return 1
}

redis_cluster_kill() {
    kill -9 "${CLUSTER_PIDS[$1]}" 2>/dev/null
    wait "${CLUSTER_PIDS[$1]}" 2>/dev/null
}

redis_cluster_down() {
    local pid
    for pid in "${CLUSTER_PIDS[@]}"; do
        kill -9 "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    CLUSTER_PIDS=()
    [[ -n $CLUSTER_DIR && -d $CLUSTER_DIR ]] && rm -rf "$CLUSTER_DIR"
    CLUSTER_DIR=
    return 0
}
