#!/usr/bin/env bash
# A fit over a token corpus larger than the memory it may use: the corpus is memory-mapped
# and read a window at a time, the epoch's order is computed a window at a time and packing
# plans a chunk of documents at a time, so the resident set does not grow with it. Writes a
# token corpus of GB gigabytes with its documents' starts (scripts/big_corpus.py) and a
# small one, and fits the Llama fixture on each for STEPS steps, under `--packing concat`
# and `--packing documents`, inside a memory cgroup of LIMIT (cgroup v1 or v2, as root), each
# measured by scripts/rss_peak.py from outside the process. Needs numpy and a release build.
#
# usage: scripts/big-corpus.sh [GB=16] [LIMIT=2G] [STEPS=200] [DIR=/tmp/wick-big-corpus]
set -euo pipefail
cd "$(dirname "$0")/.."
gb=${1:-16}
limit=${2:-2G}
steps=${3:-200}
dir=${4:-/tmp/wick-big-corpus}
py=${PYTHON:-python3}
mkdir -p "$dir"
wick=target/release/wick
model=tests/fixtures/hf/llama
hash=$(sha256sum "$model/tokenizer.json" | cut -d' ' -f1)
# The cgroup: v2's memory.max, or v1's memory controller.
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  cg=/sys/fs/cgroup/wick-big-corpus
  mkdir -p "$cg"
  echo "$limit" > "$cg/memory.max"
else
  cg=/sys/fs/cgroup/memory/wick-big-corpus
  mkdir -p "$cg"
  echo "$limit" > "$cg/memory.limit_in_bytes"
fi
run() {
  local data=$1 packing=$2
  # Pages another process brought in (the writer's) are charged to it, not to the fit:
  # start from an empty page cache so that every page the fit maps counts against the
  # cgroup.
  sync
  echo 1 > /proc/sys/vm/drop_caches
  # This shell joins the cgroup in a subshell, so only the fit and its measure are in it.
  (
    echo $BASHPID > "$cg/cgroup.procs"
    "$py" scripts/rss_peak.py "release/wick" -- "$wick" fit --model "$model" --data "$data" \
      --seq 128 --batch-size 8 --max-steps "$steps" --val-every "$steps" --packing "$packing" \
      --lr 1e-3 --no-checkpoints --no-progress --logger csv --log-dir "$dir/runs" \
      --run-name "$(basename "$data" .safetensors)-$packing"
  ) 2>&1 | grep -E "trained to|rss_peak|error" || true
  # The most the cgroup held at once: the fit's anonymous memory and the file pages it
  # brought in.
  local peak
  if [ -f "$cg/memory.peak" ]; then peak=$(cat "$cg/memory.peak"); else peak=$(cat "$cg/memory.max_usage_in_bytes"); fi
  echo "cgroup peak: $((peak >> 20)) MiB"
  [ -f "$cg/memory.max_usage_in_bytes" ] && echo 0 > "$cg/memory.max_usage_in_bytes" || true
}
for size in 0.1 "$gb"; do
  file="$dir/corpus-${size}g.safetensors"
  [ -f "$file" ] || "$py" scripts/big_corpus.py "$file" "$size" "$hash" 384 documents
  for packing in concat documents; do
    echo "== corpus $(du -h "$file" | cut -f1), --packing $packing, in a cgroup of $limit; $(grep MemTotal /proc/meminfo)"
    run "$file" "$packing"
  done
done
rmdir "$cg" 2>/dev/null || true
