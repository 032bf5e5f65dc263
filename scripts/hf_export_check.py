"""Loads a directory `wick export` wrote with transformers' AutoModelForCausalLM and prints
its validation loss over a token file's `val` windows, as `wick validate` computes it (mean
next-token cross-entropy over every position of every window of SEQ + 1 tokens, window i
starting at token i * SEQ), so that the two can be compared. Needs torch, transformers and
safetensors; CI does not run it.

    python scripts/hf_export_check.py EXPORTED_DIR TOKENS.safetensors SEQ [WICK_LOGITS]

WICK_LOGITS, written by `cargo run -p wick-models --example tiny_llama -- EXPORTED_DIR
--logits WICK_LOGITS`, holds `ids` and wick's `logits` for them: the script prints the
largest difference from transformers' logits of the same ids.
"""

import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main(model_dir, tokens, seq, wick_logits=None):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    val = load_file(tokens)["val"].to(torch.int64)
    windows = (val.numel() - 1) // seq
    batch = torch.stack([val[i * seq : i * seq + seq + 1] for i in range(windows)])
    with torch.no_grad():
        logits = model(input_ids=batch[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
    )
    names = sorted(load_file(f"{model_dir}/model.safetensors").keys())
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
