#!/usr/bin/env bash
# Packs a built tree for a GPU machine that lacks this project's build and
# test dependencies (the lent GPU hosts run Ubuntu 24.04 without hiredis,
# protobuf-c, cmocka or redis-server): the build's programs, tests and
# benches with debug info stripped, the shared libraries they (and redis)
# need that such a host may lack, and redis-server/redis-cli.
#
#   mk/device_carry.sh [OUT]   (default .carry/device; B=build) makes OUT/
#                              and OUT.tar.gz (what travels: 64 MiB at most)
#   there:  tar xzf OUT.tar.gz -C /tmp; . /tmp/device/env.sh
#           B=/tmp/device/build XFER_TESTS='gpu|kernels' bash tests/run.sh
#
# glibc and the C++ runtime come from the host (newer there); everything
# else is taken from this Debian 12 build host and found via LD_LIBRARY_PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
out=${1:-.carry/device}
[[ -x $B/bin/xferd ]] || { echo "device_carry: $B not built (run make first)" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out/$(basename "$B")" "$out/lib" "$out/bin"
for d in bin bench lib tests; do
    [[ -d $B/$d ]] && cp -a "$B/$d" "$out/$(basename "$B")/"
done
rm -f "$out/$(basename "$B")"/lib/*.a
for p in redis-server redis-cli; do
    cp -L "$(command -v "$p")" "$out/bin/"
done
find "$out" -type f \( -perm -u+x -o -name '*.so*' \) -exec strip --strip-debug {} + 2>/dev/null || true
find "$out" -type f \( -perm -u+x -o -name '*.so*' \) -print0 |
    xargs -0 -n 16 ldd 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
    sort -u | while read -r so path; do
    case $so in
    libc.so* | libm.so* | libpthread* | libdl.so* | librt.so* | ld-linux* | libstdc++* | libgcc_s* | \
        libcuda.so* | libibverbs* | librdmacm* | libnl-*) ;; # the host's own
    *) cp -L "$path" "$out/lib/$so" ;;
    esac
done
cat >"$out/env.sh" <<ENV
# . this file: puts the carried redis on PATH and the carried libraries last
# on the library path (after the host's own)
here=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)
export PATH=\$here/bin:\$PATH
export LD_LIBRARY_PATH=\${LD_LIBRARY_PATH:+\$LD_LIBRARY_PATH:}\$here/lib
ENV
tar czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
du -sh "$out" "$out.tar.gz" | awk '{print "device_carry: " $2 " " $1}'
