#!/usr/bin/env bash
# Engine-level demo: two nodes on loopback, no Redis.
# Node "demo-b" serves a 64 MiB region; node "demo-a" WRITEs data into it and
# READs it back at several sizes, verifies every byte and prints times and
# GB/s. Called by mk/demo.sh after the xferd demo.
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
tmp=$(mktemp -d /tmp/xfer-demo.XXXXXX)
"$B/tests/xfer_node" serve --node demo-b --out "$tmp/b.node" --region rw:rw:67108864 \
    >"$tmp/b.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 200); do [[ -s $tmp/b.node ]] && break; sleep 0.05; done
[[ -s $tmp/b.node ]] || { echo "demo: node demo-b did not start"; cat "$tmp/b.log"; exit 1; }
echo "demo: node demo-b serves region rw (64 MiB) on 127.0.0.1:$(sed -n 's/^port=//p' "$tmp/b.node")"
echo "demo: node demo-a writes to it and reads back over tcp (4 sockets)"
"$B/tests/xfer_node" demo --peer "$tmp/b.node" || { echo "demo: FAILED"; exit 1; }
echo "demo: ok"
