#!/usr/bin/env bash
# make check-deps: fails when a source file includes across the layers the
# design forbids (docs/engine.md "Layers"; /work DESIGN: service -> node ->
# registry/engine -> kernels/proto, one public header per layer):
#
#   layer      may include (besides its own folder)
#   kernels    engine/xfer_err.h
#   proto      engine/xfer_err.h, its generated *.pb-c.h
#   engine     kernels/ and proto/ (not the protobuf-generated headers)
#   registry   engine's public headers (engine/xfer*.h), proto/
#   node       registry's and engine's public headers, proto/
#   service    public headers of node, registry, engine, kernels; proto/
#
# Public headers: engine/xfer*.h, kernels/xfer*.h, registry/xfer_registry.h,
# node/xfer_node.h. Libraries: hiredis only in registry/ (and service/,
# which attaches it to libevent), libevent and protobuf-c never below
# registry/ and service/ (engine/ reaches the handshake messages through
# proto/hs_msg.h). Quoted includes are resolved like the compiler does:
# the including file's folder, then -I. -Iengine -Iproto -Iregistry
# -Ikernels -Iservice -Inode; generated proto/*.pb-c.h count as proto/.
# Usage: mk/check_deps.sh [ROOT] (default: the repository of this script).
set -u
cd "${1:-$(dirname "$0")/..}" || exit 2
bad=0
report() {
    echo "check-deps: $1:$2: includes $3: $4"
    bad=$((bad + 1))
}

resolve() { # file, include -> path of the header, or "" (system/generated)
    local dir=${1%/*} inc=$2 d
    [[ $inc == proto/*.pb-c.h || $inc == *.pb-c.h ]] && { echo "proto/${inc##*/}"; return; }
    for d in "$dir" . engine proto registry kernels service node; do
        [[ -f $d/$inc ]] && { realpath --relative-to=. "$d/$inc"; return; }
    done
    echo ""
}

public() { # path -> 0 if it is a layer's public header
    case $1 in
    engine/xfer*.h | kernels/xfer*.h | kernels/xfer*.cuh | registry/xfer_registry.h | node/xfer_node.h) return 0 ;;
    esac
    return 1
}

check_quoted() { # file layer target
    local f=$1 layer=$2 t=$3 tl=${3%%/*}
    [[ $tl == "$layer" ]] && return 0
    [[ $t == engine/xfer_err.h ]] && return 0 # the leaf header of error codes
    case $layer in
    kernels | proto)
        [[ $layer == proto && $t == proto/*.pb-c.h ]] && return 0
        return 1 ;;
    engine)
        [[ $tl == kernels ]] && return 0
        [[ $tl == proto && $t != *.pb-c.h ]] && return 0
        return 1 ;;
    registry)
        [[ $tl == proto ]] && return 0
        [[ $tl == engine ]] && public "$t" && return 0
        return 1 ;;
    node)
        [[ $tl == proto ]] && return 0
        [[ $tl == engine || $tl == registry ]] && public "$t" && return 0
        return 1 ;;
    service)
        [[ $tl == proto ]] && return 0
        [[ $tl == engine || $tl == registry || $tl == node || $tl == kernels ]] && public "$t" && return 0
        return 1 ;;
    esac
    return 1
}

check_system() { # layer header -> 0 if allowed
    local layer=$1 h=$2
    case $h in
    hiredis/*) [[ $layer == registry || $layer == service ]] ;;
    event2/*) [[ $layer == service || $layer == registry ]] ;;
    protobuf-c/*) [[ $layer == proto || $layer == service ]] ;;
    *) return 0 ;;
    esac
}

files=$(find engine kernels proto registry node service -type f \
    \( -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null | sort)
[[ -n $files ]] || { echo "check-deps: no sources found under $PWD"; exit 2; }
for f in $files; do
    layer=${f%%/*}
    while IFS=: read -r line text; do
        if [[ $text =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\"([^\"]+)\" ]]; then
            inc=${BASH_REMATCH[1]}
            t=$(resolve "$f" "$inc")
            [[ -z $t ]] && continue # not in the tree (generated elsewhere)
            check_quoted "$f" "$layer" "$t" ||
                report "$f" "$line" "\"$inc\" ($t)" "$layer/ may not include it"
        elif [[ $text =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\<([^\>]+)\> ]]; then
            inc=${BASH_REMATCH[1]}
            check_system "$layer" "$inc" || report "$f" "$line" "<$inc>" "$layer/ may not use that library"
        fi
    done < <(grep -n '^[[:space:]]*#[[:space:]]*include' "$f")
done
if ((bad)); then
    echo "check-deps: $bad include(s) across forbidden layers"
    exit 1
fi
echo "check-deps: ok (no include crosses a forbidden layer)"
