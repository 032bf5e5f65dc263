#!/usr/bin/env bash
# `wick export` read back by transformers itself: a model fine-tuned with the chat
# fixture's tokenizer in either layout (the template in tokenizer_config.json, or in
# transformers 5's chat_template.jinja), and one whose source had no tokenizer_config.json,
# exported and loaded with AutoTokenizer, AutoConfig and GenerationConfig
# (scripts/export_check.py): the same chat renders and ids as the source's tokenizer, the
# same special tokens, the generation defaults of the source model. And `export --gguf`
# (every type, and a LoRA adapter) read by the gguf package (scripts/gguf_export_check.py).
# Usage: scripts/export-check.sh PYTHON (a Python with transformers and gguf; torch is not
# needed).
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

# GGUF: a LoRA run over the GGUF chat fixture, exported merged in every type and as
# llama.cpp's adapter, read by the gguf package (scripts/gguf_export_check.py) against the
# same checkpoint's Hugging Face exports.
gguf=$repo/tests/fixtures/gguf/chat-llama.gguf
"$wick" prepare --tokenizer "$gguf" --output gguf.safetensors "$repo/data/licenses.txt" > /dev/null
"$wick" fit --model "$gguf" --data gguf.safetensors "${fit[@]}" --lora-rank 4 \
  --run-name gguf --checkpoint-dir ck-gguf > /dev/null
"$wick" export ck-gguf/last gguf-merged --merge > /dev/null
"$wick" export ck-gguf/last gguf-peft --adapter > /dev/null
"$wick" export ck-gguf/last adapter.gguf --adapter --gguf > /dev/null
for q in f32 f16 bf16 q8_0; do
  "$wick" export ck-gguf/last "merged-$q.gguf" --merge --gguf --quant "$q" > /dev/null
  "$py" "$repo/scripts/gguf_export_check.py" "merged-$q.gguf" gguf-merged adapter.gguf gguf-peft
done
# The GGUF itself converted to a directory (`export --model`): transformers reads the chat
# fixture's special tokens, template and renders from it.
"$wick" export --model "$gguf" from-gguf > /dev/null
"$py" "$repo/scripts/export_check.py" from-gguf "$hf/chat_v5" "$hf/llama" "$hf/chat/chat.jsonl"
# The K-quants quantize rows in blocks of 256: a new model 256 wide, trained a step.
cp "$hf/chat_v5/tokenizer.json" "$hf/chat_v5/tokenizer_config.json" "$hf/chat_v5/chat_template.jinja" .
cat > wide.json << 'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
 "intermediate_size": 512, "num_hidden_layers": 1, "num_attention_heads": 4,
 "num_key_value_heads": 2, "vocab_size": 384, "max_position_embeddings": 64,
 "rms_norm_eps": 1e-6, "bos_token_id": 3, "eos_token_id": 0}
JSON
"$wick" prepare --tokenizer tokenizer.json --output wide.safetensors "$repo/data/licenses.txt" > /dev/null
"$wick" fit --model wide.json --tokenizer tokenizer.json --data wide.safetensors "${fit[@]}" \
  --run-name wide --checkpoint-dir ck-wide > /dev/null
"$wick" export ck-wide/last wide-hf > /dev/null
for q in q4_k q6_k; do
  "$wick" export ck-wide/last "wide-$q.gguf" --gguf --quant "$q" > /dev/null
  "$py" "$repo/scripts/gguf_export_check.py" "wide-$q.gguf" wide-hf
done
