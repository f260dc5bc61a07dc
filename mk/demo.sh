#!/usr/bin/env bash
# `make demo`: a local redis-server and two xferd moving a file by name
# (mk/demo_service.sh), then the engine alone moving data both ways with
# READ and WRITE at several sizes, with times and GB/s (mk/demo_engine.sh).
set -eu
cd "$(dirname "$0")/.."
bash mk/demo_service.sh
printf '\n\033[1m== the engine alone: READ and WRITE over tcp, sizes, times, GB/s\033[0m\n'
bash mk/demo_engine.sh
