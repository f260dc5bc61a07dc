#!/usr/bin/env bash
# Redis Cluster: three primaries with a replica each (redis-cli --cluster
# create), three xferd in network namespaces with a redis-cluster:// URL.
# They register, find each other and copy in a loop while (1) the slots of
# n1's keys and of n3's membership shard are migrated key by key to another
# primary (heartbeats meet ASK, then MOVED), and (2) the primary holding n2's
# keys is killed and its replica promoted: n2's keys must be back on it
# (heartbeat after the kill) within TTL + 2 s, and no copy may fail.
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
source tests/lib/service.sh
source tests/lib/netns.sh
TTL_MS=3000
now_ms() { echo $(($(date +%s%N) / 1000000)); }
netns_available || { echo "SKIP: needs root and ip netns"; exit 77; }
trap 'svc_cleanup; redis_cluster_down; netns_down' EXIT
svc_init
netns_up 3 || fail "could not create 3 network namespaces"
redis_cluster_up "$NETNS_GW"; rc=$?; ((rc == 77)) && exit 77; ((rc == 0)) || fail "cluster did not start"
echo "cluster: $CLUSTER_URL"
for i in 1 2 3; do
    svc_start "n$i" "$i" --listen "${NETNS_IP[i]}" --redis-url "$CLUSTER_URL" --ttl-ms "$TTL_MS" \
        --secret clustersecret --transports tcp --region r1:1M:rw
done
for i in 1 2 3; do svc_wait_ready "n$i"; done
svc_wait_peers 3 n1 n2 n3
svc_ring_start n1 n2 n3 # copies around the ring until svc_ring_stop

hb() { redis_cluster_cli 0 hget "xfer:node:{$1}" heartbeat_ms; }
port_of() { echo "${CLUSTER_PORTS[$1]}"; }

# migrate_slot SLOT DST: key by key from its primary to primary DST, 0.4 s
# apart (about every other heartbeat lands inside the window), then hand over.
migrate_slot() {
    local slot=$1 dst=$2 src sid did key i n=0
    src=$(redis_cluster_owner "$slot") || fail "no owner of slot $slot"
    [[ $src == "$dst" ]] && return 0
    sid=$(redis-cli -p "$(port_of "$src")" cluster myid)
    did=$(redis-cli -p "$(port_of "$dst")" cluster myid)
    redis-cli -p "$(port_of "$dst")" cluster setslot "$slot" importing "$sid" >/dev/null
    redis-cli -p "$(port_of "$src")" cluster setslot "$slot" migrating "$did" >/dev/null
    while key=$(redis-cli -p "$(port_of "$src")" cluster getkeysinslot "$slot" 1) && [[ -n $key ]]; do
        out=$(redis-cli -p "$(port_of "$src")" migrate "$CLUSTER_IP" "$(port_of "$dst")" "$key" 0 5000)
        [[ $out == OK || $out == NOKEY ]] || fail "MIGRATE $key: $out"
        n=$((n + 1))
        sleep 0.4
    done
    for i in 0 1 2 3 4 5; do redis-cli -p "$(port_of "$i")" cluster setslot "$slot" node "$did" >/dev/null; done
    echo "slot $slot: $n keys moved from server $src to $dst"
}

# (1) Resharding while the nodes heartbeat.
slot1=$(redis-cli -p "$(port_of 0)" cluster keyslot 'xfer:node:{n1}')
# n3's shard: the registry hashes the node id with CRC16 (mod 16); the
# cluster's CLUSTER KEYSLOT is CRC16 mod 16384, so keyslot(n3) mod 16 is it.
shard3=$(printf 'xfer:nodes:{s%02d}' $(($(redis-cli -p "$(port_of 0)" cluster keyslot n3) % 16)))
slot3=$(redis-cli -p "$(port_of 0)" cluster keyslot "$shard3")
[[ $(redis_cluster_cli 0 zscore "$shard3" n3) ]] || fail "n3 not in $shard3"
t_mig=$(now_ms)
own1=$(redis_cluster_owner "$slot1")
migrate_slot "$slot1" $(((own1 + 1) % 3))
own3=$(redis_cluster_owner "$slot3")
migrate_slot "$slot3" $(((own3 + 1) % 3))
for n in n1 n2 n3; do
    wait_for 5 bash -c "(( \$(redis-cli -c -p $(port_of 0) hget 'xfer:node:{$n}' heartbeat_ms) > $(now_ms) ))" ||
        fail "$n: no heartbeat after the resharding (last $(hb "$n"))"
done
[[ $(redis_cluster_owner "$slot1") == $(((own1 + 1) % 3)) ]] || fail "slot $slot1 did not move"
wait_for 5 bash -c "(( \$(redis-cli -c -p $(port_of 0) zscore '$shard3' n3) > $(now_ms) ))" ||
    fail "n3's membership score not refreshed after its shard moved"
echo "resharding done in $(($(now_ms) - t_mig)) ms; heartbeats continue"
for i in 1 2 3; do
    wait_for 5 bash -c "(( \$($XFERCTL --socket $SVC_DIR/n$i.sock peers | tail -n +2 | wc -l) == 3 ))" ||
        fail "n$i does not list 3 peers after the resharding: $(ctl "n$i" peers 2>&1)"
done

# (2) The primary holding n2's keys dies; its replica takes over.
slot2=$(redis-cli -p "$(port_of 0)" cluster keyslot 'xfer:node:{n2}')
dead=$(redis_cluster_owner "$slot2")
t_kill=$(now_ms)
redis_cluster_kill "$dead"
echo "killed server $dead (primary of slot $slot2)"
promoted() { local o; o=$(redis_cluster_owner "$slot2") && [[ $o != "$dead" ]]; }
wait_for 20 promoted || fail "no replica promoted within 20 s"
t_prom=$(now_ms)
echo "replica promoted $((t_prom - t_kill)) ms after the kill"
bound=$((TTL_MS + 2000))
until h=$(hb n2) && [[ $h =~ ^[0-9]+$ ]] && ((h > t_kill)) &&
    [[ $(redis_cluster_cli 0 exists 'xfer:region:{n2}:r1') == 1 ]]; do
    (($(now_ms) - t_kill < bound + 10000)) || fail "n2's keys not back within $((bound + 10000)) ms"
    sleep 0.05
done
t_back=$(now_ms)
echo "n2's keys back $((t_back - t_kill)) ms after the kill ($((t_back - t_prom)) ms after the promotion; bound $bound ms)"
((t_back - t_kill <= bound)) || fail "keys back after $((t_back - t_kill)) ms > TTL + 2 s"

svc_ring_stop # no copy may have failed

# The operator's view of the fleet (docs/registry.md), then a clean leave.
fleet() { for s in $(seq -w 0 15); do redis_cluster_cli 0 zrange "xfer:nodes:{s$s}" 0 -1; done | grep -v '^$' | sort | tr '\n' ' '; }
echo "fleet: $(fleet)"
[[ $(fleet) == "n1 n2 n3 " ]] || fail "fleet listing: '$(fleet)'"
svc_stop_all_checked
[[ -z $(fleet | tr -d ' ') ]] || fail "members left after SIGTERM: $(fleet)"
[[ $(redis_cluster_cli 0 exists 'xfer:node:{n1}') == 0 ]] || fail "n1's hash left after SIGTERM"
echo "PASS"
