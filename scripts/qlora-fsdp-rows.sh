#!/usr/bin/env bash
# QLoRA under fsdp at W=2, process against process: wick's two ranks under
# `mpirun -np 2` beside transformers + peft + bitsandbytes under FSDP2 over gloo
# (`scripts/bnb_qlora_row.py ... 2`), alternating for ROUNDS rounds, on a SmolLM2-135M-shaped
# model (`python scripts/hf_fixtures.py --smollm2-135m DIR`): sequence 256, global batch 8,
# 6 steps, LoRA of rank 16 (alpha 32) on every linear layer of a block, NF4 with double
# quantization, each block recomputed in backward. Prints per row the median tokens/s of
# steps 3-6 and the sum of each process's largest resident set, measured from outside the
# same way on both sides (scripts/rss_peak.py).
#
# usage: scripts/qlora-fsdp-rows.sh WICK_MPI MODEL_DIR PYTHON [ROUNDS]
#   WICK_MPI   cargo build --release --bin wick --features mpi
#   MODEL_DIR  a SmolLM2-135M-shaped Hugging Face directory (with tokenizer.json)
#   PYTHON     a Python with torch, transformers, peft and bitsandbytes
set -euo pipefail
wick=$(realpath "$1")
model=$(realpath "$2")
python=$3
rounds=${4:-2}
repo=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$wick" prepare --tokenizer "$model/tokenizer.json" --output tokens.safetensors \
  "$repo"/data/licenses.txt --no-progress > /dev/null
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
for round in $(seq "$rounds"); do
  "$python" "$repo"/scripts/rss_peak.py spawn_main -- "$python" "$repo"/scripts/bnb_qlora_row.py \
    "$model" tokens.safetensors 256 8 6 2 > torch.out 2>&1
  echo "row=torch+bnb round=$round $(grep -o 'steps 3-6: .*' torch.out | cut -d' ' -f3) tokens/s," \
    "$(grep -o 'peak_mb=[0-9]*' torch.out)"
  "$python" "$repo"/scripts/rss_peak.py "^$wick fit" -- mpirun --allow-run-as-root -np 2 \
    --bind-to none "$wick" fit --model "$model" --data tokens.safetensors --seq 256 \
    --batch-size 8 --max-steps 6 --val-every 1000 --no-progress --no-checkpoints \
    --run-name "r$round" --log-dir runs --strategy fsdp --lora-rank 16 --lora-alpha 32 \
    --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj \
    --quantize-base nf4 --activation-checkpointing full > wick.out 2>&1
  tps=$("$python" -c "
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print(round(statistics.median(float(r['tokens_per_s']) for r in rows[2:]), 1))
" "runs/r$round/metrics.csv")
  echo "row=wick round=$round $tps tokens/s, $(grep -o 'peak_mb=[0-9]*' wick.out)"
done
