# Shell functions the checks of runs under launchers share; sourced by
# scripts/preemption-check.sh, scripts/soak.sh and scripts/slurm-check.sh (and scripts/mpi-check.sh).
# Each expects a `fail MESSAGE` function of its caller.

# The pid of the process that `mpirun` (pid LAUNCHER) started as rank RANK, or nothing.
rank_pid() {
  local launcher=$1 rank=$2 p
  for p in $(pgrep -P "$launcher" || true); do
    if tr '\0' '\n' < /proc/"$p"/environ 2> /dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$rank"; then
      echo "$p"
      return
    fi
  done
}

# Fails unless a run ended where an uninterrupted one ended, bit for bit: the metrics'
# deterministic columns (step, epoch, losses, lr, skipped steps) and the files of both
# runs' checkpoints at step STEPS.
#   same_run CSV STRAIGHT_CSV CK_ROOT STRAIGHT_CK_ROOT STEPS
same_run() {
  local csv=$1 straight_csv=$2 ck=$3 straight_ck=$4 steps=$5 final f
  cmp <(cut -d, -f1-6 "$csv") <(cut -d, -f1-6 "$straight_csv") \
    || fail "the metrics differ from the uninterrupted run's"
  final=$(printf 'step-%08d' "$steps")
  for f in rank-0.safetensors rank-1.safetensors; do
    cmp "$ck/$final/$f" "$straight_ck/$final/$f" || fail "$final/$f differs from the uninterrupted run's"
  done
}
