#!/usr/bin/env bash
# PyPI's PyTorch 2.x (tests/python/torch2-requirements.txt) in a venv of its
# own, beside Debian's python3-torch 1.13, so the tests that drive Python run
# under both (docs/testing.md, "Two PyTorch versions").
#
#   scripts/torch2-venv.sh          make or reuse the venv; print its python
#   FULLBURN_TORCH2_VENV=DIR        where (default ~/.cache/fullburn/torch-2.11.0)
#
# Made once per machine: torch's wheel brings its CUDA libraries (about
# 2.5 GB installed), so a venv whose requirements are unchanged is reused.
# It is built on Debian's /usr/bin/python3, the interpreter fullburn's Python
# module is compiled for. Without PyPI it says so in one line and exits 1;
# the torch 2.x tests are then skipped with that reason.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
exec "$src/scripts/lib/pip-venv.sh" torch2-venv "$src/tests/python/torch2-requirements.txt" \
  "${FULLBURN_TORCH2_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fullburn/torch-2.11.0}" \
  torch "PyTorch 2.x (about 2.5 GB with its CUDA libraries)"
