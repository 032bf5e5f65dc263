#!/usr/bin/env bash
# wick's loggers read back by their own tools: TensorBoard's EventAccumulator reads a run
# resumed from its middle and finds every step's train/loss equal to metrics.csv; a local
# `mlflow server` holds the run, FINISHED, with its params and metrics (checked through the
# REST API), a DPO run's own metrics too, and a failed run FAILED; a server that is down leaves the run unharmed.
# Usage: scripts/loggers-check.sh PYTHON (a Python with tensorboard, mlflow and numpy).
set -euo pipefail
cd "$(dirname "$0")/.."
py=$1
wick=${WICK:-target/release/wick}
tmp=$(mktemp -d)
server=
cleanup() {
  [ -n "$server" ] && kill "$server" 2> /dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
common=(--no-progress --val-every 5 --log-dir "$tmp/runs" --checkpoint-dir "$tmp/ck")

# TensorBoard: 20 steps, then steps 11-20 again from the checkpoint of step 10.
"$wick" fit --max-steps 20 --save-every 10 --run-name tb "${common[@]}" > /dev/null
"$wick" fit --max-steps 20 --save-every 10 --run-name tb --resume "$tmp/ck/step-00000010" \
  "${common[@]}" > /dev/null
test "$(ls "$tmp"/runs/tb/events.out.tfevents.* | wc -l)" -eq 2
"$py" scripts/loggers_check.py tensorboard "$tmp/runs/tb"

# MLflow: a server on loopback, a run that finishes and one that fails.
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
uri="http://127.0.0.1:$port"
"$(dirname "$py")/mlflow" server --host 127.0.0.1 --port "$port" --workers 1 \
  --backend-store-uri "sqlite:///$tmp/mlflow.db" --default-artifact-root "$tmp/artifacts" \
  > "$tmp/mlflow.log" 2>&1 &
server=$!
for _ in $(seq 120); do
  curl -sf "$uri/health" > /dev/null && break
  sleep 1
done
curl -sf "$uri/health" > /dev/null || { cat "$tmp/mlflow.log"; exit 1; }
"$wick" fit --max-steps 12 --no-checkpoints --run-name ml --logger csv,mlflow --mlflow-uri "$uri" \
  "${common[@]}" > /dev/null
"$py" scripts/loggers_check.py mlflow "$uri" "$tmp/runs/ml" ml
# A DPO run: the module's own metrics (TRL's rewards/* and logps/*) reach the server too.
"$wick" prepare --format jsonl --tokenizer tests/fixtures/hf/llama/tokenizer.json \
  --output "$tmp/pairs.safetensors" --val-fraction 0.25 tests/fixtures/hf/dpo/pairs.jsonl > /dev/null
"$wick" fit --model tests/fixtures/hf/llama --data "$tmp/pairs.safetensors" --objective dpo \
  --lr 1e-3 --seq 64 --batch-size 4 --max-steps 4 --no-checkpoints --run-name dpo \
  --logger csv,mlflow --mlflow-uri "$uri" "${common[@]}" > /dev/null
"$py" scripts/loggers_check.py mlflow-dpo "$uri" "$tmp/runs/dpo" dpo
# A learning rate that makes the loss overflow: the run stops with an error at a step.
if "$wick" fit --max-steps 12 --no-checkpoints --run-name boom --lr 1e30 --logger mlflow \
  --mlflow-uri "$uri" "${common[@]}" > /dev/null 2> "$tmp/boom.err"; then
  echo "the run with --lr 1e30 did not fail"; exit 1
fi
"$py" scripts/loggers_check.py mlflow-failed "$uri" boom
# NaN steps skipped, the run goes on: MLflow stores the NaN losses as NaN (not 0 or a
# refused batch), and the steps after them arrive.
"$wick" fit --max-steps 12 --no-checkpoints --run-name nan --lr 1e30 --on-nonfinite skip \
  --logger csv,mlflow --mlflow-uri "$uri" "${common[@]}" > /dev/null
"$py" scripts/loggers_check.py mlflow-nan "$uri" "$tmp/runs/nan" nan

# A server that is down: the run trains to its end, says so once, and reports what it kept.
kill "$server"; wait "$server" 2> /dev/null || true; server=
"$wick" fit --max-steps 12 --no-checkpoints --run-name down --logger csv,mlflow \
  --mlflow-uri "$uri" "${common[@]}" > "$tmp/down.out" 2> "$tmp/down.err"
grep -q "trained to step 12" "$tmp/down.out"
test "$(grep -c "training goes on" "$tmp/down.err")" -eq 1
grep -q "were not sent" "$tmp/down.err"
echo "mlflow: with the server down the run trained to step 12 and said so once"
