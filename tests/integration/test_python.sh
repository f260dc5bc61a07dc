#!/usr/bin/env bash
# The Python package: installed offline into a venv (make python), then its
# pytest suite against this build's libxfer.so (two processes through a real
# redis-server, asyncio, errors, leaks, ABI check against the headers).
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
venv=$PWD/$B/venv
bash mk/python.sh "$venv" || { echo "FAIL: install into $venv"; exit 1; }
export XFER_LIB=$PWD/$B/lib/libxfer.so XFER_ROOT=$PWD
if [[ $B == *san* ]]; then
    # An ASan-built library needs the ASan runtime loaded first.
    LD_PRELOAD=$(cc -print-file-name=libasan.so) || exit 1
    export LD_PRELOAD ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0 XFER_SAN=1
fi
# The tests must import the installed copy, not python/xfer of the tree.
where=$(cd /tmp && "$venv/bin/python" -c 'import xfer; print(xfer.__file__)') || exit 1
[[ $where == "$venv/"* ]] || { echo "FAIL: xfer imported from $where, not the venv"; exit 1; }
cd python/tests
"$venv/bin/python" -m pytest -q -p no:cacheprovider -o console_output_style=classic .
rc=$?
((rc == 5)) && { echo "FAIL: pytest found no tests"; exit 1; }
exit $rc
