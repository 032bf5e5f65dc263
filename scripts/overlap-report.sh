#!/usr/bin/env bash
# Exposed communication per step with and without overlap, ranks as processes: each job
# runs under `LAUNCH` (default: mpirun -np 2 on this machine) with collectives overlapped
# (the default) and with `--no-overlap-comm` (each completes where it is issued), the two
# alternating for ROUNDS rounds. Prints one line per job and mode: the median tokens/s and
# the median `comm_wait_s` (rank 0's seconds in collectives that overlap did not hide) of
# the steps after the first five, pooled over the rounds (medians: on a shared 2-core
# machine single steps stall now and then), and the ratios of the two modes.
#
# usage: scripts/overlap-report.sh MPI_WICK [ROUNDS]     (from the repository's root)
#   MPI_WICK  a release `wick` built with --features mpi
#   LAUNCH    the launcher and its options (scripts/two-hosts.sh sets it for two hosts)
#   JOBS      which of main-fsdp, main-ddp, llama-fsdp, llama-zero2 to run [default: all]
set -euo pipefail
wick=$(realpath "$1")
rounds=${2:-2}
read -r -a launch <<< "${LAUNCH:-mpirun --allow-run-as-root --oversubscribe -np 2}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
here=$(pwd)
cd "$tmp"

source "$here/scripts/llama-job.sh"

common=(fit --no-progress --no-checkpoints --val-every 1000000)
declare -A jobs=(
  [main-fsdp]="--max-steps 30 --data $here/data/licenses.txt"
  [main-ddp]="--max-steps 30 --strategy ddp --data $here/data/licenses.txt"
  [llama-fsdp]="--max-steps 12 $llama_args"
  [llama-zero2]="--max-steps 12 --strategy zero2 $llama_args"
)

# tokens/s and comm_wait_s of each step of a metrics.csv from step 6 on, one per line.
steps() {
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    $1 > 5 { print $col["tokens_per_s"], $col["comm_wait_s"] }' "$1"
}

# The median of column $1 of standard input.
median() {
  sort -g -k"$1,$1" | awk -v c="$1" '{ v[NR] = $c } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

for job in ${JOBS:-main-fsdp main-ddp llama-fsdp llama-zero2}; do
  read -r -a args <<< "${jobs[$job]}"
  for mode in overlap blocking; do : > "$job-$mode.txt"; done
  for round in $(seq "$rounds"); do
    for mode in overlap blocking; do
      flag=()
      [ "$mode" = blocking ] && flag=(--no-overlap-comm)
      dir="$job-$mode-$round"
      "${launch[@]}" "$wick" "${common[@]}" "${args[@]}" "${flag[@]}" --log-dir "$dir" \
        --run-name run > /dev/null
      steps "$dir/run/metrics.csv" >> "$job-$mode.txt"
    done
  done
  declare -A tps wait
  for mode in overlap blocking; do
    tps[$mode]=$(median 1 < "$job-$mode.txt")
    wait[$mode]=$(median 2 < "$job-$mode.txt")
    echo "$job $mode: median $(printf %.0f "${tps[$mode]}") tokens/s, comm_wait" \
      "$(awk -v w="${wait[$mode]}" 'BEGIN { printf "%.1f", 1000 * w }') ms per step" \
      "($(wc -l < "$job-$mode.txt") steps, $rounds runs)"
  done
  awk -v to="${tps[overlap]}" -v tb="${tps[blocking]}" -v wo="${wait[overlap]}" \
    -v wb="${wait[blocking]}" -v job="$job" 'BEGIN {
      printf "%s: overlap against blocking: tokens/s x%.3f, comm_wait x%.3f\n", job, to / tb, wo / wb }'
done
