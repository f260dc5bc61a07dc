#!/usr/bin/env bash
# Installs the Debian packages xfer needs that are missing. Idempotent, and
# quick when everything is there (one dpkg query, no apt-get).
set -eu
pkgs=(build-essential pkg-config libhiredis-dev libevent-dev libprotobuf-c-dev
      protobuf-c-compiler libssl-dev libcmocka-dev libibverbs-dev librdmacm-dev
      redis-server redis-tools iperf3 iproute2 procps psmisc curl python3)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0
if [[ $(id -u) != 0 ]]; then
    echo "deps: missing packages: ${missing[*]} (run 'make deps' as root)" >&2
    exit 1
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
