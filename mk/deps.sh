#!/usr/bin/env bash
# Installs the Debian packages xfer needs that are missing. Idempotent, and
# quick when everything is there (dpkg queries only, no apt-get).
#   mk/deps.sh          build and test packages (make deps, make test)
#   mk/deps.sh deploy   plus the deployment tests' packages: a container
#                       engine, a base-image builder, an ELF editor (make
#                       deps-deploy); kept apart so plain `make test` stays light
#   mk/deps.sh bench    plus the peers `make bench` measures beside xfer and its
#                       plotter: ucx_perftest (ucx-utils), gnuplot (make bench)
set -eu
pkgs=(build-essential pkg-config libhiredis-dev libevent-dev libprotobuf-c-dev
      protobuf-c-compiler libssl-dev libcmocka-dev libibverbs-dev librdmacm-dev
      redis-server redis-tools iperf3 iproute2 procps psmisc curl python3
      python3-venv python3-pip python3-setuptools python3-numpy python3-pytest binutils)
what=deps
if [[ ${1:-} == deploy ]]; then
    what=deps-deploy
    pkgs+=(podman podman-compose runc debootstrap patchelf uidmap netavark aardvark-dns iptables)
elif [[ ${1:-} == bench ]]; then
    what=bench
    pkgs+=(ucx-utils gnuplot-nox)
fi
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0
if [[ $(id -u) != 0 ]]; then
    echo "$what: missing packages: ${missing[*]} (run 'make $what' as root)" >&2
    exit 1
fi
echo "$what: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
