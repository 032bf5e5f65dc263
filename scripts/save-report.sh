#!/usr/bin/env bash
# The step time around a checkpoint save, blocking against `--async-save`, on the main job
# and on a 20.2M-parameter Llama (2 ranks as threads, fsdp). From each run's metrics.csv:
# the wall time from one step's row to the next's (`epoch_time_s` differences), for the
# steps that follow a save (they carry the save, blocking or its start) and for the others.
# Each job runs blocking and asynchronous alternately for ROUNDS rounds; prints medians and
# the ratio asynchronous / blocking of the step after a save.
#
# usage: scripts/save-report.sh WICK [ROUNDS]     (from the repository's root)
set -euo pipefail
wick=$(realpath "$1")
rounds=${2:-2}
here=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
source "$here/scripts/llama-job.sh"

common=(fit --devices 2 --no-progress --val-every 1000000 --keep-last 2)
declare -A jobs=(
  [main]="--max-steps 200 --save-every 10 --data $here/data/licenses.txt"
  [llama]="--max-steps 25 --save-every 4 $llama_args"
)
declare -A every=([main]=10 [llama]=4)

# "after" or "other" and the seconds from the previous row, for each step from the third
# on (the first steps warm up), within an epoch.
intervals() {
  awk -F, -v every="$2" 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    { step = $1; epoch = $col["epoch"]; t = $col["epoch_time_s"]
      if (step > 2 && epoch == last_epoch) print ((step - 1) % every == 0 ? "after" : "other"), t - last_t
      last_epoch = epoch; last_t = t }' "$1"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

for job in main llama; do
  read -r -a args <<< "${jobs[$job]}"
  for mode in blocking async; do : > "$job-$mode.txt"; done
  for round in $(seq "$rounds"); do
    for mode in blocking async; do
      flag=()
      [ "$mode" = async ] && flag=(--async-save)
      dir=$job-$mode-$round
      "$wick" "${common[@]}" "${args[@]}" "${flag[@]}" --log-dir "$dir" --run-name run \
        --checkpoint-dir "$dir-ck" > /dev/null
      intervals "$dir/run/metrics.csv" "${every[$job]}" >> "$job-$mode.txt"
      rm -rf "$dir-ck"
    done
  done
  declare -A after other
  for mode in blocking async; do
    after[$mode]=$(awk '$1 == "after" { print $2 }' "$job-$mode.txt" | median)
    other[$mode]=$(awk '$1 == "other" { print $2 }' "$job-$mode.txt" | median)
    awk -v j="$job" -v m="$mode" -v a="${after[$mode]}" -v o="${other[$mode]}" \
      -v n="$(grep -c after "$job-$mode.txt")" 'BEGIN {
        printf "%s %s: step after a save %.1f ms, other steps %.1f ms (median; %d saves)\n", j, m, 1000 * a, 1000 * o, n }'
  done
  awk -v j="$job" -v ab="${after[blocking]}" -v aa="${after[async]}" -v ob="${other[blocking]}" \
    -v oa="${other[async]}" 'BEGIN {
      printf "%s: step after a save, async / blocking x%.3f (its cost over an ordinary step: %.1f ms blocking, %.1f ms async)\n", j, aa / ab, 1000 * (ab - ob), 1000 * (aa - oa) }'
done
