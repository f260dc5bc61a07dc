#!/bin/bash
# Runs inside the bundle test's chroot/netns with a clean environment
# (env -i, empty LD_LIBRARY_PATH): $1 = where the bundle lies. Starts the
# bundled redis-server and two xferd, moves 4 MiB between them by name with
# xferctl, compares. Only the bundle's programs (and coreutils) are used.
set -u
X=$1
tmp=$(mktemp -d)
[[ -z ${LD_LIBRARY_PATH:-} ]] || { echo "LD_LIBRARY_PATH is set: $LD_LIBRARY_PATH"; exit 1; }
fail() { echo "inner: $*"; for f in "$tmp"/*.log; do echo "--- $f"; tail -n 15 "$f"; done; exit 1; }
wait_for() { # seconds, command...
    local deadline=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || return 1
        sleep 0.1
    done
}

"$X/run" redis-server --port 6399 --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$tmp" --daemonize no >"$tmp/redis.log" 2>&1 &
wait_for 10 "$X/run" redis-cli -p 6399 ping || fail "bundled redis-server did not start"
echo "ok: bundled redis-server answers"

for n in b1 b2; do
    "$X/run" xferd --node "$n" --redis-url redis://127.0.0.1:6399 --secret bundle-test \
        --ctrl-socket "$tmp/$n.sock" --region kv:8M:rw >"$tmp/$n.log" 2>&1 &
done
for n in b1 b2; do
    wait_for 15 "$X/run" xferctl --socket "$tmp/$n.sock" health || fail "xferd $n not healthy"
done
echo "ok: two bundled xferd healthy"

head -c 4194304 /dev/urandom >"$tmp/in"
x1() { "$X/run" xferctl --socket "$tmp/b1.sock" "$@"; }
x1 put "$tmp/in" b1/kv >/dev/null || fail "xferctl put"
x1 copy b1/kv b2/kv+4096 4194304 >/dev/null || fail "xferctl copy b1/kv -> b2/kv"
"$X/run" xferctl --socket "$tmp/b2.sock" get b2/kv+4096 4194304 "$tmp/out" >/dev/null ||
    fail "xferctl get"
cmp "$tmp/in" "$tmp/out" || fail "bytes differ after the transfer"
echo "ok: 4 MiB b1/kv -> b2/kv+4096 by name, identical (sha256 $(sha256sum <"$tmp/out" | cut -c1-16)...)"
[[ $("$X/run" redis-cli -p 6399 ZCARD xfer:nodes) == 2 ]] || fail "registry does not list 2 nodes"
echo "ok: redis-cli sees both nodes"
