#!/usr/bin/env bash
# The README's test command (`cargo test --workspace`) RUNS times beside BUSY busy loops,
# so that the tests' timing bounds are seen to hold on a loaded machine. Prints each run's
# outcome and time; fails on the first run that fails (its log is kept and named).
#
# usage: scripts/loaded-suite.sh [RUNS] [BUSY]     (defaults: 3 runs beside 2 busy loops)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
busy=${2:-2}
cargo test --workspace --no-run --quiet
loops=()
trap 'kill "${loops[@]}" 2> /dev/null || true' EXIT
for _ in $(seq "$busy"); do
  yes > /dev/null &
  loops+=($!)
done
for run in $(seq "$runs"); do
  log=$(mktemp --suffix=.log)
  start=$(date +%s)
  if ! cargo test --workspace > "$log" 2>&1; then
    echo "run $run of $runs beside $busy busy loops: FAILED after $(($(date +%s) - start)) s; log $log" >&2
    grep -E 'panicked|FAILED|failed' "$log" | head -20 >&2
    exit 1
  fi
  passed=$(awk '/^test result/ {s += $4} END {print s}' "$log")
  echo "run $run of $runs beside $busy busy loops: $passed passed in $(($(date +%s) - start)) s"
  rm -f "$log"
done
