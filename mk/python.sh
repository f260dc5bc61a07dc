#!/usr/bin/env bash
# Installs the Python package (python/) into a virtual environment, offline:
# the venv sees Debian's site packages (numpy, pytest, setuptools) and pip
# builds the pure-Python package with them (no build isolation, no index).
#   mk/python.sh VENV      (make python: VENV = $(B)/venv)
set -eu
venv=$1
py=${PYTHON:-/usr/bin/python3}
if [[ ! -x $venv/bin/python ]]; then
    "$py" -m venv --system-site-packages "$venv"
fi
"$venv/bin/python" -m pip install --quiet --no-build-isolation --no-index --no-deps \
    --disable-pip-version-check --force-reinstall ./python
# Leave the build's scratch out of the source tree.
rm -rf python/build python/*.egg-info
echo "python: xfer installed in $venv (activate: . $venv/bin/activate; library: XFER_LIB or make install)"
