#!/usr/bin/env bash
# The product in five minutes: installs what the monitoring half needs,
# builds only `fullburn`, and runs it over an unchanged PyTorch script
# (examples/demo/train.py) whose DataLoader is starved on purpose: the live
# line, the finding (cause, evidence, fix), the same script with that fix,
# `fullburn compare` of the two with the measured gain, and the HTML report.
# Debian's python3-torch runs the script, or the PyTorch 2.x venv of
# scripts/torch2-venv.sh where there is one. Nothing to download but packages.
#
#   scripts/demo.sh          the above
#   scripts/demo.sh train    fullburn's own trainer instead (libtorch): `fullburn train`
#                            on its embedded default; further arguments go to it
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}

if [[ "${1:-}" == "train" ]]; then
  shift
  echo "demo: 1/3 packages, 2/3 build (fullburn and the training half only), 3/3 the main job"
  scripts/build.sh --demo-train
  if [[ -x "$build/src/fullburn-train" ]]; then
    echo "demo: 3/3 fullburn train: a small ResNet on synthetic JPEGs, on the GPU if libtorch sees one"
    "$build/src/fullburn" train "$@"
    echo
    echo "Next: $build/src/fullburn runs show last    $build/src/fullburn runs trace last > trace.json"
  else
    echo "demo: 3/3 fullburn run on the example workload (built without libtorch)"
    "$build/src/fullburn" run --name demo -- \
      "$build/examples/fullburn-example-workload" train --seconds "${DEMO_SECONDS:-15}" --workers 1
    echo
    echo "Next: $build/src/fullburn runs show last    $build/src/fullburn watch    $build/src/fullburn serve"
  fi
  echo "      scripts/test.sh builds the rest (tests, benchmarks) and runs the test suite"
  exit 0
fi

echo "demo: 1/6 packages, 2/6 build (the monitoring half: fullburn), then an unchanged PyTorch script under it"
scripts/build.sh --demo
fb="$build/src/fullburn"
# Debian's PyTorch (install-deps --demo installs it), else the 2.x venv.
venv="${FULLBURN_TORCH2_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fullburn/torch-2.11.0}"
python=/usr/bin/python3
if ! "$python" -c "import torch" 2>/dev/null; then
  python=$venv/bin/python
  if ! [[ -x $python ]] || ! "$python" -c "import torch" 2>/dev/null; then
    echo "demo: /usr/bin/python3 cannot import torch and there is no PyTorch venv at $venv:" \
         "apt-get install python3-torch (scripts/install-deps.sh --demo does)" >&2
    exit 1
  fi
fi
# py-spy for the stacks (install-deps --demo installs it), unless one is named.
spy=${FULLBURN_PY_SPY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fullburn/py-spy}/bin/py-spy
if [[ -z ${FULLBURN_PY_SPY:-} && -x $spy ]]; then
  export FULLBURN_PY_SPY=$spy
fi
script=examples/demo/train.py
epochs=${DEMO_EPOCHS:-8}
torch_version=$("$python" -c "import torch; print(torch.__version__)")

echo
echo "demo: 3/6 fullburn run -- python $script: a plain PyTorch loop (PyTorch $torch_version), nothing"
echo "      of fullburn in it; its Dataset augments each 320x320 photo on the CPU in augment(), and its"
echo "      DataLoader has the default num_workers=0. Watch the line at the bottom: step, loss, samples/s,"
echo "      data wait, the CPU, and (after 20 s of steps) what limits the job now."
"$fb" run --name demo-starved -- "$python" "$script" --epochs "$epochs"
starved=$("$fb" runs list --last 1 --json | "$python" -c "import json, sys; print(json.load(sys.stdin)[0]['id'])")

# The fix the diagnosis named: its DataLoader's num_workers, "num_workers=0 -> N" in
# code or "num_workers (0 -> N)" where the script has its own flag for it.
workers=$("$fb" diagnose "$starved" --json | "$python" -c '
import json, re, sys
for f in json.load(sys.stdin):
    m = re.search(r"num_workers[= (]+0 -> (\d+)", f["fix"])
    if m:
        print(m.group(1)); break
else:
    print(1)')
echo
echo "demo: 4/6 the same script with the fix the finding names: DataLoader(num_workers=$workers), the"
echo "      script's own --workers flag; augment() now runs in worker processes beside the training"
"$fb" run --name demo-fixed -- "$python" "$script" --epochs "$epochs" --workers "$workers"
fixed=$("$fb" runs list --last 1 --json | "$python" -c "import json, sys; print(json.load(sys.stdin)[0]['id'])")

echo
echo "demo: 5/6 fullburn compare $starved $fixed: the two runs side by side"
"$fb" compare "$starved" "$fixed"
gain=$("$fb" compare "$starved" "$fixed" --json | "$python" -c '
import json, sys
a, b = json.load(sys.stdin)
if a["samples_per_s"] and b["samples_per_s"]:
    print("%.2fx the samples/s (%.0f -> %.0f)" % (b["samples_per_s"] / a["samples_per_s"], a["samples_per_s"], b["samples_per_s"]))
else:
    print("no samples/s measured")')
echo "demo: the fix gave $gain on this machine's $(nproc) cores"

echo
report="fullburn-report-$starved-$fixed.html"
echo "demo: 6/6 fullburn report $starved $fixed -o $report"
"$fb" report "$starved" "$fixed" -o "$report"
echo
echo "Next: $fb runs show $starved    $fb watch    python3 -m http.server (then open $report)"
echo "      your own script: $fb run -- python train.py     (scripts/demo.sh train: fullburn's own trainer)"
echo "      scripts/test.sh builds the rest (tests, benchmarks) and runs the test suite"
