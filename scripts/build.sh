#!/usr/bin/env bash
# Installs dependencies (scripts/install-deps.sh) and builds into ./build.
#   BUILD_DIR=build  JOBS=$(nproc)  CMAKE_ARGS="-DFULLBURN_WITH_TORCH=OFF ..."
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${BUILD_DIR:-build}
# shellcheck disable=SC2086
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo ${CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j"${JOBS:-$(nproc)}"
