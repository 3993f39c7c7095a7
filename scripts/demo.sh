#!/usr/bin/env bash
# Installs dependencies, builds, and runs the main job: `fullburn train` on its
# embedded default (a small ResNet on a synthetic JPEG image set it creates on
# first use), with the live progress line and the end-of-run summary. Nothing
# to download. Without libtorch (FULLBURN_NO_TORCH=1) it shows the monitoring
# half instead: `fullburn run` on the bundled example workload.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
build=${BUILD_DIR:-build}
if [[ -x "$build/src/fullburn-train" ]]; then
  "$build/src/fullburn" train "$@"
  echo
  echo "Next: $build/src/fullburn runs show last    $build/src/fullburn runs trace last > trace.json"
else
  "$build/src/fullburn" run --name demo -- \
    "$build/examples/fullburn-example-workload" train --seconds "${DEMO_SECONDS:-15}" --workers 1
  echo
  echo "Next: $build/src/fullburn runs show last    $build/src/fullburn watch    $build/src/fullburn serve"
fi
