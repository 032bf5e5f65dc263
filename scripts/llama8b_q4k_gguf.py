"""A GGUF of Llama-3.1-8B's shape (its real config) whose weights are seeded random Q4_K
blocks, for the 8B QLoRA step (`wick fit --keep-quantized`, docs/performance.md): 4.5 GB,
nothing of it checked in.

Every matrix (the embedding and output head too) is random Q4_K super-blocks built to
decode to about zero mean and a 0.02 standard deviation, the init scale of the config:
each 32-value sub-block has scale and min code 32, d = 1.36e-4 and dmin = 7.5 d, so a
value is d * 32 * (q - 7.5) for a random 4-bit q. The norms are ones. The gguf package
decodes one block per tensor kind here as a check. No tokenizer is written: prepare and
fit with `--tokenizer` llama.cpp's `ggml-vocab-llama-bpe.gguf` (Llama 3's vocabulary,
which scripts/llama-vocabs.sh fetches).

    python scripts/llama8b_q4k_gguf.py OUT.gguf
"""

import sys

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize

sys.path.insert(0, "scripts")
from gguf_fixtures import add_config, rope_freqs  # noqa: E402

# meta-llama/Llama-3.1-8B's config.json, in transformers' rope_parameters form.
CONFIG = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}

Q4_K = GGMLQuantizationType.Q4_K
BLOCK, BLOCK_BYTES = GGML_QUANT_SIZES[Q4_K]


def header():
    """A super-block's first 16 bytes: d, dmin (f16) and the 12 bytes of 6-bit scales and
    mins, every sub-block's scale and min 32 (llama.cpp's get_scale_min_k4)."""
    d = np.float16(1.36e-4)
    dmin = np.float16(7.5 * float(d))
    scales = np.array([160] * 8 + [0] * 4, dtype=np.uint8)
    return np.concatenate([np.array([d, dmin], dtype=np.float16).view(np.uint8), scales])


def random_q4k(rng, rows, cols):
    """rows x cols values as random Q4_K super-blocks: (rows, cols / 256 * 144) bytes."""
    blocks = rows * cols // BLOCK
    out = np.empty((blocks, BLOCK_BYTES), dtype=np.uint8)
    out[:, :16] = header()
    out[:, 16:] = rng.integers(0, 256, size=(blocks, BLOCK_BYTES - 16), dtype=np.uint8)
    return out.reshape(rows, cols // BLOCK * BLOCK_BYTES)


def main():
    out = sys.argv[1]
    c = CONFIG
    h, m, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    rng = np.random.default_rng(0)
    w = GGUFWriter(out, "llama")
    w.add_name("wick random Llama-3.1-8B shape (Q4_K)")
    add_config(w, c)
    w.add_file_type(15)  # llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M
    w.add_tensor("rope_freqs.weight", rope_freqs(c))
    sample = random_q4k(rng, 1, BLOCK)
    values = dequantize(sample, Q4_K)
    assert abs(values.mean()) < 0.01 and 0.01 < values.std() < 0.03, (values.mean(), values.std())

    def matrix(name, rows, cols):
        w.add_tensor(name, random_q4k(rng, rows, cols), raw_dtype=Q4_K)

    def ones(name, n):
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    matrix("token_embd.weight", v, h)
    for i in range(c["num_hidden_layers"]):
        ones(f"blk.{i}.attn_norm.weight", h)
        matrix(f"blk.{i}.attn_q.weight", q, h)
        matrix(f"blk.{i}.attn_k.weight", kv, h)
        matrix(f"blk.{i}.attn_v.weight", kv, h)
        matrix(f"blk.{i}.attn_output.weight", h, q)
        ones(f"blk.{i}.ffn_norm.weight", h)
        matrix(f"blk.{i}.ffn_gate.weight", m, h)
        matrix(f"blk.{i}.ffn_up.weight", m, h)
        matrix(f"blk.{i}.ffn_down.weight", h, m)
    ones("output_norm.weight", h)
    matrix("output.weight", v, h)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
