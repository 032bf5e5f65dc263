#!/usr/bin/env bash
# `wick estimate`'s peak resident set beside what a run measures: `wick fit` of a decoder
# (`python scripts/hf_fixtures.py --smollm2-135m DIR` or `--llama-3.2-1b DIR`) under fsdp
# full_shard at W=2, ranks as threads, sequence 256, global batch 8, 2 steps, fully
# fine-tuned, with LoRA of rank 16 on every linear layer of a block, and QLoRA (NF4; and with
# --quantize-embeddings, the embedding and head in NF4 too), each
# keeping and recomputing activations. Prints per row the process's peak resident set
# (GNU time's "Maximum resident set size", from outside), the estimate's "2 ranks,
# threads" figure for the same options, and measured / estimated. A row whose estimate
# exceeds 85% of this machine's available memory is not run (the estimate's own verdict,
# with room for its error).
#
# usage: scripts/peak-rows.sh WICK MODEL_DIR
#   WICK       cargo build --release --bin wick
#   MODEL_DIR  a Hugging Face decoder directory (with tokenizer.json)
set -euo pipefail
wick=$(realpath "$1")
model=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$wick" prepare --tokenizer "$model/tokenizer.json" --output tokens.safetensors \
  "$OLDPWD"/data/licenses.txt --no-progress > /dev/null
lora=(--lora-rank 16 --lora-alpha 32
  --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)
shape=(--seq 256 --batch-size 8)
available_mib=$(awk '/MemAvailable/ {print int($2 / 1024)}' /proc/meminfo)
row() {
  local name=$1
  shift
  # The estimate takes fit's options but LoRA's alpha, which moves no memory.
  local est=() skip=0 a
  for a in "$@"; do
    if (( skip )); then skip=0; elif [[ $a == --lora-alpha ]]; then skip=1; else est+=("$a"); fi
  done
  local estimate_gib
  estimate_gib=$("$wick" estimate --model "$model" --world 2 "${shape[@]}" "${est[@]}" \
    | awk '/^peak resident set/ {p = 1} p && /^fsdp full_shard/ {print $(NF-3); exit}')
  local estimate_mib
  estimate_mib=$(python3 -c "print(round($estimate_gib * 1024))")
  if (( estimate_mib > available_mib * 85 / 100 )); then
    echo "row=$name estimated_mib=$estimate_mib not run: more than 85% of the $available_mib MiB available"
    return
  fi
  /usr/bin/time -v "$wick" fit --model "$model" --data tokens.safetensors "${shape[@]}" \
    --max-steps 2 --val-every 1000 --no-progress --no-checkpoints --run-name "$name" \
    --log-dir runs --strategy fsdp --devices 2 "$@" > out 2> err
  local rss_mib
  rss_mib=$(awk '/Maximum resident/ {print int($6 / 1024)}' err)
  echo "row=$name measured_mib=$rss_mib estimated_mib=$estimate_mib \
measured/estimated=$(python3 -c "print(round($rss_mib / $estimate_mib, 3))")"
}
echo "model: $model, fsdp full_shard, W=2 (threads), --seq 256 --batch-size 8"
row full
row full-recomputed --activation-checkpointing full
row lora "${lora[@]}"
row lora-recomputed "${lora[@]}" --activation-checkpointing full
row qlora "${lora[@]}" --quantize-base nf4
row qlora-recomputed "${lora[@]}" --quantize-base nf4 --activation-checkpointing full
row qlora-embeddings "${lora[@]}" --quantize-base nf4 --quantize-embeddings
row qlora-embeddings-recomputed "${lora[@]}" --quantize-base nf4 --quantize-embeddings \
  --activation-checkpointing full
