"""Writes tests/fixtures/nf4/nf4.safetensors: weights quantized to NF4 with double
quantization by bitsandbytes itself (`bitsandbytes.functional.quantize_4bit(w,
blocksize=64, quant_type="nf4", compress_statistics=True)`, as QLoRA and PEFT's
`BitsAndBytesConfig(bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)` store a
frozen base), and what bitsandbytes dequantizes them to, for wick's NF4 to equal bit for
bit (tests in crates/core/src/nf4.rs).

For each case NAME (a shape, normal weights from a seed): `NAME.weight` (f32, the input),
`NAME.packed` (u8, two 4-bit codes a byte, the first in the high nibble),
`NAME.absmax_codes` (u8, each 64-block's absmax less the offset, in bitsandbytes' 8-bit
dynamic code), `NAME.absmax_scales` (f32, one per 256 of those), `NAME.offset` (f32, the
mean absmax), `NAME.dequantized` (f32). `dynamic_code` (f32, 256) is the 8-bit code the
absmax codes index, as bitsandbytes stores it with the quantized state.

Needs torch, safetensors and bitsandbytes (its CPU kernels run here); CI does not run it.
From the repository root:

    python scripts/nf4_fixtures.py
"""

import os

import bitsandbytes.functional as F
import torch
from safetensors.torch import save_file

OUT = "tests/fixtures/nf4"

# (name, shape, scale): whole 64-blocks; a tail block and an odd count; more than 256
# blocks (three absmax scales, the last partial); a block of zeros beside others; enough
# absmaxes (1024) that bitsandbytes' 8-bit code is not the nearest entry for some of them
# (its CPU kernel looks each value up in a 65536-entry table of the [-1, 1] range).
CASES = [
    ("square", (64, 128), 0.02),
    ("tail", (3, 101), 1.0),
    ("wide", (160, 264), 0.05),
    ("table", (128, 512), 0.02),
]


def not_nearest(w, state):
    """How many absmaxes bitsandbytes coded other than to the nearest code entry."""
    absmax = w.reshape(-1, 64).abs().max(1).values - state.offset
    blocks = absmax.reshape(-1, 256)
    normed = (blocks * (1 / blocks.abs().max(1, keepdim=True).values)).reshape(-1)
    nearest = (normed[:, None] - state.state2.code[None, :]).abs().argmin(1)
    return int((nearest != state.absmax.reshape(-1).long()).sum())


def main():
    os.makedirs(OUT, exist_ok=True)
    tensors = {}
    for seed, (name, shape, scale) in enumerate(CASES):
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(shape, generator=g) * scale
        if name == "wide":
            w.view(-1)[64:128] = 0.0
        packed, state = F.quantize_4bit(
            w, blocksize=64, quant_type="nf4", compress_statistics=True
        )
        assert state.nested and state.state2.blocksize == 256
        if name == "table":
            assert not_nearest(w, state) > 0, "the table case needs a code off the nearest"
        tensors[f"{name}.weight"] = w.contiguous()
        tensors[f"{name}.packed"] = packed.reshape(-1).contiguous()
        tensors[f"{name}.absmax_codes"] = state.absmax.reshape(-1).contiguous()
        tensors[f"{name}.absmax_scales"] = state.state2.absmax.reshape(-1).contiguous()
        tensors[f"{name}.offset"] = state.offset.reshape(1).float().contiguous()
        tensors[f"{name}.dequantized"] = F.dequantize_4bit(packed, state).contiguous()
        tensors["dynamic_code"] = state.state2.code.contiguous()
    save_file(tensors, f"{OUT}/nf4.safetensors")
    print(f"wrote {OUT}/nf4.safetensors ({len(CASES)} cases)")


if __name__ == "__main__":
    main()
