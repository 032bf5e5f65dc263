"""Writes tests/fixtures/hf/chat_v5: the chat fixture's tokenizer (tests/fixtures/hf/chat,
whose template is in tokenizer_config.json, the layout before transformers 5) saved again by
transformers' own `save_pretrained`, in the layout of transformers 5 (the template in
`chat_template.jinja`), with `renders.json`: what `apply_chat_template` renders for each
conversation of the fixture's chat.jsonl, without and with the generation prompt, and the
ids it tokenizes them to.

Needs transformers 5 (`pip install "transformers>=5"`; torch is not needed); CI does not run
it. Run from the repository root:

    python scripts/chat_layout_fixture.py
"""

import json
import os
import shutil

import transformers
from transformers import AutoTokenizer

SOURCE = "tests/fixtures/hf/chat"
OUT = "tests/fixtures/hf/chat_v5"


def main():
    assert int(transformers.__version__.split(".")[0]) >= 5, transformers.__version__
    shutil.rmtree(OUT, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(SOURCE)
    tok.save_pretrained(OUT)
    assert os.path.exists(os.path.join(OUT, "chat_template.jinja")), os.listdir(OUT)
    assert "chat_template" not in json.load(open(os.path.join(OUT, "tokenizer_config.json")))
    renders = []
    for line in open(os.path.join(SOURCE, "chat.jsonl")):
        messages = json.loads(line).get("messages")
        if messages is None:
            continue
        for prompt in (False, True):
            text = tok.apply_chat_template(messages, tokenize=False,
                                           add_generation_prompt=prompt)
            ids = tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                          add_generation_prompt=prompt)["input_ids"]
            renders.append({"messages": messages, "add_generation_prompt": prompt,
                            "text": text, "ids": list(ids)})
    with open(os.path.join(OUT, "renders.json"), "w") as f:
        json.dump({"transformers": transformers.__version__, "renders": renders}, f, indent=1)
    print(f"{OUT}: {sorted(os.listdir(OUT))}, {len(renders)} renders")


if __name__ == "__main__":
    main()
