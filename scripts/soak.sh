#!/usr/bin/env bash
# A soak test of runs that survive clusters: the main job under `mpirun -np 2`, its
# checkpoints written in the background every few steps, interrupted INTERRUPTIONS times at
# random moments (SIGKILL or SIGTERM to a random rank's process) and restarted each time
# with `--resume auto` until it completes. After every interruption each checkpoint
# directory and `last` are opened and checked whole (`wick inspect`: manifest, every file's
# length and checksum); at the end the metrics (deterministic columns) and the final
# checkpoint's files equal those of a run never interrupted, bit for bit. The random
# choices come from SEED (the argument, else $SOAK_SEED, else the clock), printed at the
# start and with any failure, so that a failure can be replayed: SOAK_SEED=N (or the third
# argument) makes the same choices again.
#
# usage: [SOAK_SEED=N] scripts/soak.sh MPI_WICK [INTERRUPTIONS] [SEED]
#   MPI_WICK  a release `wick` built with --features mpi
set -euo pipefail
source "$(dirname "$0")/checks-lib.sh"
wick=$(realpath "$1")
interruptions=${2:-6}
seed=${3:-${SOAK_SEED:-$(date +%s)}}
RANDOM=$seed
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
steps=400
mpirun=(mpirun --allow-run-as-root --oversubscribe -np 2)
opts=(fit --no-progress --val-every 50 --max-steps "$steps" --resume auto --save-every 7
  --keep-last 4 --async-save)
fail() { echo "FAILED (seed $seed; replay with SOAK_SEED=$seed): $*" >&2; exit 1; }
echo "soak: $interruptions interruptions, seed $seed"

"${mpirun[@]}" "$wick" "${opts[@]}" --checkpoint-dir straight-ck --log-dir straight \
  > straight.out 2>&1 || { cat straight.out; fail "the uninterrupted run"; }

csv=runs/char-gpt/metrics.csv
last_step() { if [ -f "$csv" ]; then tail -1 "$csv" | cut -d, -f1; else echo 0; fi; }
verified=0
# Every checkpoint directory under ck (not the temporary ones) and `last` load whole.
verify() {
  for dir in ck/step-*; do
    case "$dir" in *.tmp | 'ck/step-*') continue ;; esac
    "$wick" inspect "$dir" > /dev/null 2> inspect.err || { cat inspect.err; fail "$dir is damaged"; }
    verified=$((verified + 1))
  done
  if [ -f ck/last ]; then
    "$wick" inspect ck/last > /dev/null 2> inspect.err || { cat inspect.err; fail "ck/last is damaged"; }
  fi
}

kills=0 terms=0 restarts=0 run=0
while :; do
  run=$((run + 1))
  "${mpirun[@]}" "$wick" "${opts[@]}" --checkpoint-dir ck --log-dir runs > "run-$run.out" 2>&1 &
  launcher=$!
  if [ $((kills + terms)) -ge "$interruptions" ]; then
    wait "$launcher" || { cat "run-$run.out"; fail "the last run (after $restarts restarts)"; }
    break
  fi
  # A random moment: 3 to 40 steps after where the run resumes, or as soon as it is
  # running for a kill within its first steps.
  from=$(last_step)
  until=$((from + 3 + RANDOM % 38))
  while kill -0 "$launcher" 2> /dev/null && [ "$(last_step)" -lt "$until" ]; do sleep 0.02; done
  victim_rank=$((RANDOM % 2))
  # Drawn here, not inside $(...): bash reseeds RANDOM in a subshell, so a draw there
  # would not come again on a replay.
  coin=$((RANDOM % 2))
  signal=$([ "$coin" = 0 ] && echo KILL || echo TERM)
  victim=$(rank_pid "$launcher" "$victim_rank")
  [ -n "$victim" ] || { wait "$launcher" || true; cat "run-$run.out"; fail "run $run ended before its interruption"; }
  at=$(last_step)
  kill -"$signal" "$victim" 2> /dev/null || true
  set +e
  wait "$launcher"
  rc=$?
  set -e
  case $signal in
    KILL) kills=$((kills + 1)); [ "$rc" -ne 0 ] || fail "mpirun exited 0 after SIGKILL" ;;
    TERM) terms=$((terms + 1)); [ "$rc" = 75 ] || { cat "run-$run.out"; fail "mpirun exited $rc after SIGTERM, not 75"; } ;;
  esac
  echo "run $run: SIG$signal to rank $victim_rank near step $at: mpirun exited $rc; last names $(cat ck/last 2> /dev/null || echo nothing)"
  verify
  # Killed before its first checkpoint: the next run starts fresh, and a fresh run never
  # logs into another run's folder (it would take runs/char-gpt-v1). Its log goes where
  # this one's went, so that the steps watched and compared are the run that continues.
  [ -f ck/last ] || rm -rf runs
  restarts=$((restarts + 1))
done
verify

same_run "$csv" straight/char-gpt/metrics.csv ck straight-ck "$steps"
echo "soak (seed $seed): $kills SIGKILLs, $terms SIGTERMs, $restarts restarts, $verified checkpoint directories verified whole; the final parameters and metrics equal the uninterrupted run's, bit for bit"
