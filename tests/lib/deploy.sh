# Shell helpers for the deployment tests (bundle, compose, metrics).
# Sourced by tests/integration/*.sh; needs bash.

XFER_TEST_CACHE=${XFER_TEST_CACHE:-/var/cache/xfer-test}

# First http(s) URI of the configured Debian archive (deb822 or one-line
# sources), so that debootstrap uses the mirror this host already uses.
deploy_debian_mirror() {
    local f uri
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -r $f ]] || continue
        uri=$(awk '/^URIs:/ {print $2; exit}' "$f")
        [[ $uri == *debian* && $uri != *security* ]] && { echo "$uri"; return 0; }
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -r $f ]] || continue
        uri=$(awk '$1 == "deb" && $0 ~ /debian/ && $0 !~ /security/ {
                     for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }' "$f")
        [[ -n $uri ]] && { echo "$uri"; return 0; }
    done
    echo "http://deb.debian.org/debian"
}

# Minimal Debian 12 root filesystem (debootstrap --variant=minbase, no -dev
# package in it) as a tarball, made once and cached: prints its path.
deploy_rootfs_tarball() {
    local tarball=$XFER_TEST_CACHE/debian-bookworm-minbase.tar
    if [[ -s $tarball ]]; then
        echo "$tarball"
        return 0
    fi
    command -v debootstrap >/dev/null || { echo "deploy: debootstrap missing" >&2; return 1; }
    mkdir -p "$XFER_TEST_CACHE" || return 1
    local dir mirror rc
    mirror=$(deploy_debian_mirror)
    dir=$(mktemp -d "$XFER_TEST_CACHE/rootfs.XXXXXX") || return 1
    echo "deploy: debootstrap bookworm from $mirror (cached afterwards)" >&2
    if ! debootstrap --variant=minbase bookworm "$dir" "$mirror" \
            >"$XFER_TEST_CACHE/debootstrap.log" 2>&1; then
        echo "deploy: debootstrap failed, see $XFER_TEST_CACHE/debootstrap.log" >&2
        rm -rf "$dir"
        return 1
    fi
    # The same sources inside as on the host, so apt-get in a container made
    # from this rootfs reaches the same mirror.
    if [[ -r /etc/apt/sources.list.d/debian.sources ]]; then
        rm -f "$dir"/etc/apt/sources.list
        cp /etc/apt/sources.list.d/debian.sources "$dir"/etc/apt/sources.list.d/
    fi
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
    tar -C "$dir" --numeric-owner -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rc=$?
    rm -rf "$dir"
    [[ $rc == 0 ]] && echo "$tarball"
}
