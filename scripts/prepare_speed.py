"""The Python side of scripts/prepare-speed.sh: a text corpus tokenized as Hugging Face
users do it, `datasets.load_dataset("text")` (a row per line) and `Dataset.map(batched=True)`
calling the `tokenizers` library's `encode_batch` on each batch of rows, the ids written to
the dataset's Arrow cache. Prints `python tokens=<n> seconds=<s> tokens_per_s=<r>`: the
seconds from the start to the map's end; the tokens are counted after, from the Arrow
column's list lengths (reading every row back through Python took longer than the map).

usage: python scripts/prepare_speed.py TOKENIZER_JSON CORPUS CACHE_DIR NUM_PROC
       (NUM_PROC 0: one process, `encode_batch` parallel over the cores itself)
"""
import sys
import time

import datasets
import pyarrow.compute as pc
from tokenizers import Tokenizer

tokenizer_path, corpus, cache, num_proc = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
start = time.perf_counter()
tokenizer = Tokenizer.from_file(tokenizer_path)
data = datasets.load_dataset("text", data_files=corpus, split="train", cache_dir=cache)


def encode(batch):
    return {"ids": [e.ids for e in tokenizer.encode_batch(batch["text"])]}


ids = data.map(encode, batched=True, num_proc=num_proc or None, remove_columns=["text"])
seconds = time.perf_counter() - start
tokens = pc.sum(pc.list_value_length(ids.data.column("ids"))).as_py()
print(f"python tokens={tokens} seconds={seconds:.1f} tokens_per_s={tokens / seconds:.0f}")
