#!/usr/bin/env bash
# Control-server limits (issue 14 item 3, issue 18 item 5), one xferd on the
# loopback:
#  - 1,000 silent TCP clients (no handshake bytes) leave `xferctl --connect
#    ... health` answering from the same source address, its median of 5
#    within 3x + 100 ms of the median of 5 just before they connected;
#  - a client that pipelines reads and never reads its replies is cut off
#    (or stopped) while xferd's memory stays bounded and others are served;
#  - connections past the cap get a clear error; registrations past
#    max_region_bytes too;
#  - a client with 64 async batches queued or running gets a clear error for
#    the next one, and xferd keeps serving (issue 18 item 5).
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
source tests/lib/service.sh
# Under ASan (make test SAN=1) freed memory waits in a 256 MB quarantine
# before reuse, which the RSS bound below would count as growth: keep it small.
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=8:allocator_release_to_os_interval_ms=100
ABUSE=$B/tests/ctl_abuse
[[ -x $ABUSE && -x $XFERD && -x $XFERCTL ]] || fail "ctl_abuse/xferd/xferctl not built in $B"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; [[ -n ${SVC_PID[c2]:-} ]] && kill -CONT "${SVC_PID[c2]}" 2>/dev/null; svc_cleanup; redis_stop' EXIT
svc_init
svc_redis_up

svc_start c1 0 --redis-url "$REDIS_URL" --secret s3cret --region kv:8M:rw --max-region-bytes 64M
svc_wait_ready c1
port=$(redis-cli -p "$REDIS_PORT" hget 'xfer:node:{c1}' ctrl_port)
[[ -n $port ]] || fail "no ctrl_port published"
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# Starts "$ABUSE ARGS" with its stdin on a fifo (EOF = let go); waits for
# its one status line (15 s max) into $ABUSE_OUT.
abuse() {
    local fifo=$SVC_DIR/abuse.$RANDOM out=$SVC_DIR/abuse.out.$RANDOM
    mkfifo "$fifo"
    "$ABUSE" "$@" <"$fifo" >"$out" 2>&1 &
    pids+=($!)
    exec {ABUSE_FD}>"$fifo"
    wait_for 15 test -s "$out" || fail "ctl_abuse $1 gave no status: $(cat "$out")"
    ABUSE_OUT=$(cat "$out")
}
let_go() { exec {ABUSE_FD}>&-; }

# ---- 1,000 silent TCP clients -------------------------------------------------
# Five healths over TCP: their times in ms (the xferctl process start counts).
health_times() {
    local t0 i
    times=()
    for i in 1 2 3 4 5; do
        t0=$(now_ms)
        "$XFERCTL" --connect "127.0.0.1:$port" --secret s3cret --timeout 2000 health |
            grep -q 'node c1' || fail "health over TCP $1"
        times+=($(($(now_ms) - t0)))
    done
    sorted=($(printf '%s\n' "${times[@]}" | sort -n))
}
health_times "before the silent clients"
base=${sorted[2]} base_times=${times[*]}
abuse silent 127.0.0.1 "$port" 1000
[[ $ABUSE_OUT == "open 1000" ]] || fail "silent clients: $ABUSE_OUT"
health_times "with 1,000 silent clients connected"
# A loop blocked by the silent clients fails every health above (2 s
# timeout). Beyond that, the median with them is held against the median
# of the same healths just before, on the same machine in the same run
# (not a fixed time: a median of 112 ms against a 100 ms limit failed once
# when two full suites shared the 2-core VM; ~10 ms alone): at most 3x
# that + 100 ms; the worst under 1 s (one slow process start under load).
median=${sorted[2]} worst=${sorted[4]}
((median <= 3 * base + 100 && worst < 1000)) ||
    fail "health took ${times[*]} ms with 1,000 silent clients, ${base_times} ms before (limits: median 3 x ${base} + 100 ms, worst 1 s)"
grep -q "half-open control connections per source reached" "$SVC_DIR/c1.log" \
    || fail "no warning about the half-open cap in the log"
echo "ok: 1,000 silent TCP clients: health over TCP in ${times[*]} ms (${base_times} ms before)"
let_go

# ---- connection cap (unix socket) ------------------------------------------
abuse hold "$SVC_DIR/c1.sock" 256
[[ $ABUSE_OUT == "open 256" ]] || fail "holding connections: $ABUSE_OUT"
out=$(ctl c1 health 2>&1) && fail "a 257th connection was served"
[[ $out == *"at most 256 control connections"* ]] || fail "no clear error past the cap: $out"
let_go
wait_for 10 ctl c1 health || fail "health after the held connections closed"
echo "ok: connection 257 refused with a clear error, served again after"

# ---- a client that never reads its replies ----------------------------------
pid=${SVC_PID[c1]}
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$pid/status"; }
base=$(rss_kb)
abuse noread "$SVC_DIR/c1.sock" c1/kv 1048576 2000
[[ $ABUSE_OUT == "closed after"* || $ABUSE_OUT == "blocked after"* ]] || fail "noread: $ABUSE_OUT"
peak=$(rss_kb)
for i in $(seq 20); do
    r=$(rss_kb); ((r > peak)) && peak=$r
    ctl c1 health >/dev/null || fail "health while a client does not read its replies"
done
grown=$(((peak - base) / 1024))
# Unbounded, 2,000 replies of 1 MiB would be 2 GB; the limits keep it to
# tens of MB (32 MiB of unread replies, in-flight reads, allocator slack).
# Under ASan (SAN=1) the allocator keeps freed chunks of its size classes
# and redzones every buffer: measured 280-420 MB there against 2 MB plain.
# On a loaded machine a plain build was seen at 179 MB (reads in flight
# pile up while the loop is starved). Both bounds still tell bounded from
# the unbounded 2 GB.
limit=512
nm -D "$XFERD" 2>/dev/null | grep -q __asan_init && limit=1024
((grown < limit)) || fail "xferd grew by $grown MB for a client that does not read ($ABUSE_OUT)"
echo "ok: a client that never reads its replies: $ABUSE_OUT of 2000 requests, xferd grew $grown MB"
let_go

# ---- async batches per client -----------------------------------------------
ctl c1 register kv2 8M >/dev/null || fail "register kv2"
# 80 async batches pipelined on one connection, each a 4 KiB READ from a peer
# that is stopped (SIGSTOP, every thread) while they are submitted, so they
# cannot finish before the later ones arrive: 64 accepted, the rest refused.
# (Local copies that merely took long flaked: all 80 accepted when the
# machine was busy and xferd read the requests slower than the copies ran.)
# tcp only: an ipc peer lends its memory for direct copies, which need no owner
XFER_TRANSPORTS=tcp svc_start c2 0 --redis-url "$REDIS_URL" --secret s3cret --region kv:8M:rw
svc_wait_ready c2
ctl c1 copy c1/kv c2/kv 4096 >/dev/null || fail "warm c1 -> c2"
pid_freeze "${SVC_PID[c2]}" || fail "c2 did not stop"
out=$("$ABUSE" async "$SVC_DIR/c1.sock" c2/kv c1/kv 4096 1 80 2>&1)
abuse_rc=$?
kill -CONT "${SVC_PID[c2]}"
((abuse_rc == 0)) || fail "async flood: $out"
read -r _ accepted _ refused <<<"$(head -1 <<<"$out")"
((accepted >= 64 && refused >= 1 && accepted + refused == 80)) || fail "async flood: $out"
[[ $(sed -n 2p <<<"$out") == *"64 async batches running (the limit)"* ]] \
    || fail "no clear error past 64 async batches: $out"
ctl c1 health >/dev/null || fail "health after the async flood"
# Once they are done, the same client may submit again (the slots came back).
wait_for 120 bash -c "\"$ABUSE\" async \"$SVC_DIR/c1.sock\" c1/kv c1/kv2 4096 1 64 | grep -qx 'accepted 64 refused 0'" \
    || fail "async batches refused after the earlier ones finished"
wait_for 60 ctl c1 deregister kv2 || fail "deregister kv2"
echo "ok: async batch 65+ of one client refused with a clear error ($accepted accepted, $refused refused), served after"

# ---- registration size -------------------------------------------------------
out=$(ctl c1 register big 128M 2>&1) && fail "a 128 MiB region past max_region_bytes was registered"
[[ $out == *max_region_bytes* ]] || fail "no clear error for a too large region: $out"
ctl c1 register mid 40M >/dev/null || fail "a 40 MiB region within the limit"
out=$(ctl c1 register more 20M 2>&1) && fail "regions past max_region_bytes in total"
[[ $out == *max_region_bytes* ]] || fail "no clear error for the total: $out"
ctl c1 deregister mid || fail "deregister"
ctl c1 register more 20M >/dev/null || fail "20 MiB after freeing 40"
echo "ok: registrations past max_region_bytes refused with a clear error"

svc_kill c1 TERM; rc=$?
grep -qE "AddressSanitizer|LeakSanitizer|runtime error" "$SVC_DIR/c1.log" && fail "sanitizer report: $(grep -A20 Sanitizer "$SVC_DIR/c1.log")"
((rc == 0)) || fail "xferd exit status after SIGTERM: $rc"
echo "control limits test passed"
