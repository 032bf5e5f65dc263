"""Reads a file written by `wick consolidate` with Python's safetensors (no wick code) and
checks it against the checkpoint's manifest: the same names, shapes and element count."""
import json
import sys

import numpy as np
from safetensors.numpy import load_file

model_file, checkpoint_dir = sys.argv[1], sys.argv[2]
tensors = load_file(model_file)
with open(f"{checkpoint_dir}/manifest.json") as f:
    manifest = json.load(f)
params = {p["name"]: p["shape"] for g in manifest["groups"] for p in g["params"]}
assert set(tensors) == set(params), set(tensors) ^ set(params)
for name, t in tensors.items():
    assert list(t.shape) == params[name], (name, t.shape, params[name])
    assert t.dtype == np.float32 and np.isfinite(t).all(), name
print(f"python safetensors read {len(tensors)} tensors, "
      f"{sum(t.size for t in tensors.values())} parameters, from {model_file}")
