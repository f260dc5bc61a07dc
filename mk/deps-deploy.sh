#!/usr/bin/env bash
# Extra Debian packages for the deployment tests only (make test-deploy,
# make bundle and its test): a container engine, a base-image builder and
# an ELF editor. Kept apart from mk/deps.sh so plain `make test` stays light.
# Idempotent and quick when everything is there (one dpkg query per package).
set -eu
pkgs=(podman podman-compose runc debootstrap patchelf uidmap
      netavark aardvark-dns redis-tools curl)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0
if [[ $(id -u) != 0 ]]; then
    echo "deps-deploy: missing packages: ${missing[*]} (run 'make deps-deploy' as root)" >&2
    exit 1
fi
echo "deps-deploy: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
