#!/usr/bin/env bash
# Makes a relocatable tarball of xferd and xferctl:
#
#   dist/xfer-bundle-<ver>.tar.gz
#     xfer-bundle-<ver>/bin/     xferd, xferctl (+ redis-server, redis-cli)
#     xfer-bundle-<ver>/lib/     every shared library they need except glibc's
#     xfer-bundle-<ver>/env.sh   `. env.sh` puts bin/ on PATH
#     xfer-bundle-<ver>/run      `run xferd ...` runs a bundled program
#     xfer-bundle-<ver>/MANIFEST what is inside, and the newest glibc needed
#
# How: the binaries of the normal build ($B/bin) are copied, stripped, and
# given the rpath $ORIGIN/../lib with patchelf; each copied library gets
# $ORIGIN. The libraries are the ones `ldd` resolves on this (Debian 12) host,
# so the bundle runs on any x86_64 Linux with glibc >= the version MANIFEST
# names (Debian 12: 2.36; Ubuntu 24.04 has 2.39) and no -dev packages.
# The rpaths are DT_RUNPATH, so LD_LIBRARY_PATH still wins: see docs/deploy.md
# for using the host's own libibverbs/librdmacm (RDMA providers).
#
# usage: mk/bundle.sh [outdir]     env: B (build dir, default build),
#        XFER_BUNDLE_REDIS=auto|0|1 (bundle redis-server/redis-cli; auto = if
#        installed), XFER_BUNDLE_VERSION (default: engine/xfer.h version)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
out=${1:-dist}
with_redis=${XFER_BUNDLE_REDIS:-auto}
ver=${XFER_BUNDLE_VERSION:-$(sed -n 's/^#define XFER_VERSION_STRING "\(.*\)"/\1/p' engine/xfer.h)}
name=xfer-bundle-$ver

die() { echo "bundle: $*" >&2; exit 1; }
command -v patchelf >/dev/null || die "patchelf missing (apt-get install patchelf, or make deps-deploy)"

progs=()
for p in xferd xferctl; do
    [[ -x $B/bin/$p ]] || die "$B/bin/$p not built (run make first)"
    progs+=("$B/bin/$p")
done
if [[ $with_redis != 0 ]]; then
    for p in redis-server redis-cli; do
        if command -v "$p" >/dev/null; then
            progs+=("$(readlink -f "$(command -v "$p")")")
        elif [[ $with_redis == 1 ]]; then
            die "$p requested but not installed"
        fi
    done
fi

# glibc's own libraries come from the target host; everything else travels.
is_glibc() {
    case $1 in
    ld-linux*.so* | libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | \
        libresolv.so.* | libutil.so.* | libanl.so.* | libnsl.so.* | libmvec.so.* | \
        libBrokenLocale.so.* | libthread_db.so.* | libnss_*.so.* | linux-vdso.so.*)
        return 0 ;;
    esac
    return 1
}

stage=$(mktemp -d "${TMPDIR:-/tmp}/xfer-bundle.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root=$stage/$name
mkdir -p "$root/bin" "$root/lib"

declare -A libs=()
for p in "${progs[@]}"; do
    # "libfoo.so.1 => /path/libfoo.so.1 (0x...)"; ldd lists the whole closure.
    while read -r soname arrow path _; do
        [[ $arrow == "=>" ]] || continue
        [[ $path == "not" ]] && die "$p: $soname not found on this host"
        is_glibc "$soname" && continue
        libs[$soname]=$path
    done < <(ldd "$p")
    dest=$root/bin/$(basename "$p")
    [[ $(basename "$p") == redis-check-rdb ]] && dest=$root/bin/redis-server
    install -m 755 "$p" "$dest"
done
for soname in "${!libs[@]}"; do
    install -m 644 "${libs[$soname]}" "$root/lib/$soname"
done

strip --strip-unneeded "$root"/bin/* "$root"/lib/* 2>/dev/null || true
for f in "$root"/bin/*; do patchelf --set-rpath '$ORIGIN/../lib' "$f"; done
for f in "$root"/lib/*; do patchelf --set-rpath '$ORIGIN' "$f"; done

# Newest GLIBC_x.y symbol version any file needs = the oldest usable glibc.
glibc_min=$(objdump -T "$root"/bin/* "$root"/lib/* 2>/dev/null |
    grep -o 'GLIBC_[0-9][0-9.]*' | sort -u -V | tail -n1)

cat >"$root/env.sh" <<'EOF'
# Source me: puts this bundle's programs on PATH. No LD_LIBRARY_PATH is
# needed: every program and library finds lib/ through its $ORIGIN rpath.
XFER_BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)
export XFER_BUNDLE PATH="$XFER_BUNDLE/bin:$PATH"
EOF
cat >"$root/run" <<'EOF'
#!/bin/sh
# run PROGRAM [ARGS...]: runs bin/PROGRAM of this bundle, from anywhere.
# XFER_HOST_VERBS=1 prefers the host's libibverbs/librdmacm (whose RDMA
# providers in /usr/lib/<arch>/libibverbs match them) over the bundled ones.
here=$(cd "$(dirname "$0")" && pwd)
prog=${1:?usage: run xferd|xferctl|redis-server|redis-cli [args...]}
shift
if [ "${XFER_HOST_VERBS:-0}" = 1 ]; then
    hostlib=$(dirname "$(ldconfig -p 2>/dev/null | awk '/libibverbs\.so\.1 /{print $NF; exit}')")
    [ -n "$hostlib" ] && [ "$hostlib" != . ] &&
        export LD_LIBRARY_PATH="$hostlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
exec "$here/bin/$prog" "$@"
EOF
chmod 755 "$root/run"
{
    echo "xfer bundle $ver, built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME") $(uname -m)"
    echo "needs: Linux $(uname -m), glibc >= ${glibc_min#GLIBC_}"
    echo "bin:"; (cd "$root/bin" && ls -1 | sed 's/^/  /')
    echo "lib:"; (cd "$root/lib" && ls -1 | sed 's/^/  /')
} >"$root/MANIFEST"

mkdir -p "$out"
tar -C "$stage" --owner=0 --group=0 --numeric-owner -czf "$out/$name.tar.gz.tmp" "$name"
mv "$out/$name.tar.gz.tmp" "$out/$name.tar.gz"
echo "$out/$name.tar.gz"
