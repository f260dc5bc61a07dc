#!/usr/bin/env bash
# tests/run.sh itself (issue 18 item 10): an empty unit folder, a missing
# unit binary and a skip for something "not built" are failures; cases a
# passing test leaves out ("skip-case:" lines) are counted; a skip for a
# real reason stays a skip. Runs run.sh on a scratch build folder and a
# scratch folder of scripts.
set -u
cd "${XFER_ROOT:-.}"
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/b/tests/unit" "$tmp/it"
printf '#!/bin/bash\necho "skip-case: no frobnicator here; frob case not run"\necho "skip-case: second"\nexit 0\n' >"$tmp/it/test_a.sh"
printf '#!/bin/bash\necho "SKIP: helper xyz not built"\nexit 77\n' >"$tmp/it/test_b.sh"
printf '#!/bin/bash\necho "SKIP: no GPU"\nexit 77\n' >"$tmp/it/test_c.sh"

out=$(XFER_TESTS=. B=$tmp/b bash tests/run.sh unit 2>&1) && fail "an empty unit folder passed: $out"
grep -q 'FAIL  unit/test_batch .*not built' <<<"$out" || fail "missing unit binary not named: $out"
grep -q 'FAIL  unit/(all)' <<<"$out" || fail "empty unit folder not reported: $out"

out=$(XFER_TESTS=. B=$tmp/b XFER_INTEGRATION_DIR=$tmp/it bash tests/run.sh integration 2>&1) && fail "a 'not built' skip passed: $out"
grep -q 'FAIL  integration/test_b' <<<"$out" || fail "'not built' skip not a failure: $out"
grep -q 'SKIP  integration/test_c .*no GPU' <<<"$out" || fail "a real skip changed: $out"
grep -q 'PASS  integration/test_a .*(2 case(s) skipped)' <<<"$out" || fail "skipped cases not counted: $out"
grep -q '^2 case(s) skipped inside passing tests' <<<"$out" || fail "no skipped-case total: $out"
grep -q 'test_a: no frobnicator here' <<<"$out" || fail "skipped case reason not listed: $out"
tail -n 1 <<<"$out" | grep -qx '1 passed, 1 failed, 1 skipped' || fail "summary line: $(tail -n 1 <<<"$out")"
echo "ok: run.sh fails empty/missing builds and 'not built' skips, counts skipped cases"
