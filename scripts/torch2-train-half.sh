#!/usr/bin/env bash
# fullburn's training half (fullburn-train) built against the libtorch inside
# PyPI's PyTorch 2.x wheel (scripts/torch2-venv.sh's venv), beside the main
# build's, which links Debian's 1.13. Debian's is built with the reference
# BLAS; the wheel's has MKL, as the libtorch people train with does, so a
# benchmark of the training half against PyPI's PyTorch compares like with
# like (bench/train_vs_torch --train-half).
#
#   scripts/torch2-train-half.sh      configure (once) and build; print the binary
#   BUILD=DIR                          where (default build-torch2)
#
# The wheel is a CUDA build: its CMake files want the CUDA toolkit
# (/usr/local/cuda); no GPU is needed to build or to train on the CPU.
# PyTorch 2.x ships fmt's headers (v12) ahead of Debian's fmt 9, hence
# header-only fmt (as scripts/device-build.sh).
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD:-$src/build-torch2}"
python=$("$src/scripts/torch2-venv.sh")
torch_cmake=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
if [[ ! -f $build/CMakeCache.txt ]]; then
  [[ -x /usr/local/cuda/bin/nvcc ]] || {
    echo "torch2-train-half: the wheel's libtorch is a CUDA build and wants the CUDA toolkit in /usr/local/cuda" >&2
    exit 1
  }
  echo "torch2-train-half: configuring $build against $torch_cmake" >&2
  mkdir -p "$build"
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DFULLBURN_WITH_TORCH=ON \
    -DCMAKE_PREFIX_PATH="$torch_cmake" -DCMAKE_CXX_FLAGS="-DFMT_HEADER_ONLY" \
    -DCUDAToolkit_ROOT=/usr/local/cuda -DCUDA_TOOLKIT_ROOT_DIR=/usr/local/cuda \
    -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DTORCH_CUDA_ARCH_LIST=9.0 \
    >"$build/fullburn-configure.log" 2>&1 ||
    { tail -20 "$build/fullburn-configure.log"; echo "torch2-train-half: configure failed ($build/fullburn-configure.log)" >&2; exit 1; }
fi
echo "torch2-train-half: building fullburn-train in $build (about 15 min on 2 cores the first time)" >&2
cmake --build "$build" -j "$(nproc)" --target fullburn-train >"$build/fullburn-build.log" 2>&1 ||
  { tail -30 "$build/fullburn-build.log"; echo "torch2-train-half: build failed ($build/fullburn-build.log)" >&2; exit 1; }
"$build/src/fullburn-train" --version >&2
echo "$build/src/fullburn-train"
