#!/usr/bin/env bash
# Redis Sentinel failover under traffic: a primary, a replica and three
# sentinels on the loopback; three xferd with a redis-sentinel:// URL copy to
# each other in a loop while the primary is killed (SIGKILL). The sentinels
# promote the replica; every node must find it and have all its keys there
# (heartbeat written after the kill) within TTL + 2 s of the kill, and no
# copy between the already-connected nodes may fail meanwhile.
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
source tests/lib/service.sh
TTL_MS=3000
now_ms() { echo $(($(date +%s%N) / 1000000)); }
trap 'svc_cleanup; redis_sentinel_down; redis_stop' EXIT
svc_init
redis_sentinel_up 3; rc=$?; ((rc == 77)) && exit 77; ((rc == 0)) || fail "sentinel set did not start"
echo "sentinels: $SENTINEL_URL, primary :$REDIS_PORT, replica :$REPLICA_PORT"
for n in a b c; do
    svc_start "$n" 0 --listen 127.0.0.1 --redis-url "$SENTINEL_URL" --ttl-ms "$TTL_MS" \
        --transports tcp --region r1:1M:rw
done
for n in a b c; do svc_wait_ready "$n"; done
svc_wait_peers 3 a b c
[[ $(redis-cli -p "$REDIS_PORT" zcard xfer:nodes) == 3 ]] || fail "nodes not on the primary"
svc_ring_start a b c # copies around the ring until svc_ring_stop

old=$REDIS_PORT
t_kill=$(now_ms)
kill -9 "$REDIS_PID"
wait "$REDIS_PID" 2>/dev/null
REDIS_PID=
echo "killed the primary :$old"
wait_for 20 bash -c "! redis-cli -p ${SENT_PORTS[0]} sentinel get-master-addr-by-name xfer | grep -qx $old" ||
    fail "no failover within 20 s"
t_switch=$(now_ms)
new=$(redis_sentinel_primary | awk '{print $2}')
echo "sentinels promoted :$new after $((t_switch - t_kill)) ms"
[[ $new == "$REPLICA_PORT" ]] || fail "promoted :$new, expected the replica :$REPLICA_PORT"

# Every node's keys on the new primary, with a heartbeat from after the kill.
keys_back() {
    local n hb
    for n in a b c; do
        hb=$(redis-cli -p "$new" hget "xfer:node:{$n}" heartbeat_ms)
        [[ -n $hb ]] && ((hb > t_kill)) || return 1
        [[ $(redis-cli -p "$new" exists "xfer:region:{$n}:r1") == 1 ]] || return 1
        [[ $(redis-cli -p "$new" sismember "xfer:regions:{$n}" r1) == 1 ]] || return 1
        [[ -n $(redis-cli -p "$new" zscore xfer:nodes "$n") ]] || return 1
    done
}
bound=$((TTL_MS + 2000))
until keys_back; do
    (($(now_ms) - t_kill < bound + 5000)) || fail "keys not back on :$new within $((bound + 5000)) ms"
    sleep 0.05
done
t_back=$(now_ms)
echo "every node's keys back on :$new $((t_back - t_kill)) ms after the kill ($((t_back - t_switch)) ms after the switch; bound $bound ms)"
((t_back - t_kill <= bound)) || fail "keys back after $((t_back - t_kill)) ms > TTL + 2 s = $bound ms"

# A little more traffic on the new primary, then stop and count.
svc_ring_stop
grep -h "sentinel" "$SVC_DIR"/a.log | head -5
for n in a b c; do
    grep -q "names 127.0.0.1:$new primary\|now 127.0.0.1:$new" "$SVC_DIR/$n.log" ||
        fail "$n's log does not name the new primary"
done
# A node that starts now finds the new primary through the sentinels.
svc_start d 0 --listen 127.0.0.1 --redis-url "$SENTINEL_URL" --ttl-ms "$TTL_MS" --transports tcp \
    --region r1:1M:rw
svc_wait_ready d
wait_for 10 bash -c "[[ \$(redis-cli -p $new exists 'xfer:node:{d}') == 1 ]]" || fail "d not on the new primary"
ctl d copy d/r1 a/r1 65536 >/dev/null || fail "copy d -> a after the failover"
svc_stop_all_checked
echo "PASS"
