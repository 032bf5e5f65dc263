#!/usr/bin/env bash
# The real-size rows in one run: a model of SmolLM2-135M's shape (or any decoder directory)
# fine-tuned under fsdp full_shard at W=2, full and with LoRA of rank 16, each with the
# blocks' activations kept and recomputed, by wick (`throughput --hf`, ranks as threads)
# and by transformers + peft under FSDP2 (`torch_baseline.py --hf`, ranks as processes over
# gloo, fused AdamW, wick's malloc thresholds), alternating row by row so that the machine's
# drift falls on both alike. One process per row, so each row's peak memory is its own.
# Prints the CPU and its vector ISA, then each row of both.
#
# usage: scripts/real-size-rows.sh THROUGHPUT DIR PYTHON
#   THROUGHPUT  cargo build --release --example throughput
#   DIR         python scripts/hf_fixtures.py --smollm2-135m DIR
#   PYTHON      a python with torch, transformers and peft (not in CI)
set -euo pipefail
bin=$(realpath "$1")
dir=$2
py=$3
malloc=(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=134217728)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
isa=$(grep -m1 '^flags' /proc/cpuinfo | grep -qw avx512f && echo AVX-512 || \
  (grep -m1 '^flags' /proc/cpuinfo | grep -qw avx2 && echo AVX2 || echo 'no AVX2'))
echo "cpu: $cpu, $(nproc) cores, $isa"
for lora in "" 16; do
  for ac in "" --checkpoint-activations; do
    "$bin" --hf "$dir" ${lora:+--lora-rank $lora} $ac | grep '^impl=wick'
    env "${malloc[@]}" "$py" scripts/torch_baseline.py --d-model --worlds 2 \
      --strategies fsdp_full_shard --hf "$dir" ${lora:+--lora $lora} $ac | grep '^impl=torch'
  done
done
