#!/usr/bin/env bash
# The real-size rows, like for like: a model of SmolLM2-135M's shape (or any decoder
# directory) fine-tuned under fsdp full_shard at W=2, fully and with LoRA of rank 16, each
# with the blocks' activations kept and recomputed, by
# - wick with its two ranks as threads of one process (`throughput --hf`),
# - wick with its two ranks as two processes under `mpirun -np 2` (`throughput --hf
#   --processes`, a build with `--features mpi`), each in a pool of cores / 2 threads,
# - transformers + peft under FSDP2, two processes over gloo (`torch_baseline.py --hf`):
#   fused AdamW, cores / 2 threads a process, the model made on the meta device and
#   materialised shard by shard (torchtitan's way), eager and, for the configs in COMPILED
#   (default all), under torch.compile after fully_shard, each its own row,
# all with wick's malloc thresholds, alternating row by row for ROUNDS rounds so that the
# machine's drift falls on all alike. Every row's memory is measured from outside, the
# same way for all (`scripts/rss_peak.py`: each rank process's largest resident size, the
# largest sum of the ranks' sizes at one moment, and each rank's largest size over the
# measured steps, after the warm-up steps, which both sides announce). Prints the CPU and its vector ISA,
# each row as it comes, then the table (`scripts/real_size_table.py`): tokens/s and peaks
# as the median [min-max] of the rounds.
#
# usage: [COMPILED=CONFIGS] scripts/real-size-rows.sh THROUGHPUT THROUGHPUT_MPI DIR PYTHON [ROUNDS] [CONFIGS]
#   THROUGHPUT      cargo build --release --example throughput
#   THROUGHPUT_MPI  the same with --features mpi, copied aside
#   DIR             python scripts/hf_fixtures.py --smollm2-135m DIR
#   PYTHON          a python with torch, transformers, peft and safetensors (not in CI)
#   ROUNDS          default 5
#   CONFIGS         default "full full+ac lora lora+ac"
set -euo pipefail
bin=$(realpath "$1")
bin_mpi=$(realpath "$2")
dir=$3
py=$4
rounds=${5:-5}
configs=${6:-full full+ac lora lora+ac}
compiled_configs=${COMPILED-$configs}
here=$(dirname "$0")
# wick's malloc settings (host_tuning.rs), in glibc's variables, for every side.
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 \
  MALLOC_TOP_PAD_=67108864 MALLOC_ARENA_MAX=$(nproc)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
isa=$(grep -m1 '^flags' /proc/cpuinfo | grep -qw avx512f && echo AVX-512 || \
  (grep -m1 '^flags' /proc/cpuinfo | grep -qw avx2 && echo AVX2 || echo 'no AVX2'))
echo "cpu: $cpu, $(nproc) cores, $isa"
log=$(mktemp)
# One row: its line (impl=...) and its sampled peak, labelled with the config.
row() {
  local config=$1 ranks=$2
  shift 2
  "$py" "$here/rss_peak.py" "$ranks" -- "$@" | grep -E '^(impl=(wick|torch) model|rss_peak ranks)' \
    | sed "s/^/config=$config /" | tee -a "$log"
}
for round in $(seq "$rounds"); do
  echo "round $round"
  for config in $configs; do
    lora=
    ac=
    case $config in lora*) lora=16 ;; esac
    case $config in *+ac) ac=--checkpoint-activations ;; esac
    wick=(--hf "$dir" ${lora:+--lora-rank $lora} $ac)
    row "$config" '^\S*/throughput\S* ' "$bin" "${wick[@]}"
    row "$config" '^\S*/throughput\S* ' mpirun --allow-run-as-root --oversubscribe --bind-to none \
      -np 2 -x MALLOC_MMAP_THRESHOLD_ -x MALLOC_TRIM_THRESHOLD_ -x MALLOC_TOP_PAD_ \
      -x MALLOC_ARENA_MAX \
      "$bin_mpi" "${wick[@]}" --processes
    torch=("$py" "$here/torch_baseline.py" --d-model --worlds 2 --strategies fsdp_full_shard
      --hf "$dir" ${lora:+--lora $lora} $ac)
    row "$config" 'spawn_main' "${torch[@]}"
    if [[ " ${compiled_configs} " == *" $config "* ]]; then
      row "$config" 'spawn_main' "${torch[@]}" --compile --compiled-only
    fi
  done
done
"$py" "$here/real_size_table.py" "$log"
rm -f "$log"
