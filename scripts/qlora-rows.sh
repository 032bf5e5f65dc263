#!/usr/bin/env bash
# QLoRA beside LoRA over an f32 base, in one run: `wick fit` of a SmolLM2-135M-shaped model
# (`python scripts/hf_fixtures.py --smollm2-135m DIR`) under STRATEGY (ddp, which keeps
# the base whole on each rank, or fsdp, which shards it by whole blocks) at W=2 (ranks as threads),
# sequence 256, global batch 8, LoRA of rank 16 (alpha 32) on every linear layer of a block,
# 6 steps, with and without `--quantize-base nf4` (and with `--quantize-embeddings` too, the
# embedding and its tied head in NF4), keeping activations and recomputing them
# (`--activation-checkpointing full`), alternating for ROUNDS rounds. Prints per row the
# process's peak resident set (GNU time's "Maximum resident set size", from outside), the
# median tokens/s of steps 3-6 (metrics.csv) and the model state per rank wick reports.
#
# usage: scripts/qlora-rows.sh WICK MODEL_DIR [ROUNDS] [STRATEGY]
#   WICK       cargo build --release --bin wick
#   MODEL_DIR  a SmolLM2-135M-shaped Hugging Face directory (with tokenizer.json)
#   STRATEGY   ddp (the default) or fsdp
set -euo pipefail
wick=$(realpath "$1")
model=$(realpath "$2")
rounds=${3:-2}
strategy=${4:-ddp}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$wick" prepare --tokenizer "$model/tokenizer.json" --output tokens.safetensors \
  "$OLDPWD"/data/licenses.txt --no-progress > /dev/null
lora=(--lora-rank 16 --lora-alpha 32
  --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)
row() {
  local name=$1 round=$2
  shift 2
  /usr/bin/time -v "$wick" fit --model "$model" --data tokens.safetensors --seq 256 \
    --batch-size 8 --max-steps 6 --val-every 1000 --no-progress --no-checkpoints \
    --run-name "$name-$round" --log-dir runs --strategy "$strategy" --devices 2 "${lora[@]}" "$@" \
    > out 2> err
  local rss state tps
  rss=$(awk '/Maximum resident/ {print $6}' err)
  state=$(sed -n 's/.*model state per rank: .*total \([0-9]*\) B.*/\1/p' out)
  tps=$(python3 -c "
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print(round(statistics.median(float(r['tokens_per_s']) for r in rows[2:]), 1))
" "runs/$name-$round/metrics.csv")
  echo "row=$name round=$round peak_rss_gib=$(python3 -c "print(round($rss / 1048576, 2))") \
tokens_per_s=$tps model_state_per_rank_mb=$(python3 -c "print(round($state / 1e6, 1))")"
}
echo "strategy: $strategy at W=2"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
for round in $(seq "$rounds"); do
  row lora "$round"
  row qlora "$round" --quantize-base nf4
  row lora-ac "$round" --activation-checkpointing full
  row qlora-ac "$round" --quantize-base nf4 --activation-checkpointing full
  row qlora-emb "$round" --quantize-base nf4 --quantize-embeddings
  row qlora-emb-ac "$round" --quantize-base nf4 --quantize-embeddings \
    --activation-checkpointing full
done
