"""Writes tests/fixtures/data: instruction data in the schemas fine-tuning datasets use, as
Parquet files written by pyarrow (the Hugging Face Hub's format) beside JSON Lines files of
the same examples, for tests/program/datasets.rs to hold `wick prepare` to: each Parquet
file must give the token file its JSON Lines twin gives, byte for byte.

- `messages.parquet` (zstd pages) / `messages.jsonl`: conversations, `messages` a list of
  {role, content}, with and without a system turn, one and two exchanges;
- `sharegpt.parquet` (snappy) / `sharegpt.jsonl`: the same conversations in ShareGPT's
  schema (`conversations`, {from, value}, from `system`, `human` and `gpt`), and
  `sharegpt_as_messages.jsonl`: what they are in `messages` (the roles ShareGPT's speakers
  are);
- `alpaca.parquet` / `alpaca_as_messages.jsonl`: Alpaca's `instruction`, `input` (empty
  in some rows) and `output`, and as `messages`: a user turn of the instruction and, where
  there is one, a blank line and the input; the output as the answer;
- `prompt_completion.parquet` / `.jsonl` and `text.parquet` / `.jsonl`;
- `preference.parquet` / `.jsonl` (text `prompt`/`chosen`/`rejected`) and
  `preference_messages.parquet` / `.jsonl` (each a list of messages): preference pairs;
- `bad.parquet`: conversations whose third row has a turn without a role.

Needs pyarrow. Run from the repository root:

    python scripts/dataset_fixtures.py
"""

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

OUT = "tests/fixtures/data"

CONVERSATIONS = [
    [("user", "What does the license permit?"),
     ("assistant", "Use, copy, modify and merge.")],
    [("system", "You answer in one sentence."),
     ("user", "May I sell copies?"),
     ("assistant", "Yes, you may sell copies of the Software.")],
    [("user", "Who holds the copyright?"),
     ("assistant", "The copyright holders named in the notice."),
     ("user", "And the warranty?"),
     ("assistant", "There is none: the Software is provided as is.")],
    [("user", "Must the notice be kept?"),
     ("assistant", "Yes, in all copies or substantial portions.")],
]
SHAREGPT = {"system": "system", "user": "human", "assistant": "gpt"}
ALPACA = [
    ("Summarize the license in one line.", "", "Do anything, keep the notice, no warranty."),
    ("Translate into French.", "Permission is hereby granted.", "La permission est accordée."),
    ("Name the license.", "", "The MIT License."),
    ("Answer the question.", "Is there a warranty?", "No."),
]
PROMPT_COMPLETION = [
    ("Permission is hereby granted", ", free of charge, to any person"),
    ("THE SOFTWARE IS PROVIDED", " \"AS IS\", WITHOUT WARRANTY OF ANY KIND"),
]
TEXT = ["The above copyright notice shall be included in all copies.",
        "IN NO EVENT SHALL THE AUTHORS BE LIABLE FOR ANY CLAIM."]


def messages(conversation):
    return [{"role": r, "content": c} for r, c in conversation]


def jsonl(name, rows):
    with open(os.path.join(OUT, name), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def parquet(name, rows, compression="snappy"):
    pq.write_table(pa.Table.from_pylist(rows), os.path.join(OUT, name), compression=compression)


def main():
    os.makedirs(OUT, exist_ok=True)
    rows = [{"messages": messages(c)} for c in CONVERSATIONS]
    jsonl("messages.jsonl", rows)
    parquet("messages.parquet", rows, compression="zstd")
    sharegpt = [{"conversations": [{"from": SHAREGPT[r], "value": c} for r, c in conv]}
                for conv in CONVERSATIONS]
    jsonl("sharegpt.jsonl", sharegpt)
    parquet("sharegpt.parquet", sharegpt)
    jsonl("sharegpt_as_messages.jsonl", rows)
    alpaca = [{"instruction": i, "input": x, "output": o} for i, x, o in ALPACA]
    parquet("alpaca.parquet", alpaca)
    jsonl("alpaca_as_messages.jsonl", [
        {"messages": [{"role": "user", "content": i + ("\n\n" + x if x else "")},
                      {"role": "assistant", "content": o}]} for i, x, o in ALPACA])
    pc = [{"prompt": p, "completion": c} for p, c in PROMPT_COMPLETION]
    jsonl("prompt_completion.jsonl", pc)
    parquet("prompt_completion.parquet", pc)
    text = [{"text": t} for t in TEXT]
    jsonl("text.jsonl", text)
    parquet("text.parquet", text)
    # Preference pairs: each conversation's last answer chosen over a curt one.
    pairs = [(conv[:-1], conv[-1][1], "No comment.") for conv in CONVERSATIONS]
    text_pairs = [{"prompt": " ".join(c for _, c in p), "chosen": " " + a, "rejected": " " + r}
                  for p, a, r in pairs]
    jsonl("preference.jsonl", text_pairs)
    parquet("preference.parquet", text_pairs)
    message_pairs = [{"prompt": messages(p), "chosen": messages([("assistant", a)]),
                      "rejected": messages([("assistant", r)])} for p, a, r in pairs]
    jsonl("preference_messages.jsonl", message_pairs)
    parquet("preference_messages.parquet", message_pairs, compression="zstd")
    bad = [{"messages": messages(c)} for c in CONVERSATIONS]
    bad[2]["messages"][1]["role"] = None
    parquet("bad.parquet", bad)
    print(f"{OUT}: {len(os.listdir(OUT))} files")


if __name__ == "__main__":
    main()
