"""Gives GGUF files to llama.cpp itself (the llama-cpp-python package's build of it) and
compares its greedy answers with wick's: for each `FILE[+ADAPTER]=WICK_TEXT` argument,
llama.cpp loads FILE (with llama.cpp's LoRA adapter file ADAPTER applied, if given), greedy-
decodes the answer to QUESTION rendered as the file's chat template renders it (ChatML:
SmolLM2's system turn, the question, the generation prompt) with an f32 KV cache, and the
answer is compared with WICK_TEXT, the answer `wick sample --chat` printed. Prints a line per
file; exits 1 if an f32 file's answers differ.

    python scripts/gguf_llama_check.py QUESTION FILE[+ADAPTER]=WICK_TEXT ...
"""

import sys

from llama_cpp import Llama

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def answer(path, adapter, question, n=48):
    llm = Llama(model_path=path, lora_path=adapter, n_ctx=512, n_threads=2, verbose=False,
                type_k=0, type_v=0)
    chat = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
            "<|im_start|>assistant\n")
    ids = llm.tokenize(chat.encode(), add_bos=False, special=True)
    out = []
    for token in llm.generate(ids, top_k=1, temp=0.0, repeat_penalty=1.0):
        if llm.token_is_eog(token) if hasattr(llm, "token_is_eog") else token == llm.token_eos():
            break
        out.append(token)
        if len(out) == n:
            break
    return llm.detokenize(out).decode(errors="replace")


def main(question, *cases):
    failed = False
    for case in cases:
        files, wick = case.split("=", 1)
        path, _, adapter = files.partition("+")
        got = answer(path, adapter or None, question)
        same = got.strip() == wick.strip()
        exact = "f32" in path and not adapter
        failed |= exact and not same
        print(f"{files}: llama.cpp {'==' if same else '!='} wick: {got.strip()!r}"
              + ("" if same else f" (wick: {wick.strip()!r})"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main(*sys.argv[1:])
