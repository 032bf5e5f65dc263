#!/usr/bin/env bash
# wick against PyTorch on this CPU, in one run: the throughput example's `--compare` rows
# (ranks as threads), the same example's rows as two processes under `mpirun -np 2`
# (`--compare --processes`, MpiWorld), and scripts/torch_baseline.py's (eager, fused AdamW,
# DDP and FSDP2 over gloo, each rank a process; with --compile also the W=1 runs under
# torch.compile), alternating for ROUNDS rounds so that the machine's drift falls on all
# alike. PyTorch's processes get wick's glibc malloc thresholds in their environment
# (crates/accelerator/src/host_tuning.rs; wick's processes set them themselves), and every
# rank of either gets cores / W threads.
#
# Prints the CPU and its vector ISA, torch's version, then one line per row: each
# implementation's median tokens/s with its min and max over the rounds, the ratios of
# wick's rows to torch eager's (threads and processes; W=1 is one process for both) and to
# torch compiled's, and the model FLOPs utilisation of each median over the median GEMM
# peak (the GEMM kernel alone on square 1024 and 2048 matrices, at the start of each wick
# round; torch.mm's own peak, measured the same way, beside it).
#
# usage: [MODELS=gpt-d512,llama] scripts/perf-report.sh THROUGHPUT THROUGHPUT_MPI PYTHON [ROUNDS]
#          [THROUGHPUT_MKL THROUGHPUT_MKL_MPI]
#   (from the repository's root; MODELS defaults to gpt-d128,gpt-d512,llama, ROUNDS to 5)
#   THROUGHPUT      cargo build --release --example throughput
#   THROUGHPUT_MPI  the same with --features mpi (copied aside: both build to one path)
#   PYTHON          a python with torch and transformers (not in CI)
#   THROUGHPUT_MKL, THROUGHPUT_MKL_MPI  optional: the same two built with --features mkl
#                   (eval "$(scripts/mkl-env.sh)" first), run in the same rounds as more
#                   columns (Candle's matmul on Intel MKL)
set -euo pipefail
bin=$(realpath "$1")
mpi_bin=$(realpath "$2")
py=$3
rounds=${4:-5}
mkl_bin=${5:+$(realpath "$5")}
mkl_mpi_bin=${6:+$(realpath "$6")}
models=${MODELS:-gpt-d128,gpt-d512,llama}
# The same models for torch_baseline.py: the GPTs' widths, and --llama.
torch_models=(--d-model $(tr ',' '\n' <<< "$models" | sed -n 's/^gpt-d//p'))
grep -qw llama <<< "${models//,/ }" && torch_models+=(--llama)
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
# wick's malloc settings, as glibc's variables (host_tuning.rs: 32 MiB, 1 GiB, a 64 MiB
# pad, an arena a core).
malloc=(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824
  MALLOC_TOP_PAD_=67108864 MALLOC_ARENA_MAX=$(nproc))
mpirun=(mpirun --allow-run-as-root --bind-to none -np 2)
for round in $(seq "$rounds"); do
  echo "round $round of $rounds" >&2
  "$bin" --compare --models "$models" >> "$rows"
  "${mpirun[@]}" "$mpi_bin" --compare --processes --models "$models" >> "$rows"
  if [ -n "$mkl_bin" ]; then
    "$mkl_bin" --compare --models "$models" >> "$rows"
    "${mpirun[@]}" "$mkl_mpi_bin" --compare --processes --models "$models" >> "$rows"
  fi
  env "${malloc[@]}" "$py" scripts/torch_baseline.py "${torch_models[@]}" --compile >> "$rows"
done
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
isa=$(grep -m1 '^flags' /proc/cpuinfo | grep -qw avx512f && echo AVX-512 || \
  (grep -m1 '^flags' /proc/cpuinfo | grep -qw avx2 && echo AVX2 || echo 'no AVX2'))
echo "cpu: $cpu, $(nproc) cores, $isa; torch $("$py" -c 'import torch; print(torch.__version__)')"
python3 - "$rows" "$rounds" <<'PY'
import statistics
import sys

rows, peaks, torch_peaks, per_token = {}, [], [], {}
for line in open(sys.argv[1]):
    fields = dict(f.split("=", 1) for f in line.split())
    if "peak_gflops" in fields:
        peaks.append(float(fields["peak_gflops"]))
        continue
    if "impl" not in fields:
        continue
    if "mm_peak_gflops" in fields:
        torch_peaks.append(float(fields["mm_peak_gflops"]))
        continue
    # Who ran it: wick as threads or processes, torch eager or compiled.
    who = f"{fields['impl']}-{fields.get('mode', fields['transport'])}"
    if who == "wick-none":
        who = "wick-threads"  # W=1: one rank, the same process either way
    if fields.get("matmul") == "mkl":
        who += "-mkl"
    key = (fields["model"], fields["strategy"], int(fields["world"]))
    rows.setdefault(key, {}).setdefault(who, []).append(float(fields["tokens_per_s"]))
    if fields["impl"] == "wick":
        per_token[key[0]] = float(fields["flops_per_token"])
    if fields["impl"] == "torch":
        rows[key].setdefault("optimizer", set()).add(fields["optimizer"])

peak = statistics.median(peaks)
print(f"rounds: {sys.argv[2]}")
for name, values in [("gemm_peak_gflops", peaks), ("torch_mm_peak_gflops", torch_peaks)]:
    print(f"{name} median {statistics.median(values):.1f} "
          f"(min {min(values):.1f}, max {max(values):.1f})")
cols = ["wick-threads", "wick-mpi", "wick-threads-mkl", "wick-mpi-mkl", "torch-eager",
        "torch-compiled"]
for key in sorted(rows):
    model, strategy, world = key
    by = rows[key]
    med = {c: statistics.median(by[c]) for c in cols if c in by}
    cells = [f"{c}={med[c]:.0f}[{min(by[c]):.0f}-{max(by[c]):.0f}]" for c in cols if c in by]
    ratios = []
    for wick in ("wick-threads", "wick-mpi", "wick-threads-mkl", "wick-mpi-mkl"):
        for torch in ("torch-eager", "torch-compiled"):
            if wick in med and torch in med:
                ratios.append(f"{wick}/{torch}={med[wick] / med[torch]:.3f}")
    mfu = [f"mfu_{c}={med[c] * per_token[model] / 1e9 / peak:.3f}" for c in cols if c in med]
    optimizer = ",".join(sorted(by.get("optimizer", [])))
    print(f"model={model} strategy={strategy} world={world} {' '.join(cells)} "
          f"{' '.join(ratios)} {' '.join(mfu)} torch_optimizer={optimizer}")
PY
