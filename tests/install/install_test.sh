#!/usr/bin/env bash
# CTest: `cmake --install` into a fresh prefix, then use that prefix as a user
# would, away from the source tree: the installed fullburn puts its own
# share/fullburn/python on a job's PYTHONPATH; with the training half, a
# program of its own (examples/cpp_api) configures against the installed
# CMake package, builds, trains its own network on its own tensors (and on
# its own Dataset) into a run store, the installed fullburn reads that run
# back, and launches the program as 2 data-parallel ranks.
#   install_test.sh BUILD_DIR SOURCE_DIR WITH_TORCH(ON|OFF)
set -euo pipefail
build=$1 source=$2 with_torch=$3
work=$build/install-test
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
fail() { echo "install_test: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; fail "cmake --install failed"; }
for f in bin/fullburn include/fullburn/train.h include/fullburn/pipeline.h \
         share/fullburn/python/fullburn_markers.py share/fullburn/python/autosteps/sitecustomize.py \
         share/fullburn/python/fullburn_autosteps/__init__.py share/fullburn/python/fullburn_autosteps/torch_hooks.py \
         lib/cmake/fullburn/fullburnConfig.cmake lib/libfullburn_pipeline.a; do
  [[ -e $prefix/$f ]] || fail "$f was not installed"
done
# Only the public headers are installed; the internal ones (src/internal/) stay behind.
for h in "$source"/src/internal/fullburn/*.h; do
  [[ ! -e $prefix/include/fullburn/$(basename "$h") ]] || fail "internal header $(basename "$h") was installed"
done
public=$(ls "$source"/include/fullburn/*.h | wc -l)
installed=$(ls "$prefix"/include/fullburn/*.h | wc -l)
[[ $public == "$installed" ]] || fail "$installed headers installed, but include/fullburn/ has $public"
fb=$prefix/bin/fullburn
store=$work/runs.db

# The job's PYTHONPATH leads to the installed helpers, not the source tree's.
where=$("$fb" run -q --store "$store" -- python3 -c 'import fullburn_markers; print(fullburn_markers.__file__)')
[[ $where == "$prefix/share/fullburn/python/fullburn_markers.py" ]] || fail "the job imported fullburn_markers from '$where'"

if [[ $with_torch != ON ]]; then
  echo "install_test: passed (monitoring half; no libtorch, so no C++ API program)"
  exit 0
fi
[[ -x $prefix/bin/fullburn-train && -e $prefix/lib/libfullburn_train.a ]] || fail "the training half was not installed"

# A program of the user's own, built against the installed package only.
cmake -S "$source/examples/cpp_api" -B "$work/program" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "find_package(fullburn) failed"; }
cmake --build "$work/program" -j2 >"$work/build.log" 2>&1 || { tail -50 "$work/build.log"; fail "the program did not build against the installed fullburn"; }
FULLBURN_STORE=$store "$work/program/train_own_model" train.threads=1 train.epochs=3 \
  checkpoint.dir="$work/ckpt" 2>"$work/train.log" || { cat "$work/train.log"; fail "the program's training failed"; }
# Its summary's held-out line; 4 classes: chance is 25%.
accuracy=$(sed -n 's/.*held-out at step [0-9]*: loss [0-9.]*, accuracy \([0-9.]*\)%.*/\1/p' "$work/train.log")
python3 -c "import sys; sys.exit(not float('${accuracy:-0}') > 60)" ||
  { cat "$work/train.log"; fail "no held-out accuracy well above chance ('$accuracy')"; }

shown=$("$fb" runs show last --json --store "$store")
python3 - "$shown" <<'EOF' || fail "the program's run is not as trained: $shown"
import json, sys
run = json.loads(sys.argv[1])
assert run["name"] == "QuadrantNet on tensors", run["name"]
assert run["status"] == "finished", run["status"]
assert run["config"]["model"]["name"] == "custom", run["config"]["model"]
EOF
"$fb" diagnose last --store "$store" >"$work/diagnose.log" || fail "diagnose of the program's run failed"

# Its samples made by its own Dataset on fullburn's loader threads.
FULLBURN_STORE=$store "$work/program/train_own_model" --dataset train.threads=1 data.threads=1 \
  train.epochs=2 checkpoint.dir="$work/ckpt-dataset" 2>"$work/dataset.log" || { cat "$work/dataset.log"; fail "the program's Dataset training failed"; }
grep -q "held-out at step 128: loss [0-9.]*, accuracy" "$work/dataset.log" &&
  "$fb" runs show last --json --store "$store" | grep -q '"name": "QuadrantNet on dataset"' ||
  { cat "$work/dataset.log"; fail "the Dataset run is not in the store as trained"; }

# The same program as 2 data-parallel ranks, launched by the installed fullburn.
FULLBURN_STORE=$store "$fb" launch --nproc 2 -- "$work/program/train_own_model" -q train.threads=1 \
  train.epochs=1 checkpoint.dir="$work/ckpt-ranks" 2>"$work/launch.log" || { cat "$work/launch.log"; fail "2 ranks of the program failed"; }
"$fb" runs show last --store "$store" | grep -q "steps:   32 on 2 ranks" ||
  { "$fb" runs show last --store "$store"; fail "the 2 ranks' steps are not in the run"; }
echo "install_test: passed (installed, built a program against it, trained, read back)"
