#!/usr/bin/env bash
# wick under a real Slurm (one node, scripts/slurm-cluster.sh):
#   1. `srun -n 2 --mpi=pmix wick fit` logs the same metrics (deterministic columns) as two
#      ranks as threads;
#   2. docs/wick-fit.sbatch, the batch script the guide shows (checked to be the guide's
#      text), submitted with sbatch and requeued mid-run with `scontrol requeue`: its ranks
#      save and stop, the job starts again (SLURM_RESTART_COUNT=1), resumes with
#      `--resume auto`, and ends with the metrics and the final checkpoint, bit for bit, of
#      a run never requeued.
#
# usage: scripts/slurm-check.sh MPI_WICK      (from the repository's root, SLURM_CONF set)
set -euo pipefail
source "$(dirname "$0")/checks-lib.sh"
wick=$(realpath "$1")
: "${SLURM_CONF:?set SLURM_CONF (scripts/slurm-cluster.sh up BASE)}"
here=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }
steps=240
opts=(--no-progress --val-every 50 --max-steps "$steps" --save-every 40)

# The guide's script is this file, word for word.
awk '/^```bash$/ && found {on = 1; next} /^```/ {on = 0} on; /docs\/wick-fit.sbatch/ {found = 1}' \
  docs/guide.md | awk 'NR == 1, /^exit/' > "$tmp/guide.sbatch"
cmp "$tmp/guide.sbatch" docs/wick-fit.sbatch || fail "docs/guide.md does not show docs/wick-fit.sbatch as it is"

cd "$tmp"
echo "== 1. srun -n 2 --mpi=pmix against 2 ranks as threads"
timeout 300 srun -n 2 --mpi=pmix "$wick" fit "${opts[@]}" --resume auto --async-save \
  --checkpoint-dir straight-ck --log-dir straight > srun.out 2>&1 || { cat srun.out; fail "srun"; }
"$wick" fit --devices 2 "${opts[@]}" --checkpoint-dir threads-ck --log-dir threads > threads.out 2>&1 \
  || { cat threads.out; fail "threads"; }
cmp <(cut -d, -f1-6 straight/char-gpt/metrics.csv) <(cut -d, -f1-6 threads/char-gpt/metrics.csv) \
  || fail "srun's metrics differ from the threads'"
[ "$(grep -c '^trained ' srun.out)" = 1 ] || fail "the report was printed $(grep -c '^trained ' srun.out) times"
echo "srun -n 2: $steps steps, metrics equal to 2 threads' (deterministic columns)"

echo "== 2. sbatch docs/wick-fit.sbatch, requeued mid-run"
job=$(WICK=$wick sbatch --parsable --chdir="$tmp" "$here/docs/wick-fit.sbatch" "${opts[@]}" \
  --checkpoint-dir ck --log-dir runs)
out=wick-fit-$job.out
csv=runs/char-gpt/metrics.csv
state() { scontrol show job "$job" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
for _ in $(seq 1200); do
  [ -f "$csv" ] && [ "$(wc -l < "$csv")" -gt 50 ] && break
  sleep 0.1
done
[ -f "$csv" ] || { cat "$out" 2> /dev/null; fail "the job made no progress in 120 s"; }
scontrol requeue "$job"
for _ in $(seq 900); do
  [ "$(state)" = COMPLETED ] && break
  case $(state) in FAILED | CANCELLED | TIMEOUT | NODE_FAIL) cat "$out"; fail "the job ended $(state)" ;; esac
  sleep 0.2
done
cat "$out"
[ "$(state)" = COMPLETED ] || fail "the job did not complete within 180 s of the requeue: $(state)"
grep -q "wick-fit: job $job, start 2" "$out" || fail "the job did not start again"
stopped=$(sed -n 's/.*interrupted by SIGTERM after step \([0-9]*\);.*/\1/p' "$out" | head -1)
[ -n "$stopped" ] || fail "the ranks did not report saving on SIGTERM"
same_run "$csv" straight/char-gpt/metrics.csv ck straight-ck "$steps"
echo "slurm-check: job $job requeued after step $stopped, started again (SLURM_RESTART_COUNT=1) and resumed to $steps; the metrics and the final checkpoint equal the uninterrupted run's, bit for bit"
