#!/usr/bin/env bash
# What the loggers cost the main job: `wick fit --no-progress` (400 steps, the defaults)
# with --logger csv against --logger csv,tensorboard,mlflow (a local mlflow server),
# alternating, ROUNDS rounds (default 3), after one uncounted run; prints each run's wall seconds and the ratio of
# the medians. The server shares the machine's cores with the training; SERVER_NICE=19 runs
# it at the lowest priority, to stand for a tracking server on another machine (what is then
# left is wick's own cost). Usage: [SERVER_NICE=N] scripts/logger-cost.sh PYTHON_WITH_MLFLOW
# [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
py=$1
rounds=${2:-3}
wick=${WICK:-target/release/wick}
tmp=$(mktemp -d)
server=
trap '[ -n "$server" ] && kill "$server"; rm -rf "$tmp"' EXIT
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
${SERVER_NICE:+nice -n "$SERVER_NICE"} "$(dirname "$py")/mlflow" server --host 127.0.0.1 --port "$port" --workers 1 \
  --backend-store-uri "sqlite:///$tmp/mlflow.db" --default-artifact-root "$tmp/artifacts" \
  > "$tmp/mlflow.log" 2>&1 &
server=$!
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 1; done
# A run first, not counted: the server finishes starting (its first requests are slow and
# its start-up work would fall on whichever run came first).
"$wick" fit --no-progress --no-checkpoints --log-dir "$tmp/runs" --max-steps 20 \
  --logger mlflow --mlflow-uri "http://127.0.0.1:$port" > /dev/null
sleep 5
run() {
  local start end
  start=$(date +%s.%N)
  "$wick" fit --no-progress --no-checkpoints --log-dir "$tmp/runs" "$@" > /dev/null
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f\n", b - a }'
}
csv=() all=()
for r in $(seq "$rounds"); do
  csv+=("$(run --logger csv)")
  all+=("$(run --logger csv,tensorboard,mlflow --mlflow-uri "http://127.0.0.1:$port")")
  echo "round $r: csv ${csv[-1]} s, csv+tensorboard+mlflow ${all[-1]} s"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
m_csv=$(median "${csv[@]}") m_all=$(median "${all[@]}")
echo "median: csv $m_csv s, csv+tensorboard+mlflow $m_all s, ratio $(awk -v a="$m_all" -v b="$m_csv" 'BEGIN { printf "%.4f", a / b }')"
