#!/usr/bin/env bash
# Instructions and system calls per 8-byte round trip, repeatable on a noisy
# machine: runs xfer_bench under callgrind (both processes: the target is a
# fork) with two batch counts and divides the difference. Extra arguments go
# to xfer_bench (e.g. --op read). Needs valgrind and strace.
#   B=build bench/callgrind.sh [--op read]
# XFER_CG_PROG=bench_notify counts bench_notify instead (two engines in one
# process; N = --iters): per notified 4 KiB batch or per 8 B send/recv round
# trip (docs/perf.md, "Messages and notifications"):
#   XFER_CG_PROG=bench_notify bench/callgrind.sh --only sendrecv --transport tcp
# For bench_notify the tcp hold window is raised to 5 ms (unless set): under
# valgrind the next frame never follows an answer within the default 20 us,
# so answers and FINs would never ride along and the profile would not be
# the path a real run takes (docs/perf.md, step 18).
set -eu
cd "$(dirname "$0")/.."
B=${B:-build}
lo=${XFER_CG_LO:-500}
hi=${XFER_CG_HI:-1500}
prog=${XFER_CG_PROG:-xfer_bench}
[ "$prog" = bench_notify ] && export XFER_TCP_HOLD_WINDOW_US=${XFER_TCP_HOLD_WINDOW_US:-5000}
run_args() { # the program and its arguments for a run of $1 round trips
    if [ "$prog" = bench_notify ]; then
        echo "$B/bench/bench_notify --iters $1"
    else
        echo "$B/bench/xfer_bench --seconds 600 --warmup 0 --count $1"
    fi
}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
instr() { # total instructions of all processes for a run of $1 batches
    valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="$dir/cg.$1.%p" \
        $(run_args "$1") "${@:2}" >/dev/null 2>"$dir/vg.$1"
    cat "$dir"/cg."$1".* | awk '/^summary:/ {s += $2} END {print s}'
}
syscalls() { # system calls of all threads and processes for $1 batches
    strace -f -c -o "$dir/st.$1" $(run_args "$1") "${@:2}" >/dev/null
    awk 'NR>2 && $NF != "total" && $4 ~ /^[0-9]+$/ {s += $4} END {print s}' "$dir/st.$1"
}
i_lo=$(instr "$lo" "$@")
i_hi=$(instr "$hi" "$@")
s_lo=$(syscalls "$lo" "$@")
s_hi=$(syscalls "$hi" "$@")
echo "per round trip ($*): $(((i_hi - i_lo) / (hi - lo))) instructions, $(((s_hi - s_lo) * 100 / (hi - lo)))/100 system calls (both processes)"
# per-call counts of the calls the round trip makes (difference of the runs)
join <(awk 'NR>2 && $4 ~ /^[0-9]+$/ {print $NF, $4}' "$dir/st.$lo" | sort) \
    <(awk 'NR>2 && $4 ~ /^[0-9]+$/ {print $NF, $4}' "$dir/st.$hi" | sort) |
    awk -v d=$((hi - lo)) '$3 > $2 + d / 20 {printf "  %s %.2f", $1, ($3 - $2) / d} END {print ""}'
