#!/usr/bin/env bash
# deploy/compose.yaml brought up for real with rootful podman + podman-compose
# (make test-deploy): base image made here (debootstrap, cached), xfer and
# Redis images built from deploy/, Redis + two xferd started, a named transfer
# between the two containers, the registry read with redis-cli, /metrics
# scraped, HEALTHCHECK run, and `down` checked to leave nothing behind.
# Exit 0 pass, 77 skip (no usable container engine), else fail.
# Not named test_*.sh: it takes minutes on a cold cache (see docs/deploy.md).
set -u
cd "${XFER_ROOT:-$(dirname "$0")/../..}"
source tests/lib/deploy.sh

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
t0=$SECONDS
step() { printf '[%4ss] %s\n' $((SECONDS - t0)) "$*"; }

[[ $(id -u) == 0 ]] || skip "rootful podman needs root"
command -v podman >/dev/null || skip "podman not installed (make deps-deploy)"
command -v podman-compose >/dev/null || skip "podman-compose not installed (make deps-deploy)"
export CONTAINERS_CONF=$PWD/deploy/containers.conf
timeout 60 podman info >/dev/null 2>&1 || skip "podman cannot run here: $(podman info 2>&1 | tail -n1)"

base=docker.io/library/debian:bookworm # what `FROM debian:bookworm` resolves to
image=localhost/xfer:latest
redis_image=localhost/xfer-redis:7
proj=xfertest
compose=(timeout 300 podman-compose -p "$proj" -f deploy/compose.yaml)
export XFER_IMAGE=$image XFER_REDIS_IMAGE=$redis_image
export XFER_REDIS_PASSWORD=rp-$RANDOM$RANDOM XFER_SECRET=cs-$RANDOM$RANDOM
export XFER_REGIONS=kv:4M:rw XFER_TRANSPORTS=tcp
c_redis=${proj}_redis_1 c1=${proj}_xferd-1_1 c2=${proj}_xferd-2_1

leftovers() {
    podman ps -a -q --filter "label=io.podman.compose.project=$proj"
    podman volume ls -q --filter "label=io.podman.compose.project=$proj"
    podman network ls -q --filter "label=io.podman.compose.project=$proj"
}
# podman-compose 1.0.3 `down` leaves the project network: remove it too.
down() {
    "${compose[@]}" down -v -t 10 >"$work/down.log" 2>&1
    local rc=$?
    podman network rm -f "${proj}_default" >/dev/null 2>&1
    return $rc
}
work=$(mktemp -d /tmp/xfer-compose-test.XXXXXX)
cleanup() {
    if [[ -n $(leftovers) ]]; then down; fi
    rm -rf "$work"
}
trap cleanup EXIT
[[ -z $(leftovers) ]] || { step "removing leftovers of an earlier run"; down; }

# ---- images --------------------------------------------------------------
if ! podman image exists "$base"; then
    step "base image: $base from a debootstrap minbase rootfs"
    tarball=$(deploy_rootfs_tarball) || fail "cannot make the Debian rootfs"
    podman import "$tarball" "$base" >/dev/null || fail "podman import failed"
fi
# --network host: the build reaches the Debian mirror the way this host does;
# --format docker keeps HEALTHCHECK in the image.
build() { # tag, dockerfile, context, [podman build args]
    local log=$work/build-${1##*/}.log
    timeout 900 podman build --network host --pull=never --format docker \
        -t "$1" -f "$2" "${@:4}" "$3" >"$log" 2>&1 || { tail -n 30 "$log"; fail "building $1"; }
}
step "building $image (cached layers are reused)"
# The build-dependency stage gets a tag so that pruning the dangling images
# of earlier builds keeps its (slow) apt layer cached.
build localhost/xfer-build-deps:cache deploy/Dockerfile . --target deps
build "$image" deploy/Dockerfile .
step "building $redis_image"
build "$redis_image" deploy/redis.Dockerfile deploy
podman image prune -f >/dev/null 2>&1
step "image $image: $(podman image inspect -f '{{.Size}}' "$image" | numfmt --to=iec)B," \
    "user $(podman image inspect -f '{{.Config.User}}' "$image")"
[[ $(podman image inspect -f '{{.Config.User}}' "$image") == xfer* ]] || fail "image runs as root"
podman image inspect -f '{{.Config.Healthcheck}}' "$image" | grep -q 'xferctl health' ||
    fail "image has no HEALTHCHECK"
# First prove a container starts at all (on a machine without iptables,
# netavark cannot set up the network and every run fails): name that cause
# rather than blaming the image.
podman run --rm --entrypoint true "$image" >"$work/run.log" 2>&1 ||
    fail "podman cannot start a container: $(tail -n 3 "$work/run.log" | tr '\n' ' ')" \
        "(netavark needs iptables: make deps-deploy installs it)"
podman run --rm --entrypoint sh "$image" -c \
    'test -z "$(dpkg-query -W -f "\${Package}\n" | grep -E -- "-dev(:|$)")" && ! command -v cc' ||
    fail "runtime image holds -dev packages or a compiler"

# ---- up ------------------------------------------------------------------
step "compose up"
"${compose[@]}" up -d >"$work/up.log" 2>&1 || { tail -n 30 "$work/up.log"; fail "compose up"; }

ex() { timeout 60 podman exec "$@"; }
wait_for() { # what, seconds, command...
    local what=$1 deadline=$((SECONDS + $2))
    shift 2
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS > deadline)); then
            for c in $c_redis $c1 $c2; do
                echo "--- logs $c"; podman logs --tail 20 "$c" 2>&1
            done
            fail "timed out waiting for $what"
        fi
        sleep 0.5
    done
}
rcli() { ex "$c_redis" redis-cli --no-auth-warning -a "$XFER_REDIS_PASSWORD" "$@"; }
wait_for "redis" 60 rcli ping
wait_for "xferd n1 healthy" 60 ex "$c1" xferctl health
wait_for "xferd n2 healthy" 60 ex "$c2" xferctl health
wait_for "both nodes in the registry" 30 \
    bash -c "[[ \$(podman exec $c_redis redis-cli --no-auth-warning -a $XFER_REDIS_PASSWORD ZCARD xfer:nodes) == 2 ]]"
step "redis and both xferd up"
for c in $c1 $c2; do
    timeout 30 podman healthcheck run "$c" >/dev/null || fail "HEALTHCHECK of $c failed"
done
step "HEALTHCHECK (xferctl health) passes in both containers"

# ---- a named transfer between the two containers ---------------------------
ex "$c1" sh -c 'head -c 1048576 /dev/urandom >/tmp/in && sha256sum </tmp/in >/tmp/in.sum' ||
    fail "making test data"
ex "$c1" xferctl put /tmp/in n1/kv >/dev/null || fail "xferctl put n1/kv"
ex "$c1" xferctl copy n1/kv n2/kv 1048576 >"$work/copy.out" || fail "xferctl copy n1/kv n2/kv"
ex "$c2" xferctl get n2/kv 1048576 /tmp/out >/dev/null || fail "xferctl get n2/kv"
want=$(ex "$c1" cat /tmp/in.sum) got=$(ex "$c2" sh -c 'sha256sum </tmp/out')
[[ -n $want && $want == "$got" ]] || fail "data differs after n1 -> n2 copy ($want vs $got)"
# and back: n2 reads n1's region by name, asked through n2
ex "$c2" xferctl copy n1/kv+0 n2/kv+0 4096 --op read >/dev/null || fail "xferctl copy --op read"
step "named transfer n1/kv -> n2/kv (1 MiB) verified by sha256 across containers"

# ---- registry, seen with redis-cli ---------------------------------------------
ip1=$(podman inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$c1")
[[ $(rcli HGET 'xfer:node:{n1}' addr) == "$ip1" ]] || fail "n1 publishes addr $(rcli HGET 'xfer:node:{n1}' addr), not its IP $ip1"
rcli SMEMBERS 'xfer:regions:{n2}' | grep -qx kv || fail "region kv of n2 missing in Redis"
[[ $(rcli HGET 'xfer:region:{n2}:kv' len) == 4194304 ]] || fail "region n2/kv has the wrong len"
ex "$c_redis" redis-cli ping 2>&1 | grep -q NOAUTH || fail "Redis answers without the password"
[[ $(rcli CONFIG GET appendonly | tail -n1) == yes ]] || fail "Redis persistence (appendonly) is off"
step "redis-cli: nodes n1 n2, regions, addr $ip1; password enforced; appendonly on"

# ---- metrics ---------------------------------------------------------------------
scrape=$(curl -sf --max-time 5 "http://$ip1:9400/metrics") || fail "cannot scrape n1 /metrics"
written=$(awk '$1 == "xfer_node_bytes_total{op=\"write\"}" {print $2}' <<<"$scrape")
[[ -n $written ]] && ((written >= 1048576)) ||
    fail "n1 xfer_node_bytes_total{op=\"write\"} = '$written' after a 1 MiB copy"
grep -q '^xfer_registry_connected 1$' <<<"$scrape" || fail "n1 metrics: registry not connected"
step "metrics of n1: bytes written $written, registry connected"

# ---- down ---------------------------------------------------------------------
step "compose down -v"
down || { tail -n 20 "$work/down.log"; fail "compose down"; }
[[ -z $(leftovers) ]] || fail "left behind: $(leftovers | tr '\n' ' ')"
step "nothing left: no container, volume or network of project $proj"
echo "PASS (took $((SECONDS - t0)) s)"
