#!/usr/bin/env bash
# Fleet load on the registry (docs/registry.md, "A thousand nodes"):
# bench_fleet for N simulated nodes (64 regions each, default TTL 10 s, so a
# heartbeat every 3.3 s, reaping every 1 s, an event subscriber each) in a few
# processes, against one Redis (started by bench_fleet) and against a
# three-primary cluster with a replica each (started here).
#   bench/fleet.sh                 N = 100 1000 5000
#   XFER_FLEET_SIZES="100" XFER_FLEET_PROCS=4 XFER_FLEET_TARGETS="single cluster"
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
sizes=${XFER_FLEET_SIZES:-100 1000 5000}
procs=${XFER_FLEET_PROCS:-4}
targets=${XFER_FLEET_TARGETS:-single cluster}
source tests/lib/redis.sh
trap 'redis_cluster_down' EXIT
echo "| target | nodes | procs | all published | Redis cmds/s | cmds per heartbeat round | Redis CPU | fan-out p50 / p99 (received) | uncached lookup p50 / p99 | cached p50 / p99 | restart: all nodes / all keys back |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for target in $targets; do
    for n in $sizes; do
        p=$procs
        ((p > n)) && p=$n
        if [[ $target == single ]]; then
            "$B/bench/bench_fleet" -n "$n" -p "$p"
        else
            redis_cluster_up 127.0.0.1 --maxclients 20000 || { echo "cluster did not start"; exit 1; }
            primaries=$(redis-cli -p "${CLUSTER_PORTS[0]}" cluster nodes |
                awk '$3 ~ /master/ { split($2, a, "@"); print a[1] }' | paste -sd,)
            "$B/bench/bench_fleet" -n "$n" -p "$p" --url "$CLUSTER_URL" --info "$primaries"
            redis_cluster_down
        fi
    done
done
