"""Writes a token file of random ids larger than memory, for scripts/big-corpus.sh: `train`
of TRAIN_GB gigabytes of u16 ids below the vocabulary of the tokenizer it names (in the
metadata, as `wick prepare` writes it), `val` of a few windows. Written a block at a time,
so the writer's memory stays small.

usage: python scripts/big_corpus.py OUT TRAIN_GB TOKENIZER_SHA256 VOCAB
"""
import json
import struct
import sys

import numpy as np

BLOCK = 1 << 26  # ids per block written (128 MiB)
VAL = 1 << 16


def main(out, gigabytes, tokenizer, vocab):
    train = int(float(gigabytes) * (1 << 30)) // 2
    vocab = int(vocab)
    header = {
        "__metadata__": {"wick.tokenizer": tokenizer, "wick.vocab_size": str(vocab)},
        "train": {"dtype": "U16", "shape": [train], "data_offsets": [0, 2 * train]},
        "val": {"dtype": "U16", "shape": [VAL], "data_offsets": [2 * train, 2 * train + 2 * VAL]},
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    rng = np.random.default_rng(0)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for n in [train, VAL]:
            while n > 0:
                k = min(n, BLOCK)
                f.write(rng.integers(0, vocab, size=k, dtype=np.uint16).tobytes())
                n -= k


if __name__ == "__main__":
    main(*sys.argv[1:])
