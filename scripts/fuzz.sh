#!/usr/bin/env bash
# The parsers' libFuzzer targets (fuzz/, docs/testing.md "Fuzzing").
#
#   scripts/fuzz.sh [--short SECONDS | --long MINUTES] [BUILD_DIR] [TARGET...]
#
# Configures and builds the clang build (AddressSanitizer, UBSan, libFuzzer's
# coverage) in BUILD_DIR (default build-fuzz/), then:
#   --short S  replays each target's fuzz/regressions/<target>/ inputs, then
#              fuzzes it S seconds from fuzz/corpus/<target>/; one line per
#              target; exit 1 if any input crashed, hung or ran away.
#   --seeds    rewrites fuzz/corpus/ from the test fixtures
#              (fuzz/make_corpus.py, fuzz/make_image_seeds.cpp) and stops.
#   Where fuzz/dicts/<target>.dict exists it is the fuzzer's dictionary.
#   --long M   fuzzes each target M minutes from a copy of its corpus (kept in
#              BUILD_DIR/fuzz-long/<target>/), to see where coverage levels
#              off; prints the final cov:/ft: and the CPU time used.
# Without clang or libFuzzer's runtime (Debian: clang, libclang-rt-14-dev)
# it says so and exits 77 (CTest's skip).
set -uo pipefail

mode=short amount=5 build="" targets=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --short) mode=short amount="$2"; shift 2 ;;
    --long) mode=long amount="$2"; shift 2 ;;
    --seeds) mode=seeds; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) if [[ -z "$build" && ( "$1" == */* || ! -f "$(dirname "$0")/../fuzz/$1_fuzz.cpp" ) ]]; then
         build="$1"
       else
         targets+=("$1")
       fi
       shift ;;
  esac
done
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${build:-$src/build-fuzz}"
[[ ${#targets[@]} -gt 0 ]] || targets=(trace prom_json prom_duration tensorfile pack tokens config events stacks proc jpeg png)

if ! command -v clang++ >/dev/null || ! command -v clang >/dev/null; then
  echo "fuzz: skipped: no clang/clang++ (apt-get install clang libclang-rt-14-dev)"; exit 77
fi
runtime="$(clang++ -print-resource-dir)/lib/linux/libclang_rt.fuzzer-$(uname -m).a"
if [[ ! -f "$runtime" ]]; then
  echo "fuzz: skipped: no libFuzzer runtime ($runtime; apt-get install libclang-rt-14-dev)"; exit 77
fi

if [[ ! -f "$build/CMakeCache.txt" ]]; then
  mkdir -p "$build"
  # -O1 and line tables only, as libFuzzer's docs build: a third less compile
  # time than -O2 -g (CI builds this beside the suite), stack traces keep lines.
  opt="-O1 -gline-tables-only -DNDEBUG"
  CC=clang CXX=clang++ cmake -S "$src" -B "$build" -DFULLBURN_FUZZ=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS_RELWITHDEBINFO="$opt" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$opt" >"$build/fuzz-configure.log" 2>&1 ||
    { cat "$build/fuzz-configure.log"; echo "fuzz: configure failed"; exit 1; }
fi
# One compile at a time by default: CI runs this beside the rest of the suite.
extra=() && [[ $mode == seeds ]] && extra=(make_image_seeds)
cmake --build "$build" -j"${FUZZ_JOBS:-1}" --target fullburn_fuzz_all "${extra[@]}" >"$build/fuzz-build.log" 2>&1 ||
  { tail -40 "$build/fuzz-build.log"; echo "fuzz: build failed ($build/fuzz-build.log)"; exit 1; }

if [[ $mode == seeds ]]; then
  python3 "$src/fuzz/make_corpus.py" || exit 1
  rm -rf "$src/fuzz/corpus/jpeg" "$src/fuzz/corpus/png"
  mkdir -p "$src/fuzz/corpus/jpeg" "$src/fuzz/corpus/png"
  "$build/fuzz/make_image_seeds" "$src/fuzz/corpus"; exit
fi

# A runaway allocation is one malloc over 1 GB or 2 GB resident; a hang is
# one input over the timeout (generous: ASan, and CI's busy cores).
opts=(-rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout="${FUZZ_TIMEOUT:-25}" -print_final_stats=1)
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

failed=0
for t in "${targets[@]}"; do
  bin="$build/fuzz/${t}_fuzz"
  if [[ ! -x "$bin" ]]; then
    echo "$t: not built (analyze needs libsimdjson-dev)"; continue
  fi
  work="$build/fuzz-$mode/$t"
  rm -rf "$work/new" "$work/artifacts" "$work/tmp" && mkdir -p "$work/new" "$work/artifacts"
  log="$work/log"
  # The path-taking parsers' scratch files (fuzz/fuzz_files.h) stay in here.
  mkdir -p "$work/tmp" && export TMPDIR="$work/tmp"
  regressions=("$src/fuzz/regressions/$t"/*)
  if [[ -e "${regressions[0]}" ]]; then
    if ! "$bin" "${opts[@]}" -artifact_prefix="$work/artifacts/" "${regressions[@]}" >"$log" 2>&1; then
      echo "$t: FAILED on a regression input ($log)"; failed=1; continue
    fi
  fi
  if [[ $mode == short ]]; then
    corpus=("$work/new" "$src/fuzz/corpus/$t")
    seconds=$amount
  else
    # The long run keeps what it finds: the next run starts from there.
    mkdir -p "$work/corpus" && cp -n "$src/fuzz/corpus/$t"/* "$work/corpus/" 2>/dev/null
    corpus=("$work/corpus")
    seconds=$((amount * 60))
  fi
  # A dictionary of the tokens the parser looks for (fuzz/dicts/) gets the
  # fuzzer past the keys it would otherwise have to guess byte by byte.
  dict=() && [[ -f "$src/fuzz/dicts/$t.dict" ]] && dict=(-dict="$src/fuzz/dicts/$t.dict")
  TIMEFORMAT='%U %S'
  { time "$bin" "${opts[@]}" "${dict[@]}" -max_total_time="$seconds" -artifact_prefix="$work/artifacts/" \
      "${corpus[@]}" >"$log" 2>&1; } 2>"$work/cpu"
  rc=$?
  read -r user sys <"$work/cpu"
  cpu=$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.1f", (u + s) / 60 }')
  last=$(grep -E 'cov: [0-9]+' "$log" | tail -1 | grep -oE '(#[0-9]+|cov: [0-9]+|ft: [0-9]+)' | tr '\n' ' ')
  if [[ $rc -ne 0 ]]; then
    crash=$(ls "$work/artifacts" 2>/dev/null | head -1)
    echo "$t: FAILED (exit $rc): $(grep -m1 -E 'ERROR:|runtime error|==ERROR|timeout' "$log") input: $work/artifacts/$crash log: $log"
    failed=1
  else
    # Where the edge count last grew, to tell a plateau from a run cut short.
    grew=$(awk '/cov: [0-9]+/ { for (i = 1; i <= NF; i++) if ($i == "cov:") c = $(i + 1);
                                if (c != prev) { at = $1; prev = c } } END { print at }' "$log")
    echo "$t: ok, $seconds s, $cpu CPU-min, ${last}(cov last grew at ${grew})"
  fi
done
exit $failed
