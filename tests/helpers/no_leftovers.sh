#!/usr/bin/env bash
# The suite's last test: fails if a process the tests started is still alive.
# Every test runs with FULLBURN_TEST_SUITE=<marker> in its environment
# (tests/CMakeLists.txt), which whatever it starts inherits; this finds the
# processes that still carry it, gives them a few seconds to finish exiting,
# then names each one, kills it (so the next run starts clean) and fails.
#   no_leftovers.sh MARKER [GRACE_SECONDS]
set -uo pipefail
marker="FULLBURN_TEST_SUITE=$1"
grace=${2:-5}

leftovers() {
  local pid
  for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    # This script and the commands it runs carry the marker too.
    [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
    local parent
    parent=$(cut -d' ' -f4 "$dir/stat" 2>/dev/null)
    [[ $parent == "$$" || $parent == "$BASHPID" ]] && continue
    # -z: environ's entries end in NUL; unreadable (another user's, gone) is not ours.
    grep -qzxF "$marker" "$dir/environ" 2>/dev/null && echo "$pid"
  done
}

deadline=$((SECONDS + grace))
left=$(leftovers)
while [[ -n $left && $SECONDS -lt $deadline ]]; do
  sleep 0.5
  left=$(leftovers)
done
if [[ -z $left ]]; then
  echo "no_leftovers: no process started by the tests is still running"
  exit 0
fi
for pid in $left; do
  cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)
  echo "no_leftovers: pid $pid is still running after the tests: ${cmd:-?} (killed now)" >&2
  kill -KILL "$pid" 2>/dev/null
done
exit 1
