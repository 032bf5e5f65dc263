#!/usr/bin/env bash
# Checks of the `wick` program with ranks as processes under mpirun (Open MPI):
#   1. the main job under `mpirun -np 2` logs the same train_loss at every step as
#      `--devices 2` with threads, in the same CSV, and only rank 0 reports; so does a LoRA
#      fine-tune of the Qwen2 fixture under fsdp; and DPO under fsdp, whole (the reference
#      log-probabilities computed by rank 0's pass and read by the other processes) and
#      LoRA (the adapters off), every metric TRL names as with threads;
#   2. checkpoints cross engines (zero3): one saved by processes has the same bytes as one
#      saved by threads; resumed by the other engine at the same world size it ends where
#      the uninterrupted run ends (1e-5), and at another world size (saved under mpirun
#      -np 4, resumed by 2 threads, and the reverse) where the same reshard with threads
#      alone ends;
#   3. a rank killed with SIGKILL mid-fit: mpirun and every other rank exit non-zero within
#      30 s, and `last` still names a checkpoint that loads;
#   4. bad launches: --devices against the launcher's count, a build without the `mpi`
#      feature under mpirun, and consolidate (one process's job) under mpirun -np 2, each a
#      clear error, no hang, no files.
#
# usage: scripts/mpi-check.sh MPI_WICK PLAIN_WICK PYTHON
#   MPI_WICK    a release `wick` built with --features mpi
#   PLAIN_WICK  a release `wick` built without it
#   PYTHON      a python with numpy and safetensors (to compare consolidated parameters)
set -euo pipefail
source "$(dirname "$0")/checks-lib.sh"
mpi_wick=$(realpath "$1")
plain_wick=$(realpath "$2")
python=$3
repo=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
mpirun=(mpirun --allow-run-as-root --oversubscribe)
quiet=(--no-progress --val-every 1000000)
fail() { echo "FAILED: $*" >&2; exit 1; }

echo "== 1. main job: mpirun -np 2 against --devices 2 (threads)"
"${mpirun[@]}" -np 2 "$mpi_wick" fit --max-steps 20 --no-checkpoints --no-progress \
  --log-dir procs > procs.out
"$mpi_wick" fit --devices 2 --max-steps 20 --no-checkpoints --no-progress --log-dir threads > threads.out
cat procs.out
[ "$(grep -c '^trained ' procs.out)" = 1 ] || fail "the report was printed $(grep -c '^trained ' procs.out) times"
[ "$(grep -c '^total params' procs.out)" = 1 ] || fail "the model summary was not printed once"
"$python" - procs/char-gpt/metrics.csv threads/char-gpt/metrics.csv <<'EOF'
import csv, sys
a, b = (list(csv.reader(open(p))) for p in sys.argv[1:3])
assert a[0] == b[0], f"headers differ: {a[0]} vs {b[0]}"
assert len(a) == len(b) == 21, f"{len(a) - 1} and {len(b) - 1} rows"
worst = max(abs(float(x[2]) - float(y[2])) for x, y in zip(a[1:], b[1:]))
assert worst <= 1e-5, f"train_loss differs by {worst}"
print(f"20 steps, same CSV format, max |train_loss diff| {worst:g}")
EOF

echo "== 1b. LoRA (fsdp, frozen base weights beside adapters in each unit): mpirun -np 2 against threads"
"$mpi_wick" prepare --tokenizer "$repo/tests/fixtures/hf/qwen2/tokenizer.json" \
  --output lora-tokens.safetensors "$repo/data/licenses.txt" > /dev/null
lora=(fit --model "$repo/tests/fixtures/hf/qwen2" --data lora-tokens.safetensors --seq 32
  --batch-size 4 --max-steps 6 --strategy fsdp --lora-rank 4 --lora-targets q_proj,v_proj,down_proj
  --no-checkpoints "${quiet[@]}")
"${mpirun[@]}" -np 2 "$mpi_wick" "${lora[@]}" --log-dir lora-procs > /dev/null
"$mpi_wick" "${lora[@]}" --devices 2 --log-dir lora-threads > /dev/null
"$python" - lora-procs/qwen2/metrics.csv lora-threads/qwen2/metrics.csv <<'EOF'
import csv, sys
a, b = (list(csv.reader(open(p))) for p in sys.argv[1:3])
assert len(a) == len(b) == 7, f"{len(a) - 1} and {len(b) - 1} rows"
worst = max(abs(float(x[2]) - float(y[2])) for x, y in zip(a[1:], b[1:]))
assert worst <= 1e-6, f"train_loss differs by {worst}"
print(f"LoRA: 6 steps, max |train_loss diff| processes vs threads {worst:g}")
EOF

echo "== 1c. DPO (fsdp): mpirun -np 2 against threads, whole (a precomputed reference) and LoRA"
"$mpi_wick" prepare --format jsonl --tokenizer "$repo/tests/fixtures/hf/llama/tokenizer.json" \
  --output pairs.safetensors --val-fraction 0.25 "$repo/tests/fixtures/hf/dpo/pairs.jsonl" > /dev/null
dpo=(fit --model "$repo/tests/fixtures/hf/llama" --data pairs.safetensors --objective dpo
  --lr 1e-3 --seq 64 --batch-size 4 --max-steps 4 --strategy fsdp --no-checkpoints "${quiet[@]}")
for kind in whole lora; do
  extra=()
  [ "$kind" = lora ] && extra=(--lora-rank 4)
  # The whole model's reference file is made by the first run and read by the second:
  # each engine makes its own.
  rm -f pairs.safetensors.dpo-reference
  "${mpirun[@]}" -np 2 "$mpi_wick" "${dpo[@]}" "${extra[@]}" --log-dir dpo-procs-$kind > /dev/null
  if [ "$kind" = whole ]; then
    [ -f pairs.safetensors.dpo-reference ] || fail "no reference file after the processes' DPO run"
    mv pairs.safetensors.dpo-reference procs.dpo-reference
  fi
  "$mpi_wick" "${dpo[@]}" "${extra[@]}" --devices 2 --log-dir dpo-threads-$kind > /dev/null
  if [ "$kind" = whole ]; then
    cmp procs.dpo-reference pairs.safetensors.dpo-reference || fail "the processes' reference file differs from the threads'"
  fi
  "$python" - dpo-procs-$kind/llama/metrics.csv dpo-threads-$kind/llama/metrics.csv "$kind" <<'EOF'
import csv, sys
a, b = (list(csv.DictReader(open(p))) for p in sys.argv[1:3])
assert len(a) == len(b) == 4, f"{len(a)} and {len(b)} rows"
names = ["train_loss"] + [n for n in a[0] if n.startswith(("rewards/", "logps/"))]
assert len(names) == 7, f"columns {list(a[0])}"
worst = max(abs(float(x[n]) - float(y[n])) for x, y in zip(a, b) for n in names)
assert worst <= 1e-5, f"differs by {worst}"
moved = abs(float(a[-1]["train_loss"]) - float(a[0]["train_loss"]))
print(f"DPO {sys.argv[3]}: 4 steps, {len(names)} metrics, max diff processes vs threads {worst:g} "
      f"(the loss moved {moved:.3g})")
EOF
done

echo "== 2. checkpoints across engines (zero3)"
# One learning-rate schedule for runs of 6 and of 12 steps, so a 6-step run is the first
# half of a 12-step one.
# The two runs whose step 6 is compared log into folders of their own (their manifests
# record them as `run`).
z3=(--strategy zero3 "${quiet[@]}" --save-every 6 --decay-steps 12)
fit() { "$@" > /dev/null; }
# Uninterrupted, with threads at 2 and at 4 ranks (saving at steps 6 and 12).
fit "$mpi_wick" fit --devices 4 "${z3[@]}" --max-steps 12 --checkpoint-dir ck-u4 --log-dir runs-u4
fit "$mpi_wick" fit --devices 2 "${z3[@]}" --max-steps 12 --checkpoint-dir ck-u2 --log-dir runs
# Saved by 4 processes; resumed by 4 threads and by 2 threads.
fit "${mpirun[@]}" -np 4 "$mpi_wick" fit "${z3[@]}" --max-steps 6 --checkpoint-dir ck-p4 --log-dir runs-p4
fit "$mpi_wick" fit --devices 4 "${z3[@]}" --max-steps 12 --resume ck-p4/step-00000006 --checkpoint-dir ck-p4-t4 --log-dir runs
fit "$mpi_wick" fit --devices 2 "${z3[@]}" --max-steps 12 --resume ck-p4/step-00000006 --checkpoint-dir ck-p4-t2 --log-dir runs
# Saved by 2 threads; resumed by 2 and by 4 processes, and (the reference) by 4 threads.
fit "${mpirun[@]}" -np 2 "$mpi_wick" fit "${z3[@]}" --max-steps 12 --resume ck-u2/step-00000006 --checkpoint-dir ck-t2-p2 --log-dir runs
fit "${mpirun[@]}" -np 4 "$mpi_wick" fit "${z3[@]}" --max-steps 12 --resume ck-u2/step-00000006 --checkpoint-dir ck-t2-p4 --log-dir runs
fit "$mpi_wick" fit --devices 4 "${z3[@]}" --max-steps 12 --resume ck-u2/step-00000006 --checkpoint-dir ck-t2-t4 --log-dir runs
# The reference of ck-p4-t2: the threads' own step 6 at 4 ranks, resumed by 2 threads.
fit "$mpi_wick" fit --devices 2 "${z3[@]}" --max-steps 12 --resume ck-u4/step-00000006 --checkpoint-dir ck-t4-t2 --log-dir runs
for f in rank-0.safetensors rank-1.safetensors rank-2.safetensors rank-3.safetensors; do
  cmp ck-u4/step-00000006/$f ck-p4/step-00000006/$f || fail "$f saved by processes differs from threads"
done
# The manifests differ only in the log directory each run recorded (`run`).
"$python" - ck-u4/step-00000006/manifest.json ck-p4/step-00000006/manifest.json <<'EOF' || fail "manifest.json saved by processes differs from threads"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert (a.pop("run"), b.pop("run")) == ("runs-u4/char-gpt", "runs-p4/char-gpt"), "the runs' log directories"
assert a == b, "the manifests differ beyond the run's log directory"
EOF
echo "step 6 saved by 4 processes has the same bytes as by 4 threads (rank files; the manifest but for its run)"
for c in u4 u2 p4-t4 p4-t2 t2-p2 t2-p4 t2-t4 t4-t2; do
  "$mpi_wick" consolidate ck-$c/last $c.safetensors > /dev/null
done
"$python" - <<'EOF'
import numpy as np
from safetensors.numpy import load_file
def diff(a, b):
    a, b = load_file(a + ".safetensors"), load_file(b + ".safetensors")
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)
# Same world size, other engine: where the uninterrupted run ends.
for got, want, what in (("p4-t4", "u4", "saved by 4 processes, resumed by 4 threads"),
                        ("t2-p2", "u2", "saved by 2 threads, resumed by 2 processes")):
    d = diff(got, want)
    assert d <= 1e-5, f"{what}: {d} from the uninterrupted run"
    print(f"{what}: step 12 within {d:g} of the uninterrupted run")
# Another world size: the engine changes nothing; the world size changes the float sums,
# as it does with threads alone.
for got, ref, want, what in (("p4-t2", "t4-t2", "u4", "saved by 4 processes, resumed by 2 threads"),
                             ("t2-p4", "t2-t4", "u2", "saved by 2 threads, resumed by 4 processes")):
    d = diff(got, ref)
    assert d <= 1e-5, f"{what}: {d} from the same reshard with threads only"
    print(f"{what}: within {d:g} of the same reshard with threads only, "
          f"{diff(got, want):.2g} from the uninterrupted run at the first world size")
print(f"(uninterrupted runs at 2 and at 4 threads differ by {diff('u2', 'u4'):.2g} after 12 steps)")
EOF

echo "== 3. a rank killed with SIGKILL"
set +e
"${mpirun[@]}" -np 2 "$mpi_wick" fit --max-steps 1000000 --save-every 5 --keep-last 2 \
  "${quiet[@]}" --checkpoint-dir ck-k --log-dir runs > kill.out 2>&1 &
launcher=$!
for _ in $(seq 600); do [ -f ck-k/last ] && break; sleep 0.1; done
[ -f ck-k/last ] || fail "no checkpoint after 60 s"
sleep 1
ranks=$(pgrep -P "$launcher")
victim=$(rank_pid "$launcher" 1)
[ -n "$victim" ] || fail "rank 1's process not found among mpirun's children ($ranks)"
start=$(date +%s%N)
kill -9 "$victim"
wait "$launcher"
rc=$?
set -e
# A process is gone when /proc has no entry for it or it is a zombie.
running() { for p in $ranks; do [ -r /proc/"$p"/stat ] && ! grep -q '^[0-9]* ([^)]*) Z' /proc/"$p"/stat && echo "$p"; done; true; }
while [ -n "$(running)" ] && [ $(($(date +%s%N) - start)) -lt 30000000000 ]; do sleep 0.05; done
ms=$((($(date +%s%N) - start) / 1000000))
seconds=$((ms / 1000)).$(printf %03d $((ms % 1000)))
alive=$(running)
echo "mpirun exited $rc; ${seconds} s after SIGKILL to rank 1 (pid $victim) every rank process was gone"
[ "$rc" -ne 0 ] || fail "mpirun exited 0 after a rank was killed"
[ -z "$alive" ] || fail "ranks still running 30 s after the kill: $alive"
last=$(cat ck-k/last)
step=$((10#${last##*-}))
"$mpi_wick" fit --devices 2 "${quiet[@]}" --no-checkpoints --resume ck-k/last \
  --max-steps $((step + 1)) --log-dir runs > resumed.out
echo "last names $last, which loads: $(grep '^trained' resumed.out)"

echo "== 4. bad launches"
set +e
timeout 120 "${mpirun[@]}" -np 2 "$mpi_wick" fit --devices 3 --log-dir bad1 > bad1.out 2>&1
rc=$?
set -e
grep -q "3 asked, but mpirun started 2 processes" bad1.out || { cat bad1.out; fail "--devices 3 under -np 2: no clear error"; }
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "--devices 3 under -np 2 exited $rc"
[ ! -e bad1 ] || fail "--devices 3 under -np 2 wrote files"
echo "--devices 3 under mpirun -np 2: exit $rc, $(grep -m1 '^error' bad1.out)"
set +e
timeout 120 "${mpirun[@]}" -np 2 "$plain_wick" fit --log-dir bad2 --checkpoint-dir bad2ck > bad2.out 2>&1
rc=$?
set -e
grep -q "built without the \`mpi\` feature" bad2.out || { cat bad2.out; fail "a build without mpi ran under mpirun"; }
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "a build without mpi under mpirun exited $rc"
[ ! -e bad2 ] && [ ! -e bad2ck ] || fail "a build without mpi under mpirun wrote files"
echo "a build without the mpi feature under mpirun -np 2: exit $rc, $(grep -m1 '^error' bad2.out)"
set +e
timeout 120 "${mpirun[@]}" -np 2 "$mpi_wick" consolidate ck-u2/last two.safetensors > bad3.out 2>&1
rc=$?
set -e
grep -q "wick consolidate, export and prepare write from one process" bad3.out || { cat bad3.out; fail "consolidate ran under mpirun -np 2"; }
[ "$rc" -ne 0 ] && [ ! -e two.safetensors ] || fail "consolidate under mpirun -np 2 exited $rc or wrote a file"
echo "consolidate under mpirun -np 2: exit $rc, $(grep -m1 '^error' bad3.out)"
echo "mpi-check: all passed"
