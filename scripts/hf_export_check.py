"""Loads a directory `wick export` wrote with transformers' AutoModelForCausalLM and prints
its validation loss over a token file's `val` windows, as `wick validate` computes it (mean
next-token cross-entropy over every position of every window of SEQ + 1 tokens, window i
starting at token i * SEQ), so that the two can be compared. Needs torch, transformers and
safetensors; CI does not run it.

    python scripts/hf_export_check.py EXPORTED_DIR TOKENS.safetensors SEQ [WICK_LOGITS]

WICK_LOGITS, written by `cargo run -p wick-models --example tiny_llama -- EXPORTED_DIR
--logits WICK_LOGITS`, holds `ids` and wick's `logits` for them: the script prints the
largest difference from transformers' logits of the same ids.

An EXPORTED_DIR that `wick export --adapter` wrote (adapter_config.json) is loaded with
peft's PeftModel.from_pretrained over the base model its config names (needs peft); its
WICK_LOGITS can come from the `--merge` export of the same checkpoint.
"""

import json
import os

import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main(model_dir, tokens, seq, wick_logits=None):
    adapter_config = os.path.join(model_dir, "adapter_config.json")
    if os.path.exists(adapter_config):
        from peft import PeftModel

        base = json.load(open(adapter_config))["base_model_name_or_path"]
        base_model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        model = PeftModel.from_pretrained(base_model, model_dir)
        weights = "adapter_model.safetensors"
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        weights = "model.safetensors"
    model.eval()
    val = load_file(tokens)["val"].to(torch.int64)
    windows = (val.numel() - 1) // seq
    batch = torch.stack([val[i * seq : i * seq + seq + 1] for i in range(windows)])
    with torch.no_grad():
        logits = model(input_ids=batch[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
    )
    names = sorted(load_file(os.path.join(model_dir, weights)).keys())
    print(f"transformers loaded {model_dir} ({type(model).__name__}, {len(names)} tensors): "
          f"val_loss {loss.item():.6f} over {windows} windows of {seq}")
    if wick_logits:
        wick = load_file(wick_logits)
        with torch.no_grad():
            theirs = model(input_ids=wick["ids"].to(torch.int64)).logits
        diff = (theirs - wick["logits"]).abs().max().item()
        print(f"logits of {wick['ids'].numel()} tokens: max |transformers - wick| = {diff:.3e}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:5])
