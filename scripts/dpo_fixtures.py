"""Makes the preference-tuning fixtures of tests/dpo.rs: what TRL's `DPOTrainer` computes on
the Llama fixture of tests/fixtures/hf/llama over eight preference pairs.

For each case (full fine-tuning or LoRA; the sigmoid DPO loss or IPO) it records, on the
global batch of all eight pairs: the loss, every trainable parameter's gradient, and the
metrics TRL logs (`rewards/*`, `logps/*`); then the losses and final trainable parameters of
10 AdamW steps (constant rate, no weight decay, no clipping: the options wick's test
gives its own run). The full cases use TRL's `precompute_ref_log_probs`; the LoRA cases
its reference of the base model with the adapters off. The LoRA cases start from one PEFT
adapter, saved here, whose B is not zero, so that the policy and the reference differ
from the first step.

It also writes the pairs as JSON Lines (`prompt`/`chosen`/`rejected`, TRL's standard
preference schema; and as conversations, with an explicit prompt and with TRL's implicit
one) and the ids TRL's tokenization made of them (the conversations through the chat
fixture's template), which `wick prepare` must make too.

Needs torch, transformers, trl, peft and safetensors; CI does not run it. From the
repository root:

    python scripts/dpo_fixtures.py tests/fixtures/hf/dpo

Everything is in f32 and seeded, so a second run writes the same numbers (up to the order
TRL's sampler gives the pairs within a step, which moves the sums in their last bits).
"""

import json
import os
import sys
import tempfile

import torch
from datasets import Dataset
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from trl import DPOConfig, DPOTrainer

BASE = "tests/fixtures/hf/llama"
EOS = "<|endoftext|>"
STEPS = 10
LR = 1e-3
BETA = 0.1
LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0)

# Eight pairs: a prompt, a preferred completion and a worse one, of different lengths.
PAIRS = [
    ("The river ran", " clear and cold past the mill.", " backwards."),
    ("She opened the letter and", " read it twice before she smiled.", " ate it."),
    ("Winter came early that year;", " the fields froze by October.", " it was warm."),
    ("He counted the coins:", " twelve silver and three gold.", " many."),
    ("The old house stood", " at the end of the lane, its windows dark.", " up and walked."),
    ("In the morning the ship", " left the harbour under grey sails.", " sang."),
    ("They walked for hours", " until the road turned toward the sea.", " or not at all, who knows, maybe."),
    ("A quiet voice said", " wait here until I come back.", " the the the."),
]


def tokenizer():
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(BASE, "tokenizer.json"))
    tok.eos_token = EOS
    tok.pad_token = EOS
    return tok


def dataset():
    return Dataset.from_list([dict(prompt=p, chosen=c, rejected=r) for p, c, r in PAIRS])


def trainer_for(case, out_dir, tok):
    full = case.startswith("full")
    args = DPOConfig(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=len(PAIRS),
        max_steps=STEPS,
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        optim="adamw_torch",
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        # TRL defaults to bf16 autocast, on the CPU too; the reference is f32 throughout.
        bf16=False,
        seed=0,
        beta=BETA,
        loss_type=["ipo" if case.endswith("ipo") else "sigmoid"],
        max_length=None,
        precompute_ref_log_probs=full,
        dataset_num_proc=None,
    )
    model = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32)
    peft_config = None
    if not full:
        from peft import LoraConfig

        peft_config = LoraConfig(**LORA, init_lora_weights=False)
    trainer = DPOTrainer(
        model=model,
        args=args,
        train_dataset=dataset(),
        processing_class=tok,
        peft_config=peft_config,
    )
    if not full:
        # PEFT's init without zeros draws B as large as A; smaller, the adapted model stays
        # near the base, as a trained adapter does.
        torch.manual_seed(1)
        with torch.no_grad():
            for n, p in trainer.model.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn_like(p) * 0.02)
        adapter = os.path.join(out_dir, "adapter")
        if not os.path.isdir(adapter):
            trainer.model.save_pretrained(adapter)
            with open(os.path.join(adapter, "adapter_config.json")) as f:
                config = json.load(f)
            config["base_model_name_or_path"] = "../../llama"
            with open(os.path.join(adapter, "adapter_config.json"), "w") as f:
                json.dump(config, f, indent=2)
    return trainer


def wick_name(name):
    """PEFT's parameter name as wick names it."""
    return name.replace("base_model.model.", "").replace(".default", "")


def record(case, out_dir, tok, ref):
    torch.manual_seed(0)
    trainer = trainer_for(case, out_dir, tok)
    model = trainer.model
    data = trainer.train_dataset
    batch = trainer.data_collator([data[i] for i in range(len(data))])
    if "ids" not in ref:
        ref["ids"] = batch["input_ids"].contiguous()
        ref["completion_mask"] = batch["completion_mask"].contiguous()
    if case.startswith("full"):
        ref[f"{case}.reference"] = torch.cat(
            [batch["ref_chosen_logps"], batch["ref_rejected_logps"]]
        ).float().contiguous()
    model.train()
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    ref[f"{case}.loss"] = loss.detach().reshape(1)
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    for n, p in trained:
        ref[f"{case}.grad.{wick_name(n)}"] = p.grad.detach().clone().contiguous()
    metrics = trainer._metrics["train"]
    names = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
             "logps/chosen", "logps/rejected"]
    ref[f"{case}.metrics"] = torch.tensor([metrics[m][-1] for m in names], dtype=torch.float32)
    model.zero_grad()
    trainer._metrics["train"].clear()
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == STEPS, losses
    ref[f"{case}.steps.losses"] = torch.tensor(losses, dtype=torch.float32)
    for n, p in trained:
        ref[f"{case}.final.{wick_name(n)}"] = p.detach().clone().contiguous()
    print(f"{case}: loss {loss.item():.6f}, {len(trained)} trained tensors, "
          f"steps {losses[0]:.4f} -> {losses[-1]:.4f}")


CHAT = "tests/fixtures/hf/chat"


def conversational(out_dir, trainer):
    """The pairs as conversations (a user turn, then each answer as an assistant turn),
    with an explicit prompt and with TRL's implicit one (the turns both lists begin with),
    tokenized by TRL through the chat fixture's template: `conversational.json`, beside the
    JSON Lines files it read."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(CHAT)
    user = lambda p: [{"role": "user", "content": p}]
    answer = lambda c: [{"role": "assistant", "content": c.strip()}]
    explicit = [dict(prompt=user(p), chosen=answer(c), rejected=answer(r)) for p, c, r in PAIRS]
    implicit = [dict(chosen=user(p) + answer(c), rejected=user(p) + answer(r)) for p, c, r in PAIRS]
    out = {}
    for name, rows in [("explicit", explicit), ("implicit", implicit)]:
        with open(os.path.join(out_dir, f"conversational_{name}.jsonl"), "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        done = trainer._prepare_dataset(Dataset.from_list(rows), tok, trainer.args, name)
        out[name] = [
            dict(prompt_ids=d["prompt_ids"], chosen_ids=d["chosen_ids"], rejected_ids=d["rejected_ids"])
            for d in done
        ]
    with open(os.path.join(out_dir, "conversational.json"), "w") as f:
        json.dump(out, f)


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    tok = tokenizer()
    with open(os.path.join(out_dir, "pairs.jsonl"), "w") as f:
        for p, c, r in PAIRS:
            f.write(json.dumps(dict(prompt=p, chosen=c, rejected=r)) + "\n")
    ref = {}
    for case in ["full_sigmoid", "full_ipo", "lora_sigmoid", "lora_ipo"]:
        record(case, out_dir, tok, ref)
    conversational(out_dir, trainer_for("full_sigmoid", out_dir, tok))
    ref["beta"] = torch.tensor([BETA], dtype=torch.float32)
    save_file(ref, os.path.join(out_dir, "reference.safetensors"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/hf/dpo")
