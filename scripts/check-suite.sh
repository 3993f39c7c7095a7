#!/usr/bin/env bash
# Shows the test suite holds: on a fresh clone of this repository's HEAD,
# scripts/test.sh (install, build, ctest -jJOBS), then ctest again RUNS-1
# more times, then once more while stress-ng keeps every core busy (started
# and stopped here). Prints one line per pass with its duration and result;
# exits non-zero if any pass failed. docs/testing.md records its runs.
#   scripts/check-suite.sh [RUNS]       (default 3)
#   CLONE_DIR=/tmp/fullburn-check  JOBS=2
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
jobs=${JOBS:-2}
clone=${CLONE_DIR:-$(mktemp -d /tmp/fullburn-check.XXXXXX)}
if ! command -v stress-ng >/dev/null; then
  echo "check-suite: stress-ng is missing: run scripts/install-deps.sh --bench (or apt-get install stress-ng)" >&2
  exit 1
fi

rm -rf "$clone"
git clone -q . "$clone"
echo "check-suite: fresh clone of $(git rev-parse --short HEAD) in $clone; $(nproc) cores, ctest -j$jobs"
failed=0
log_dir="$clone/check-logs"
mkdir -p "$log_dir"

pass() {  # pass NAME COMMAND...
  local name=$1 start=$SECONDS code=0
  shift
  "$@" >"$log_dir/$name.log" 2>&1 || code=$?
  local took=$((SECONDS - start)) summary
  summary=$(grep -E "tests passed|tests failed" "$log_dir/$name.log" | tail -n1 || true)
  echo "check-suite: $name: exit $code in $((took / 60))m$((took % 60))s: ${summary:-no ctest summary} ($log_dir/$name.log)"
  [[ $code -eq 0 ]] || failed=1
}

pass "1-test.sh" env JOBS="$jobs" "$clone/scripts/test.sh"
for ((i = 2; i <= runs; ++i)); do
  pass "$i-ctest" bash -c "cd '$clone/build' && ctest --output-on-failure -j$jobs"
done

stress-ng --cpu "$(nproc)" --timeout 7200 >/dev/null 2>&1 &
burner=$!
trap 'kill $burner 2>/dev/null || true' EXIT
sleep 1
pass "$((runs + 1))-ctest-under-load" bash -c "cd '$clone/build' && ctest --output-on-failure -j$jobs"
kill $burner 2>/dev/null || true
wait $burner 2>/dev/null || true
exit $failed
