#!/usr/bin/env bash
# What packing buys: SmolLM2-135M-Instruct (the published GGUF that scripts/smollm2-gguf.sh
# fetches, at its own shape) fine-tuned on the repository's chat data (data/facts.jsonl and
# the instruction fixtures, 69 examples of 11 to 72 tokens in SmolLM2's chat template) with
# `--packing documents` against one example per window (`--packing padded`): at the same
# window (256) and batch (4), and at a window as long as the longest example (72) with a
# batch of 14 windows, so that a step holds about as many positions (1008 against 1024),
# under fsdp at W=2, one after another in one run.
#
# One line per row: packing, seq, padding (the share of positions that are padding, which
# fit prints), tokens_per_s (all positions, padding too: the median of metrics.csv's steps
# after the first) and example_tokens_per_s (the positions that hold an example's token:
# tokens_per_s x (1 - padding)); then the ratios of packed to each padded row.
#
#   scripts/packing-speed.sh [STEPS]   (default 6 steps a row)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-6}
gguf=${WICK_SMOLLM2_GGUF:-$HOME/.cache/wick/smollm2-gguf/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$gguf" ] || scripts/smollm2-gguf.sh >/dev/null
cargo build --release --quiet
wick=target/release/wick
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$wick" prepare --format jsonl --tokenizer "$gguf" --output "$work/chat.safetensors" \
  --val-fraction 0.1 --no-progress data/facts.jsonl tests/fixtures/hf/chat/chat.jsonl \
  tests/fixtures/data/messages.jsonl tests/fixtures/data/sharegpt.jsonl \
  tests/fixtures/data/alpaca.parquet tests/fixtures/data/prompt_completion.jsonl
echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
for row in "documents 256 4" "padded 256 4" "padded 72 14"; do
  set -- $row
  name="$1-$2"
  out=$("$wick" fit --model "$gguf" --data "$work/chat.safetensors" --seq "$2" --packing "$1" \
    --batch-size "$3" --devices 2 --strategy fsdp --max-steps "$steps" --val-every 100000 \
    --no-progress --run-name "$name" --log-dir "$work/logs" --checkpoint-dir "$work/ck-$name" 2>&1)
  padding=$(grep -o 'train split: .* \([0-9.]*\)% padding' <<<"$out" | grep -o '[0-9.]*% padding' | tr -d '% padding')
  tps=$(awk -F, 'NR > 2 { print $7 }' "$work/logs/$name/metrics.csv" | sort -n |
    awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  real=$(awk -v t="$tps" -v p="$padding" 'BEGIN { printf "%.1f", t * (1 - p / 100) }')
  echo "packing=$1 seq=$2 batch=$3 padding=${padding}% tokens_per_s=$tps example_tokens_per_s=$real"
  echo "$1-$2 $real" >>"$work/rows"
done
awk '{ r[$1] = $2 } END {
  printf "# example tokens/s, packed over padded at seq 256: %.2fx; over padded at seq 72: %.2fx\n",
    r["documents-256"] / r["padded-256"], r["documents-256"] / r["padded-72"] }' "$work/rows"
