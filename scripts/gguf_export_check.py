"""Checks with the `gguf` package (llama.cpp's own Python reader) that a GGUF file `wick
export --gguf` wrote holds the model of the Hugging Face directory wick exported from the
same checkpoint:

- the architecture's metadata equals config.json's values;
- every tensor, dequantized by the gguf package, equals the directory's weight in llama.cpp's
  layout (Llama's query and key rows permuted, Gemma's norms + 1, GPT-2's Conv1D transposed):
  bit for bit in f32; in F16, BF16 and Q8_0 bit for bit with the gguf package's own
  quantization of that weight; in the K-quants (which the gguf package cannot quantize)
  within a tenth of each row's largest magnitude;
- the vocabulary is the directory's `tokenizer.json` (every id's token and type, the
  merges) and the chat template its `chat_template.jinja` (that the pre-tokenizer named
  tokenizes as the source does, tests/gguf_vocab.rs shows on llama.cpp's own cases; that
  llama.cpp reads the files so, scripts/gguf-llama-check.sh);
- with ADAPTER_GGUF and PEFT_DIR: the adapter file's lora_a and lora_b are PEFT's A and B (B's
  rows permuted for Llama's q and k), and alpha / r is PEFT's.

Needs numpy, safetensors and gguf.

    python scripts/gguf_export_check.py GGUF HF_DIR [ADAPTER_GGUF PEFT_DIR]
"""

import json
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T, GGUFReader
from gguf.quants import dequantize, quantize
from safetensors.numpy import load_file

ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
        "gemma2": "gemma2", "gpt2": "gpt2"}
BLOCK = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
GEMMA2 = dict(BLOCK, post_attention_layernorm="post_attention_norm",
              pre_feedforward_layernorm="ffn_norm", post_feedforward_layernorm="post_ffw_norm")
GPT2 = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
        "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output",
          "transformer.wte": "token_embd", "transformer.wpe": "position_embd",
          "transformer.ln_f": "output_norm"}


def permute(w, heads):
    """llama.cpp's order of a projection's rows within each head (its converter's)."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


# A K-quant's step over a block's range: 4 bits (15 steps), 6 bits (63 steps).
K_STEP = {T.Q4_K: 1 / 15}


def gguf_name(config, name):
    """llama.cpp's name of the Hugging Face weight `name`."""
    arch = ARCH[config["model_type"]]
    module, kind = name.rsplit(".", 1)
    parts = module.split(".")
    if parts[:2] in (["model", "layers"], ["transformer", "h"]):
        table = {"gemma2": GEMMA2, "gpt2": GPT2}.get(arch, BLOCK)
        return f"blk.{parts[2]}.{table['.'.join(parts[3:])]}.{kind}"
    return f"{GLOBAL[module]}.{kind}"


def in_gguf(config, name, w):
    """The GGUF name and values of the Hugging Face weight `name`."""
    arch = ARCH[config["model_type"]]
    module, kind = name.rsplit(".", 1)
    gguf = gguf_name(config, name)
    if arch == "llama" and ".q_proj." in name:
        w = permute(w, config["num_attention_heads"])
    if arch == "llama" and ".k_proj." in name:
        w = permute(w, config["num_key_value_heads"])
    if arch == "gpt2" and kind == "weight" and module.endswith(("c_attn", "c_proj", "c_fc")):
        w = w.T
    if arch == "gemma2" and name.endswith("norm.weight"):
        w = w + 1
    return gguf, np.ascontiguousarray(w, dtype=np.float32)


def field(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def check_metadata(reader, config):
    arch = ARCH[config["model_type"]]
    assert field(reader, "general.architecture") == arch
    if arch == "gpt2":
        pairs = {"embedding_length": "n_embd", "block_count": "n_layer",
                 "attention.head_count": "n_head", "context_length": "n_positions"}
    else:
        pairs = {"embedding_length": "hidden_size", "block_count": "num_hidden_layers",
                 "feed_forward_length": "intermediate_size",
                 "attention.head_count": "num_attention_heads",
                 "attention.head_count_kv": "num_key_value_heads",
                 "context_length": "max_position_embeddings"}
    for key, hf in pairs.items():
        got = field(reader, f"{arch}.{key}")
        assert got == config[hf], f"{arch}.{key} is {got}, config.json's {hf} {config[hf]}"
    return len(pairs)


def check_tensors(reader, config, weights):
    tensors = {t.name: t for t in reader.tensors}
    counts, worst = {}, 0.0
    for name, w in weights.items():
        gguf, want = in_gguf(config, name, w)
        t = tensors.pop(gguf)
        got = dequantize(t.data, t.tensor_type).reshape(want.shape).astype(np.float32)
        kind = t.tensor_type
        if kind == T.F32:
            same = np.array_equal(got.view(np.uint32), want.view(np.uint32))
        elif kind in (T.F16, T.BF16, T.Q8_0):
            ref = dequantize(quantize(want, kind), kind).astype(np.float32)
            same = np.array_equal(got.view(np.uint32), ref.reshape(want.shape).view(np.uint32))
        elif kind == T.Q6_K:
            # Each value at the level nearest it, of the 64 (-32..31) that its 16 values'
            # scale as the file stores it allows (a block of 256: 128 + 64 bytes of quants,
            # 16 int8 scales, the f16 scale d); a value past the last level clamps to it.
            raw = np.asarray(t.data, dtype=np.uint8).reshape(-1, 210)
            d = raw[:, 208:210].copy().view(np.float16).astype(np.float32)
            scale = (d * raw[:, 192:208].copy().view(np.int8)).reshape(-1, 1)
            x = want.reshape(-1, 16)
            safe = np.where(scale == 0, 1, scale)
            level = np.where(scale == 0, 0, np.clip(np.round(x / safe), -32, 31)) * scale
            best = np.abs(level - x)
            error = np.abs(got.reshape(-1, 16) - x)
            same = bool((error <= best + 1e-6 * np.abs(scale)).all())
        else:
            # Within one step of the type's levels over each block of 32 values' range.
            blocks = want.reshape(-1, 32)
            spread = blocks.max(axis=1, keepdims=True) - blocks.min(axis=1, keepdims=True)
            error = np.abs(got.reshape(-1, 32) - blocks) / spread
            worst = max(worst, float(error.max()))
            same = bool((error <= K_STEP[kind]).all())
        assert same, f"{gguf} ({kind.name}) is not {name}"
        counts[kind.name] = counts.get(kind.name, 0) + 1
    assert not tensors, f"tensors the model does not have: {sorted(tensors)}"
    return counts, worst


def check_tokenizer(reader, hf_dir):
    """The GGUF's vocabulary is the directory's tokenizer.json: every id's token (added
    tokens' types: control where special, user-defined otherwise), the merges, and the chat
    template."""
    source = json.load(open(os.path.join(hf_dir, "tokenizer.json")))
    by_id = {i: (t, 1) for t, i in source["model"]["vocab"].items()}
    for added in source["added_tokens"]:
        by_id[added["id"]] = (added["content"], 3 if added["special"] else 4)
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    for i, (token, kind) in sorted(by_id.items()):
        assert tokens[i] == token and types[i] == kind, (i, tokens[i], types[i], token, kind)
    assert all(t.startswith("[PAD") for t in tokens[len(by_id):]), tokens[len(by_id):]
    merges = [m if isinstance(m, str) else " ".join(m) for m in source["model"]["merges"]]
    assert field(reader, "tokenizer.ggml.merges") == merges
    template = open(os.path.join(hf_dir, "chat_template.jinja")).read()
    assert field(reader, "tokenizer.chat_template") == template
    return len(by_id)


def check_adapter(path, peft_dir, config):
    reader = GGUFReader(path)
    assert field(reader, "general.type") == "adapter"
    assert field(reader, "adapter.type") == "lora"
    peft = json.load(open(os.path.join(peft_dir, "adapter_config.json")))
    weights = load_file(os.path.join(peft_dir, "adapter_model.safetensors"))
    tensors = {t.name: t for t in reader.tensors}
    for name, w in weights.items():
        layer = name.removeprefix("base_model.model.").rsplit(".lora_", 1)[0]
        part = "lora_a" if ".lora_A." in name else "lora_b"
        gguf = gguf_name(config, layer + ".weight")
        t = tensors.pop(f"{gguf}.{part}")
        if part == "lora_b" and ARCH[config["model_type"]] == "llama":
            if ".q_proj" in layer:
                w = permute(w, config["num_attention_heads"])
            if ".k_proj" in layer:
                w = permute(w, config["num_key_value_heads"])
        got = np.asarray(t.data).reshape(w.shape)
        assert np.array_equal(got, w), f"{gguf}.{part} is not {name}"
    assert not tensors, sorted(tensors)
    alpha = field(reader, "adapter.lora.alpha")
    assert np.isclose(alpha / peft["r"], peft["lora_alpha"] / peft["r"]), (alpha, peft)
    return len(weights)


def main(path, hf_dir, adapter=None, peft_dir=None):
    config = json.load(open(os.path.join(hf_dir, "config.json")))
    reader = GGUFReader(path)
    keys = check_metadata(reader, config)
    counts, worst = check_tensors(reader, config,
                                  load_file(os.path.join(hf_dir, "model.safetensors")))
    vocab = check_tokenizer(reader, hf_dir)
    k_quants = f" (K-quants within {worst:.4f} of each block's range)" if worst else ""
    print(f"{path}: {keys} metadata keys, tensors {counts} equal to {hf_dir}'s{k_quants}; "
          f"its {vocab} tokens, merges and chat template the directory's")
    if adapter:
        n = check_adapter(adapter, peft_dir, config)
        print(f"{adapter}: {n} adapter tensors equal to {peft_dir}'s")


if __name__ == "__main__":
    main(*sys.argv[1:])
