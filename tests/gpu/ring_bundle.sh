#!/usr/bin/env bash
# Packs the GPU request ring test and bench (built by `make` with CUDA) for a
# GPU machine that lacks this project's build dependencies (no protobuf-c,
# hiredis, cmocka): the binaries, the shared libraries they need that such a
# machine may lack (used only where the machine has none of its own), and
# run.sh, which runs the unit test, the GPU tests, compute-sanitizer and the
# bench, writing everything to $OUT/gpu_ring_run.txt.
#
#   tests/gpu/ring_bundle.sh OUTDIR         (B=build by default)
#   on the GPU machine:  bash OUTDIR/run.sh [check|bench|all]
#       XFER_RING_PEER_GPU=1 puts the receiver on GPU 1 (two GPUs: the
#       "other GPU over ipc" case; docs/gpu_initiated.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${B:-build}
out=${1:?usage: ring_bundle.sh OUTDIR}
for p in "$B/tests/gpu_ring" "$B/tests/unit/test_gpu_ring"; do
    [[ -x $p ]] || { echo "missing $p (make with nvcc first)"; exit 1; }
done
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
cp "$B/tests/gpu_ring" "$B/tests/unit/test_gpu_ring" "$out/bin/"
for p in "$out"/bin/*; do
    ldd "$p" | awk '$2 == "=>" {print $1, $3}'
done | sort -u | while read -r so path; do
    case $so in # glibc and the C++ runtime come from the machine (newer there)
    libc.so* | libm.so* | libpthread* | libdl.so* | librt.so* | ld-linux* | libstdc++* | libgcc_s*) ;;
    *) cp -L "$path" "$out/lib/$so" ;;
    esac
done
cat >"$out/run.sh" <<'EOF'
#!/usr/bin/env bash
# GPU request rings on this machine: bash run.sh [check|bench|all] (default all)
set -u
here=$(cd "$(dirname "$0")" && pwd)
what=${1:-all}
peer_gpu=${XFER_RING_PEER_GPU:-0}
out=${OUT:-/tmp/gpu_ring_out}
mkdir -p "$out"
exec > >(tee -a "$out/gpu_ring_run.txt") 2>&1
# bundled libraries only where the machine has none of its own
libdir=$(mktemp -d)
for f in "$here"/lib/*; do
    so=$(basename "$f")
    ldconfig -p | awk '{print $1}' | grep -qxF "$so" || ln -s "$f" "$libdir/$so"
done
export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "# $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -r), $(nproc) CPUs, receiver GPU $peer_gpu"
echo "# bundled libraries used: $(ls "$libdir" | tr '\n' ' ')"
nvidia-smi -L
nvidia-smi topo -m 2>/dev/null | head -5
cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
step() { # NAME SECONDS CMD...: its exit status
    local name=$1 secs=$2 t0=$SECONDS rc
    shift 2
    echo; echo "## $name"
    timeout -k 5 "$secs" "$@"
    rc=$?
    echo "## $name: exit $rc after $((SECONDS - t0)) s"
    return $rc
}
if [[ $what == all || $what == check ]]; then
    step unit 40 "$here/bin/test_gpu_ring"
    step check 150 "$here/bin/gpu_ring" check --peer-gpu "$peer_gpu" ||
        CUDA_MODULE_LOADING=EAGER step check-eager-loading 120 "$here/bin/gpu_ring" check \
            --peer-gpu "$peer_gpu" --cases local,tcp,ipc
    if [[ -n $cs ]]; then
        step memcheck 90 "$cs" --tool memcheck --error-exitcode 9 "$here/bin/gpu_ring" check \
            --cases local,pressure
        step synccheck 60 "$cs" --tool synccheck --error-exitcode 9 "$here/bin/gpu_ring" check \
            --cases local,pressure
    else
        echo "## compute-sanitizer not found"
    fi
fi
if [[ $what == all || $what == bench ]]; then
    step bench 240 "$here/bin/gpu_ring" bench --peer-gpu "$peer_gpu"
fi
rm -rf "$libdir"
EOF
chmod +x "$out/run.sh"
du -sh "$out"
