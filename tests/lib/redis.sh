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
        kill "$REDIS_PID" 2>/dev/null
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
