#!/usr/bin/env bash
# Makes or reuses a venv on Debian's /usr/bin/python3 holding a requirements
# file from PyPI, and prints its python. Shared by scripts/torch2-venv.sh and
# scripts/trackers-venv.sh:
#   pip-venv.sh TAG REQUIREMENTS VENV CHECK WHAT
# TAG names the caller in messages; CHECK is what must import after the
# install ("mlflow, tensorboard"), or bin/PROGRAM, a program of the venv that
# must run with --version (a wheel that brings only a binary, py-spy); a venv whose requirements are unchanged
# (a copy kept beside it) is reused. Without PyPI it says so in one line and
# exits 1; the tests that need the venv are then skipped with that reason.
set -euo pipefail
tag=$1 requirements=$2 venv=$3 check=$4 what=$5
stamp="$venv/.fullburn-requirements"

if [[ -x $venv/bin/python && -f $stamp ]] && cmp -s "$stamp" "$requirements"; then
  echo "$venv/bin/python"
  exit 0
fi
if ! /usr/bin/python3 -m venv --help >/dev/null 2>&1; then
  echo "$tag: /usr/bin/python3 cannot make a venv: apt-get install python3-venv" >&2
  exit 1
fi
echo "$tag: installing $what into $venv (once per machine)" >&2
rm -f "$stamp"
log=$(mktemp)
if ! { [[ -x $venv/bin/python ]] || /usr/bin/python3 -m venv "$venv"; } >"$log" 2>&1 ||
   ! "$venv/bin/pip" install --disable-pip-version-check -q -r "$requirements" >>"$log" 2>&1; then
  echo "$tag: pip could not install $(grep -v '^#' "$requirements" | head -1) into $venv" \
       "($(grep -m1 -iE 'error|could not' "$log" || tail -n1 "$log")): check the network to PyPI" \
       "and the free disk, then run scripts/$tag.sh again" >&2
  rm -f "$log"
  exit 1
fi
rm -f "$log"
if [[ $check == bin/* ]]; then
  if ! "$venv/$check" --version >/dev/null 2>&1; then
    echo "$tag: $venv/$check does not run after the install: remove $venv and run again" >&2
    exit 1
  fi
elif ! "$venv/bin/python" -c "import $check" >/dev/null 2>&1; then
  echo "$tag: $venv/bin/python cannot import $check after the install: remove $venv and run again" >&2
  exit 1
fi
cp "$requirements" "$stamp"
echo "$venv/bin/python"
