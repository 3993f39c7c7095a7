#!/usr/bin/env bash
# What a refactoring must leave as it was: `fullburn analyze` (text and
# --json) of every trace fixture, and `diagnose`, `diagnose --json`, `runs
# show` and `report` of every run in the fixture store, written into OUT by
# the fullburn binary given. Two revisions' outputs are compared with
# `diff -r`:
#   scripts/same-output.sh build-a/src/fullburn /tmp/a
#   scripts/same-output.sh build/src/fullburn /tmp/b && diff -r /tmp/a /tmp/b
# Each store is copied first (opening an older store migrates it).
set -euo pipefail
fullburn=$(realpath "$1")
out=$2
cd "$(dirname "$0")/.."
mkdir -p "$out"
for trace in tests/analyze/fixtures/*.json*; do
  name=$(basename "$trace")
  "$fullburn" analyze "$trace" >"$out/analyze-$name.txt" 2>&1 || echo "exit $?" >>"$out/analyze-$name.txt"
  "$fullburn" analyze --json "$trace" >"$out/analyze-$name.json" 2>&1 || echo "exit $?" >>"$out/analyze-$name.json"
done
"$fullburn" analyze tests/analyze/fixtures/torch211_h200_ranks_rank0.pt.trace.json.gz \
  tests/analyze/fixtures/torch211_h200_ranks_rank1.pt.trace.json.gz >"$out/analyze-ranks.txt" 2>&1 || true
# The fixture store, and any recorded by hand (STORES="a.db b.db": runs of
# planted scripts, whose findings the fixture's one run does not reach).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
for source in tests/store/fixtures/store_v1.db ${STORES:-}; do
  n=$((n + 1))
  store=$tmp/runs$n.db
  cp "$source" "$store"
  ids=$("$fullburn" runs list --store "$store" 2>/dev/null | awk '$1 ~ /^[0-9]+$/ {print $1}')
  for id in $ids; do
    tag=$n-$id
    "$fullburn" diagnose "$id" --store "$store" >"$out/diagnose-$tag.txt" 2>&1 || true
    "$fullburn" diagnose "$id" --json --store "$store" >"$out/diagnose-$tag.json" 2>&1 || true
    "$fullburn" runs show "$id" --store "$store" >"$out/show-$tag.txt" 2>&1 || true
    "$fullburn" report "$id" --store "$store" -o "$out/report-$tag.html" >/dev/null 2>&1 || true
  done
  # shellcheck disable=SC2086
  [[ $(wc -w <<<"$ids") -ge 2 ]] && "$fullburn" compare $ids --store "$store" >"$out/compare-$n.txt" 2>&1 || true
done
ls "$out" | wc -l
