#!/usr/bin/env bash
# Runs every test: unit binaries ($B/tests/unit/test_*) and integration
# scripts (tests/integration/test_*.sh). Exit 0 = passed, 77 = skipped,
# anything else = failed. Ends with "N passed, N failed, N skipped".
# What cannot pass quietly: a unit source without its binary (or no unit
# binary at all) fails, and so does a skip that blames something not built
# ("not built" in its reason: a missing helper is a build fault, not a
# missing machine feature). A passing test that leaves cases out says so on
# lines starting "skip-case: REASON"; they are counted and listed.
#   tests/run.sh [unit|integration]   XFER_TESTS=regex filters by name
#   XFER_TEST_TIMEOUT=seconds per test (default 900)
#   XFER_INTEGRATION_DIR=folder of the scripts (default tests/integration;
#   test_runner_rules.sh points it elsewhere to test these rules)
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
export B XFER_ROOT=$PWD
what=${1:-all}
filter=${XFER_TESTS:-.}
limit=${XFER_TEST_TIMEOUT:-900}
logs=$B/test-logs
mkdir -p "$logs"
passed=0 failed=0 skipped=0 cases_skipped=0 failed_names=() case_notes=()

run_one() { # name, command...
    local name=$1; shift
    [[ $name =~ $filter ]] || return 0
    local log=$logs/${name//\//_}.log start=$SECONDS rc
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1 </dev/null
    rc=$?
    local took=$((SECONDS - start))
    local why
    why=$(grep -m1 -i 'skip' "$log" | cut -c1-100)
    if ((rc == 77)) && [[ $why == *"not built"* ]]; then
        echo "a skip for something not built is a failure: $why" >>"$log"
        rc=1
    fi
    case $rc in
    0) passed=$((passed + 1))
       local n
       n=$(grep -c '^skip-case: ' "$log")
       if ((n)); then
           cases_skipped=$((cases_skipped + n))
           case_notes+=("$name: $(grep -m1 '^skip-case: ' "$log" | cut -c12-110)")
           printf 'PASS  %-40s %4ss  (%d case(s) skipped)\n' "$name" "$took" "$n"
       else
           printf 'PASS  %-40s %4ss\n' "$name" "$took"
       fi ;;
    77) skipped=$((skipped + 1))
        printf 'SKIP  %-40s %s\n' "$name" "$why" ;;
    *) failed=$((failed + 1)); failed_names+=("$name")
       printf 'FAIL  %-40s %4ss (exit %d, log %s)\n' "$name" "$took" "$rc" "$log"
       tail -n 40 "$log" | sed 's/^/      | /' ;;
    esac
}

fail_now() { # name, reason: a failure found without running anything
    [[ $1 =~ $filter ]] || return 0
    failed=$((failed + 1)); failed_names+=("$1")
    printf 'FAIL  %-40s %s\n' "$1" "$2"
}

if [[ $what == all || $what == unit ]]; then
    units=0
    for src in tests/unit/test_*.c; do
        t=$B/tests/unit/$(basename "$src" .c)
        if [[ -x $t ]]; then
            units=$((units + 1))
            run_one "unit/$(basename "$t")" "$t"
        else
            fail_now "unit/$(basename "$t")" "not built ($t missing)"
        fi
    done
    ((units > 0)) || fail_now "unit/(all)" "no unit test binary in $B/tests/unit (not built?)"
fi
if [[ $what == all || $what == integration ]]; then
    for t in "${XFER_INTEGRATION_DIR:-tests/integration}"/test_*.sh; do
        [[ -f $t ]] || continue
        run_one "integration/$(basename "$t" .sh)" bash "$t"
    done
fi
if ((failed)); then printf 'failed: %s\n' "${failed_names[*]}"; fi
if ((cases_skipped)); then
    echo "$cases_skipped case(s) skipped inside passing tests:"
    printf '  %s\n' "${case_notes[@]}"
fi
echo "$passed passed, $failed failed, $skipped skipped"
((failed == 0))
