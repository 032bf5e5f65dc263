"""Makes the Hugging Face fixtures of tests/models.rs: two tiny random-init checkpoints
(a Llama with grouped-query attention and untied embeddings, a GPT-2 with tied ones), a
byte-level BPE tokenizer trained on the bundled text, and what `transformers` computes on
fixed batches: logits, loss, every parameter's gradient, and 10 AdamW steps.

Needs torch, transformers and tokenizers (`pip install torch transformers tokenizers
safetensors`); CI does not run it. Run from the repository root:

    python scripts/hf_fixtures.py tests/fixtures/hf

Everything is in f32 and seeded, so a second run writes the same numbers.
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

SEQ = 32  # tokens a window feeds the model (a window holds SEQ + 1)
BATCH = 4  # global batch of the 10 steps: divides by 1, 2 and 4 ranks
STEPS = 10
# wick's default AdamW: torch.optim.AdamW with these
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def tokenizer(text):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([text], trainer)
    return tok


def windows(ids, count):
    """`count` windows of SEQ + 1 tokens, each starting SEQ + 1 after the last."""
    return torch.tensor(
        [ids[i * (SEQ + 1) : (i + 1) * (SEQ + 1)] for i in range(count)], dtype=torch.int64
    )


def record(model, batches, out_dir):
    """Saves the model and what it computes: logits, loss and gradients on the first
    batch, then the losses and final parameters of STEPS AdamW steps over `batches`."""
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    names = [n for n, _ in model.named_parameters()]
    ref = {}
    first = batches[0]
    inputs, targets = first[:, :-1], first[:, 1:]
    logits = model(input_ids=inputs).logits
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    )
    loss.backward()
    ref["logits"] = logits.detach().contiguous()
    ref["loss"] = loss.detach().reshape(1)
    for n, p in model.named_parameters():
        ref[f"grad.{n}"] = p.grad.detach().clone().contiguous()
    model.zero_grad()
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    losses = []
    for batch in batches:
        inputs, targets = batch[:, :-1], batch[:, 1:]
        logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
        )
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    ref["steps.losses"] = torch.tensor(losses, dtype=torch.float32)
    for n, p in model.named_parameters():
        ref[f"final.{n}"] = p.detach().clone().contiguous()
    ref["windows"] = torch.cat(batches).to(torch.int64).contiguous()
    save_file(ref, os.path.join(out_dir, "reference.safetensors"))
    print(f"{out_dir}: {sum(p.numel() for p in model.parameters())} parameters, "
          f"{len(names)} tensors, losses {losses[0]:.4f} -> {losses[-1]:.4f}")


def main(out):
    torch.use_deterministic_algorithms(True)
    text = open("data/licenses.txt", encoding="utf-8").read()
    tok = tokenizer(text)
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    sample = text[:4000]
    ids = tok.encode(sample).ids
    with open(os.path.join(out, "tokenizer_ids.json"), "w") as f:
        json.dump({"text": sample, "ids": ids}, f)
    all_ids = tok.encode(text).ids
    batches = list(windows(all_ids, BATCH * STEPS).split(BATCH))
    vocab = tok.get_vocab_size()

    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=88, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        rope_theta=10000.0, max_position_embeddings=128, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, attn_implementation="eager",
        bos_token_id=0, eos_token_id=0, pad_token_id=None,
    )).float()
    record(llama, batches, os.path.join(out, "llama"))
    tok.save(os.path.join(out, "llama", "tokenizer.json"))

    torch.manual_seed(1)
    gpt2 = GPT2LMHeadModel(GPT2Config(
        vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=128,
        layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        activation_function="gelu_new", attn_implementation="eager",
        bos_token_id=0, eos_token_id=0,
    )).float()
    record(gpt2, batches, os.path.join(out, "gpt2"))
    tok.save(os.path.join(out, "gpt2", "tokenizer.json"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/hf")
