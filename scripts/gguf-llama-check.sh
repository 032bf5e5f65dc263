#!/usr/bin/env bash
# llama.cpp itself reads what `wick export --gguf` writes: SmolLM2-135M-Instruct's published
# Q4_1 GGUF (scripts/smollm2-gguf.sh) fine-tuned with LoRA on data/facts.jsonl as the guide
# does, exported merged in f32, Q8_0 and Q4_K and as llama.cpp's adapter file, and each
# answer of llama.cpp (greedy, f32 KV cache) compared with wick's `sample --chat` on the same
# file (scripts/gguf_llama_check.py): the f32 files' must be equal. Also the base alone, in
# Q4_1 as published and as wick's f32 export of its dequantized weights; and QLoRA over the
# published Q4_1 blocks kept as read (`--keep-quantized`), exported merged in f32 (the
# blocks' decoded values plus the update) and as an adapter over the Q4_1 file.
# Not in CI: building llama.cpp takes about 10 minutes on two cores.
# Usage: scripts/gguf-llama-check.sh [PYTHON]: a Python with llama-cpp-python; without
# one, a venv in ~/.cache/wick/llama-cpp gets it, built from its source on PyPI (for any
# x86-64 CPU: AMX, which some virtual machines refuse, off).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
py=${1:-}
if [ -z "$py" ]; then
  venv=$HOME/.cache/wick/llama-cpp
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import llama_cpp" 2> /dev/null; then
    python3 -m venv "$venv"
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AMX_INT8=OFF -DGGML_OPENMP=OFF" \
      "$venv/bin/pip" install --quiet llama-cpp-python==0.3.36
  fi
  py=$venv/bin/python
fi
cargo build --release --quiet
wick=$repo/target/release/wick
base=$(bash scripts/smollm2-gguf.sh)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
"$wick" prepare --tokenizer "$base" --format jsonl --output facts.safetensors "$repo/data/facts.jsonl" > /dev/null
lora=(--seq 64 --batch-size 4 --lora-rank 8 --lora-alpha 16 --no-progress
  --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)
"$wick" fit --model "$base" --data facts.safetensors "${lora[@]}" --max-steps 40 --lr 1e-3 \
  --checkpoint-dir ck --run-name facts > /dev/null
# The base's own weights as wick reads them: a LoRA run that cannot move (lr 1e-30), merged.
"$wick" fit --model "$base" --data facts.safetensors "${lora[@]}" --max-steps 1 --lr 1e-30 \
  --checkpoint-dir ck-base --run-name base > /dev/null
"$wick" export ck-base/last base-f32.gguf --merge --gguf > /dev/null
for q in f32 q8_0 q4_k; do
  "$wick" export ck/last "facts-$q.gguf" --merge --gguf --quant "$q" > /dev/null
done
"$wick" export ck/last facts-lora.gguf --adapter --gguf > /dev/null
# QLoRA: the same run over the base's own Q4_1 blocks, kept as the file holds them.
"$wick" fit --model "$base" --data facts.safetensors "${lora[@]}" --max-steps 40 --lr 1e-3 \
  --keep-quantized --checkpoint-dir ck-qlora --run-name qlora > /dev/null
"$wick" export ck-qlora/last qlora-f32.gguf --merge --gguf > /dev/null
"$wick" export ck-qlora/last qlora-lora.gguf --adapter --gguf > /dev/null
ls -l ./*.gguf
for question in "What is the capital of France?" "Who keeps the lighthouse at Wick Point?"; do
  ask() { "$wick" sample "$@" --chat "$question" --max-new-tokens 48 --temperature 0; }
  echo "== $question"
  "$py" "$repo/scripts/gguf_llama_check.py" "$question" \
    "$base=$(ask --model "$base")" \
    "base-f32.gguf=$(ask --model base-f32.gguf)" \
    "facts-f32.gguf=$(ask --model facts-f32.gguf)" \
    "facts-q8_0.gguf=$(ask --model facts-q8_0.gguf)" \
    "facts-q4_k.gguf=$(ask --model facts-q4_k.gguf)" \
    "base-f32.gguf+facts-lora.gguf=$(ask ck/last)" \
    "$base+facts-lora.gguf=$(ask ck/last)" \
    "qlora-f32.gguf=$(ask --model qlora-f32.gguf)" \
    "$base+qlora-lora.gguf=$(ask ck-qlora/last)"
done
