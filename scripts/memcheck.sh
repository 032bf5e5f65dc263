#!/usr/bin/env bash
# The failure, timeout and dropped-call tests under valgrind's memcheck: a rank that fails,
# times out or drops a started call must never make another read or write freed memory.
# Any invalid read, write or free fails the run.
#
# - ThreadWorld: the barrier's own tests (a failure does not end the closing wait, a timed
#   out opening wait withdraws, a panic inside the copies arrives) and tests/thread_world.rs
#   (failing, panicking, leaving and slow peers; split worlds);
# - core: a dropped Work completes its call;
# - the trainer: a rank failing mid-fit under every strategy (tests/failures.rs), and a
#   kept clone of a released parameter reading an error (tests/fsdp.rs);
# - MpiWorld (with the mpi feature, when MPI=1): started calls dropped with their buffers,
#   under mpirun -np 2 (tests/mpi.rs's dropped-calls mode). Open MPI's own reports
#   (uninitialised bytes it sends, conditional jumps in its progress engine) are not
#   memory errors of wick's and are not counted: only invalid reads, writes and frees are.
#
# usage: scripts/memcheck.sh        (from anywhere; needs valgrind: installed if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind > /dev/null || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind > /dev/null
}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# The test binaries `cargo test --no-run` builds with the given arguments, as lines of
# "kind name path" (the README's test command has built them: nothing new is compiled).
binaries() {
  cargo test --no-run --quiet --message-format=json "$@" 2> /dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if m.get("executable"):
        print(t["kind"][0], t["name"], m["executable"])
'
}
# The path of the binary of kind $1 and name $2 in the list $3.
binary() {
  awk -v kind="$1" -v name="$2" '$1 == kind && $2 == name { print $3 }' <<< "$3" | tail -1
}

failed=0
# Runs one test binary under memcheck with a filter; counts memcheck's invalid accesses.
check() {
  local label=$1 bin=$2
  shift 2
  local log="$logs/$label.log"
  local start=$SECONDS
  valgrind --tool=memcheck --leak-check=no --track-origins=no --error-limit=no \
    --log-file="$log" "$bin" --test-threads=1 "$@" > "$logs/$label.out" 2>&1 || {
    echo "memcheck: $label: the tests failed under valgrind"
    tail -30 "$logs/$label.out"
    failed=1
  }
  local invalid
  invalid=$(grep -cE "Invalid (read|write|free)|Mismatched free|invalid (read|write)" "$log" || true)
  printf 'memcheck: %-28s %3d invalid accesses, %s, %d s\n' "$label" "$invalid" \
    "$(grep -hoE '[0-9]+ passed' "$logs/$label.out" | paste -sd+ | sed 's/$/ tests passed/')" \
    $((SECONDS - start))
  if [ "$invalid" -ne 0 ]; then
    grep -E -A12 "Invalid (read|write|free)|Mismatched free" "$log" | head -60
    failed=1
  fi
}

built=$(binaries --workspace)
accelerator_lib=$(binary lib wick_accelerator "$built")
thread_world=$(binary test thread_world "$built")
core_lib=$(binary lib wick_core "$built")
tests=$(binary test tests "$built")

check barrier "$accelerator_lib" worlds::thread
check thread_world "$thread_world"
check dropped_work "$core_lib" collective::tests
check failures "$tests" failures::a_rank_that
check released_clone "$tests" fsdp::a_clone_of_a_released

if [ "${MPI:-0}" = 1 ]; then
  mpi=$(binary test mpi "$(binaries --features mpi --test mpi)")
  log="$logs/mpi.log"
  start=$SECONDS
  mpirun --allow-run-as-root --oversubscribe -np 2 \
    valgrind --tool=memcheck --leak-check=no --error-limit=no --log-file="$log.%p" \
    "$mpi" dropped-calls > "$logs/mpi.out" 2>&1 || {
    echo "memcheck: mpi: the dropped-calls run failed under valgrind"
    tail -30 "$logs/mpi.out"
    failed=1
  }
  invalid=$(cat "$log".* | grep -cE "Invalid (read|write|free)|Mismatched free" || true)
  printf 'memcheck: %-28s %3d invalid accesses, %d s\n' "mpi dropped calls (np 2)" "$invalid" \
    $((SECONDS - start))
  if [ "$invalid" -ne 0 ]; then
    cat "$log".* | grep -E -A12 "Invalid (read|write|free)|Mismatched free" | head -60
    failed=1
  fi
fi
exit "$failed"
