#!/bin/bash
# Runs inside the bundle test's chroot/netns with a clean environment:
# $1 = where the bundle lies. Uses only the bundle's programs.
set -u
X=$1
tmp=$(mktemp -d)
[[ -z ${LD_LIBRARY_PATH:-} ]] || { echo "LD_LIBRARY_PATH is set: $LD_LIBRARY_PATH"; exit 1; }
"$X/run" redis-server --port 6399 --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$tmp" --daemonize no >"$tmp/redis.log" 2>&1 &
for _ in $(seq 100); do
    [[ $("$X/run" redis-cli -p 6399 ping 2>/dev/null) == PONG ]] && break
    sleep 0.05
done
[[ $("$X/run" redis-cli -p 6399 ping) == PONG ]] || { cat "$tmp/redis.log"; exit 1; }
echo "ok: bundled redis-server answers"
