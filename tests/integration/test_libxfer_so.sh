#!/usr/bin/env bash
# libxfer.so is the public library: it exports only xfer_-prefixed public
# API (built with -fvisibility=hidden), holds no xferd/xferctl code, and
# `make install` gives headers and a library that a C program builds and
# runs against.
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
so=$B/lib/libxfer.so
fail() { echo "FAIL: $*"; exit 1; }
[[ -f $so ]] || fail "$so not built"

syms=$(nm -D --defined-only "$so" | awk '{print $3}')
bad=$(grep -v '^xfer_' <<<"$syms" | grep -v '^_\(init\|fini\|edata\|end\|_bss_start\)$' || true)
[[ -z $bad ]] || fail "non-API symbols exported: $(head -20 <<<"$bad" | tr '\n' ' ')"
for s in xfer_engine_new xfer_batch_submit xfer_registry_new xfer_strerror xfer_peer_add; do
    grep -qx "$s" <<<"$syms" || fail "public $s not exported"
done
# Engine internals keep their xfer_ names but must stay hidden.
for s in xfer_handshake_client xfer_frame_send; do
    ! grep -qx "$s" <<<"$syms" || fail "internal $s exported"
done
# No service code: no function defined by service/ objects is in the library.
svc=$(nm --defined-only "$B"/obj/service/*.o 2>/dev/null | awk '$2 == "T" {print $3}' | sort -u)
[[ -n $svc ]] || fail "no service objects to compare with"
all=$(nm --defined-only "$so" | awk '{print $3}' | sort -u)
both=$(comm -12 <(echo "$svc") <(echo "$all"))
[[ -z $both ]] || fail "service code in $so: $(head -5 <<<"$both" | tr '\n' ' ')"
echo "exports: $(wc -l <<<"$syms") symbols, all xfer_"

tmp=$(mktemp -d /tmp/xfer-so.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
sanmake=0
[[ $B == *san* ]] && sanmake=1
make --no-print-directory -s install B="$B" SAN=$sanmake DESTDIR="$tmp" PREFIX=/usr >/dev/null ||
    fail "make install"
for h in xfer.h xfer_err.h xfer_registry.h; do
    [[ -f $tmp/usr/include/xfer/$h ]] || fail "header $h not installed"
done
[[ -L $tmp/usr/lib/libxfer.so && -f $tmp/usr/lib/libxfer.so.0 ]] || fail "library not installed"
cat >"$tmp/use.c" <<'C'
#include <stdio.h>
#include <string.h>
#include <xfer/xfer_registry.h>
int main(void)
{
    struct xfer_redis_url u;
    char why[128];
    if (xfer_redis_url_parse("redis://h:7/2", &u, why, sizeof why) || u.port != 7 || u.db != 2)
        return 1;
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = "so-test";
    cfg.transports = XFER_TRANSPORT_TCP;
    int err = 0;
    xfer_engine *e = xfer_engine_new(&cfg, &err);
    if (!e) { printf("engine: %s\n", xfer_strerror(err)); return 1; }
    xfer_region *r = NULL;
    if (xfer_region_alloc(e, "r", 4096, XFER_ACCESS_RW, &r)) return 1;
    memset(xfer_region_ptr(r), 7, 4096);
    xfer_engine_free(e);
    puts("ok");
    return 0;
}
C
san=()
[[ $B == *san* ]] && san=(-fsanitize=address,undefined)
cc "${san[@]}" -I"$tmp/usr/include" "$tmp/use.c" -o "$tmp/use" -L"$tmp/usr/lib" -lxfer || fail "compile against installed headers"
out=$(LD_LIBRARY_PATH=$tmp/usr/lib "$tmp/use") || fail "program on libxfer.so: $out"
[[ $out == ok ]] || fail "unexpected output: $out"
echo "installed library and headers work"
