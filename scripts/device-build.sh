#!/usr/bin/env bash
# Builds fullburn against the libtorch of this machine's Python PyTorch
# (a CUDA one on the GPU machine) and the packages scripts/device-kit.sh put
# in .kit/, for a machine without Debian's packages. Prints where the
# binaries are. DEVELOPERS.md, "On a GPU machine", says what to run next.
#   PYTHON       the Python whose torch to build against (python3)
#   TORCH_CMAKE  or that libtorch's CMake folder, given
#   BUILD        the build folder (build-gpu)
#   KEEP_GOING   1: build every target it can past a failing one, to see all errors in one call
#   TARGETS      only these targets (space-separated), to save a lent machine's minutes
#   KERNELS=1    also fullburn's own CUDA kernels (-DFULLBURN_CUDA_KERNELS=ON: model.loss_kernel);
#                the build folder keeps the setting until KERNELS=0
# Debian builds cpp-httplib as a library with OpenSSL, zlib and Brotli
# (its pkg-config Cflags): the same definitions here, or its classes differ.
set -euo pipefail
cd "$(dirname "$0")/.."
kit="$PWD/.kit"
[[ -d $kit/root ]] || { echo "device-build: no .kit: run scripts/device-kit.sh on Debian, then carry .kit" >&2; exit 2; }
python=${PYTHON:-python3}
build=${BUILD:-build-gpu}
torch_cmake=${TORCH_CMAKE:-$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')}
torch_include=$(dirname "$(dirname "$(dirname "$torch_cmake")")")/include
lib="$kit/root/usr/lib/x86_64-linux-gnu"
# PyTorch 2.x ships fmt's headers (v12) in its include folder, which comes
# before the kit's (fmt 9): header-only fmt, so each file links the fmt
# whose headers it saw.
flags="-DFMT_HEADER_ONLY"
# Multiarch headers (jconfig.h: the JPEG library version) from the kit, not
# the machine's own (an Ubuntu libjpeg8 there: "library is 62, caller expects 80").
flags+=" -isystem $kit/root/usr/include/x86_64-linux-gnu"
# c10d's Gloo headers include gloo's: libtorch's own where it ships them.
[[ -f $torch_include/gloo/config.h || -f /usr/include/gloo/config.h ]] || flags+=" -isystem $kit/gloo"
# The Python module (fullburn_python) against this Python and the pybind11
# of its pip packages, where it has one (the GPU machine's does).
python_module=()
if pybind=$("$python" -m pybind11 --cmakedir 2>/dev/null); then
  python_module=(-Dpybind11_DIR="$pybind" -DPython_EXECUTABLE="$(command -v "$python")")
fi
# GnuTLS and Nettle (serve --web-config) are the machine's own, as
# libmicrohttpd's GnuTLS is; only their headers come from the kit.
machine_lib() { ldconfig -p | awk -v n="$1" '$1 == n { print $NF; exit }'; }
gnutls_lib=$(machine_lib libgnutls.so.30)
nettle_lib=$(machine_lib libnettle.so.8)
[[ -n $gnutls_lib && -n $nettle_lib ]] || {
  echo "device-build: this machine lacks libgnutls.so.30 or libnettle.so.8 (ldconfig -p): install GnuTLS (Nettle comes with it)" >&2
  exit 2
}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cuda=()
if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  cuda=(-DCUDAToolkit_ROOT=/usr/local/cuda -DCUDA_TOOLKIT_ROOT_DIR=/usr/local/cuda
        -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc
        -DTORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}")
fi
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DFULLBURN_WITH_TORCH=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON \
  -DCMAKE_PREFIX_PATH="$kit/root/usr;$torch_cmake" -DCMAKE_CXX_FLAGS="$flags" \
  -DSQLite3_INCLUDE_DIR="$kit/root/usr/include" -DSQLite3_LIBRARY="$lib/libsqlite3.so" \
  -DJPEG_INCLUDE_DIR="$kit/root/usr/include" -DJPEG_LIBRARY="$lib/libjpeg.so" \
  -DPNG_PNG_INCLUDE_DIR="$kit/root/usr/include" -DPNG_LIBRARY="$lib/libpng16.so" \
  -DZLIB_INCLUDE_DIR="$kit/root/usr/include" -DZLIB_LIBRARY="$lib/libz.so" \
  -Dfmt_DIR="$lib/cmake/fmt" -DGTest_DIR="$lib/cmake/GTest" \
  -DCLI11_DIR="$kit/root/usr/share/cmake/CLI11" \
  -Dnlohmann_json_DIR="$kit/root/usr/share/cmake/nlohmann_json" \
  -DHTTPLIB_INCLUDE_DIR="$kit/root/usr/include" -DTOMLPP_INCLUDE_DIR="$kit/root/usr/include" \
  -DHTTPLIB_LIBRARY="$lib/libcpp-httplib.so" \
  -DMHD_INCLUDE_DIR="$kit/root/usr/include" -DMHD_LIBRARY="$lib/libmicrohttpd.so" \
  -DYAMLCPP_INCLUDE_DIR="$kit/root/usr/include" -DYAMLCPP_LIBRARY="$lib/libyaml-cpp.so" \
  -DGNUTLS_INCLUDE_DIR="$kit/root/usr/include" -DGNUTLS_LIBRARY="$gnutls_lib" \
  -DNETTLE_INCLUDE_DIR="$kit/root/usr/include" -DNETTLE_LIBRARY="$nettle_lib" \
  -DHTTPLIB_DEFINITIONS="CPPHTTPLIB_OPENSSL_SUPPORT;CPPHTTPLIB_ZLIB_SUPPORT;CPPHTTPLIB_BROTLI_SUPPORT" \
  "${cuda[@]}" "${python_module[@]}" ${KERNELS:+-DFULLBURN_CUDA_KERNELS=$([[ $KERNELS == 1 ]] && echo ON || echo OFF)}
keep=()
if [[ ${KEEP_GOING:-0} == 1 ]]; then keep=(-- -k); [[ ${#generator[@]} -gt 0 ]] && keep+=(0); fi
targets=()
for t in ${TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j "$(nproc)" "${targets[@]}" "${keep[@]}"
echo "device-build: $build/src/fullburn and $build/src/fullburn-train, against $torch_cmake"
echo "device-build: run them with LD_LIBRARY_PATH=$lib (cpp-httplib's OpenSSL and Brotli)"
