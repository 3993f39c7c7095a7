#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j"${JOBS:-$(nproc)}"
