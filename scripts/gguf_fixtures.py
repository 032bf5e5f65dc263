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
`quants.safetensors` holds the `gguf` package's dequantization of each.

Needs numpy, safetensors and gguf (`pip install gguf`); CI does not run it. Run from the
repository root:

    python scripts/gguf_fixtures.py
"""

import json
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


def gguf_tensors(config, weights):
    """(GGUF name, array) of every weight, in llama.cpp's names and layout."""
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    out = [("token_embd.weight", weights["model.embed_tokens.weight"])]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names = {
            "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
            "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
            "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
        }
        for gguf_name, hf_name in names.items():
            w = weights[p + hf_name + ".weight"]
            if gguf_name == "attn_q":
                w = permute(w, heads)
            if gguf_name == "attn_k":
                w = permute(w, kv_heads)
            out.append((f"blk.{i}.{gguf_name}.weight", w))
    out.append(("output_norm.weight", weights["model.norm.weight"]))
    out.append(("output.weight", weights["lm_head.weight"]))
    return out


def write(path, config, tensors, quant):
    w = GGUFWriter(path, "llama")
    w.add_name("wick llama fixture")
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_key_length(config["head_dim"])
    w.add_value_length(config["head_dim"])
    w.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_vocab_size(config["vocab_size"])
    w.add_file_type(0 if quant is None else 7)
    reference = {}
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


def main():
    os.makedirs(OUT, exist_ok=True)
    config = json.load(open(os.path.join(SOURCE, "config.json")))
    tensors = gguf_tensors(config, load_file(os.path.join(SOURCE, "model.safetensors")))
    write(os.path.join(OUT, "llama-f32.gguf"), config, tensors, None)
    reference = write(os.path.join(OUT, "llama-q8_0.gguf"), config, tensors,
                      GGMLQuantizationType.Q8_0)
    save_file(reference, os.path.join(OUT, "llama-q8_0.safetensors"))
    save_file(quants(os.path.join(OUT, "quants.gguf")), os.path.join(OUT, "quants.safetensors"))
    print(f"{OUT}: {len(tensors)} tensors, {len(reference)} of them Q8_0")


if __name__ == "__main__":
    main()
