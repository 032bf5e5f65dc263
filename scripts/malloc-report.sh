#!/usr/bin/env bash
# wick's glibc malloc thresholds (crates/accelerator/src/host_tuning.rs) against glibc's
# own, in one run: the main job's wall time and the throughput example's rows, alternating
# for ROUNDS rounds. glibc's own settings are had by a malloc tunable set to its default
# value (GLIBC_TUNABLES=glibc.malloc.perturb=0), which glibc reads as no change and wick as
# the user's choice. Prints each measure's median under both and their ratio.
#
# usage: scripts/malloc-report.sh WICK THROUGHPUT [ROUNDS]     (from the repository's root)
#   WICK        cargo build --release: target/release/wick
#   THROUGHPUT  cargo build --release --example throughput: target/release/examples/throughput
set -euo pipefail
wick=$(realpath "$1")
throughput=$(realpath "$2")
rounds=${3:-3}
rows=$(mktemp)
runs=$(mktemp -d)
trap 'rm -rf "$rows" "$runs"' EXIT
for round in $(seq "$rounds"); do
  echo "round $round of $rounds" >&2
  for malloc in wick glibc; do
    tunables=()
    [ "$malloc" = glibc ] && tunables=(GLIBC_TUNABLES=glibc.malloc.perturb=0)
    start=$(date +%s.%N)
    env "${tunables[@]}" "$wick" fit --no-progress --no-checkpoints --log-dir "$runs" \
      --run-name "$malloc-$round" > /dev/null
    echo "malloc=$malloc measure=main_job_s value=$(echo "$(date +%s.%N) - $start" | bc)" >> "$rows"
    env "${tunables[@]}" "$throughput" | awk -v m="$malloc" '/^impl=wick/ {
      split($2, s, "="); split($3, w, "="); split($4, t, "=");
      print "malloc=" m " measure=" s[2] "_w" w[2] "_tokens_per_s value=" t[2] }' >> "$rows"
  done
done
python3 - "$rows" <<'PY'
import statistics
import sys

values = {}
for line in open(sys.argv[1]):
    f = dict(kv.split("=", 1) for kv in line.split())
    values.setdefault(f["measure"], {}).setdefault(f["malloc"], []).append(float(f["value"]))
for measure, by in values.items():
    wick, glibc = statistics.median(by["wick"]), statistics.median(by["glibc"])
    print(f"{measure} wick_malloc={wick:.1f} glibc_malloc={glibc:.1f} ratio={wick / glibc:.3f}")
PY
