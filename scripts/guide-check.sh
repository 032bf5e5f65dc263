#!/usr/bin/env bash
# Runs every command of docs/guide.md's `sh` blocks, in order, from the repository root;
# the first that fails fails the check. CI runs it (it needs Open MPI for the launch
# section). The guide's runs write into runs/ and checkpoints/ as the main job does; the
# files and folders named for the guide are removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
# mpirun as root (CI's containers) needs Open MPI's consent.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mapfile -t commands < <(awk '/^```sh$/ {on = 1; next} /^```/ {on = 0} on && !/^#/ && NF' docs/guide.md)
[ "${#commands[@]}" -gt 0 ] || { echo "guide-check: no sh blocks in docs/guide.md" >&2; exit 1; }
cleanup() {
  rm -rf run.toml guide-model.safetensors checkpoints/guide checkpoints/guide-llama \
    checkpoints/guide-auto checkpoints/guide-qwen2 checkpoints/guide-lora checkpoints/guide-qlora checkpoints/guide-chat checkpoints/guide-packed checkpoints/guide-files checkpoints/guide-dpo checkpoints/guide-dpo-lora runs/guide-* \
    guide-tokens.safetensors guide-chat.safetensors guide-chat-files guide-mix.safetensors guide-llama-hf guide-qwen2-hf \
    guide-lora-adapter guide-lora-merged guide-chat-hf guide-pairs.safetensors guide-pairs.safetensors.dpo-reference checkpoints/guide-gguf guide-facts.safetensors \
    guide-gguf-q8_0.gguf guide-gguf-lora.gguf guide-gguf-peft
}
trap cleanup EXIT
n=0
for cmd in "${commands[@]}"; do
  n=$((n + 1))
  echo "== guide $n: $cmd"
  bash -euo pipefail -c "$cmd" < /dev/null > "/tmp/guide-check-$n.log" 2>&1 || {
    echo "guide-check: command $n failed: $cmd" >&2
    tail -20 "/tmp/guide-check-$n.log" >&2
    exit 1
  }
  tail -3 "/tmp/guide-check-$n.log"
done
# What the guide says of the resumed run: its metrics cover the whole run, steps 1 to 90.
steps=$(awk -F, 'NR > 1 { printf "%s ", $1 }' runs/guide-ck/metrics.csv)
[ "$steps" = "$(seq -s ' ' 1 90) " ] || { echo "guide-check: runs/guide-ck/metrics.csv has steps $steps" >&2; exit 1; }
echo "guide-check: all $n commands passed; the resumed run's metrics cover steps 1-90"
