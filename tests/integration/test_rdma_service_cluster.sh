#!/usr/bin/env bash
# Three xferd on three hosts (network namespaces, Redis in the root
# namespace) talking rdma only, on the verbs stand-in: each node publishes
# its fake NIC (at its host's address) and per-region rkeys through the
# registry, peers find each other there, and named transfers between every
# pair (WRITE, READ, third-party) are verified by sha256; then a node is
# killed and transfers to it fail with a connection error.
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
source tests/lib/netns.sh
source tests/lib/service.sh
[[ -x $B/tests/fake/xferd ]] || { echo "SKIP: $B/tests/fake/xferd not built"; exit 77; }
netns_available || { echo "SKIP: needs root and ip netns"; exit 77; }
command -v redis-server >/dev/null || { echo "SKIP: redis-server not installed"; exit 77; }
trap 'svc_cleanup; redis_stop; netns_down' EXIT
svc_init
# xferd linked with libfakeverbs; its fake NIC takes the host's address.
cat >"$SVC_DIR/xferd-fake" <<EOS
#!/usr/bin/env bash
args=("\$@")
for ((i = 0; i < \${#args[@]}; i++)); do
    [[ \${args[i]} == --listen ]] && export XFER_FAKEVERBS_ADDR=\${args[i + 1]}
done
exec "$PWD/$B/tests/fake/xferd" "\$@"
EOS
chmod +x "$SVC_DIR/xferd-fake"
XFERD=$SVC_DIR/xferd-fake
svc_cluster_up 3 --transports rdma

for i in 1 2 3; do
    nics=$(redis_cli HGET "xfer:node:{n$i}" nics)
    [[ $nics == fake0,1,::ffff:${NETNS_IP[i]},eth,* ]] || fail "n$i publishes nics '$nics'"
    rkeys=$(redis_cli HGET "xfer:region:{n$i}:r1" rkeys)
    [[ $rkeys =~ ^[0-9a-f]+$ ]] || fail "n$i region r1 publishes rkeys '$rkeys'"
    echo "n$i: nics=$nics r1.rkeys=$rkeys"
done

MiB=$((1 << 20))
for a in 1 2 3; do
    for b in 1 2 3; do
        ((a == b)) && continue
        c=$((6 - a - b))
        len=$((300000 + a * 1000 + b))
        head -c "$len" /dev/urandom >"$SVC_DIR/src.bin"
        want=$(sum_of "$SVC_DIR/src.bin")
        ctl "n$a" put "$SVC_DIR/src.bin" "n$a/r1" || fail "put on n$a"
        ctl "n$a" copy "n$a/r1" "n$b/r1+$MiB" "$len" >/dev/null || fail "write n$a -> n$b"
        ctl "n$b" copy --op read "n$a/r1" "n$b/r1+$((2 * MiB))" "$len" >/dev/null ||
            fail "read n$b <- n$a"
        ctl "n$c" copy "n$a/r1" "n$b/r1+$((3 * MiB))" "$len" >/dev/null ||
            fail "third-party on n$c: n$a -> n$b"
        for k in 1 2 3; do
            ctl "n$b" get "n$b/r1+$((k * MiB))" "$len" "$SVC_DIR/out.bin" || fail "get n$b"
            [[ $(sum_of "$SVC_DIR/out.bin") == "$want" ]] || fail "checksum n$a -> n$b (way $k)"
        done
    done
done
echo "pairs: 6 x (write, read, third-party) over rdma verified by sha256"
ctl n1 peers
grep -h "rdma" "$SVC_DIR"/n*.log | grep -v "^.*debug" | head -5

# A read-only region refuses writes (checked before the NIC would).
out=$(ctl n1 copy n1/r1 n2/ro 4096 2>&1) && fail "write into a read-only region accepted"
echo "write into n2/ro: $out"

# A dead node: transfers to it fail with a connection error, fast.
svc_kill n3 KILL
start=$SECONDS
out=$(ctl n1 copy n1/r1 n3/r1 4096 2>&1) && fail "copy to a dead node succeeded"
echo "copy to killed n3 after $((SECONDS - start)) s: $out"
((SECONDS - start <= 15)) || fail "took too long"
for i in 1 2; do svc_kill "n$i" TERM || fail "n$i did not exit cleanly"; done
echo PASS
