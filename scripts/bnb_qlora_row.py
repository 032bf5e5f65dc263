"""The torch side of the QLoRA rows in docs/performance.md: transformers + peft +
bitsandbytes QLoRA (NF4, double quantization, f32 compute; LoRA of rank 16, alpha 32, on
every linear layer of a block; gradient checkpointing; torch's AdamW) over a Hugging Face
model directory, on the windows of a wick token file, 6 steps of batch 8 and sequence 256
(or those given) on 2 threads; with WORLD 2, as FSDP2 users run QLoRA: two processes over
gloo, one thread each, each decoder layer and then the model under `fully_shard`, the
4-bit weights stored in f32 words (`bnb_4bit_quant_storage`, which FSDP needs to shard
them beside the other parameters), each process half of every batch. Prints each step's
loss and tokens/s (rank 0), then the median from step 3 on. Measure its memory from
outside (`/usr/bin/time -v` for one process; `scripts/rss_peak.py spawn_main -- ...` for
two), as wick's.

    python scripts/bnb_qlora_row.py MODEL_DIR TOKENS.safetensors [SEQ BATCH STEPS WORLD]

Needs torch, transformers, peft and bitsandbytes (which runs on the CPU).
"""

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def run(rank, model_dir, tokens, seq, batch, steps, world):
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    torch.set_num_threads(2 // world)
    storage = {"bnb_4bit_quant_storage": torch.float32} if world > 1 else {}
    quantization = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.float32, **storage)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, quantization_config=quantization, torch_dtype=torch.float32,
        device_map="cpu")
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS,
                      task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    if world > 1:
        from torch.distributed.fsdp import fully_shard

        for layer in model.base_model.model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = load_file(tokens)["train"].long()
    per = batch // world
    rates = []
    for step in range(steps):
        at = step * batch * seq % (ids.numel() - batch * seq)
        window = ids[at:at + batch * seq].view(batch, seq)[rank * per:(rank + 1) * per]
        start = time.time()
        loss = model(input_ids=window, labels=window).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        rates.append(batch * seq / (time.time() - start))
        if rank == 0:
            print(step + 1, loss.item(), round(rates[-1], 1), flush=True)
    if rank == 0:
        print(f"median tokens/s, steps 3-{steps}:", round(statistics.median(rates[2:]), 1))
    if world > 1:
        dist.destroy_process_group()


def main(model_dir, tokens, seq=256, batch=8, steps=6, world=1):
    args = (model_dir, tokens, seq, batch, steps, world)
    if world > 1:
        mp.spawn(run, args=args, nprocs=world)
    else:
        run(0, *args)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:7]))
