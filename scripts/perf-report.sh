#!/usr/bin/env bash
# wick against PyTorch on this CPU, in one run: the throughput example's `--compare` rows
# and scripts/torch_baseline.py's, alternating for ROUNDS rounds so that the machine's
# drift falls on both alike. Prints each row's median tokens/s for both, their ratio, and
# the model FLOPs utilisation of both over the median peak (a large square matmul of
# Candle's GEMM, measured at the start of each wick round).
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

rows, peaks, params = {}, [], {}
for line in open(sys.argv[1]):
    fields = dict(f.split("=", 1) for f in line.split())
    if "peak_gflops" in fields:
        peaks.append(float(fields["peak_gflops"]))
        continue
    key = (fields["model"], fields["strategy"], int(fields["world"]))
    rows.setdefault((fields["impl"],) + key, []).append(float(fields["tokens_per_s"]))
    if fields["impl"] == "wick":
        params[key[0]] = int(fields["parameters"])

peak = statistics.median(peaks)
# PaLM's accounting, as the throughput example computes it.
shape = {"llama": (4, 8, 64, 256)}
for d in (128, 512):
    shape[f"gpt-d{d}"] = (4, 4, d // 4, 64)

def flops_per_token(model):
    layers, heads, head_dim, seq = shape[model]
    return 6 * params[model] + 12 * layers * heads * head_dim * seq

print(f"peak_gflops median {peak:.1f} ({len(peaks)} rounds: {', '.join(f'{p:.1f}' for p in peaks)})")
for key in sorted({k[1:] for k in rows}):
    model, strategy, world = key
    wick = statistics.median(rows.get(("wick",) + key, [float("nan")]))
    torch = statistics.median(rows.get(("torch",) + key, [float("nan")]))
    mfu = lambda tps: tps * flops_per_token(model) / 1e9 / peak
    print(f"model={model} strategy={strategy} world={world} wick_tokens_per_s={wick:.0f} "
          f"torch_tokens_per_s={torch:.0f} ratio={wick / torch:.3f} "
          f"wick_mfu={mfu(wick):.3f} torch_mfu={mfu(torch):.3f}")
EOF
