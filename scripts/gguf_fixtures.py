"""Writes tests/fixtures/gguf: the Llama fixture (tests/fixtures/hf/llama) as llama.cpp's
converter lays a Llama out in GGUF, written by the `gguf` package: llama.cpp's tensor names,
the query and key rows permuted as `convert_hf_to_gguf.py` permutes them for llama.cpp's
rope, the config in `llama.*` metadata. `llama-f32.gguf` holds every tensor in f32;
`llama-q8_0.gguf` quantizes to Q8_0 the tensors whose rows divide into its blocks (the
others stay f32, as llama.cpp's quantizer leaves them), and `llama-q8_0.safetensors` holds
what the `gguf` package dequantizes each quantized tensor to, by its GGUF name, in GGUF's
layout, for wick's dequantization to equal bit for bit. `quants.gguf` holds one tensor
of 2 x 512 per type llama.cpp writes most (F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K,
Q3_K, Q4_K, Q5_K, Q6_K): the `gguf` package's quantization where it has one, and for the
K-quants (which it only dequantizes) seeded random blocks with finite scales;
`quants.safetensors` holds the `gguf` package's dequantization of each. Every family's
file in Q8_0 with its tokenizer (`{family}-tok-q8_0.gguf`) and transformers' GGUF loader's
logits on it (`families-q8_0.logits.safetensors`); the chat model of tests/program
(`chat-llama.gguf`); the Llama 3 fixture with its scaled rope's `rope_freqs.weight`
(`llama3-f32.gguf`).

Needs numpy, safetensors and gguf (`pip install gguf`), and torch, transformers and
accelerate for the logits; CI does not run it. Run from the
repository root:

    python scripts/gguf_fixtures.py
"""

import json
import math
import os

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize
from safetensors.numpy import load_file, save_file

SOURCE = "tests/fixtures/hf/llama"
OUT = "tests/fixtures/gguf"


def permute(w, heads):
    """llama.cpp's order of a projection's rows within each head (convert_hf_to_gguf.py)."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


# llama.cpp's names of a decoder block's tensors (gguf-py's tensor_mapping.py).
DECODER_BLOCK = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
GEMMA2_BLOCK = dict(DECODER_BLOCK, post_attention_layernorm="post_attention_norm",
                    pre_feedforward_layernorm="ffn_norm",
                    post_feedforward_layernorm="post_ffw_norm")
GPT2_BLOCK = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
              "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm",
          "lm_head": "output", "transformer.wte": "token_embd", "transformer.wpe": "position_embd",
          "transformer.ln_f": "output_norm"}


def gguf_tensors(config, weights):
    """(GGUF name, array) of every weight, in llama.cpp's names and layout, as its converter
    writes them: Llama's (and Mistral's) query and key rows permuted, GPT-2's Conv1D weights
    transposed, Gemma 2's norms stored as 1 + weight."""
    arch = ARCH[config["model_type"]]
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads")
    out = []
    for name, w in sorted(weights.items()):
        module, kind = name.rsplit(".", 1)
        parts = module.split(".")
        if parts[:2] in (["model", "layers"], ["transformer", "h"]):
            block, rest = parts[2], ".".join(parts[3:])
            table = {"gemma2": GEMMA2_BLOCK, "gpt2": GPT2_BLOCK}.get(arch, DECODER_BLOCK)
            gguf = f"blk.{block}.{table[rest]}.{kind}"
        else:
            gguf = f"{GLOBAL[module]}.{kind}"
        if arch == "llama" and rest_is(name, "q_proj"):
            w = permute(w, heads)
        if arch == "llama" and rest_is(name, "k_proj"):
            w = permute(w, kv_heads)
        if arch == "gpt2" and kind == "weight" and module.endswith(("c_attn", "c_proj", "c_fc")):
            w = w.T
        if arch == "gemma2" and name.endswith("norm.weight"):
            w = w + 1
        out.append((gguf, w))
    return out


def rest_is(name, proj):
    return f".self_attn.{proj}." in name


# The GGUF architecture of each model_type (Mistral's files say llama).
ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
        "gemma2": "gemma2", "gpt2": "gpt2"}


def add_config(w, config):
    """The architecture's metadata, as llama.cpp's converter writes it."""
    if config["model_type"] == "gpt2":
        w.add_context_length(config["n_positions"])
        w.add_embedding_length(config["n_embd"])
        w.add_block_count(config["n_layer"])
        w.add_feed_forward_length(config.get("n_inner") or 4 * config["n_embd"])
        w.add_head_count(config["n_head"])
        w.add_layer_norm_eps(config["layer_norm_epsilon"])
        return
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if config["model_type"] == "gemma2":
        w.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        w.add_final_logit_softcapping(config["final_logit_softcapping"])
        w.add_sliding_window(config["sliding_window"])


def add_tokenizer(w, tokenizer_dir, config):
    """A byte-level BPE tokenizer.json as llama.cpp's converter writes it: the tokens by id,
    special added tokens as control tokens, the merges, GPT-2's pre-tokenizer; the chat
    template of tokenizer_config.json or chat_template.jinja where the directory has one."""
    t = json.load(open(os.path.join(tokenizer_dir, "tokenizer.json")))
    vocab = dict(t["model"]["vocab"])
    special = {a["content"] for a in t["added_tokens"] if a["special"]}
    for a in t["added_tokens"]:
        vocab[a["content"]] = a["id"]
    tokens = sorted(vocab, key=vocab.get)
    assert [vocab[x] for x in tokens] == list(range(len(tokens)))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([3 if x in special else 1 for x in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in t["model"]["merges"]])
    # The special tokens as gguf-py's SpecialVocab reads them: tokenizer_config.json's names
    # (else config.json's ids), and BOS added where the post-processor adds it.
    names = {}
    config_path = os.path.join(tokenizer_dir, "tokenizer_config.json")
    if os.path.exists(config_path):
        names = json.load(open(config_path))
    bos = vocab.get(names.get("bos_token"), config.get("bos_token_id"))
    eos = vocab.get(names.get("eos_token"), config.get("eos_token_id"))
    post = t.get("post_processor") or {}
    single = post.get("single", []) if post.get("type") == "TemplateProcessing" else []
    adds_bos = bool(single) and "SpecialToken" in single[0]
    if adds_bos:
        bos = vocab[single[0]["SpecialToken"]["id"]]
    if eos is not None:
        w.add_eos_token_id(eos)
    if bos is not None:
        w.add_bos_token_id(bos)
    w.add_add_bos_token(adds_bos)
    jinja = os.path.join(tokenizer_dir, "chat_template.jinja")
    if os.path.exists(jinja):
        w.add_chat_template(open(jinja).read())


def rope_freqs(config):
    """llama.cpp's converter's divisors of a Llama 3 rope (rope_freqs.weight), or None."""
    rope = config.get("rope_parameters") or {}
    if rope.get("rope_type") != "llama3":
        return None
    base, dim = rope["rope_theta"], config["head_dim"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write(path, config, tensors, quant, tokenizer_dir=None):
    w = GGUFWriter(path, ARCH[config["model_type"]])
    w.add_name(f"wick {config['model_type']} fixture")
    add_config(w, config)
    if tokenizer_dir is not None:
        add_tokenizer(w, tokenizer_dir, config)
    w.add_file_type(0 if quant is None else 7)
    reference = {}
    divisors = rope_freqs(config)
    if divisors is not None:
        w.add_tensor("rope_freqs.weight", divisors)
    for name, array in tensors:
        array = np.ascontiguousarray(array, dtype=np.float32)
        if quant is not None and array.ndim == 2 and array.shape[1] % 32 == 0:
            data = quantize(array, quant)
            w.add_tensor(name, data, raw_dtype=quant)
            reference[name] = dequantize(data, quant).astype(np.float32)
        else:
            w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return reference


# Where each K-quant block keeps its f16 scale factors (byte offsets in the block):
# llama.cpp's block_q2_K .. block_q6_K.
K_SCALES = {
    GGMLQuantizationType.Q2_K: (80, 82),
    GGMLQuantizationType.Q3_K: (108,),
    GGMLQuantizationType.Q4_K: (0, 2),
    GGMLQuantizationType.Q5_K: (0, 2),
    GGMLQuantizationType.Q6_K: (208,),
}


def quants(path):
    rng = np.random.default_rng(0)
    values = rng.standard_normal((2, 512)).astype(np.float32)
    w = GGUFWriter(path, "quants")
    reference = {}
    T = GGMLQuantizationType
    for t in [T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1]:
        data = quantize(values, t)
        w.add_tensor(f"t.{t.name}", data, raw_dtype=t)
        reference[f"t.{t.name}"] = dequantize(data, t).astype(np.float32)
    for t, offsets in K_SCALES.items():
        block, size = GGML_QUANT_SIZES[t]
        data = rng.integers(0, 256, (2, 512 // block * size), dtype=np.uint8)
        blocks = data.reshape(-1, size)
        for offset in offsets:
            scale = (rng.uniform(0.001, 0.05, len(blocks))).astype(np.float16)
            blocks[:, offset:offset + 2] = scale.view(np.uint8).reshape(-1, 2)
        w.add_tensor(f"t.{t.name}", data, raw_dtype=t)
        reference[f"t.{t.name}"] = dequantize(data, t).astype(np.float32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return reference


FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gpt2"]


def transformers_logits(files, ids):
    """Each file's logits on `ids` by transformers' own GGUF loader (which dequantizes with
    the gguf package), given what that loader does not read from the file as llama.cpp
    reads it: the head size (`{arch}.attention.key_length`, which it ignores where it
    differs from the width per head), GPT-2's positions (`gpt2.context_length`), Gemma 2's soft caps
    (`gemma2.attn_logit_softcapping`, `gemma2.final_logit_softcapping`) and its query scale (llama.cpp's: the head
    size)."""
    import torch
    from transformers import AutoModelForCausalLM
    out = {}
    for family, name in files:
        config = json.load(open(os.path.join("tests/fixtures/hf", family, "config.json")))
        extra = {"head_dim": config["head_dim"]} if config.get("head_dim") else {}
        if family == "gemma2":
            extra["query_pre_attn_scalar"] = config["head_dim"]
            for cap in ["attn_logit_softcapping", "final_logit_softcapping"]:
                extra[cap] = config[cap]
        if family == "gpt2":
            extra["n_positions"] = config["n_positions"]
        model = AutoModelForCausalLM.from_pretrained(OUT, gguf_file=name, dtype=torch.float32,
                                                     **extra)
        with torch.no_grad():
            out[family] = model(torch.tensor(ids)).logits.float().numpy()
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    config = json.load(open(os.path.join(SOURCE, "config.json")))
    tensors = gguf_tensors(config, load_file(os.path.join(SOURCE, "model.safetensors")))
    write(os.path.join(OUT, "llama-f32.gguf"), config, tensors, None)
    reference = write(os.path.join(OUT, "llama-q8_0.gguf"), config, tensors,
                      GGMLQuantizationType.Q8_0)
    save_file(reference, os.path.join(OUT, "llama-q8_0.safetensors"))
    save_file(quants(os.path.join(OUT, "quants.gguf")), os.path.join(OUT, "quants.safetensors"))
    # Every family in Q8_0 with its tokenizer, and the chat model of tests/program (the
    # Llama fixture's weights, the chat fixture's tokenizer and template) in f32.
    files = []
    for family in FAMILIES:
        source = os.path.join("tests/fixtures/hf", family)
        config = json.load(open(os.path.join(source, "config.json")))
        weights = load_file(os.path.join(source, "model.safetensors"))
        name = f"{family}-tok-q8_0.gguf"
        write(os.path.join(OUT, name), config, gguf_tensors(config, weights),
              GGMLQuantizationType.Q8_0, source)
        files.append((family, name))
    ids = np.random.default_rng(0).integers(0, 384, (2, 8)).astype(np.int64)
    logits = transformers_logits(files, ids)
    logits["ids"] = ids.astype(np.int64)
    save_file(logits, os.path.join(OUT, "families-q8_0.logits.safetensors"))
    config = json.load(open(os.path.join(SOURCE, "config.json")))
    write(os.path.join(OUT, "chat-llama.gguf"), config, tensors, None, "tests/fixtures/hf/chat_v5")
    # Llama 3's scaled rope, as llama.cpp stores it (rope_freqs.weight), in f32: its logits
    # are the Hugging Face fixture's (transformers' GGUF loader does not read the tensor).
    llama3 = "tests/fixtures/hf/llama3"
    config = json.load(open(os.path.join(llama3, "config.json")))
    weights = load_file(os.path.join(llama3, "model.safetensors"))
    write(os.path.join(OUT, "llama3-f32.gguf"), config, gguf_tensors(config, weights), None, llama3)
    print(f"{OUT}: {len(tensors)} tensors, {len(reference)} of them Q8_0; "
          f"{len(files)} families with their tokenizers")


if __name__ == "__main__":
    main()
