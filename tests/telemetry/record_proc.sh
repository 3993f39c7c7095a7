#!/bin/sh
# Records the /proc and /sys files fullburn's host and process-tree collectors
# read, into DEST/proc and DEST/sys, so tests can replay them (RootedEnv).
# Usage: record_proc.sh DEST [ROOT_PID]   (ROOT_PID is written to DEST/root_pid)
set -eu
dest=$1
mkdir -p "$dest/proc/net" "$dest/sys/block"
for f in stat meminfo vmstat diskstats loadavg net/dev; do cat "/proc/$f" > "$dest/proc/$f"; done
for d in /sys/block/*; do mkdir -p "$dest/sys/block/$(basename "$d")"; done
for p in /proc/[0-9]*; do
  pid=$(basename "$p")
  if stat=$(cat "$p/stat" 2>/dev/null); then
    mkdir -p "$dest/proc/$pid"
    printf '%s\n' "$stat" > "$dest/proc/$pid/stat"
  fi
done
[ $# -ge 2 ] && echo "$2" > "$dest/root_pid"
getconf CLK_TCK > "$dest/clk_tck"
getconf PAGESIZE > "$dest/page_size"
