"""Writes tests/fixtures/hf/generate.json: what transformers' greedy `generate` makes of
each family fixture (tests/fixtures/hf/FAMILY, see scripts/hf_fixtures.py) from one prompt,
token for token, and generate.safetensors: the logits each step chose from (`FAMILY`,
`[new tokens, vocab]`), for tests/generation.rs to hold wick's generation against (random
tied-embedding models repeat a token, so the logits carry the check where the tokens
cannot).

The prompt is the first 12 ids of tokenizer_ids.json (the fixtures' tokenizer on the
bundled text); each model, in f32 with eager attention, generates 40 tokens with
`do_sample=False` and its own generation config's end tokens (a fixture without a
generation_config.json ends at none), so that the cache is used well past the sliding
window (8) of the families that have one.

Needs torch and transformers; CI does not run it. Run from the repository root:

    python scripts/generation_fixtures.py
"""

import json
import os

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

FIXTURES = "tests/fixtures/hf"
FAMILIES = ["llama", "llama3", "smollm2", "mistral", "qwen2", "qwen3", "gemma2", "gpt2"]
PROMPT = 12
NEW = 40


def main():
    torch.use_deterministic_algorithms(True)
    prompt = json.load(open(os.path.join(FIXTURES, "tokenizer_ids.json")))["ids"][:PROMPT]
    out = {"transformers": transformers.__version__, "torch": torch.__version__,
           "prompt": prompt, "max_new_tokens": NEW, "families": {}}
    scores = {}
    for family in FAMILIES:
        path = os.path.join(FIXTURES, family)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                     attn_implementation="eager").eval()
        has_generation_config = os.path.exists(os.path.join(path, "generation_config.json"))
        eos = model.generation_config.eos_token_id if has_generation_config else None
        with torch.no_grad():
            gen = model.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False,
                                 eos_token_id=eos, pad_token_id=0, min_new_tokens=0,
                                 output_logits=True, return_dict_in_generate=True)
        new = gen.sequences[0, len(prompt):].tolist()
        scores[family] = torch.cat(gen.logits, dim=0).contiguous()
        out["families"][family] = {"eos_token_id": eos, "greedy": new}
        print(f"{family}: {len(new)} tokens, eos {eos}: {new[:10]}...")
    with open(os.path.join(FIXTURES, "generate.json"), "w") as f:
        json.dump(out, f, indent=1)
    save_file(scores, os.path.join(FIXTURES, "generate.safetensors"))


if __name__ == "__main__":
    main()
