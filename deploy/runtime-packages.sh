#!/usr/bin/env bash
# Prints the Debian packages that provide the shared libraries the given
# programs load (per ldd), one per line. Used by deploy/Dockerfile so the
# runtime image installs exactly the runtime libraries, never a -dev package.
set -euo pipefail
declare -A pkgs=()
owner() { # path -> package, trying the /usr-merged spellings dpkg may know
    local p=$1 real
    real=$(readlink -f "$p")
    for c in "$p" "/usr$p" "${p#/usr}" "$real" "/usr$real" "${real#/usr}"; do
        dpkg-query -S "$c" 2>/dev/null | head -n1 | cut -d: -f1 && return 0
    done
    echo "runtime-packages: no package owns $p" >&2
    return 1
}
for prog in "$@"; do
    while read -r _ arrow path _; do
        [[ $arrow == "=>" && $path == /* ]] || continue
        pkgs[$(owner "$path")]=1
    done < <(ldd "$prog")
done
printf '%s\n' "${!pkgs[@]}" | sort
