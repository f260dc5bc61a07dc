#!/usr/bin/env bash
# Prometheus /metrics of xferd (--metrics-port): scraped while named
# transfers run, counters never go down and end moved by exactly the bytes
# and items moved, per node, peer and transport, on both sides; registry
# gauges; `xferctl stats` shows the same numbers; non-GET and other paths
# are refused. Real redis-server, two real xferd.
set -u
cd "${XFER_ROOT:-$(dirname "$0")/../..}"
B=${B:-build}
skip() { echo "SKIP: $*"; exit 77; }
[[ -x $B/bin/xferd && -x $B/bin/xferctl ]] || skip "xferd/xferctl not built in $B"
command -v curl >/dev/null || skip "curl missing"
source tests/lib/service.sh

svc_init
trap 'svc_cleanup; redis_stop' EXIT
redis_start || fail "redis did not start"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
P1=$(free_port) P2=$(free_port)
for n in m1 m2; do
    port=$([[ $n == m1 ]] && echo "$P1" || echo "$P2")
    svc_start "$n" 0 --redis-url "$REDIS_URL" --transports tcp --region kv:16M:rw \
        --metrics-port "$port"
done
svc_wait_ready m1
svc_wait_ready m2

scrape() { curl -sf --max-time 5 "http://127.0.0.1:$1/metrics"; }
metric() { awk -v k="$2" '$1 == k {print $2; found = 1} END {exit !found}' <<<"$1"; }
must() { # text key -> value, or fail
    local v
    v=$(metric "$1" "$2") || fail "metric $2 missing"
    echo "$v"
}
wait_for 10 bash -c "curl -sf http://127.0.0.1:$P1/metrics | grep -qx 'xfer_registry_known_peers 1'" ||
    fail "m1 never lists m2 as a known peer: $(scrape "$P1" | grep registry)"

# ---- format and content type ----------------------------------------------
ctype=$(curl -sf -o /dev/null -w '%{content_type}' "http://127.0.0.1:$P1/metrics")
[[ $ctype == "text/plain; version=0.0.4"* ]] || fail "content type '$ctype'"
before1=$(scrape "$P1") || fail "cannot scrape m1"
before2=$(scrape "$P2") || fail "cannot scrape m2"
bad=$(grep -v '^#' <<<"$before1" | grep -Ev '^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})? [0-9.e+-]+$' | head -n 3)
[[ -z $bad ]] || fail "malformed sample lines: $bad"
[[ $(must "$before1" xfer_registry_connected) == 1 ]] || fail "m1 registry not connected"
[[ $(must "$before1" xfer_regions) == 1 ]] || fail "m1 should publish 1 region"
[[ $(must "$before1" xfer_up) == 1 ]] || fail "xfer_up"

# ---- scrape while transfers run ----------------------------------------------
count=24 size=$((4 << 20)) total=$((24 * (4 << 20)))
head -c "$size" /dev/urandom >"$SVC_DIR/in"
ctl m1 put "$SVC_DIR/in" m1/kv >/dev/null || fail "put"
base1=$(scrape "$P1") base2=$(scrape "$P2")
key_w='xfer_node_bytes_total{op="write"}'
(
    for ((i = 0; i < count; i++)); do
        ctl m1 copy m1/kv "m2/kv+$(((i % 3) * size))" "$size" >/dev/null || exit 1
    done
) &
copier=$!
scrapes=0 intermediate=0 last=$(must "$base1" "$key_w")
while kill -0 "$copier" 2>/dev/null; do
    s=$(scrape "$P1") || fail "scrape failed during transfers"
    v=$(must "$s" "$key_w")
    ((v >= last)) || fail "counter went down: $last -> $v"
    last=$v scrapes=$((scrapes + 1))
    (( v > $(must "$base1" "$key_w") && v < $(must "$base1" "$key_w") + total )) &&
        intermediate=$((intermediate + 1))
done
wait "$copier" || fail "a copy failed"
echo "scrapes during the transfers: $scrapes ($intermediate saw a partial total)"
((scrapes > 0)) || fail "no scrape completed while the transfers ran"

# ---- counters moved by exactly what was moved ------------------------------------
after1=$(scrape "$P1") after2=$(scrape "$P2")
delta() { # text-before text-after key (a series absent before counts as 0)
    local b
    b=$(metric "$1" "$3") || b=0
    echo $(($(must "$2" "$3") - b))
}
check() { # before after key expected what
    local d
    d=$(delta "$1" "$2" "$3")
    [[ $d == "$4" ]] || fail "$5: $3 moved by $d, expected $4"
    echo "ok: $5 $3 +$d"
}
check "$base1" "$after1" "$key_w" "$total" m1
check "$base1" "$after1" 'xfer_node_ops_total{op="write"}' "$count" m1
check "$base1" "$after1" 'xfer_peer_bytes_total{peer="m2",op="write"}' "$total" m1
check "$base1" "$after1" 'xfer_transport_bytes_total{transport="tcp",op="write"}' "$total" m1
check "$base1" "$after1" xfer_node_op_latency_seconds_count "$count" m1
check "$base1" "$after1" 'xfer_node_op_latency_seconds_bucket{le="+Inf"}' "$count" m1
check "$base1" "$after1" xfer_node_errors_total 0 m1
check "$base2" "$after2" xfer_node_served_bytes_total "$total" m2
check "$base2" "$after2" 'xfer_transport_served_bytes_total{transport="tcp"}' "$total" m2
metric "$after1" 'xfer_peer_transport_info{peer="m2",transport="tcp"}' >/dev/null ||
    fail "m1 does not report tcp towards m2"

# ---- the same numbers in xferctl stats -----------------------------------------
stats=$(ctl m1 stats) || fail "xferctl stats"
written=$(awk '$1 == "total" {print $6}' <<<"$stats")
[[ $written == "$(must "$after1" "$key_w")" ]] ||
    fail "xferctl stats says $written bytes written, /metrics $(must "$after1" "$key_w")"
prom=$(ctl m1 stats --prometheus) || fail "xferctl stats --prometheus"
for k in "$key_w" 'xfer_peer_bytes_total{peer="m2",op="write"}' xfer_node_op_latency_seconds_count \
    'xfer_node_op_latency_seconds_bucket{le="+Inf"}'; do
    [[ $(must "$prom" "$k") == "$(must "$after1" "$k")" ]] ||
        fail "xferctl stats --prometheus $k = $(must "$prom" "$k"), /metrics $(must "$after1" "$k")"
done
echo "ok: xferctl stats (table and --prometheus) and /metrics agree: $written bytes written by m1"

# ---- what is refused ---------------------------------------------------------------
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P1/")
[[ $code == 404 ]] || fail "GET / gave $code"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST --data x "http://127.0.0.1:$P1/metrics")
[[ $code == 405 || $code == 501 ]] || fail "POST /metrics gave $code"
scrape "$P1" >/dev/null || fail "server unusable after refused requests"

# ---- a port in use is a clear startup error ----------------------------------------
svc_start m3 0 --redis-url "$REDIS_URL" --metrics-port "$P1"
wait_for 10 bash -c "! kill -0 ${SVC_PID[m3]} 2>/dev/null" || fail "xferd started on a taken metrics port"
grep -q "metrics on .*:$P1" "$SVC_DIR/m3.log" || fail "no clear error: $(tail -n 3 "$SVC_DIR/m3.log")"
svc_kill m3

# ---- known peers come from registry events, not Redis per scrape -----------------
pid_freeze "$REDIS_PID" || { kill -CONT "$REDIS_PID"; fail "redis did not stop"; } # every thread
t0=$(date +%s%N)
out=$(scrape "$P1") || { kill -CONT "$REDIS_PID"; fail "no scrape while Redis is stopped"; }
ms=$((($(date +%s%N) - t0) / 1000000))
kill -CONT "$REDIS_PID"
((ms < 500)) || fail "a scrape took $ms ms while Redis was stopped (a Redis call per scrape?)"
[[ $(metric "$out" xfer_registry_known_peers) == 1 ]] || fail "known peers while Redis is stopped: $(grep known <<<"$out")"
echo "ok: scrape in $ms ms with Redis stopped, known peers still 1"

# ---- metrics are on by default: port 9400 on the listen address ---------------------
# (a loopback address of its own, so no other xferd holds 9400 there)
addr=127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1)).$((RANDOM % 250 + 1))
SVC_METRICS_PORT= svc_start m4 0 --redis-url "$REDIS_URL" --listen "$addr" --transports tcp
svc_wait_ready m4
wait_for 10 curl -sf "http://$addr:9400/metrics" || fail "no /metrics on $addr:9400 by default: $(tail -n 3 "$SVC_DIR/m4.log")"
curl -sf "http://$addr:9400/metrics" | grep -q '^xfer_registry_connected 1$' || fail "default /metrics content"
svc_kill m4 TERM || fail "m4 exit status"
echo "ok: /metrics on by default at $addr:9400"

for n in m1 m2; do
    svc_kill "$n" TERM || fail "xferd $n exited non-zero on SIGTERM"
    ! grep -q 'ERROR: AddressSanitizer\|runtime error:' "$SVC_DIR/$n.log" ||
        fail "sanitizer report in $n.log"
done
echo "PASS"
