#!/usr/bin/env bash
# The relocatable bundle (mk/bundle.sh) runs where no -dev package exists:
#  1. every library its programs load resolves inside the bundle or to glibc
#     (ldd with env -i and an empty LD_LIBRARY_PATH);
#  2. in a chroot made from a minimal Debian 12 rootfs (debootstrap minbase,
#     checked to hold no -dev package and none of our libraries), in fresh
#     network, mount and pid namespaces, with env -i: the bundled redis-server,
#     two xferd and xferctl do a named WRITE and READ and compare bytes.
# Without a cached rootfs or debootstrap (or with XFER_BUNDLE_NO_CHROOT=1),
# step 2 runs on the host instead (in a fresh netns, env -i), and says so.
set -u
cd "${XFER_ROOT:-$(dirname "$0")/../..}"
B=${B:-build}
source tests/lib/deploy.sh

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
[[ $(id -u) == 0 ]] || skip "needs root (chroot, namespaces)"
command -v patchelf >/dev/null || skip "patchelf missing (make deps-deploy)"
command -v unshare >/dev/null || skip "unshare missing"
[[ -x $B/bin/xferd && -x $B/bin/xferctl ]] || skip "xferd/xferctl not built in $B"

work=$(mktemp -d /tmp/xfer-bundle-test.XXXXXX)
cleanup() { rm -rf --one-file-system "$work"; }
trap cleanup EXIT

# ---- make and unpack the bundle into an empty directory -----------------
tarball=$(B=$B XFER_BUNDLE_REDIS=1 bash mk/bundle.sh "$work/dist") || fail "mk/bundle.sh failed"
mkdir "$work/unpacked"
tar -C "$work/unpacked" -xzf "$tarball" || fail "cannot unpack $tarball"
bundle=$(echo "$work"/unpacked/xfer-bundle-*)
echo "bundle: $tarball ($(du -h "$tarball" | cut -f1)), $(ls "$bundle/lib" | wc -l) libraries"
head -n2 "$bundle/MANIFEST"

# ---- 1. ldd: everything resolves inside the bundle or to glibc ----------
# usage: check_ldd PREFIX-OF-BUNDLE [chroot-dir]
check_ldd() {
    local prefix=$1 chroot_dir=${2:-} f line bad=0
    for f in "$bundle"/bin/* "$bundle"/lib/*; do
        local rel=${f#"$bundle"/}
        if [[ -n $chroot_dir ]]; then
            out=$(chroot "$chroot_dir" /usr/bin/env -i LD_LIBRARY_PATH= /usr/bin/ldd "$prefix/$rel" 2>&1)
        else
            out=$(env -i LD_LIBRARY_PATH= /usr/bin/ldd "$prefix/$rel" 2>&1)
        fi
        while read -r line; do
            case $line in
            *"not found"*) echo "  $rel: $line"; bad=1 ;;
            *"=> $prefix/lib/"* | *"=> $prefix/bin/../lib/"* | *"=> $prefix/lib/../lib/"*) ;;
            *"=> "*) local so=${line%% *}
                     is_glibc_soname "$so" || { echo "  $rel: outside bundle: $line"; bad=1; } ;;
            esac
        done <<<"$out"
    done
    return $bad
}
is_glibc_soname() {
    case $1 in
    ld-linux*.so* | libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | \
        libresolv.so.* | libutil.so.* | libanl.so.* | libmvec.so.*) return 0 ;;
    esac
    return 1
}
check_ldd "$bundle" || fail "libraries resolve outside the bundle (host ldd)"
echo "ok: host ldd (env -i): every non-glibc library resolves in $bundle/lib"

# ---- 2. run it where no -dev package is installed ---------------------------
rootfs_tar=
[[ ${XFER_BUNDLE_NO_CHROOT:-0} == 1 ]] || rootfs_tar=$(deploy_rootfs_tarball) || rootfs_tar=
if [[ -n $rootfs_tar ]]; then
    root=$work/root
    mkdir "$root"
    tar -C "$root" -xf "$rootfs_tar" || fail "cannot unpack $rootfs_tar"
    devs=$(chroot "$root" dpkg-query -W -f '${Package}\n' | grep -E -- '-dev(:|$)' || true)
    [[ -z $devs ]] || fail "rootfs has -dev packages: $devs"
    for l in libhiredis libevent libprotobuf-c libibverbs librdmacm liblzf libjemalloc; do
        ! ls "$root"/usr/lib/*/"$l".so* >/dev/null 2>&1 || fail "rootfs already has $l"
    done
    echo "ok: chroot rootfs: no -dev package, none of the bundled libraries"
    mkdir -p "$root/opt"
    cp -a "$bundle" "$root/opt/xfer"
    check_ldd /opt/xfer "$root" || fail "libraries resolve outside the bundle (chroot ldd)"
    echo "ok: chroot ldd (env -i): every non-glibc library resolves in /opt/xfer/lib"
    inside=$root
    prefix=/opt/xfer
else
    echo "NOTE: no Debian rootfs (debootstrap missing or failed): running on the host instead of a chroot"
    inside=
    prefix=$bundle
fi

cp tests/lib/deploy_bundle_inner.sh "${inside:-$work}/inner.sh"
script=$([[ -n $inside ]] && echo /inner.sh || echo "$work/inner.sh")
# Fresh net/mount/pid namespaces: only lo, nothing of the host's network, and
# every process started inside dies with the namespace's init.
timeout 120 unshare --net --mount --pid --fork --kill-child bash -c '
    set -e
    ip link set lo up
    mount --make-rprivate /
    if [[ -n $1 ]]; then
        mount --rbind /dev "$1/dev"
        mount -t proc proc "$1/proc"
        mount -t tmpfs tmpfs "$1/tmp"
        exec chroot "$1" /usr/bin/env -i LD_LIBRARY_PATH= PATH=/usr/bin:/bin \
            /bin/bash "$3" "$2"
    fi
    mount -t proc proc /proc
    exec /usr/bin/env -i LD_LIBRARY_PATH= PATH=/usr/bin:/bin /bin/bash "$3" "$2"
' inner "$inside" "$prefix" "$script"
rc=$?
[[ $rc == 0 ]] || fail "transfer with the bundle failed (exit $rc)"
echo "PASS"
