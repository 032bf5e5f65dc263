#!/usr/bin/env bash
# wick's GPU checks, from the binaries scripts/gpu-build.sh put in target-gpu/; needs no Rust
# toolchain, only a CUDA driver and Python's NVIDIA wheels (cu13 and nccl) for the libraries.
#
#     scripts/gpu-check.sh             # on a machine with CUDA GPUs: runs them, prints figures
#     scripts/gpu-check.sh --dry-run   # anywhere: what can be checked without a GPU
#
# On a GPU it runs, each under a timeout: every GPU test (tests/gpu.rs: strategies on CUDA
# against the CPU at 1 rank, at 2 and 4 ranks sharing GPU 0, bf16-mixed, NCCL worlds of 1,
# and NCCL worlds across GPUs when there are 2 or more), the main job with
# `--accelerator cuda` beside the same job on the CPU, NCCL bandwidth, and the peak device
# memory of each strategy at 2 and 4 ranks (at most about 10 minutes in all). Then one
# line: how many checks passed.
#
# The dry run uses a stand-in driver (libcuda.so.1) whose every call answers
# CUDA_ERROR_NO_DEVICE. It checks that every binary loads with every library found, that
# the test binary lists the GPU tests, and that each program asked for a GPU says there is
# none, clearly and with an error status, and writes nothing. Nothing runs on a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=target-gpu
dry=false
[ "${1:-}" = --dry-run ] && dry=true
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
pass() { echo "PASS $*"; passed=$((passed + 1)); }
fail() { echo "FAIL $*"; failed=$((failed + 1)); }

for b in wick gpu-tests memory_report nccl_bandwidth; do
  [ -x "$bin/$b" ] || { echo "missing $bin/$b: run scripts/gpu-build.sh first" >&2; exit 2; }
done

if $dry; then
  # The build environment's CUDA libraries, and the stand-in driver.
  eval "$(scripts/cuda-env.sh)"
  nvidia=$(dirname "$CUDA_ROOT")
  mkdir -p "$tmp/driver"
  grep -oE "void cu[A-Za-z0-9_]+" "${WICK_CUDA_HOME:-$HOME/.cache/wick-cuda}/lib/cuda_stub.c" \
    | awk '{print "int " $2 "(void) { return 100; }"}' > "$tmp/driver/no_device.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$tmp/driver/libcuda.so.1" "$tmp/driver/no_device.c"
  export LD_LIBRARY_PATH="$tmp/driver:$nvidia/cu13/lib:$nvidia/nccl/lib:${LD_LIBRARY_PATH:-}"
else
  P=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__path__[0]))')
  export LD_LIBRARY_PATH="$P/nccl/lib:$P/cu13/lib:${LD_LIBRARY_PATH:-}"
  nvidia-smi -L
fi

for b in wick gpu-tests memory_report nccl_bandwidth; do
  missing=$(ldd "$bin/$b" | grep "not found" || true)
  [ -z "$missing" ] && pass "$b loads: every library found" || fail "$b: $missing"
done
listed=$("$bin/gpu-tests" --list --ignored 2>/dev/null | grep -c ": test$" || true)
[ "$listed" -ge 6 ] && pass "gpu-tests lists $listed GPU tests" || fail "gpu-tests lists $listed tests"

# Runs a program that must fail for want of a GPU: an error status (not a crash) and an
# error that says so.
no_gpu() {
  local name=$1; shift
  "$@" > "$tmp/out" 2>&1
  local rc=$?
  if [ "$rc" -ge 1 ] && [ "$rc" -le 101 ] && grep -qiE "no CUDA device|CUDA_ERROR_NO_DEVICE" "$tmp/out"; then
    pass "$name: a clear error without a GPU (status $rc): $(grep -iE -m1 "no CUDA device|NO_DEVICE" "$tmp/out" | cut -c1-150)"
  else
    fail "$name: status $rc"; tail -5 "$tmp/out"
  fi
}

if $dry; then
  no_gpu "gpu-tests" "$bin/gpu-tests" --ignored --test-threads 1 every_strategy_on_one_gpu
  no_gpu "wick fit --accelerator cuda" "$bin/wick" fit --accelerator cuda --max-steps 2 \
    --no-progress --log-dir "$tmp/runs" --checkpoint-dir "$tmp/ck" --save-every 1
  [ ! -e "$tmp/runs" ] && [ ! -e "$tmp/ck" ] && pass "wick fit wrote nothing" \
    || fail "wick fit wrote files without a GPU"
  no_gpu "memory_report --accelerator cuda" "$bin/memory_report" --accelerator cuda --world 2
  no_gpu "nccl_bandwidth" "$bin/nccl_bandwidth"
  echo "dry run: $passed passed, $failed failed; nothing ran on a GPU"
  [ "$failed" -eq 0 ]; exit
fi

gpus=$(nvidia-smi -L | grep -c "^GPU")
run() {
  local name=$1 limit=$2; shift 2
  local start=$(date +%s)
  if timeout "$limit" "$@"; then pass "$name ($(($(date +%s) - start)) s)"; else fail "$name (status $?)"; fi
}
skip=()
[ "$gpus" -ge 2 ] || { skip=(--skip nccl_worlds_across_gpus); echo "one GPU: the NCCL worlds across GPUs are not run"; }
run "GPU tests" 240 "$bin/gpu-tests" --ignored --nocapture --test-threads 1 "${skip[@]}"
for accel in cuda cpu; do
  run "main job, --accelerator $accel" 80 "$bin/wick" fit --accelerator "$accel" --devices 1 \
    --max-steps 100 --val-every 50 --no-progress --run-name "$accel" --log-dir "$tmp/runs" \
    --checkpoint-dir "$tmp/ck-$accel"
done
# The last train loss on the GPU within 5% of the CPU's (f32 kernels differ in order).
python3 - "$tmp/runs" <<'PY' && pass "main job: GPU and CPU losses agree" || fail "main job: GPU and CPU losses differ"
import csv, sys
last = {a: list(csv.DictReader(open(f"{sys.argv[1]}/{a}/metrics.csv")))[-1] for a in ("cuda", "cpu")}
gpu, cpu = (float(last[a]["train_loss"]) for a in ("cuda", "cpu"))
print(f"main job, step {last['cuda']['step']}: train_loss cuda {gpu:.4f}, cpu {cpu:.4f}")
sys.exit(abs(gpu - cpu) > 0.05 * cpu)
PY
run "NCCL bandwidth" 60 "$bin/nccl_bandwidth"
# The memory report's own checks (full_shard's bound, the strategies' order) must hold.
for world in 2 4; do
  out="$tmp/memory-$world"
  timeout 90 "$bin/memory_report" --accelerator cuda --world "$world" > "$out" 2>&1
  rc=$?
  cat "$out"
  if [ "$rc" -eq 0 ] && ! grep -q "(false)" "$out"; then
    pass "device memory per strategy at $world ranks: the report's checks hold"
  else
    fail "device memory per strategy at $world ranks (status $rc)"
  fi
done
echo "gpu check: $passed passed, $failed failed on $gpus GPU(s)"
[ "$failed" -eq 0 ]
