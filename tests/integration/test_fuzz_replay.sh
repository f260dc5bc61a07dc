#!/usr/bin/env bash
# A short fixed-seed run of every fuzz target (issue 14): each
# tests/fuzz/fuzz_NAME.c is built without libFuzzer as $B/tests/replay_NAME
# (tests/fuzz/replay.c) and run over its committed seeds
# (tests/fuzz/corpus/NAME/) and 500 deterministic mutations of each. Under
# `make test SAN=1` the replays run with ASan/UBSan. A target without its
# binary or its seeds fails the test.
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
fail() { echo "FAIL: $*" >&2; exit 1; }
n=0
for src in tests/fuzz/fuzz_*.c; do
    name=$(basename "$src" .c); name=${name#fuzz_}
    bin=$B/tests/replay_$name corpus=tests/fuzz/corpus/$name
    [[ -x $bin ]] || fail "$bin not built"
    [[ -d $corpus && -n $(ls -A "$corpus") ]] || fail "no seeds in $corpus"
    out=$("$bin" -n 500 "$corpus" 2>&1) || fail "replay of $name: $(tail -n 30 <<<"$out")"
    echo "$name: $out"
    n=$((n + 1))
done
((n >= 4)) || fail "only $n fuzz targets found (wire, ctl, ipc, registry_rows expected)"
echo "fuzz replay: $n targets passed"
