#!/usr/bin/env bash
# One xferd on the loopback with a real redis-server: CLI basics, config
# errors, regions at run time (allocated and memfd handover), inline
# write/read, put/get through the unix socket, local copies, typed layouts,
# the clear errors, TCP control with a wrong secret, SIGTERM drain.
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
source tests/lib/service.sh
trap 'svc_cleanup; redis_stop' EXIT
svc_init
svc_redis_up

# --help / --version / bad config: exit codes and one-line reasons.
"$XFERD" --help | grep -q -- '--redis-url' || fail "xferd --help"
"$XFERD" --version | grep -q '^xferd ' || fail "xferd --version"
"$XFERCTL" --help | grep -q 'probe SRC DST' || fail "xferctl --help"
"$XFERCTL" --version | grep -q '^xferctl ' || fail "xferctl --version"
out=$("$XFERD" 2>&1); rc=$?
((rc == 2)) && [[ $out == *"no node id"* ]] || fail "xferd without node: rc=$rc '$out'"
printf 'node = x\n[region kv]\nsize = lots\n' >"$SVC_DIR/bad.conf"
out=$("$XFERD" --config "$SVC_DIR/bad.conf" 2>&1); rc=$?
((rc == 2)) && [[ $out == *"bad.conf:3:"* ]] || fail "bad config: rc=$rc '$out'"
# Beyond loopback with no secret: refused, unless --insecure (then a warning).
out=$("$XFERD" --node open1 --listen 0.0.0.0 --advertise 127.0.0.1 --redis-url "$REDIS_URL" 2>&1); rc=$?
((rc == 2)) && [[ $out == *"no cluster secret"*"--insecure"* ]] || fail "unauthenticated 0.0.0.0: rc=$rc '$out'"
svc_start open1 0 --listen 0.0.0.0 --advertise 127.0.0.1 --redis-url "$REDIS_URL" --insecure
svc_wait_ready open1
grep -q "warn .*INSECURE: serving on 0.0.0.0 with no cluster secret" "$SVC_DIR/open1.log" \
    || fail "no loud warning with --insecure: $(head -n 5 "$SVC_DIR/open1.log")"
svc_kill open1 TERM || fail "open1 exit status"

# Config file + env + flags (flag wins over env wins over file).
cat >"$SVC_DIR/n1.conf" <<CONF
node = from-file
redis_url = $REDIS_URL
ttl_ms = 2000
[region kv]
size = 4M
access = rw
dtype = bf16
block_bytes = 4096
num_blocks = 1024
[region ro]
size = 64k
access = r
CONF
XFER_NODE=from-env XFER_SECRET=s3cret svc_start n1 0 --config "$SVC_DIR/n1.conf" \
    --transports tcp --region 'scratch:1M:rw'
svc_wait_ready n1
ctl n1 health | grep -q 'node n1: ok' || fail "health: $(ctl n1 health 2>&1)"
ctl n1 --json health | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["node"]=="n1" and d["registry_ok"]' \
    || fail "health --json"

# Regions: declared ones, one created at run time, layouts shown.
ctl n1 register typed 1M --layout fp8:4096:256 || fail "register typed"
ctl n1 register ro2 64k --access r || fail "register ro2"
ctl n1 regions | grep -q 'bf16 block=4096' || fail "regions table: $(ctl n1 regions)"
ctl n1 --json regions >"$SVC_DIR/regions.json"
python3 - "$SVC_DIR/regions.json" <<'PY' || fail "regions --json"
import json, sys
rs = {r["name"]: r for r in json.load(open(sys.argv[1]))}
assert set(rs) == {"kv", "ro", "scratch", "typed", "ro2"}, rs.keys()
assert rs["kv"]["len"] == 4 << 20 and rs["kv"]["access"] == "rw"
assert rs["ro"]["access"] == "r" and rs["kv"]["layout"]["dtype"] == "bf16"
PY
wait_for 5 bash -c "[[ \$(redis-cli -p $REDIS_PORT sismember 'xfer:regions:{n1}' typed) == 1 ]]" \
    || fail "typed region not published"

# Inline write/read, local copy, put/get through a memfd staging region.
ctl n1 write n1/kv+100 'hello xfer' || fail "write"
[[ $(ctl n1 read n1/kv+100 10) == 'hello xfer' ]] || fail "read back"
ctl n1 copy n1/kv+100 n1/scratch+7 10 >/dev/null || fail "local copy"
[[ $(ctl n1 read n1/scratch+7 10) == 'hello xfer' ]] || fail "local copy content"
head -c 3000000 /dev/urandom >"$SVC_DIR/in.bin"
ctl n1 put "$SVC_DIR/in.bin" n1/kv+4096 || fail "put"
ctl n1 get n1/kv+4096 3000000 "$SVC_DIR/out.bin" || fail "get"
cmp -s "$SVC_DIR/in.bin" "$SVC_DIR/out.bin" || fail "put/get content differs"
ctl n1 regions | grep -q '^n1 *_' && fail "staging region left behind"
# Progress bar only on a terminal (script(1) gives put a pty).
ctl n1 put "$SVC_DIR/in.bin" n1/kv 2>"$SVC_DIR/put.err" || fail "put"
[[ -s $SVC_DIR/put.err ]] && fail "progress output without a tty: $(cat "$SVC_DIR/put.err")"
if command -v script >/dev/null; then
    ctl n1 register big 8M || fail "register big"
    head -c 6000000 /dev/urandom >"$SVC_DIR/big.bin"
    script -qec "$XFERCTL --socket $SVC_DIR/n1.sock put $SVC_DIR/big.bin n1/big" /dev/null >"$SVC_DIR/tty.out" \
        || fail "put on a tty"
    ctl n1 deregister big || fail "deregister big"
    grep -q 'put \[###' "$SVC_DIR/tty.out" || fail "no progress bar on a tty: $(cat -v "$SVC_DIR/tty.out")"
fi
[[ -z $(redis-cli -p "$REDIS_PORT" --scan --pattern 'xfer:region:{n1}:_*') ]] \
    || fail "private staging region was published"

# Private regions ("_" names) live as long as the control connection that
# registered them: a client that dies mid-put leaves nothing behind.
ctl n1 register _tmp 64k || fail "register private"
wait_for 5 bash -c "! $XFERCTL --socket $SVC_DIR/n1.sock regions | grep -q _tmp" \
    || fail "private region outlived its connection"

# Clear errors, non-zero exit.
expect_err() { # pattern cmd...
    local pat=$1; shift
    local out rc
    out=$("$@" 2>&1); rc=$?
    ((rc != 0)) || fail "'$*' succeeded"
    [[ $out == *"$pat"* ]] || fail "'$*': expected '$pat', got '$out'"
    (($(wc -l <<<"$out") == 1)) || fail "'$*': more than one line: '$out'"
}
expect_err "unknown region n1/nope" ctl n1 copy n1/nope n1/kv 10
expect_err "unknown node 'ghost'" ctl n1 copy n1/kv ghost/kv 10
expect_err "past its end" ctl n1 copy n1/kv+4M n1/scratch 1
expect_err "past its end" ctl n1 write n1/scratch+1048575 ab
expect_err "read-only" ctl n1 write n1/ro 'x'
expect_err "read-only" ctl n1 copy n1/kv n1/ro2 16
expect_err "layouts disagree" ctl n1 copy 'n1/kv#0' 'n1/typed#1' 1
expect_err "bad address" ctl n1 copy n1 n1/kv 1
expect_err "cannot reach xferd" "$XFERCTL" --socket "$SVC_DIR/none.sock" health
port=$(redis-cli -p "$REDIS_PORT" hget 'xfer:node:{n1}' ctrl_port)
expect_err "authentication failed: the cluster secrets differ (or the peer has none)" \
    "$XFERCTL" --connect "127.0.0.1:$port" --secret wrong health
# ... and the server's log says the same.
wait_for 5 grep -q "handshake refused: handshake: xferctl: authentication failed: the cluster secrets differ" \
    "$SVC_DIR/n1.log" || fail "n1 does not log the failed authentication: $(grep -i handshake "$SVC_DIR/n1.log")"
"$XFERCTL" --connect "127.0.0.1:$port" --secret s3cret health | grep -q 'node n1' \
    || fail "TCP control with the right secret"
expect_err "unix socket" "$XFERCTL" --connect "127.0.0.1:$port" --secret s3cret put "$SVC_DIR/in.bin" n1/kv

# Bad input on the control socket: answered or dropped, never a crash.
python3 - "$SVC_DIR/n1.sock" "$port" <<'PY' || fail "bad control input"
import socket, struct, sys, os
def unix():
    s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1]); return s
s = unix()                                    # garbage protobuf: an EPROTO answer
s.sendall(struct.pack("<I", 7) + b"\xff" * 7)
hdr = s.recv(4); assert len(hdr) == 4, hdr
body = s.recv(struct.unpack("<I", hdr)[0]); assert body, "no answer to garbage"
s.sendall(struct.pack("<I", 0xFFFFFFF0))     # oversize frame: answer, then close
data = b""
while True:
    chunk = s.recv(4096)
    if not chunk: break
    data += chunk
s = unix(); s.sendall(b"\x05\x00"); s.close()  # truncated frame, then gone
s = unix()                                    # a memfd with no request, then a request with no fd
fd = os.memfd_create("x"); s.sendmsg([b"\x00"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))]); s.close()
t = socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=5)  # junk before the handshake
t.sendall(os.urandom(64)); t.settimeout(5)
try:
    while t.recv(4096): pass
except (ConnectionResetError, socket.timeout):
    pass
PY
ctl n1 health >/dev/null || fail "xferd died on bad input"

# Async batch + status, stats.
id=$(ctl n1 --json copy --async n1/kv n1/scratch 4096 | python3 -c 'import json,sys; print(json.load(sys.stdin)["batch_id"])')
wait_for 5 ctl n1 status "$id" || fail "async batch $id"
ctl n1 stats | grep -q 'control requests' || fail "stats"

# Deregister, then SIGTERM: exit 0, keys gone at once.
ctl n1 deregister typed || fail "deregister"
expect_err "no such region" ctl n1 deregister typed
svc_kill n1 TERM; rc=$?
grep -qE "AddressSanitizer|LeakSanitizer|runtime error" "$SVC_DIR/n1.log" && fail "sanitizer report: $(grep -A20 Sanitizer "$SVC_DIR/n1.log")"
((rc == 0)) || fail "xferd exit status after SIGTERM: $rc"
[[ $(redis-cli -p "$REDIS_PORT" exists 'xfer:node:{n1}' 'xfer:regions:{n1}' 'xfer:region:{n1}:kv') == 0 ]] \
    || fail "keys left after SIGTERM: $(redis-cli -p "$REDIS_PORT" keys 'xfer:*')"
[[ -e $SVC_DIR/n1.sock ]] && fail "socket file left after SIGTERM"
echo "local service test passed"
