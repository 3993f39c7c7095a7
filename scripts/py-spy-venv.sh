#!/usr/bin/env bash
# py-spy from PyPI (scripts/lib/py-spy-requirements.txt) in a venv of its own,
# for the demo: `fullburn run` samples the job's Python stacks with it, so a
# finding names the line of the script where the time goes (docs/stacks.md).
# Debian has no py-spy package. The test suite's py-spy comes with the
# PyTorch 2.x venv (scripts/torch2-venv.sh) instead.
#
#   scripts/py-spy-venv.sh          make or reuse the venv; print its python
#   FULLBURN_PY_SPY_VENV=DIR        where (default ~/.cache/fullburn/py-spy)
#
# An 8 MB program (33 MB with the venv); without PyPI it says so in one line and exits 1, and the demo
# goes on without stacks (fullburn says so in one line too).
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
exec "$src/scripts/lib/pip-venv.sh" py-spy-venv "$src/scripts/lib/py-spy-requirements.txt" \
  "${FULLBURN_PY_SPY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fullburn/py-spy}" \
  bin/py-spy "py-spy (an 8 MB program)"
