#!/usr/bin/env bash
# Installs dependencies (scripts/install-deps.sh) and builds into ./build,
# saying what it does: the packages it installs, then the build's progress.
#   build.sh              everything: fullburn, the training half, tests, benchmarks
#   build.sh --demo       only the monitoring half's fullburn: what scripts/demo.sh runs
#   build.sh --demo-train the main job's programs (fullburn, fullburn-net, fullburn-train):
#                         what scripts/demo.sh train runs
#   BUILD_DIR=build  JOBS=$(nproc)  CMAKE_ARGS="-DFULLBURN_WITH_TORCH=OFF ..."
# A failure ends in one line naming it and the command that fixes it; the
# whole build log is kept in $BUILD_DIR/build.log.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=all
[[ "${1:-}" == "--demo" ]] && mode=demo
[[ "${1:-}" == "--demo-train" ]] && mode=demo-train
case $mode in
  demo) scripts/install-deps.sh --demo ;;
  demo-train) scripts/install-deps.sh --demo-train ;;
  *) scripts/install-deps.sh ;;
esac

build=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}

# A build folder made for another checkout, by another compiler or with
# another generator makes CMake fail with a page of text: say it in one line.
cache="$build/CMakeCache.txt"
if [[ -f $cache ]]; then
  cached() { sed -n "s/^$1:[A-Z]*=//p" "$cache" | head -n1; }
  home=$(cached CMAKE_HOME_DIRECTORY)
  if [[ -n $home && $home != "$PWD" ]]; then
    echo "build: $build/ was configured for another source tree ($home): remove it (rm -rf $build) or set BUILD_DIR" >&2
    exit 1
  fi
  cxx=$(cached CMAKE_CXX_COMPILER)
  if [[ -n $cxx && ! -x $cxx ]]; then
    echo "build: $build/ was configured with the compiler $cxx, which is not here: remove it (rm -rf $build) or set BUILD_DIR" >&2
    exit 1
  fi
  if [[ -n ${CXX:-} && -n $cxx && $(command -v "$CXX" || echo "$CXX") != "$cxx" ]]; then
    echo "build: $build/ was configured with $cxx, not CXX=$CXX: remove it (rm -rf $build) or set BUILD_DIR to another folder" >&2
    exit 1
  fi
  generator=$(cached CMAKE_GENERATOR)
  if [[ -n $generator && -n ${CMAKE_GENERATOR:-} && $generator != "$CMAKE_GENERATOR" ]]; then
    echo "build: $build/ was made by the '$generator' generator, not '$CMAKE_GENERATOR': remove it (rm -rf $build) or set BUILD_DIR" >&2
    exit 1
  fi
fi

configure_args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo)
if [[ $mode == all ]]; then
  configure_args+=(-DFULLBURN_BUILD_TESTS=ON)
elif ! dpkg-query -W -f='${Status}' libgtest-dev 2>/dev/null | grep -q "install ok installed"; then
  configure_args+=(-DFULLBURN_BUILD_TESTS=OFF)  # the demo installs no test packages
fi
mkdir -p "$build"
log="$build/build.log"
echo "build: configuring with CMake in $build/"
# shellcheck disable=SC2086
if ! cmake -S . -B "$build" "${configure_args[@]}" ${CMAKE_ARGS:-} >"$log" 2>&1; then
  echo "build: CMake could not configure: $(grep -m1 -A2 'CMake Error' "$log" | tr -s ' \n' ' ')" \
       "-- see $log; scripts/install-deps.sh installs what is missing" >&2
  exit 1
fi

targets=()
if [[ $mode == demo ]]; then
  targets=(fullburn)  # the monitoring half: what `fullburn run` over a Python job needs
  what="fullburn (the monitoring half)"
elif [[ $mode == demo-train ]]; then
  targets=(fullburn_main_job)  # fullburn, fullburn-net and fullburn-train (without libtorch: the example workload)
  what="fullburn and the training half"
  grep -q 'training half (libtorch) ON' "$log" || what="fullburn and the example workload"
else
  what="everything (fullburn, the training half, tests, benchmarks)"
fi
echo "build: compiling $what with $jobs jobs (log: $log)"

# make's "[ 42%] Building CXX object ..." lines become one progress line on
# a terminal (a line per tenth elsewhere); the log keeps all of it.
progress() {
  local last_tenth=-1 pct file
  while IFS= read -r line; do
    printf '%s\n' "$line" >>"$log"
    if [[ $line =~ ^\[\ *([0-9]+)%\]\ (Building|Linking) ]]; then
      pct=${BASH_REMATCH[1]}
      file=${line##* }
      file=${file#CMakeFiles/}
      if [[ -t 1 ]]; then
        printf '\rbuild: %3d%%  %-70.70s' "$pct" "$file"
      elif ((pct / 10 != last_tenth)); then
        last_tenth=$((pct / 10))
        echo "build: $pct%"
      fi
    elif [[ $line =~ ^\[\ *[0-9]+%\]\ Built\ target\ (.*) && -t 1 ]]; then
      printf '\rbuild: built %-70.70s' "${BASH_REMATCH[1]}"
    fi
  done
  [[ -t 1 ]] && printf '\n'
  return 0
}

start=$SECONDS
args=(--build "$build" -j"$jobs")
[[ ${#targets[@]} -gt 0 ]] && args+=(--target "${targets[@]}")
if ! cmake "${args[@]}" 2>&1 | progress; then
  first=$(grep -m1 -E 'error:|Error [0-9]|undefined reference' "$log" || tail -n1 "$log")
  echo "build: the build failed: $first -- see $log" >&2
  exit 1
fi
echo "build: done in $(((SECONDS - start) / 60))m$(((SECONDS - start) % 60))s"
