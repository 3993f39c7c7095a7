#!/usr/bin/env bash
# Installs dependencies, builds everything, and runs the whole test suite with
# CTest (JOBS at a time, default: the number of cores). The suite's last test
# fails if any test left a process running.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
cd "${BUILD_DIR:-build}"
jobs=${JOBS:-$(nproc)}
echo "test: running $(ctest -N | sed -n 's/^Total Tests: //p') tests with ctest -j$jobs"
ctest --output-on-failure -j"$jobs"
