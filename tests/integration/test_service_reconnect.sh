#!/usr/bin/env bash
# Two xferd on the loopback: b is frozen (SIGSTOP) past a's io timeout, so a
# cuts its sockets to b; after SIGCONT, a must reach b again within 10 s
# without either process restarting (the engine repairs the connection, and
# xferd reconnects when xfer_peer_transport() reports it dead).
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
source tests/lib/service.sh
trap 'kill -CONT "${SVC_PID[b]:-0}" 2>/dev/null; svc_cleanup; redis_stop' EXIT
svc_init
svc_redis_up
for n in a b; do # long TTL: a frozen b must not leave the registry meanwhile
    XFER_IO_TIMEOUT_MS=1500 svc_start "$n" 0 --listen 127.0.0.1 --redis-url "$REDIS_URL" \
        --ttl-ms 60000 --transports tcp --region r1:4M:rw
done
svc_wait_ready a
svc_wait_ready b
wait_for 10 ctl a copy a/r1 b/r1 4096 || fail "warm-up copy a -> b: $(ctl a copy a/r1 b/r1 4096 2>&1)"

pid_freeze "${SVC_PID[b]}" || fail "b did not stop" # every thread: a half-stopped b still answers
t0=$SECONDS
out=$(CTL_TIMEOUT=20000 ctl a copy a/r1 b/r1 4194304 2>&1) && fail "copy to a frozen node succeeded"
echo "copy to frozen b failed after $((SECONDS - t0)) s: $out"
kill -CONT "${SVC_PID[b]}"

ctl a write a/r1+100 'after the freeze' || fail "inline write"
t0=$SECONDS
wait_for 10 ctl a copy a/r1+100 b/r1+100 16 ||
    { tail -20 "$SVC_DIR/a.log"; fail "b not reachable again after the freeze: $(ctl a copy a/r1+100 b/r1+100 16 2>&1)"; }
echo "a reaches b again $((SECONDS - t0)) s after SIGCONT"
[[ $(ctl b read b/r1+100 16) == 'after the freeze' ]] || fail "content after the freeze"
for i in 1 2 3; do ctl a copy a/r1 b/r1 4194304 >/dev/null || fail "copy $i after the freeze"; done
grep -E "re-established|reconnect" "$SVC_DIR/a.log" | head -3
svc_kill a || fail "a exit status"
svc_kill b || fail "b exit status"
echo "PASS"
