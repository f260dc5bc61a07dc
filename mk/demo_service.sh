#!/usr/bin/env bash
# make demo: a local redis-server (its own port and dir, unless
# XFER_REDIS_URL is given), two xferd, a file put into n1's region, copied
# to n2 by name, fetched back and compared; then `xferctl peers`, `regions`
# and the redis-cli view. Stops everything it started, even on failure.
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
XFERD=$B/bin/xferd XFERCTL=$B/bin/xferctl
DIR=$(mktemp -d /tmp/xfer-demo.XXXXXX)
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    rm -rf "$DIR"
}
trap cleanup EXIT
die() { echo "demo: $*" >&2; exit 1; }
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
wait_for() { # seconds cmd...
    local deadline=$((SECONDS + $1)); shift
    until "$@" >/dev/null 2>&1; do ((SECONDS < deadline)) || return 1; sleep 0.05; done
}
[[ -x $XFERD && -x $XFERCTL ]] || die "build first (make all)"

if [[ -n ${XFER_REDIS_URL:-} ]]; then
    URL=$XFER_REDIS_URL
    CLI=(redis-cli -u "$URL")
else
    command -v redis-server >/dev/null || die "redis-server not installed (make deps)"
    PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    redis-server --port "$PORT" --bind 127.0.0.1 --dir "$DIR" --save '' --appendonly no \
        --logfile "$DIR/redis.log" </dev/null &
    PIDS+=($!)
    URL=redis://127.0.0.1:$PORT
    CLI=(redis-cli -p "$PORT")
    wait_for 5 "${CLI[@]}" ping || die "redis-server did not start"
fi
step "redis at $URL; starting xferd n1 and n2"
for n in n1 n2; do
    "$XFERD" --node "demo-$n" --redis-url "$URL" --ctrl-socket "$DIR/$n.sock" --ttl-ms 5000 \
        --region kv:16M:rw --region ro:1M:r $([[ $n == n2 ]] && echo --metrics-port 0) \
        >"$DIR/$n.log" 2>&1 </dev/null &
    PIDS+=($!)
done
for n in n1 n2; do
    wait_for 10 "$XFERCTL" --socket "$DIR/$n.sock" health || { cat "$DIR/$n.log"; die "xferd $n not ready"; }
done
x1() { "$XFERCTL" --socket "$DIR/n1.sock" "$@"; }
x2() { "$XFERCTL" --socket "$DIR/n2.sock" "$@"; }
wait_for 10 bash -c "(( \$('$XFERCTL' --socket '$DIR/n1.sock' peers | tail -n +2 | wc -l) >= 2 ))" \
    || die "nodes do not see each other"
x1 health

step "put a 10 MB file into demo-n1/kv, copy it to demo-n2/kv by name, get it back"
head -c 10000000 /dev/urandom >"$DIR/in.bin"
x1 put "$DIR/in.bin" demo-n1/kv || die "put failed"
x1 copy demo-n1/kv demo-n2/kv+4096 10000000 || die "copy failed"
x2 get demo-n2/kv+4096 10000000 "$DIR/out.bin" || die "get failed"
cmp "$DIR/in.bin" "$DIR/out.bin" || die "the file came back different"
echo "sha256 in : $(sha256sum <"$DIR/in.bin" | cut -c1-64)"
echo "sha256 out: $(sha256sum <"$DIR/out.bin" | cut -c1-64)  -> identical"

step "a third-party copy (asked of n2, owned and carried out by n1) and a clear error"
x2 copy demo-n1/kv+100 demo-n1/kv+15000000 1000 || die "third-party copy failed"
x1 write demo-n2/ro 'nope' && die "write to a read-only region succeeded"

step "xferctl peers / regions"
x1 peers
x1 regions demo-n2

step "probe demo-n1/kv -> demo-n2/kv"
x1 probe demo-n1/kv demo-n2/kv --size 4M --count 8

step "the registry as redis-cli sees it"
echo "\$ redis-cli ZRANGE xfer:nodes 0 -1 WITHSCORES"
"${CLI[@]}" zrange xfer:nodes 0 -1 withscores
echo "\$ redis-cli HGETALL xfer:node:{demo-n1}"
"${CLI[@]}" hgetall 'xfer:node:{demo-n1}' | paste - -
echo "\$ redis-cli SMEMBERS xfer:regions:{demo-n1}"
"${CLI[@]}" smembers 'xfer:regions:{demo-n1}'
echo "\$ redis-cli HGETALL xfer:region:{demo-n1}:kv"
"${CLI[@]}" hgetall 'xfer:region:{demo-n1}:kv' | paste - -

step "stopping (SIGTERM: drain, remove keys, publish leave)"
for p in "${PIDS[@]:${#PIDS[@]}-2}"; do kill -TERM "$p"; done
for p in "${PIDS[@]:${#PIDS[@]}-2}"; do wait "$p" || die "xferd exited non-zero"; done
echo "keys left for the demo nodes: $("${CLI[@]}" --scan --pattern 'xfer:*demo-*' | wc -l)"
echo "demo: OK"
