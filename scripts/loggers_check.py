"""wick's loggers read back by their own tools (run by scripts/loggers-check.sh).

  loggers_check.py tensorboard RUN_DIR       TensorBoard's EventAccumulator against metrics.csv
  loggers_check.py mlflow URI RUN_DIR NAME   the MLflow run NAME, through the server's REST API
  loggers_check.py mlflow-nan URI RUN_DIR NAME  NaN losses stored as NaN, later steps sent
  loggers_check.py mlflow-dpo URI RUN_DIR NAME  a DPO run's rewards/* and logps/* under train/
  loggers_check.py mlflow-failed URI NAME    the run NAME is marked FAILED
"""
import csv
import json
import math
import sys
import urllib.parse
import urllib.request

import numpy as np


def csv_rows(run_dir):
    with open(f"{run_dir}/metrics.csv") as f:
        return list(csv.DictReader(f))


def as_f32(x):
    return float(np.float32(float(x)))


def tensorboard(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    rows = csv_rows(run_dir)
    loss = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    want = [(int(r["step"]), as_f32(r["train_loss"])) for r in rows]
    assert loss == want, f"train/loss {loss} != metrics.csv {want}"
    for tag, column in [("train/lr", "lr"), ("train/grad_norm", "grad_norm")]:
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert got == [(int(r["step"]), as_f32(r[column])) for r in rows], tag
    # metrics.csv rounds the utilisation to 4 places.
    mfu = [(e.step, e.value) for e in acc.Scalars("train/mfu")]
    assert [s for s, _ in mfu] == [int(r["step"]) for r in rows], "train/mfu steps"
    for (s, v), r in zip(mfu, rows):
        assert 0 < v < 1 and abs(v - float(r["mfu"])) <= 5.1e-5, (s, v, r["mfu"])
    val = [(e.step, e.value) for e in acc.Scalars("val/loss")]
    want_val = [(int(r["step"]), as_f32(r["val_loss"])) for r in rows if r["val_loss"]]
    assert val == want_val and val, f"val/loss {val} != {want_val}"
    ppl = [(e.step, e.value) for e in acc.Scalars("val/perplexity")]
    for (s, v), (_, p) in zip(val, ppl):
        assert math.isclose(p, math.exp(v), rel_tol=1e-5), (s, v, p)
    assert "train/peak_memory_gib" in acc.Tags()["scalars"]
    assert "options" in acc.Tags()["tensors"], acc.Tags()
    text = acc.Tensors("options")[-1].tensor_proto.string_val[0].decode()
    assert "| strategy | fsdp |" in text, text
    print(f"tensorboard: {len(loss)} steps of train/loss equal metrics.csv's, "
          f"{len(val)} of val/loss, the options as text ({run_dir})")


def rest(uri, endpoint, body=None, query=None):
    url = f"{uri}/api/2.0/mlflow/{endpoint}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as answer:
        return json.load(answer)


def run_named(uri, name):
    runs = rest(uri, "runs/search", {"experiment_ids": ["0"], "max_results": 100})["runs"]
    named = [r for r in runs if r["info"]["run_name"] == name]
    assert len(named) == 1, f"{len(named)} runs named {name}"
    return named[0]


def mlflow(uri, run_dir, name):
    run = run_named(uri, name)
    assert run["info"]["status"] == "FINISHED", run["info"]
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params.get("strategy") == "fsdp" and params.get("max-steps") == "12", params
    history = rest(uri, "metrics/get-history",
                   query={"run_id": run["info"]["run_id"], "metric_key": "train/loss"})["metrics"]
    got = sorted((m["step"], m["value"]) for m in history)
    want = [(int(r["step"]), float(r["train_loss"])) for r in csv_rows(run_dir)]
    assert got == want, f"train/loss {got} != metrics.csv {want}"
    # Every metric the loggers share reached the run (their latest values).
    latest = {m["key"] for m in run["data"]["metrics"]}
    for key in ["train/lr", "train/grad_norm", "train/tokens_per_s", "train/mfu",
                "train/peak_memory_gib", "train/comm_wait_s", "train/skipped_steps",
                "val/loss", "val/perplexity"]:
        assert key in latest, f"{key} not in {sorted(latest)}"
    print(f"mlflow: run {name} FINISHED with {len(params)} params and {len(got)} steps of "
          f"train/loss equal to metrics.csv's")


def mlflow_dpo(uri, run_dir, name):
    """A preference run's own metrics (TRL's rewards/* and logps/*) reach MLflow under train/,
    every step equal to metrics.csv's column."""
    run = run_named(uri, name)
    assert run["info"]["status"] == "FINISHED", run["info"]
    rows = csv_rows(run_dir)
    columns = [c for c in rows[0] if c.startswith(("rewards/", "logps/"))]
    assert len(columns) == 6, f"columns {list(rows[0])}"
    for column in columns:
        history = rest(uri, "metrics/get-history",
                       query={"run_id": run["info"]["run_id"], "metric_key": f"train/{column}"})
        got = sorted((m["step"], m["value"]) for m in history["metrics"])
        want = [(int(r["step"]), float(r[column])) for r in rows]
        assert got == want, f"train/{column} {got} != metrics.csv {want}"
    print(f"mlflow: run {name} FINISHED with {len(columns)} preference metrics of {len(rows)} "
          f"steps equal to metrics.csv's")


def mlflow_nan(uri, run_dir, name):
    run = run_named(uri, name)
    assert run["info"]["status"] == "FINISHED", run["info"]
    history = rest(uri, "metrics/get-history",
                   query={"run_id": run["info"]["run_id"], "metric_key": "train/loss"})["metrics"]
    got = {m["step"]: float(m["value"]) for m in history}
    want = {int(r["step"]): float(r["train_loss"]) for r in csv_rows(run_dir)}
    nan = [s for s, v in want.items() if not math.isfinite(v)]
    assert nan, f"no NaN or infinite loss in metrics.csv: {want}"
    assert sorted(got) == sorted(want), f"steps {sorted(got)} != metrics.csv's {sorted(want)}"
    for step, value in want.items():
        same = math.isnan(value) and math.isnan(got[step]) or got[step] == value
        assert same, f"step {step}: mlflow {got[step]} != metrics.csv {value}"
    print(f"mlflow: run {name} FINISHED with {len(nan)} non-finite losses stored as they are, "
          f"{len(got)} steps in all")


def mlflow_failed(uri, name):
    status = run_named(uri, name)["info"]["status"]
    assert status == "FAILED", status
    print(f"mlflow: the failed run {name} is FAILED")


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"tensorboard": tensorboard, "mlflow": mlflow, "mlflow-nan": mlflow_nan,
     "mlflow-dpo": mlflow_dpo, "mlflow-failed": mlflow_failed}[command](*args)
