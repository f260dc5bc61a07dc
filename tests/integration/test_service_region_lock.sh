#!/usr/bin/env bash
# Region registration is not starved by transfers (issue 18 item 4, second
# half). xferd's region rwlock is held for reading across every transfer
# batch; with glibc's default (readers first), three clients that each keep
# two batches running meant the read side was never free, and a deregistration
# (the write side) waited for as long as they kept going. Now writers come
# first: deregistering a region no transfer uses, and registering a new one,
# must answer within 3 s while the three clients keep copying between two
# other regions.
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
source tests/lib/service.sh
ABUSE=$B/tests/ctl_abuse
[[ -x $ABUSE && -x $XFERD && -x $XFERCTL ]] || fail "ctl_abuse/xferd/xferctl not built in $B"
pids=() fds=()
trap 'for f in "${fds[@]}"; do exec {f}>&-; done; for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; svc_cleanup; redis_stop' EXIT
svc_init
svc_redis_up

# 8 workers: six run the clients' batches, two are free for the registry changes.
svc_start r1 0 --redis-url "$REDIS_URL" --workers 8 --region a:8M:rw --region b:8M:rw \
    --region victim:1M:rw --region victim2:1M:rw
svc_wait_ready r1
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# Three clients, two batches each always in flight: a 4 MiB copy a -> b run
# 200 times under one read lock (a tenth of a second or more), the next sent as soon as one is
# answered: with six overlapping holders the read side is never free.
for i in 1 2 3; do
    fifo=$SVC_DIR/busy.$i out=$SVC_DIR/busy.out.$i
    mkfifo "$fifo"
    "$ABUSE" busy "$SVC_DIR/r1.sock" r1/a r1/b 4194304 200 2 <"$fifo" >"$out" 2>&1 &
    pids+=($!)
    exec {fd}>"$fifo"
    fds+=($fd)
done
for i in 1 2 3; do
    wait_for 30 grep -qx busy "$SVC_DIR/busy.out.$i" || fail "client $i never got a batch answered: $(cat "$SVC_DIR/busy.out.$i")"
done

# Each registry change must answer within 3 s (it waits for the batches
# running when it asked, and no later ones).
timed() { # what, command...: runs it in the background, fails past 3 s
    local what=$1; shift
    local t0 rc
    t0=$(now_ms)
    "$@" >"$SVC_DIR/timed.out" 2>&1 &
    local p=$!
    wait_for 3 bash -c "! kill -0 $p" || { kill "$p" 2>/dev/null; fail "$what took more than 3 s while transfers ran"; }
    wait "$p"; rc=$?
    ((rc == 0)) || fail "$what failed: $(cat "$SVC_DIR/timed.out")"
    echo "ok: $what answered in $(($(now_ms) - t0)) ms while 3 clients kept copying"
}
timed "deregister victim" ctl r1 deregister victim
timed "register fresh" ctl r1 register fresh 1M
timed "deregister victim2" ctl r1 deregister victim2

for f in "${fds[@]}"; do exec {f}>&-; done
fds=()
for i in 1 2 3; do
    wait "${pids[$((i - 1))]}" || fail "client $i: $(cat "$SVC_DIR/busy.out.$i")"
    grep -q '^done [1-9]' "$SVC_DIR/busy.out.$i" || fail "client $i: $(cat "$SVC_DIR/busy.out.$i")"
done
pids=()
cat "$SVC_DIR"/busy.out.*
ctl r1 regions | grep -q fresh || fail "region fresh not listed"
ctl r1 regions | grep -q victim && fail "a deregistered region is still listed"
svc_kill r1 TERM; rc=$?
grep -qE "AddressSanitizer|LeakSanitizer|runtime error" "$SVC_DIR/r1.log" && fail "sanitizer report: $(grep -A20 Sanitizer "$SVC_DIR/r1.log")"
((rc == 0)) || fail "xferd exit status after SIGTERM: $rc"
echo "region lock test passed"
