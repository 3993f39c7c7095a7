#!/usr/bin/env bash
# Installs the Debian (bookworm) packages fullburn needs. Idempotent: packages
# already present are skipped, and apt is not touched when nothing is missing.
#   install-deps.sh            what the build and the whole test suite need
#   install-deps.sh --demo     only what scripts/demo.sh builds and runs: the monitoring
#                              half, Debian's PyTorch for its example script and
#                              py-spy from PyPI (scripts/py-spy-venv.sh) for its stacks
#   install-deps.sh --demo-train  what scripts/demo.sh train builds: the monitoring half
#                              and the training half (libtorch)
#   install-deps.sh --bench    the test suite's, and the baselines of bench/
#   FULLBURN_NO_TORCH=1        skip libtorch (the monitoring half builds without it)
# Every way it can fail ends in one line naming what is missing and the
# command that fixes it.
set -euo pipefail

mode=${1:-tests}
case "$mode" in
  tests | --tests) mode=tests ;;
  --demo) mode=demo ;;
  --demo-train) mode=demo-train ;;
  --bench) mode=bench ;;
  *) echo "install-deps: unknown option '$1': use --demo, --demo-train, --bench or nothing" >&2; exit 2 ;;
esac

# What the main job needs: the build tools and the libraries of fullburn and
# fullburn-train.
packages=(
  build-essential cmake pkg-config git
  libsqlite3-dev sqlite3          # run store
  libcli11-dev                    # command line
  nlohmann-json3-dev libfmt-dev   # JSON, formatting
  libcpp-httplib-dev              # fullburn fleet (Prometheus's API)
  libmicrohttpd-dev               # fullburn serve
  libyaml-cpp-dev libgnutls28-dev nettle-dev  # fullburn serve --web-config (TLS, bcrypt)
  libtomlplusplus-dev             # fullburn train configs
  libjpeg62-turbo-dev libpng-dev  # input pipeline (JPEG, PNG)
  zlib1g-dev                      # checksums, gzip
  libsimdjson-dev                 # fullburn analyze: profiler traces
  libdeflate-dev                  # fullburn analyze: the CRC-32 of .json.gz traces
  libisal-dev                     # fullburn analyze: inflating .json.gz traces (igzip)
)
if [[ $mode == demo ]]; then
  packages+=(python3-torch)  # the demo's PyTorch script (examples/demo/train.py)
  packages+=(python3-venv)   # the demo's py-spy, from PyPI (scripts/py-spy-venv.sh)
elif [[ "${FULLBURN_NO_TORCH:-0}" != 1 ]]; then
  packages+=(libtorch-dev libgloo-dev)  # training half (CPU libtorch 1.13)
fi
if [[ $mode != demo && $mode != demo-train ]]; then
  packages+=(
    libgtest-dev libgmock-dev     # tests
    python3 python3-pil           # bench/ scripts, examples/scenarios, python/fullburn_pack.py
    chromium                      # tests: the HTML report in a real browser
    prometheus openssl            # tests: fullburn fleet against the real engine (TLS), promtool checks
    pybind11-dev python3-dev python3-numpy  # import fullburn (the module, built by the normal build)
    python3-venv                  # tests: pip install . into a fresh venv (tests/pip)
    clang libclang-rt-14-dev      # tests: the parsers' libFuzzer targets (scripts/fuzz.sh)
  )
  if [[ "${FULLBURN_NO_TORCH:-0}" != 1 ]]; then
    packages+=(python3-torch python3-torchvision)  # tests: unchanged PyTorch scripts, ImageFolder
  fi
fi
if [[ $mode == bench ]]; then
  packages+=(python3-torch python3-torchvision stress-ng)  # bench/ baselines, a loaded machine
  packages+=(python3-pandas)      # bench/analyze_vs_hta: HTA's definitions in pandas
  packages+=(prometheus-node-exporter)  # bench/serve_hostile: the exporter beside serve
fi

if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
  echo "install-deps: this is not a Debian system (no dpkg-query/apt-get): install the" \
       "equivalents of: ${packages[*]}; or use Debian bookworm" >&2
  exit 1
fi

# "install ok installed" only: a package left half-installed or unpacked by
# an interrupted apt is installed again.
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages present"
else
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then
    if ! command -v sudo >/dev/null; then
      echo "install-deps: ${#missing[@]} packages are missing and installing them needs root (no sudo here):" \
           "as root run: apt-get install ${missing[*]}" >&2
      exit 1
    fi
    if ! sudo -n true 2>/dev/null; then
      echo "install-deps: ${#missing[@]} packages are missing and sudo asks for a password:" \
           "run: sudo apt-get install ${missing[*]}   then run this script again" >&2
      exit 1
    fi
    sudo="sudo -n"
  fi
  echo "install-deps: installing ${#missing[@]} packages: ${missing[*]} (apt-get; a few minutes for libtorch)"
  export DEBIAN_FRONTEND=noninteractive
  log=$(mktemp)
  if ! $sudo apt-get update -qq >"$log" 2>&1; then
    echo "install-deps: apt-get update failed ($(grep -m1 -E '^(E|W):' "$log" || tail -n1 "$log")):" \
         "check the network or proxy to the Debian archive, then run: apt-get update && apt-get install ${missing[*]}" >&2
    rm -f "$log"
    exit 1
  fi
  if ! $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$log" 2>&1; then
    echo "install-deps: apt-get install failed ($(grep -m1 -E '^E:' "$log" || tail -n1 "$log")):" \
         "run: apt-get install ${missing[*]}   to see why (network, disk space, a held package)" >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
  echo "install-deps: done"
fi

# PyPI's PyTorch 2.x in a venv of its own, for the tests that run under both
# PyTorch versions (once per machine; without PyPI those tests are skipped).
if [[ $mode != demo && $mode != demo-train && -z ${FULLBURN_NO_TORCH:-} ]]; then
  "$(dirname "$0")/torch2-venv.sh" >/dev/null ||
    echo "install-deps: going on without PyTorch 2.x: the *.torch2 and python_torch2.* tests will be skipped"
fi
# py-spy from PyPI for the demo's stacks, so its finding names the script's
# line; the tests' py-spy comes with the PyTorch 2.x venv.
if [[ $mode == demo ]]; then
  "$(dirname "$0")/py-spy-venv.sh" >/dev/null ||
    echo "install-deps: going on without py-spy: the demo's finding will not name the script's line"
fi
# MLflow and TensorBoard from PyPI, for the tests that read back what
# fullburn sends them (docs/trackers.md); without PyPI they are skipped.
if [[ $mode != demo && $mode != demo-train ]]; then
  "$(dirname "$0")/trackers-venv.sh" >/dev/null ||
    echo "install-deps: going on without MLflow and TensorBoard: the trackers.* tests will be skipped"
fi

# Installed is not enough: a partly removed or broken toolchain fails later
# with pages of CMake output. The tools are checked by running them.
for tool in "cmake --version" "c++ --version" "make --version" "pkg-config --version"; do
  if ! $tool >/dev/null 2>&1; then
    pkg=${tool%% *}
    case $pkg in c++) pkg=g++ ;; esac
    echo "install-deps: '${tool%% *}' does not run although its package is installed: run" \
         "apt-get install --reinstall $pkg" >&2
    exit 1
  fi
done
