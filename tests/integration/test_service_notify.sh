#!/usr/bin/env bash
# Notifications through xferd and xferctl (docs/service.md, docs/notify.md):
# two xferd (n1, n2) and a real redis-server. notify -> listen roundtrip
# (text and --json), a listener's --count leaves the rest queued for the
# next one, copy --notify delivers after the data (the listener reads the
# data the moment the notification arrives), a listener that goes away and
# one that never reads (disconnected, xferd keeps serving), bad input.
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
source tests/lib/service.sh
trap 'for p in $(jobs -p); do kill "$p" 2>/dev/null; done; svc_cleanup; redis_stop' EXIT
svc_init
redis_start; rc=$?; ((rc == 77)) && exit 77; ((rc == 0)) || fail "redis did not start"
svc_start n1 0 --redis-url "$REDIS_URL" --transports tcp --region r1:4M:rw
svc_start n2 0 --redis-url "$REDIS_URL" --transports tcp --region r2:4M:rw --io-timeout-ms 2000
svc_wait_ready n1
svc_wait_ready n2
wait_for 10 ctl n1 regions n2 || fail "n1 does not see n2"
D=$SVC_DIR

# 1. standalone: sent before anyone listens, it waits in n2's queue.
ctl n1 notify n2 'hello from n1' || fail "notify"
out=$(ctl n2 --timeout 10000 listen --count 1) || fail "listen: $out"
[[ $out == "from n1 (incarnation "*") standalone: hello from n1" ]] || fail "listen printed '$out'"

# --json, one object per line; a listener's --count leaves the rest queued.
ctl n1 notify n2 'quote " back\slash tab	end' || fail "notify 2"
ctl n1 notify n2 'second' || fail "notify 3"
ctl n2 --json --timeout 10000 listen --count 1 >"$D/j1" || fail "listen --json"
ctl n2 --json --timeout 10000 listen --count 1 >"$D/j2" || fail "listen --json (the rest)"
python3 - "$D/j1" "$D/j2" <<'PY' || fail "listen --json: $(cat "$D/j1" "$D/j2")"
import json, sys
got = [json.loads(l) for f in sys.argv[1:] for l in open(f)]
assert len(got) == 2, got
texts = sorted(o["text"] for o in got)
assert texts == sorted(['quote " back\\slash tab\tend', "second"]), texts
for o in got:
    assert o["node"] == "n1" and o["bound"] is False and o["status"] == 0, o
    assert len(o["incarnation"]) == 16 and o["failed"] == [], o
PY

# 2. copy --notify: the listener reads n2's memory the moment a notification
# arrives and compares it with what was copied (round i lands at +i*256K).
rounds=6
for i in $(seq 0 $((rounds - 1))); do
    head -c 262144 /dev/urandom >"$D/in$i"
    ctl n1 put "$D/in$i" "n1/r1+$((i * 262144))" || fail "put $i"
done
(
    ctl n2 --json --timeout 30000 listen --count "$rounds" | while read -r line; do
        i=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["text"].split()[1])' "$line")
        ctl n2 get "n2/r2+$((i * 262144))" 256K "$D/seen$i" || echo "get $i failed"
        cmp -s "$D/in$i" "$D/seen$i" && echo "round $i ok" || echo "round $i DATA MISSING"
        echo "$line" >"$D/notif$i"
    done
) >"$D/listener.out" 2>&1 &
lpid=$!
for i in $(seq 0 $((rounds - 1))); do
    out=$(ctl n1 copy "n1/r1+$((i * 262144))" "n2/r2+$((i * 262144))" 256K --notify "round $i") ||
        fail "copy --notify $i: $out"
    [[ $out == *"notification delivered"* ]] || fail "copy --notify said '$out'"
done
wait_for 30 bash -c "! kill -0 $lpid" || fail "listener did not finish: $(cat "$D/listener.out")"
wait "$lpid"
[[ $(grep -c ' ok$' "$D/listener.out") == "$rounds" ]] ||
    fail "data not there when notified: $(cat "$D/listener.out")"
python3 -c 'import json,sys; o=json.load(open(sys.argv[1])); assert o["bound"] and o["items"] == 1 and o["status"] == 0, o' \
    "$D/notif0" || fail "bound notification fields: $(cat "$D/notif0")"
# READ with --notify (executed by n2): the notification goes to n1, the
# node the data came from.
out=$(ctl n2 copy n1/r1 n2/r2 4K --notify 'read done') || fail "read --notify: $out"
out=$(ctl n1 --timeout 10000 listen --count 1) || fail "listen on n1"
[[ $out == *"from n2"*"after a batch of 1 item(s), all landed: read done" ]] || fail "n1 got '$out'"

# 3. a listener that goes away is dropped; the next one gets what follows.
"$XFERCTL" --socket "$D/n2.sock" listen >/dev/null 2>&1 &
gone=$!
wait_for 5 bash -c "ls -l /proc/$gone/fd 2>/dev/null | grep -q socket" || fail "listener not up"
kill -9 "$gone"; wait "$gone" 2>/dev/null
ctl n1 notify n2 'after the crash' || fail "notify after a listener died"
out=$(ctl n2 --timeout 10000 listen --count 1) || fail "listen after a listener died: $out"
[[ $out == *"after the crash" ]] || fail "got '$out'"

# 4. a listener that never reads: n2 pauses taking from its queue (senders
# keep their notifications queued there), then after io_timeout_ms (2 s
# here) drops it with a warn line and keeps serving.
python3 - "$D/n2.sock" >"$D/slow.out" 2>&1 <<'PY' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
req = bytes([0x08, 0x01, 0xAA, 0x01, 0x00])  # Request{id 1, listen {}}
s.sendall(len(req).to_bytes(4, "little") + req)
time.sleep(60)  # never reads; killed by the test
PY
slow=$!
big=$(head -c 60000 /dev/zero | tr '\0' x)
for i in $(seq 1 40); do
    ctl n1 notify n2 "$big" >/dev/null || fail "notify big $i"
done
wait_for 20 grep -q "notification listener left .* unread .*disconnected" "$D/n2.log" ||
    fail "slow listener not dropped: $(tail -5 "$D/n2.log")"
kill "$slow" 2>/dev/null; wait "$slow" 2>/dev/null
ctl n2 health >/dev/null || fail "n2 stopped serving"
n=$(ctl n2 --json --timeout 3000 listen | wc -l)
((n > 0)) || fail "the notifications the slow listener did not take were lost"
echo "after the slow listener: $n queued notifications delivered to the next listener"

# 5. bad input: a clear error and a nonzero exit, xferd unharmed.
out=$(ctl n1 notify nosuch hi 2>&1); rc=$?
((rc == 1)) && [[ $out == *nosuch* ]] || fail "notify to an unknown node: rc=$rc '$out'"
out=$(ctl n1 notify n1 hi 2>&1); rc=$?
((rc == 1)) && [[ $out == *"is this node"* ]] || fail "notify to itself: rc=$rc '$out'"
out=$(ctl n1 notify n2 "$(head -c 70000 /dev/zero | tr '\0' y)" 2>&1); rc=$?
((rc == 2)) && [[ $out == *"over the limit"* ]] || fail "oversized notification: rc=$rc '${out:0:200}'"
out=$(ctl n1 copy n1/r1 n1/r1+1M 4K --notify x 2>&1); rc=$?
((rc == 1)) && [[ $out == *"needs a remote side"* ]] || fail "local copy --notify: rc=$rc '$out'"
out=$(ctl n1 listen --notify x 2>&1); rc=$?
((rc == 2)) || fail "--notify on listen: rc=$rc '$out'"
out=$(ctl n1 --timeout 300 listen --count 1 2>&1); rc=$?
((rc == 1)) && [[ $out == *"0 of 1 notification(s) within 300 ms"* ]] || fail "listen timeout: rc=$rc '$out'"
out=$(ctl n1 --timeout 300 listen 2>&1); rc=$?
((rc == 0)) || fail "listen --timeout without --count: rc=$rc '$out'"
ctl n1 health >/dev/null && ctl n2 health >/dev/null || fail "health after bad input"
svc_kill n1 TERM || fail "n1 exit status"
svc_kill n2 TERM || fail "n2 exit status"
echo "service notify: ok"
