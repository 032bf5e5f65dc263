"""Checks with transformers that a directory `wick export` wrote carries what its source
had: AutoTokenizer loads it with the source tokenizer's special tokens (or, where the source
had no tokenizer_config.json, those of config.json's ids), renders and tokenizes every
conversation of CHAT_JSONL as the source tokenizer does (with and without the generation
prompt), and GenerationConfig and AutoConfig load the model's defaults. Needs transformers
(torch is not needed).

    python scripts/export_check.py EXPORTED_DIR TOKENIZER_DIR MODEL_DIR [CHAT_JSONL]
"""

import json
import os
import sys

from transformers import AutoConfig, AutoTokenizer, GenerationConfig


def main(exported, tokenizer_dir, model_dir, chat_jsonl=None):
    out = AutoTokenizer.from_pretrained(exported)
    config = AutoConfig.from_pretrained(exported)
    if os.path.exists(os.path.join(tokenizer_dir, "tokenizer_config.json")):
        source = AutoTokenizer.from_pretrained(tokenizer_dir)
        want = (source.bos_token, source.eos_token)
    else:
        want = tuple(out.convert_ids_to_tokens(i) for i in (config.bos_token_id, config.eos_token_id))
    got = (out.bos_token, out.eos_token)
    assert got == want, f"{exported}: special tokens {got}, the source's {want}"
    generation = GenerationConfig.from_pretrained(exported)
    source_generation = GenerationConfig.from_pretrained(model_dir)
    assert generation.eos_token_id == source_generation.eos_token_id, (
        generation.eos_token_id, source_generation.eos_token_id)
    renders = 0
    for line in open(chat_jsonl) if chat_jsonl else []:
        messages = json.loads(line).get("messages")
        if messages is None:
            continue
        for prompt in (False, True):
            a = source.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
            b = out.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
            assert a == b, f"{exported}: renders differ:\n{a!r}\n{b!r}"
            ids = lambda t: list(t.apply_chat_template(messages, tokenize=True, return_dict=True,
                                                       add_generation_prompt=prompt)["input_ids"])
            assert ids(source) == ids(out), f"{exported}: ids differ"
            renders += 1
    print(f"{exported}: transformers reads bos/eos {got}, generation eos "
          f"{generation.eos_token_id}, {renders} chat renders equal to the source's")


if __name__ == "__main__":
    main(*sys.argv[1:])
