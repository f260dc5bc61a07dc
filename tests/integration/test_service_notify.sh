#!/usr/bin/env bash
# Notifications through xferd and xferctl (docs/service.md, docs/notify.md):
# two xferd (n1, n2) and a real redis-server. notify -> listen roundtrip
# (text and --json), a listener's --count leaves the rest queued for the
# next one, copy --notify delivers after the data (the listener reads the
# data the moment the notification arrives), a listener that goes away, one
# that never reads and one stopped with SIGSTOP (cut after io_timeout_ms,
# what they did not acknowledge goes to the next listener exactly once),
# bad input.
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
source tests/lib/service.sh
trap 'for p in $(jobs -p); do kill "$p" 2>/dev/null; done; svc_cleanup; redis_stop' EXIT
svc_init
svc_redis_up
svc_start n1 0 --redis-url "$REDIS_URL" --transports tcp --region r1:4M:rw
svc_start n2 0 --redis-url "$REDIS_URL" --transports tcp --region r2:4M:rw --io-timeout-ms 2000
svc_start n3 0 --redis-url "$REDIS_URL" --transports tcp --region r3:1M:rw
svc_wait_ready n1
svc_wait_ready n2
svc_wait_ready n3
wait_for 10 ctl n1 regions n2 || fail "n1 does not see n2"
wait_for 10 ctl n1 regions n3 || fail "n1 does not see n3"
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

# 4. a listener that never reads nor acknowledges: n2 sends it a window's
# worth and takes no more from its queue (senders keep their notifications
# queued there), then after io_timeout_ms (2 s here) cuts it with a warn
# line, keeps serving, and the next listener gets all 40, none lost.
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
wait_for 20 grep -q "notification listener acknowledged none .*disconnected" "$D/n2.log" ||
    fail "slow listener not cut: $(tail -5 "$D/n2.log")"
kill "$slow" 2>/dev/null; wait "$slow" 2>/dev/null
ctl n2 health >/dev/null || fail "n2 stopped serving"
n=$(ctl n2 --json --timeout 3000 listen | wc -l)
((n == 40)) || fail "after the slow listener was cut the next one got $n of 40 notifications"
echo "after the slow listener: all $n notifications delivered to the next listener"

# 4b. an xferctl listener stopped (SIGSTOP) with notifications in flight to
# it: cut after io_timeout_ms; resumed, it prints none of those it had not
# acknowledged and says so; a new listener gets every one exactly once.
in_poll() { # PID blocked in poll(2): past its last acknowledgement
    local nr
    read -r nr _ <"/proc/$1/syscall" && [[ $nr == 7 || $nr == 271 ]]
}
"$XFERCTL" --socket "$D/n2.sock" --json listen >"$D/frozen.out" 2>"$D/frozen.err" &
frozen=$!
ctl n1 notify n2 'before the stop' || fail "notify before the stop"
wait_for 10 grep -q 'before the stop' "$D/frozen.out" || fail "listener did not print: $(cat "$D/frozen.err")"
wait_for 10 in_poll "$frozen" || fail "listener not back in poll"
pid_freeze "$frozen" || fail "could not stop the listener"
cuts=$(grep -c "notification listener acknowledged none" "$D/n2.log")
for i in $(seq 1 50); do
    ctl n1 notify n2 "frozen $i" >/dev/null || fail "notify frozen $i"
done
wait_for 20 bash -c "(( \$(grep -c 'notification listener acknowledged none' $D/n2.log) > $cuts ))" ||
    fail "stopped listener not cut: $(tail -5 "$D/n2.log")"
kill -CONT "$frozen"
wait "$frozen"; rc=$?
((rc == 1)) && grep -q "closed this subscription after 1 notification" "$D/frozen.err" ||
    fail "resumed listener: rc=$rc $(cat "$D/frozen.err")"
[[ $(wc -l <"$D/frozen.out") == 1 ]] || fail "the cut listener printed: $(cat "$D/frozen.out")"
ctl n2 --json --timeout 10000 listen --count 50 >"$D/next.out" || fail "next listener"
ctl n2 --json --timeout 500 listen >>"$D/next.out" || fail "listen for leftovers"
python3 - "$D/next.out" <<'PY' || fail "exactly once: $(cut -c1-120 "$D/next.out")"
import json, sys
got = [json.loads(l) for l in open(sys.argv[1])]
texts = [o["text"] for o in got]
want = ["frozen %d" % i for i in range(1, 51)]
assert sorted(texts) == sorted(want), (len(texts), sorted(set(want) - set(texts)))
assert len({(o["incarnation"], o["seq"]) for o in got}) == 50
PY
echo "stopped listener cut: the next one got all 50 notifications exactly once"

# 6. batch --notify: one batch of n1 writes two lines to n2 and one to n3;
# each node gets one notification, after its lines landed, naming its
# share of the batch. A notified batch runs whole or not at all.
head -c 196608 /dev/urandom >"$D/bin"
ctl n1 put "$D/bin" n1/r1+2M || fail "put batch data"
printf 'n1/r1+2097152 n2/r2+1M 64K\nn1/r1+2162688 n3/r3 64K\nn1/r1+2228224 n2/r2+2M 64K\n' >"$D/batch1"
out=$(ctl n1 batch "$D/batch1" --notify 'batch one') || fail "batch --notify: $out"
[[ $out == *"notification delivered"* ]] || fail "batch --notify said '$out'"
ctl n2 --json --timeout 10000 listen --count 1 >"$D/b2" || fail "listen n2 (batch)"
ctl n3 --json --timeout 10000 listen --count 1 >"$D/b3" || fail "listen n3 (batch)"
python3 - "$D/b2" "$D/b3" <<'PY' || fail "batch notifications: $(cat "$D/b2" "$D/b3")"
import json, sys
b2, b3 = (json.load(open(f)) for f in sys.argv[1:])
assert b2["text"] == b3["text"] == "batch one", (b2, b3)
assert b2["bound"] and b2["items"] == 2 and b2["status"] == 0 and b2["node"] == "n1", b2
assert b3["bound"] and b3["items"] == 1 and b3["status"] == 0, b3
PY
ctl n2 get n2/r2+1M 64K "$D/g1" && ctl n3 get n3/r3 64K "$D/g2" && ctl n2 get n2/r2+2M 64K "$D/g3" ||
    fail "get batch data"
cat "$D/g1" "$D/g2" "$D/g3" | cmp -s - "$D/bin" || fail "batch data differs"
n=$(ctl n2 --json --timeout 300 listen | wc -l)
((n == 0)) || fail "n2 got $n more notification(s) after the batch"
printf 'n1/r1 n2/r2 4K\nn1/r1 n3/r3+1M 4K\n' >"$D/batch2"
out=$(ctl n1 batch "$D/batch2" --notify 'never' 2>&1) && fail "a notified batch with a bad line ran"
[[ $out == *"not run: line 2"* ]] || fail "bad notified batch said '$out'"
printf 'n1/r1 n2/r2 4K\nn2/r2 n3/r3 4K\n' >"$D/batch3"
out=$(ctl n1 batch "$D/batch3" --notify 'never' 2>&1) && fail "a notified batch with a forwarded line ran"
[[ $out == *"carried out by n2"* ]] || fail "forwarded line in a notified batch said '$out'"
n=$(ctl n2 --json --timeout 300 listen | wc -l)
((n == 0)) || fail "a refused notified batch notified n2 ($n)"
echo "batch --notify: one notification per remote node, after its lines"

# 7. a copy that xferd retries notifies once. A stale descriptor is forced
# through Redis (no event: n1's cache keeps what it read): n2/rs's "gen" is
# set to a wrong value, so each of n1's attempts fails -XFER_ESTALE at n2
# and xferd retries once after re-reading Redis; then the right value is
# put back while n1 still caches the wrong one, so the first attempt fails
# and the retry succeeds. Each copy's notification arrives exactly once:
# the failed retry's (marked failed), then the successful retry's; the
# stale first attempts' are dropped by n2.
ctl n2 register rs 64K >/dev/null || fail "register rs"
key='xfer:region:{n2}:rs'
wait_for 10 bash -c "[[ -n \$(redis-cli -p $REDIS_PORT hget '$key' gen) ]]" || fail "rs not published"
gen=$(redis_cli hget "$key" gen)
redis_cli hset "$key" gen $((gen + 1000)) >/dev/null
out=$(ctl n1 copy n1/r1 n2/rs 4K --notify 'stale twice' 2>&1) && fail "copy with a wrong generation worked"
[[ $out == *"stale"* || $out == *"generation"* || $out == *ESTALE* ]] || fail "stale copy said '$out'"
redis_cli hset "$key" gen "$gen" >/dev/null
ctl n1 write n1/r1+3M 'after the retry' || fail "write"
out=$(ctl n1 copy n1/r1+3M n2/rs 15 --notify 'retried copy') || fail "copy that needs a retry: $out"
[[ $(grep -c 'n2/rs was registered again: retrying' "$D/n1.log") == 2 ]] ||
    fail "n1 did not retry both copies: $(grep retrying "$D/n1.log")"
[[ $(ctl n2 read n2/rs 15) == 'after the retry' ]] || fail "retried copy's data"
ctl n2 --json --timeout 10000 listen --count 2 >"$D/r1" || fail "listen (retried copies)"
ctl n2 --json --timeout 500 listen >>"$D/r1"
python3 - "$D/r1" <<'PY' || fail "retried copies: $(cat "$D/r1")"
import json, sys
got = [json.loads(l) for l in open(sys.argv[1])]
assert [o["text"] for o in got] == ["stale twice", "retried copy"], got
assert got[0]["status"] != 0 and got[0]["failed"][0]["index"] == 0, got[0]
assert got[1]["status"] == 0 and got[1]["failed"] == [], got[1]
PY
[[ $(grep -c 'stale attempt, its retry is the one delivered' "$D/n2.log") == 2 ]] ||
    fail "n2 did not drop both stale attempts: $(grep notification "$D/n2.log")"
echo "retried copies: one notification each"

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
svc_kill n3 TERM || fail "n3 exit status"
echo "service notify: ok"
