#!/usr/bin/env bash
# Installs the Debian (bookworm) packages fullburn needs. Idempotent: packages
# already present are skipped, and apt is not touched when nothing is missing.
#   FULLBURN_NO_TORCH=1  skip libtorch (the monitoring half builds without it)
#   --bench              also Debian's PyTorch and torchvision, the baselines of bench/
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libsqlite3-dev sqlite3          # run store
  libcli11-dev                    # command line
  nlohmann-json3-dev libfmt-dev   # JSON, formatting
  libcpp-httplib-dev              # fullburn serve
  libtomlplusplus-dev             # fullburn train configs
  libjpeg62-turbo-dev libpng-dev  # input pipeline (JPEG, PNG)
  libgtest-dev libgmock-dev       # tests
  python3 python3-pil             # bench/ scripts, examples/scenarios, python/fullburn_pack.py
  chromium                        # tests: the HTML report in a real browser
)
if [[ "${FULLBURN_NO_TORCH:-0}" != 1 ]]; then
  packages+=(libtorch-dev libgloo-dev)  # training half (CPU libtorch 1.13)
  packages+=(python3-torch)             # tests: fullburn run on unchanged PyTorch scripts
fi
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(python3-torch python3-torchvision)  # bench/ baselines
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root or install sudo" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
