#!/usr/bin/env bash
# Preemption with ranks as processes under mpirun (Open MPI): SIGTERM to rank 1's process
# only, mid-fit, with checkpoints written in the background. Both ranks stop after the same
# step, save it and exit 75, and `last` names it; the same command with `--resume auto`
# continues, and the run ends with the metrics (deterministic columns) and the final
# checkpoint's files, bit for bit, of a run never stopped.
#
# usage: scripts/preemption-check.sh MPI_WICK     (MPI_WICK: a release `wick` built with
#                                                   --features mpi)
set -euo pipefail
source "$(dirname "$0")/checks-lib.sh"
wick=$(realpath "$1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
mpirun=(mpirun --allow-run-as-root --oversubscribe -np 2)
steps=300
fail() { echo "FAILED: $*" >&2; exit 1; }
opts=(--no-progress --val-every 50 --max-steps "$steps" --resume auto --save-every 40 --async-save)
fit() { "${mpirun[@]}" "$wick" fit "${opts[@]}" "$@"; }

fit --checkpoint-dir straight-ck --log-dir straight > straight.out 2>&1 \
  || { cat straight.out; fail "the uninterrupted run"; }

set +e
"${mpirun[@]}" "$wick" fit "${opts[@]}" --checkpoint-dir ck --log-dir runs > stopped.out 2>&1 &
launcher=$!
csv=runs/char-gpt/metrics.csv
for _ in $(seq 1200); do
  [ -f "$csv" ] && [ "$(wc -l < "$csv")" -gt 60 ] && break
  sleep 0.05
done
[ -f "$csv" ] || fail "no metrics after 60 s"
victim=$(rank_pid "$launcher" 1)
[ -n "$victim" ] || fail "rank 1's process not found among mpirun's children"
kill -TERM "$victim"
wait "$launcher"
rc=$?
set -e
cat stopped.out
[ -f ck/last ] || fail "no checkpoint saved"
last=$(cat ck/last)
at=$((10#${last##*-}))
echo "mpirun exited $rc; SIGTERM to rank 1 (pid $victim): the ranks stopped after step $at, ck/last names $last"
[ "$rc" = 75 ] || fail "mpirun exited $rc, not 75"
[ "$at" -lt "$steps" ] || fail "the run was not stopped"
grep -q "interrupted by SIGTERM after step $at;" stopped.out \
  || fail "rank 1 did not report the signal and the step"
grep -q "interrupted by a signal to another rank after step $at;" stopped.out \
  || fail "rank 0 did not stop at the same step"
[ "$(tail -1 "$csv" | cut -d, -f1)" = "$at" ] || fail "metrics go past the step saved"

fit --checkpoint-dir ck --log-dir runs > resumed.out 2>&1 || { cat resumed.out; fail "resuming"; }
same_run "$csv" straight/char-gpt/metrics.csv ck straight-ck "$steps"
echo "preemption-check: resumed from step $at to $steps; the metrics and the final checkpoint equal the uninterrupted run's, bit for bit"
