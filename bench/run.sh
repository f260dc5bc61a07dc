#!/usr/bin/env bash
# make bench: iperf3 single-stream loopback throughput as the ceiling, then
# bench_tcp (one-sided WRITE/READ, 4 KiB..64 MiB, 1 and 4 sockets) in the
# same run, with each point's ratio to the ceiling; then bench_notify
# (notifications, send/recv vs WRITE) over tcp and ipc.
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
secs=${XFER_BENCH_SECONDS:-0.5}
repeat=${XFER_BENCH_REPEAT:-3} # best of N per point: the machine may be shared
ceiling=0
if command -v iperf3 >/dev/null; then
    port=$((20000 + RANDOM % 20000))
    for try in 1 2 3; do # the server needs a moment to listen; retry the client
        timeout 20 iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
        srv=$!
        sleep 0.3
        ceiling=$(timeout 15 iperf3 -c 127.0.0.1 -p "$port" -t 3 -J 2>/dev/null |
            python3 -c '
import json, sys
r = json.load(sys.stdin)
best = max(i["sum"]["bits_per_second"] for i in r["intervals"]) / 8e9
mean = r["end"]["sum_received"]["bits_per_second"] / 8e9
print("%.2f %.2f" % (best, mean))' 2>/dev/null)
        kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null
        [[ -n $ceiling ]] && break
        ceiling=0
    done
    read -r ceiling mean <<<"$ceiling ${mean:-}"
    echo "iperf3 single stream, loopback: best 1 s interval $ceiling GB/s, mean ${mean:-?} GB/s (ceiling = best)"
else
    echo "iperf3 not installed: no ceiling"
fi
"$B/bench/bench_tcp" --seconds "$secs" --repeat "$repeat" --ceiling-gbps "$ceiling"
# notifications and send/recv against one-sided WRITE (docs/notify.md#measured)
for tr in tcp ipc; do
    "$B/bench/bench_notify" --transport "$tr" --seconds "$secs" --repeat "$repeat"
done
