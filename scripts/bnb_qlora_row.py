"""The torch side of the single-process QLoRA row in docs/performance.md: transformers +
peft + bitsandbytes QLoRA (NF4, double quantization, f32 compute; LoRA of rank 16, alpha
32, on every linear layer of a block; gradient checkpointing; torch's AdamW) over a
Hugging Face model directory, on the windows of a wick token file, 6 steps of batch 8 and
sequence 256 (or those given) on 2 threads. Prints each step's loss and tokens/s, then the
median from step 3 on. Measure its memory from outside (`/usr/bin/time -v`), as wick's.

    python scripts/bnb_qlora_row.py MODEL_DIR TOKENS.safetensors [SEQ BATCH STEPS]

Needs torch, transformers, peft and bitsandbytes (which runs on the CPU).
"""

import statistics
import sys
import time

import torch
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def main(model_dir, tokens, seq=256, batch=8, steps=6):
    torch.manual_seed(0)
    torch.set_num_threads(2)
    quantization = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, quantization_config=quantization, torch_dtype=torch.float32,
        device_map="cpu")
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS,
                      task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = load_file(tokens)["train"].long()
    rates = []
    for step in range(steps):
        at = step * batch * seq % (ids.numel() - batch * seq)
        window = ids[at:at + batch * seq].view(batch, seq)
        start = time.time()
        loss = model(input_ids=window, labels=window).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        rates.append(batch * seq / (time.time() - start))
        print(step + 1, loss.item(), round(rates[-1], 1), flush=True)
    print(f"median tokens/s, steps 3-{steps}:", round(statistics.median(rates[2:]), 1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:6]))
