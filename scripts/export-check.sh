#!/usr/bin/env bash
# `wick export` read back by transformers itself: a model fine-tuned with the chat
# fixture's tokenizer in either layout (the template in tokenizer_config.json, or in
# transformers 5's chat_template.jinja), and one whose source had no tokenizer_config.json,
# exported and loaded with AutoTokenizer, AutoConfig and GenerationConfig
# (scripts/export_check.py): the same chat renders and ids as the source's tokenizer, the
# same special tokens, the generation defaults of the source model.
# Usage: scripts/export-check.sh PYTHON (a Python with transformers; torch is not needed).
set -euo pipefail
cd "$(dirname "$0")/.."
py=$1
wick=$(realpath "${WICK:-target/release/wick}")
repo=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
hf=$repo/tests/fixtures/hf
cd "$tmp"
"$wick" prepare --format jsonl --val-fraction 0.3 --tokenizer "$hf/chat/tokenizer.json" \
  --output chat.safetensors "$hf/chat/chat.jsonl" > /dev/null
"$wick" prepare --tokenizer "$hf/llama/tokenizer.json" --output text.safetensors \
  "$repo/data/licenses.txt" > /dev/null
fit=(--seq 8 --batch-size 2 --max-steps 1 --val-every 1000 --no-progress)
for layout in chat chat_v5; do
  "$wick" fit --model "$hf/llama" --tokenizer "$hf/$layout/tokenizer.json" \
    --data chat.safetensors "${fit[@]}" --run-name "$layout" --checkpoint-dir "ck-$layout" > /dev/null
  "$wick" export "ck-$layout/last" "$layout-hf" > /dev/null
  "$py" "$repo/scripts/export_check.py" "$layout-hf" "$hf/$layout" "$hf/llama" "$hf/chat/chat.jsonl"
done
"$wick" fit --model "$hf/llama" --data text.safetensors "${fit[@]}" --run-name plain \
  --checkpoint-dir ck-plain > /dev/null
"$wick" export ck-plain/last plain-hf > /dev/null
"$py" "$repo/scripts/export_check.py" plain-hf "$hf/llama" "$hf/llama"
