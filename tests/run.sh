#!/usr/bin/env bash
# Runs every test: unit binaries ($B/tests/unit/test_*) and integration
# scripts (tests/integration/test_*.sh). Exit 0 = passed, 77 = skipped,
# anything else = failed. Ends with "N passed, N failed, N skipped".
#   tests/run.sh [unit|integration]   XFER_TESTS=regex filters by name
#   XFER_TEST_TIMEOUT=seconds per test (default 900)
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
export B XFER_ROOT=$PWD
what=${1:-all}
filter=${XFER_TESTS:-.}
limit=${XFER_TEST_TIMEOUT:-900}
logs=$B/test-logs
mkdir -p "$logs"
passed=0 failed=0 skipped=0 failed_names=()

run_one() { # name, command...
    local name=$1; shift
    [[ $name =~ $filter ]] || return 0
    local log=$logs/${name//\//_}.log start=$SECONDS rc
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1 </dev/null
    rc=$?
    local took=$((SECONDS - start))
    case $rc in
    0) passed=$((passed + 1)); printf 'PASS  %-40s %4ss\n' "$name" "$took" ;;
    77) skipped=$((skipped + 1))
        printf 'SKIP  %-40s %s\n' "$name" "$(grep -m1 -i 'skip' "$log" | cut -c1-100)" ;;
    *) failed=$((failed + 1)); failed_names+=("$name")
       printf 'FAIL  %-40s %4ss (exit %d, log %s)\n' "$name" "$took" "$rc" "$log"
       tail -n 40 "$log" | sed 's/^/      | /' ;;
    esac
}

if [[ $what == all || $what == unit ]]; then
    for t in "$B"/tests/unit/test_*; do
        [[ -x $t ]] || continue
        run_one "unit/$(basename "$t")" "$t"
    done
fi
if [[ $what == all || $what == integration ]]; then
    for t in tests/integration/test_*.sh; do
        [[ -f $t ]] || continue
        run_one "integration/$(basename "$t" .sh)" bash "$t"
    done
fi
if ((failed)); then printf 'failed: %s\n' "${failed_names[*]}"; fi
echo "$passed passed, $failed failed, $skipped skipped"
((failed == 0))
