#!/usr/bin/env bash
# make check-deps (issue 18 item 11): the tree includes across no forbidden
# layer, and the checker does catch crossings: a copy of the layers with an
# engine-private header in service/, a registry header and libevent in
# engine/, and protobuf-c in node/ must fail with each named.
set -u
cd "${XFER_ROOT:-.}"
fail() { echo "FAIL: $*" >&2; exit 1; }
bash mk/check_deps.sh || fail "the tree includes across forbidden layers"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r engine kernels proto registry node service "$tmp"/
sed -i '1a #include "handshake.h"' "$tmp/service/ctl_client.c"
sed -i '1a #include "xfer_registry.h"\n#include <event2/event.h>' "$tmp/engine/wire.c"
sed -i '1a #include <protobuf-c/protobuf-c.h>' "$tmp/node/names.c"
out=$(bash mk/check_deps.sh "$tmp" 2>&1) && fail "crossings not caught: $out"
for want in 'service/ctl_client.c:2: includes "handshake.h"' 'engine/wire.c:2: includes "xfer_registry.h"' \
    'engine/wire.c:3: includes <event2/event.h>' 'node/names.c:2: includes <protobuf-c/protobuf-c.h>'; do
    grep -qF "$want" <<<"$out" || fail "not reported: $want (got: $out)"
done
echo "ok: no forbidden include in the tree; injected ones caught"
