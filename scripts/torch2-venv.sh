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
requirements="$src/tests/python/torch2-requirements.txt"
venv="${FULLBURN_TORCH2_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fullburn/torch-2.11.0}"
stamp="$venv/.fullburn-requirements"

if [[ -x $venv/bin/python && -f $stamp ]] && cmp -s "$stamp" "$requirements"; then
  echo "$venv/bin/python"
  exit 0
fi
if ! /usr/bin/python3 -m venv --help >/dev/null 2>&1; then
  echo "torch2-venv: /usr/bin/python3 cannot make a venv: apt-get install python3-venv" >&2
  exit 1
fi
echo "torch2-venv: installing PyTorch 2.x into $venv (once per machine: about 2.5 GB with its CUDA libraries)" >&2
rm -f "$stamp"
log=$(mktemp)
if ! { [[ -x $venv/bin/python ]] || /usr/bin/python3 -m venv "$venv"; } >"$log" 2>&1 ||
   ! "$venv/bin/pip" install --disable-pip-version-check -q -r "$requirements" >>"$log" 2>&1; then
  echo "torch2-venv: pip could not install $(grep -v '^#' "$requirements" | head -1) into $venv" \
       "($(grep -m1 -iE 'error|could not' "$log" || tail -n1 "$log")): check the network to PyPI" \
       "and the free disk, then run scripts/torch2-venv.sh again" >&2
  rm -f "$log"
  exit 1
fi
rm -f "$log"
if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "torch2-venv: $venv/bin/python cannot import torch after the install: remove $venv and run again" >&2
  exit 1
fi
cp "$requirements" "$stamp"
echo "$venv/bin/python"
