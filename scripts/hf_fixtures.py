"""Makes the Hugging Face fixtures of tests/models.rs: tiny random-init checkpoints of each
family wick builds (Llama 2 and 3.x, SmolLM2, Mistral, Qwen2, Qwen3, Gemma 2, GPT-2), a
byte-level BPE tokenizer trained on the bundled text, and what `transformers` computes on
fixed batches: logits, loss, every parameter's gradient, and 10 AdamW steps. The rope
fixtures (`rope_*`, and `llama3`) also hold the loss and last logits of one 2048-token
window, where a slightly wrong long-context frequency shows.

Needs torch, transformers and tokenizers (`pip install torch transformers tokenizers
safetensors`); CI does not run it. Run from the repository root:

    python scripts/hf_fixtures.py tests/fixtures/hf [FAMILY...]

(with families named, only those are written), and

    python scripts/hf_fixtures.py --smollm2-135m DIR
    python scripts/hf_fixtures.py --llama-3.2-1b DIR

write random models of those shapes in bf16 for the real-size benchmarks.

`lora` (needs `peft` too) is a PEFT adapter over the Qwen2 fixture and what PEFT computes
with it. Everything is in f32 and seeded, so a second run writes the same numbers.
"""

import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

SEQ = 32  # tokens a window feeds the model (a window holds SEQ + 1)
LONG = 2048  # the long window of the rope fixtures
TAIL = 8  # its last positions whose logits are kept
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


def loss_of(logits, targets):
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    )


def long_window(model, long_ids, ref):
    """The loss and last TAIL positions' logits of one LONG-token window."""
    window = torch.tensor([long_ids[: LONG + 1]], dtype=torch.int64)
    with torch.no_grad():
        logits = model(input_ids=window[:, :-1]).logits
    ref["long.loss"] = loss_of(logits, window[:, 1:]).reshape(1)
    ref["long.logits_tail"] = logits[:, -TAIL:].contiguous()
    ref["long.window"] = window.contiguous()


def record(model, batches, out_dir, long_ids=None, train=True):
    """Saves the model and what it computes: logits, loss and gradients on the first
    batch, then the losses and final parameters of STEPS AdamW steps over `batches`
    (unless not `train`), and with `long_ids` the long window's loss and last logits."""
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    names = [n for n, _ in model.named_parameters()]
    ref = {}
    if long_ids is not None:
        long_window(model, long_ids, ref)
    if not train:
        save_file(ref, os.path.join(out_dir, "reference.safetensors"))
        print(f"{out_dir}: long-window loss {ref['long.loss'].item():.4f}")
        return
    first = batches[0]
    inputs, targets = first[:, :-1], first[:, 1:]
    logits = model(input_ids=inputs).logits
    loss = loss_of(logits, targets)
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
        loss = loss_of(logits, targets)
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


# The decoders, each small (hidden 32, two layers) but with what sets its family apart:
# biases, per-head norms, explicit head widths, windows shorter than SEQ, soft caps that
# bend, tied embeddings; `transformers` 5 writes each config.json with its own fields.
def families(vocab):
    common = dict(
        vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
        attn_implementation="eager", bos_token_id=0, eos_token_id=0, pad_token_id=None,
    )
    llama3_rope = dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
        high_freq_factor=4.0, original_max_position_embeddings=256,
    )
    return {
        "llama3": (LlamaForCausalLM, LlamaConfig(
            **common, head_dim=8, max_position_embeddings=4096, tie_word_embeddings=True,
            rope_parameters=llama3_rope,
        ), True),
        "smollm2": (LlamaForCausalLM, LlamaConfig(
            **{**common, "num_attention_heads": 6, "num_key_value_heads": 2, "hidden_size": 48},
            max_position_embeddings=256, tie_word_embeddings=True, is_llama_config=True,
            rope_interleaved=False, rope_parameters=dict(rope_type="default", rope_theta=100000.0),
        ), False),
        "mistral": (MistralForCausalLM, MistralConfig(
            **common, head_dim=16, max_position_embeddings=256, sliding_window=8,
            tie_word_embeddings=False,
        ), False),
        "qwen2": (Qwen2ForCausalLM, Qwen2Config(
            **common, max_position_embeddings=256, use_sliding_window=True, sliding_window=8,
            max_window_layers=1, tie_word_embeddings=True,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
        ), False),
        "qwen3": (Qwen3ForCausalLM, Qwen3Config(
            **common, head_dim=24, max_position_embeddings=256, tie_word_embeddings=False,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
        ), False),
        "gemma2": (Gemma2ForCausalLM, Gemma2Config(
            **common, head_dim=16, max_position_embeddings=256, sliding_window=8,
            query_pre_attn_scalar=24, attn_logit_softcapping=1.0, final_logit_softcapping=2.0,
            initializer_range=0.1, hidden_activation="gelu_pytorch_tanh",
        ), False),
    }


# One long window for each of the other rope types.
def ropes(vocab):
    common = dict(
        vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-6,
        attn_implementation="eager", bos_token_id=0, eos_token_id=0, pad_token_id=None,
    )
    return {
        "rope_linear": LlamaConfig(**common, max_position_embeddings=4096,
            rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0)),
        "rope_dynamic": LlamaConfig(**common, max_position_embeddings=512,
            rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=4.0)),
        "rope_yarn": LlamaConfig(**common, max_position_embeddings=2048,
            rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                 original_max_position_embeddings=512)),
    }


def main(out, only):
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
    assert len(all_ids) > LONG, len(all_ids)
    batches = list(windows(all_ids, BATCH * STEPS).split(BATCH))
    vocab = tok.get_vocab_size()

    def wanted(name):
        return not only or name in only

    if wanted("llama"):
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

    if wanted("gpt2"):
        torch.manual_seed(1)
        gpt2 = GPT2LMHeadModel(GPT2Config(
            vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=128,
            layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            activation_function="gelu_new", attn_implementation="eager",
            bos_token_id=0, eos_token_id=0,
        )).float()
        record(gpt2, batches, os.path.join(out, "gpt2"))
        tok.save(os.path.join(out, "gpt2", "tokenizer.json"))

    for seed, (name, (cls, config, long)) in enumerate(families(vocab).items(), start=2):
        if wanted(name):
            torch.manual_seed(seed)
            model = cls(config).float()
            record(model, batches, os.path.join(out, name), all_ids if long else None)
    for seed, (name, config) in enumerate(ropes(vocab).items(), start=20):
        if wanted(name):
            torch.manual_seed(seed)
            model = LlamaForCausalLM(config).float()
            record(model, batches, os.path.join(out, name), all_ids, train=False)
    if wanted("chat"):
        chat(os.path.join(out, "chat"), text, os.path.join(out, "llama"))
    if wanted("lora"):
        lora(os.path.join(out, "lora"), os.path.join(out, "qwen2"))


# PEFT's LoRA over the Qwen2 fixture: rank 4, alpha 8, every linear layer of a block.
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lora(out, base_dir):
    """A PEFT adapter over the fixture in `base_dir` (its B drawn nonzero, so that the
    update shows from the first step), as `save_pretrained` writes it, and what PEFT
    computes with it on the base fixture's windows: logits, loss, the adapters' gradients,
    then STEPS AdamW steps of the adapters alone."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(40)
    base = Qwen2ForCausalLM.from_pretrained(base_dir, attn_implementation="eager").float()
    model = get_peft_model(base, LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=LORA_TARGETS, bias="none",
        task_type="CAUSAL_LM",
    ))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn_like(p) * 0.02)
    model.save_pretrained(out)
    windows_all = load_file(os.path.join(base_dir, "reference.safetensors"))["windows"]
    batches = list(windows_all.split(BATCH))

    def wick_name(n):
        # base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight
        return n.removeprefix("base_model.model.").replace(".default.", ".")

    trained = [(wick_name(n), p) for n, p in model.named_parameters() if p.requires_grad]
    ref = {}
    first = batches[0]
    logits = model(input_ids=first[:, :-1]).logits
    loss = loss_of(logits, first[:, 1:])
    loss.backward()
    ref["logits"] = logits.detach().contiguous()
    ref["loss"] = loss.detach().reshape(1)
    for n, p in trained:
        ref[f"grad.{n}"] = p.grad.detach().clone().contiguous()
    model.zero_grad()
    opt = torch.optim.AdamW([p for _, p in trained], **ADAMW)
    losses = []
    for batch in batches[:STEPS]:
        loss = loss_of(model(input_ids=batch[:, :-1]).logits, batch[:, 1:])
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    ref["steps.losses"] = torch.tensor(losses, dtype=torch.float32)
    for n, p in trained:
        ref[f"final.{n}"] = p.detach().clone().contiguous()
    save_file(ref, os.path.join(out, "reference.safetensors"))
    print(f"{out}: {len(trained)} adapter tensors, "
          f"{sum(p.numel() for _, p in trained)} parameters, "
          f"losses {losses[0]:.4f} -> {losses[-1]:.4f}")


# Published config.json files of the real-size shapes (tests/fixtures/configs/).
SMOLLM2_135M = "tests/fixtures/configs/smollm2-135m.json"
LLAMA_32_1B = "tests/fixtures/configs/llama-3.2-1b.json"


def random_model(config_path, out):
    """A random-init model of a published config's shape in bf16, as the hub ships it,
    with the fixtures' tokenizer (its 384 ids are within the model's vocabulary): a
    real-size benchmark's directory. Not checked in (SmolLM2-135M: 270 MB; Llama-3.2-1B:
    2.5 GB)."""
    config = json.load(open(config_path))
    config.pop("architectures")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config)).to(torch.bfloat16)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer(open("data/licenses.txt", encoding="utf-8").read()).save(
        os.path.join(out, "tokenizer.json"))
    print(f"{out}: {sum(p.numel() for p in model.parameters())} parameters, bf16")


# The chat fixture (tests/fixtures/hf/chat): a tokenizer with ChatML's special tokens and a
# BOS its post-processor adds, a chat template whose `{% generation %}` blocks give
# `transformers` its own assistant mask, JSON Lines of the three shapes, and what Python
# makes of them: the ids, the flags of the targets the loss counts, and the loss of the
# Llama fixture on the first window with -100 labels.
CHAT_TEMPLATE = (
    "{%- if messages|length == 0 or messages[0].role != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}{% generation %}"
    "{{- message.content.strip() + '<|im_end|>\\n' }}{% endgeneration %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content.strip() + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CHAT_LINES = [
    {"messages": [{"role": "user", "content": "What does the license permit?"},
                  {"role": "assistant", "content": " Use, copy, modify and merge. "}]},
    {"prompt": "Permission is hereby granted", "completion": ", free of charge, to any person"},
    {"text": "THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND."},
    {"messages": [{"role": "system", "content": "Answer in one word."},
                  {"role": "user", "content": "Free of charge?"},
                  {"role": "assistant", "content": "Yes."},
                  {"role": "user", "content": "Any person?"},
                  {"role": "assistant", "content": "Yes, any."}]},
    {"prompt": "The above copyright notice", "completion": " shall be included in all copies."},
]
CHAT_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"]


def chat(out, text, llama_dir):
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    os.makedirs(out, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=CHAT_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([text], trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    tok.save(os.path.join(out, "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE,
              "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(out, "chat.jsonl"), "w") as f:
        for line in CHAT_LINES:
            f.write(json.dumps(line) + "\n")
    hf = PreTrainedTokenizerFast(tokenizer_file=os.path.join(out, "tokenizer.json"),
                                 bos_token="<s>", eos_token="<|endoftext|>")
    hf.chat_template = CHAT_TEMPLATE
    eos = hf.convert_tokens_to_ids("<|endoftext|>")
    ids, counted = [], []
    for line in CHAT_LINES:
        if "messages" in line:
            enc = hf.apply_chat_template(line["messages"], tokenize=True, return_dict=True,
                                         return_assistant_tokens_mask=True)
            more, flags = list(enc["input_ids"]), [bool(m) for m in enc["assistant_masks"]]
            close = False  # the template closes each turn itself
        elif "prompt" in line:
            p = hf(line["prompt"])["input_ids"]
            c = hf(line["completion"], add_special_tokens=False)["input_ids"]
            more, flags, close = p + c, [False] * len(p) + [True] * len(c), True
        else:
            more = hf(line["text"])["input_ids"]
            flags, close = [True] * len(more), True
        if more[-1] != eos:
            more, flags = more + [eos], flags + [close]
        ids += more
        counted += flags
    # The Llama fixture's loss on the first window of 65 tokens, -100 where not counted.
    model = LlamaForCausalLM.from_pretrained(llama_dir, dtype=torch.float32,
                                             attn_implementation="eager")
    window = torch.tensor([ids[:65]])
    labels = torch.tensor([[t if c else -100 for t, c in zip(ids[:65], counted[:65])]])
    with torch.no_grad():
        loss = model(input_ids=window, labels=labels).loss.item()
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump({"ids": ids, "counted": counted, "window_loss": loss}, f)
    print(f"{out}: {len(ids)} tokens, {sum(counted)} counted, window loss {loss:.6f}")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--smollm2-135m"]:
        random_model(SMOLLM2_135M, args[1])
    elif args[:1] == ["--llama-3.2-1b"]:
        random_model(LLAMA_32_1B, args[1])
    else:
        main(args[0] if args else "tests/fixtures/hf", set(args[1:]))
