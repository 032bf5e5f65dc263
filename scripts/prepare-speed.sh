#!/usr/bin/env bash
# How fast `wick prepare` tokenizes a text corpus, and in how much memory, beside Python:
# `datasets.load_dataset("text")` and `Dataset.map(batched=True)` over the `tokenizers`
# library's `encode_batch` (scripts/prepare_speed.py), one after the other on the same
# cores, with SmolLM2's tokenizer (from the published GGUF scripts/smollm2-gguf.sh fetches).
# The corpus is data/licenses.txt repeated to MB megabytes. Memory is measured from outside
# both processes the same way (scripts/rss_peak.py: the largest resident size of each
# process of the command, summed; `helpers_mb` for Python's map workers).
#
#   scripts/prepare-speed.sh [MB] [python]   (default 100 MB; `python` runs Python's side too)
#
# Prints `wick tokens=... seconds=... tokens_per_s=...` and rss_peak's line for each side.
# (Python's rows are the corpus's lines, the newlines dropped, so it counts fewer tokens.)
set -euo pipefail
cd "$(dirname "$0")/.."
mb=${1:-100}
python=${PYTHON:-python3}
gguf=${WICK_SMOLLM2_GGUF:-$HOME/.cache/wick/smollm2-gguf/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$gguf" ] || scripts/smollm2-gguf.sh >/dev/null
cargo build --release --quiet
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
target/release/wick export --model "$gguf" "$work/smollm2" >/dev/null
"$python" - "$work/corpus.txt" "$mb" <<'PY'
import sys
src = open("data/licenses.txt").read()
with open(sys.argv[1], "w") as f:
    for _ in range(int(sys.argv[2]) * 1024 * 1024 // len(src) + 1):
        f.write(src)
PY
echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; corpus $(du -m "$work/corpus.txt" | cut -f1) MB"
start=$(date +%s.%N)
out=$("$python" scripts/rss_peak.py "wick prepare" -- target/release/wick prepare \
  --tokenizer "$work/smollm2/tokenizer.json" --output "$work/tokens.safetensors" \
  --val-fraction 0.01 --no-progress "$work/corpus.txt")
seconds=$(echo "$(date +%s.%N) - $start" | bc)
tokens=$(grep -o '[0-9]* training and [0-9]* validation' <<<"$out" | awk '{ print $1 + $4 }')
printf 'wick tokens=%s seconds=%.1f tokens_per_s=%.0f\n' "$tokens" "$seconds" "$(echo "$tokens / $seconds" | bc -l)"
grep '^rss_peak' <<<"$out"
if [ "${2:-}" = python ]; then
  rm -f "$work/tokens.safetensors"
  "$python" scripts/rss_peak.py prepare_speed.py -- "$python" scripts/prepare_speed.py \
    "$work/smollm2/tokenizer.json" "$work/corpus.txt" "$work/cache" 0 2>/dev/null |
    grep -E '^(python|rss_peak)'
fi
