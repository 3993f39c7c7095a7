#!/usr/bin/env bash
# Installs dependencies, builds, and runs the main job: `fullburn run` on the
# bundled example workload (a data-loader process feeding a compute loop),
# with the live view and the end-of-run summary. Nothing to download.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
build=${BUILD_DIR:-build}
"$build/src/fullburn" run --name demo -- \
  "$build/examples/fullburn-example-workload" train --seconds "${DEMO_SECONDS:-15}" --workers 1
echo
echo "Next: $build/src/fullburn runs show last    $build/src/fullburn watch    $build/src/fullburn serve"
