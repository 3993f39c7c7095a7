#!/usr/bin/env bash
# MLflow (its server and client) and TensorBoard from PyPI
# (tests/python/trackers-requirements.txt) in a venv of their own, for the
# tests that read what fullburn sends to trackers back with the trackers' own
# code (docs/trackers.md).
#
#   scripts/trackers-venv.sh        make or reuse the venv; print its python
#   FULLBURN_TRACKERS_VENV=DIR      where (default ~/.cache/fullburn/trackers)
#
# Made once per machine (about 400 MB); without PyPI it says so in one line
# and exits 1, and the tracker tests are skipped with that reason.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
exec "$src/scripts/lib/pip-venv.sh" trackers-venv "$src/tests/python/trackers-requirements.txt" \
  "${FULLBURN_TRACKERS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fullburn/trackers}" \
  "mlflow, tensorboard" "MLflow and TensorBoard"
