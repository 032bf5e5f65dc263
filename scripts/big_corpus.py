"""Writes a token file of random ids larger than memory, for scripts/big-corpus.sh: `train`
of TRAIN_GB gigabytes of u16 ids below the vocabulary of the tokenizer it names (in the
metadata, as `wick prepare` writes it), `val` of a few windows, and with `documents` each
split's document starts (`train_starts`, `val_starts`: documents of 16 to 511 tokens), which
`fit --packing documents` packs. Written a block at a time, so the writer's memory stays
small.

usage: python scripts/big_corpus.py OUT TRAIN_GB TOKENIZER_SHA256 VOCAB [documents]
"""
import json
import struct
import sys

import numpy as np

BLOCK = 1 << 26  # ids (or starts) per block written
VAL = 1 << 16


def document_lengths(tokens):
    """The lengths of the documents that cover `tokens`, a block at a time (the same seed
    every pass), the last one cut to what is left."""
    rng = np.random.default_rng(1)
    left = tokens
    while left > 0:
        lengths = rng.integers(16, 512, size=1 << 20)
        ends = np.cumsum(lengths)
        if ends[-1] >= left:
            keep = int(np.searchsorted(ends, left)) + 1
            lengths = lengths[:keep]
            lengths[-1] -= int(ends[keep - 1] - left)
        left -= int(lengths.sum())
        yield lengths


def main(out, gigabytes, tokenizer, vocab, documents=None):
    train = int(float(gigabytes) * (1 << 30)) // 2
    vocab = int(vocab)
    tensors = [("train", "U16", 2, train)]
    counts = {}
    if documents:
        counts = {name: sum(len(b) for b in document_lengths(n)) for name, n in [("train", train), ("val", VAL)]}
        tensors.append(("train_starts", "I64", 8, counts["train"]))
    tensors.append(("val", "U16", 2, VAL))
    if documents:
        tensors.append(("val_starts", "I64", 8, counts["val"]))
    header = {"__metadata__": {"wick.tokenizer": tokenizer, "wick.vocab_size": str(vocab)}}
    at = 0
    for name, dtype, size, n in tensors:
        header[name] = {"dtype": dtype, "shape": [n], "data_offsets": [at, at + size * n]}
        at += size * n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    rng = np.random.default_rng(0)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, _, _, n in tensors:
            if name.endswith("_starts"):
                tokens = train if name == "train_starts" else VAL
                start = 0
                for lengths in document_lengths(tokens):
                    starts = start + np.concatenate([[0], np.cumsum(lengths)[:-1]])
                    f.write(starts.astype("<i8").tobytes())
                    start += int(lengths.sum())
                continue
            while n > 0:
                k = min(n, BLOCK)
                f.write(rng.integers(0, vocab, size=k, dtype=np.uint16).tobytes())
                n -= k


if __name__ == "__main__":
    main(*sys.argv[1:])
