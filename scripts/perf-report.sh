#!/usr/bin/env bash
# wick against PyTorch on this CPU, in one run: the throughput example's `--compare` rows
# and scripts/torch_baseline.py's, alternating for ROUNDS rounds so that the machine's
# drift falls on both alike. Prints each row's median tokens/s for both, their ratio, and
# the model FLOPs utilisation of both over the median peak (a large square matmul of
# Candle's GEMM, measured at the start of each wick round), the FLOPs per token as the
# throughput example counts them; and the median of torch.mm's own peak (its BLAS) beside.
#
# usage: scripts/perf-report.sh THROUGHPUT PYTHON [ROUNDS]     (from the repository's root)
#   THROUGHPUT  cargo build --release --example throughput: target/release/examples/throughput
#   PYTHON      a python with torch and transformers (not in CI)
set -euo pipefail
bin=$(realpath "$1")
py=$2
rounds=${3:-3}
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for round in $(seq "$rounds"); do
  echo "round $round of $rounds" >&2
  "$bin" --compare >> "$rows"
  "$py" scripts/torch_baseline.py --d-model 128 512 --llama >> "$rows"
done
python3 - "$rows" <<'EOF'
import statistics
import sys

rows, peaks, torch_peaks, per_token = {}, [], [], {}
for line in open(sys.argv[1]):
    fields = dict(f.split("=", 1) for f in line.split())
    if "peak_gflops" in fields:
        peaks.append(float(fields["peak_gflops"]))
        continue
    if "mm_peak_gflops" in fields:
        torch_peaks.append(float(fields["mm_peak_gflops"]))
        continue
    key = (fields["model"], fields["strategy"], int(fields["world"]))
    rows.setdefault((fields["impl"],) + key, []).append(float(fields["tokens_per_s"]))
    if fields["impl"] == "wick":
        per_token[key[0]] = float(fields["flops_per_token"])

peak = statistics.median(peaks)
mfu = lambda model, tps: tps * per_token[model] / 1e9 / peak
for name, values in [("peak_gflops", peaks), ("torch_mm_peak_gflops", torch_peaks)]:
    print(f"{name} median {statistics.median(values):.1f} "
          f"({len(values)} rounds: {', '.join(f'{v:.1f}' for v in values)})")
for key in sorted({k[1:] for k in rows}):
    model, strategy, world = key
    wick = statistics.median(rows.get(("wick",) + key, [float("nan")]))
    torch = statistics.median(rows.get(("torch",) + key, [float("nan")]))
    print(f"model={model} strategy={strategy} world={world} wick_tokens_per_s={wick:.0f} "
          f"torch_tokens_per_s={torch:.0f} ratio={wick / torch:.3f} "
          f"wick_mfu={mfu(model, wick):.3f} torch_mfu={mfu(model, torch):.3f}")
EOF
