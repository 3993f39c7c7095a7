#!/usr/bin/env bash
# Installs what the main job needs, builds only that, and runs it:
# `fullburn train` on its embedded default (a small ResNet on a synthetic
# JPEG image set it creates on first use), with the live progress line and
# the end-of-run summary. Nothing to download. Without libtorch
# (FULLBURN_NO_TORCH=1) it shows the monitoring half instead: `fullburn run`
# on the bundled example workload. Arguments go to `fullburn train`.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "demo: 1/3 packages, 2/3 build (fullburn and the training half only), 3/3 the main job"
scripts/build.sh --demo
build=${BUILD_DIR:-build}
if [[ -x "$build/src/fullburn-train" ]]; then
  echo "demo: 3/3 fullburn train: a small ResNet on synthetic JPEGs, on the GPU if libtorch sees one"
  "$build/src/fullburn" train "$@"
  echo
  echo "Next: $build/src/fullburn runs show last    $build/src/fullburn runs trace last > trace.json"
else
  echo "demo: 3/3 fullburn run on the example workload (built without libtorch)"
  "$build/src/fullburn" run --name demo -- \
    "$build/examples/fullburn-example-workload" train --seconds "${DEMO_SECONDS:-15}" --workers 1
  echo
  echo "Next: $build/src/fullburn runs show last    $build/src/fullburn watch    $build/src/fullburn serve"
fi
echo "      scripts/test.sh builds the rest (tests, benchmarks) and runs the test suite"
