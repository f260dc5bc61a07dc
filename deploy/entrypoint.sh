#!/bin/sh
# Container entrypoint of xferd: fills in container-friendly defaults, then
# runs xferd with the given arguments. Everything stays overridable through
# the environment (XFER_*), which is how deploy/compose.yaml configures nodes.
set -eu

# Listen on every interface of the container...
: "${XFER_LISTEN:=0.0.0.0}"
# ...and publish the address peers can reach: the container's own IP (podman
# and docker put it in /etc/hosts under the container's hostname).
if [ -z "${XFER_ADVERTISE:-}" ]; then
    for ip in $(hostname -i 2>/dev/null || true); do
        case $ip in
        127.* | ::1 | fe80:*) ;;
        *) XFER_ADVERTISE=$ip; break ;;
        esac
    done
fi
if [ -z "${XFER_ADVERTISE:-}" ]; then
    echo "xferd-entrypoint: cannot tell this container's IP; set XFER_ADVERTISE" >&2
    exit 2
fi
export XFER_LISTEN XFER_ADVERTISE
exec xferd "$@"
