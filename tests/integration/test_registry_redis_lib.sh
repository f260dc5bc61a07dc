#!/usr/bin/env bash
# tests/lib/redis.sh itself: start, restart empty on the same port, stop and
# clean up (other integration scripts rely on it).
set -u
source "$XFER_ROOT/tests/lib/redis.sh"
trap 'redis_stop' EXIT
redis_start || exit $?
fail() { echo "FAIL: $*"; exit 1; }
[[ $(redis_cli ping) == PONG ]] || fail "no PONG on $REDIS_PORT"
[[ $REDIS_URL == "redis://127.0.0.1:$REDIS_PORT" ]] || fail "REDIS_URL=$REDIS_URL"
[[ -S $REDIS_SOCK ]] || fail "no unix socket at $REDIS_SOCK"
redis_cli set k v >/dev/null
old_pid=$REDIS_PID
redis_restart || fail "restart"
[[ $REDIS_PID != "$old_pid" ]] || fail "same pid after restart"
[[ $(redis_cli dbsize) == 0 ]] || fail "restarted redis is not empty"
dir=$REDIS_DIR pid=$REDIS_PID
redis_stop
kill -0 "$pid" 2>/dev/null && fail "redis-server $pid still running"
[[ -e $dir ]] && fail "$dir left behind"
echo "ok"
