#!/usr/bin/env bash
# Generation speed beside transformers: a model directory (SmolLM2-135M's shape:
# `python scripts/hf_fixtures.py --smollm2-135m DIR`) generating greedily in f32 on this
# machine's cores, wick (examples/generation_speed.rs, the KV cache) and transformers'
# `generate` (scripts/generate_baseline.py), the two alternating round by round so that the
# machine's drift falls on both. Prints the CPU, each round's line, then per side the median
# [min-max] over the rounds of tokens/s and of the time of the new token around the 10th
# and the 500th.
#
# usage: scripts/generation-report.sh GENERATION_SPEED DIR PYTHON [ROUNDS]
#   GENERATION_SPEED  cargo build --release --example generation_speed
#   PYTHON            a python with torch and transformers (not in CI)
set -euo pipefail
bin=$(realpath "$1")
dir=$2
py=$3
rounds=${4:-5}
cd "$(dirname "$0")/.."
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
lines=$(mktemp)
trap 'rm -f "$lines"' EXIT
for round in $(seq "$rounds"); do
  "$bin" "$dir" --rounds 1 | sed "s/round 1/round $round/" | tee -a "$lines"
  "$py" scripts/generate_baseline.py "$dir" --rounds 1 2> /dev/null \
    | sed "s/round 1/round $round/" | tee -a "$lines"
done
"$py" - "$lines" << 'PYEOF'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\w+) round \d+: ([\d.]+) tokens/s, token 10 ([\d.]+) ms, token (\d+) ([\d.]+) ms", line)
    if m:
        side, tps, t10, late, tlate = m.groups()
        rows.setdefault(side, []).append((float(tps), float(t10), float(tlate), late))
def cell(xs, digits):
    return f"{statistics.median(xs):.{digits}f} [{min(xs):.{digits}f}-{max(xs):.{digits}f}]"
print("| side | tokens/s | token 10 (ms) | token 500 (ms) |")
print("|---|---|---|---|")
for side, r in rows.items():
    print(f"| {side} | {cell([x[0] for x in r], 1)} | {cell([x[1] for x in r], 1)} | "
          f"{cell([x[2] for x in r], 1)} |")
PYEOF
