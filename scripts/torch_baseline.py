#!/usr/bin/env python3
"""The PyTorch side of `examples/throughput`: the same GPT and Llama shapes trained with
PyTorch (single process, DDP and FSDP2 over gloo at W=2, each rank a process), one row per
run in the example's format, so that both can be read from one run on the same machine.

    python scripts/torch_baseline.py [--d-model 128 512] [--llama] [--worlds 1 2] [--compile]

What a PyTorch expert gives it: AdamW with `fused=True` (its one fused CPU kernel; where it
is refused, `foreach=True`, and the row says which), the processes' threads set to
`cores / W` as wick's ranks get, and, from `scripts/perf-report.sh`, glibc's malloc
thresholds in the environment as wick sets them for itself. `--compile` adds the same runs
with the model under `torch.compile` (inductor, default mode) for W=1, and for `--hf`'s
model at every W (compiled after `fully_shard`, as FSDP2's users compile), where the first
steps compile and the warm-up steps absorb that.

First `impl=torch mm_peak_gflops=<g>`: torch.mm's best rate on square 1024 and 2048
matrices on all cores, written into a buffer made once (`out=`), so the kernel alone is
timed. Then rows: `impl=torch model=<gpt-d<D>|llama> strategy=<single|ddp|fsdp_full_shard>
world=<W> transport=<none|gloo> mode=<eager|compiled> optimizer=<fused|foreach>
tokens_per_s=<n>`, the median step of 10 after 3 warm-up steps, as the example measures.
The GPT is the example's (4 layers, 4 heads, context 64, vocabulary 96, global batch 16,
AdamW betas 0.9/0.95, weight decay 0.01): token and position embeddings, pre-norm blocks
(layer norm, causal attention through `scaled_dot_product_attention`, GELU with the tanh
approximation), a final norm and a linear head. The Llama is `transformers`'
`LlamaForCausalLM` of the example's config (20.2M parameters), sequence 256, global batch 8.
`--hf DIR` adds the model of a Hugging Face directory (`AutoModelForCausalLM`, f32) at
sequence 256, global batch 8 (`model=hf:DIR`), the median step of 4 after 2 warm-up steps, and with `--lora R` peft's LoRA of rank R
on it (`model=hf:DIR+loraR`: alpha 2R, every linear layer of a block; only the adapters in
the optimizer). `--profile` prints only the `--d-model` GPTs' single step op by op under `torch.profiler`
(each op's self time per step), beside `throughput --profile`'s rows for wick.
`--checkpoint-activations` recomputes each block in backward, torchtitan's
way (`checkpoint_wrapper` around each block before `fully_shard`; rows labelled
`activation_checkpointing=full`). Under FSDP2 the `--hf` model is made on the meta device and
materialised shard by shard, the weights broadcast from rank 0 (torchtitan's way). Each row's
`peak_rss_mb` is the sum over its ranks of each process's peak resident memory, as the
process sees it; `scripts/rss_peak.py` measures both sides the same way from outside, and
rank 0 prints `rss_peak steady` as the measured steps begin, for its steady-state peak.

Needs torch (and, for --llama and --hf, transformers; for --lora, peft); CI does not run it.
"""

import argparse
import os
import resource
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

WARMUP, MEASURED = 3, 10
HF_WARMUP, HF_MEASURED = 2, 4  # --hf: as the example's --hf row (steps of seconds each)
STEADY = "rss_peak steady"  # rank 0's line when the measured steps begin (scripts/rss_peak.py)
GPT_BATCH, GPT_BLOCK, GPT_VOCAB, GPT_LAYERS, GPT_HEADS = 16, 64, 96, 4, 4
LLAMA_BATCH, LLAMA_SEQ = 8, 256
HF_SHAPE = (8, 256)  # --hf: global batch and sequence, as `wick fit --batch-size 8 --seq 256`
LLAMA = dict(
    vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
    num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.tok = nn.Embedding(GPT_VOCAB, d)
        self.pos = nn.Parameter(torch.randn(GPT_BLOCK, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, GPT_HEADS) for _ in range(GPT_LAYERS))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, GPT_VOCAB)

    def forward(self, ids, targets):
        x = self.tok(ids) + self.pos[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class Pretrained(nn.Module):
    """A Hugging Face directory's model (`AutoModelForCausalLM`, f32, sdpa attention), with
    peft's LoRA of rank `lora` (alpha 2r, every linear layer of a block, no dropout) if
    given, as the example's `--hf DIR --lora-rank R` trains it. With `meta`, made on the
    meta device, as FSDP2 users build a model (torchtitan): no process ever holds it whole;
    `materialize` then makes each rank's shards and loads the weights into them."""

    def __init__(self, path, lora=None, meta=False):
        super().__init__()
        from transformers import AutoConfig, AutoModelForCausalLM

        self.path = path
        if meta:
            config = AutoConfig.from_pretrained(path)
            with torch.device("meta"):
                self.lm = AutoModelForCausalLM.from_config(
                    config, dtype=torch.float32, attn_implementation="sdpa")
        else:
            self.lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                           attn_implementation="sdpa")
        self.blocks = self.lm.model.layers
        if lora:
            from peft import LoraConfig, get_peft_model

            self.lm = get_peft_model(self.lm, LoraConfig(
                r=lora, lora_alpha=2 * lora, lora_dropout=0.0, target_modules=LORA_TARGETS,
                bias="none", task_type="CAUSAL_LM"))

    def forward(self, ids, targets):
        # No KV cache in training (as transformers' Trainer runs it): it is never read, and
        # under torch.compile its per-layer updates recompile the graph.
        logits = self.lm(input_ids=ids, use_cache=False).logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def materialize(self, rank):
        """After `fully_shard` on a meta model: each rank's shards made on the CPU, the
        weights read by rank 0 (bf16 as stored, cast to f32) and broadcast into them
        (`set_model_state_dict`, torchtitan's way), the rotary tables made again (buffers
        that are not in the file), and LoRA's adapters set (A to 1/r, B to 0: values that
        do not change a step's cost)."""
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                               set_model_state_dict)

        self.to_empty(device="cpu")
        full = {}
        if rank == 0:
            stored = load_file(os.path.join(self.path, "model.safetensors"))
            for name in self.state_dict():
                key = (name.removeprefix("lm.").removeprefix("base_model.model.")
                       .replace("._checkpoint_wrapped_module", "").replace(".base_layer.", "."))
                if key in stored:
                    full[name] = stored[key].to(torch.float32)
        set_model_state_dict(self, full, options=StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=True, strict=False))
        for module in self.modules():
            if hasattr(module, "inv_freq") and hasattr(module, "config"):
                fresh = type(module)(config=module.config)
                module.inv_freq = fresh.inv_freq
                if hasattr(module, "original_inv_freq"):
                    module.original_inv_freq = fresh.original_inv_freq
            if hasattr(module, "lora_A"):
                for a in module.lora_A.values():
                    a.weight.data.fill_(1.0 / a.weight.shape[0])
                for b in module.lora_B.values():
                    b.weight.data.zero_()


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(**LLAMA, attn_implementation="sdpa")
        self.lm = LlamaForCausalLM(config)
        self.blocks = self.lm.model.layers

    def forward(self, ids, targets):
        logits = self.lm(input_ids=ids, use_cache=False).logits  # as in Pretrained
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def batches(vocab, batch, seq, steps, rank, world):
    """The global batches' ids from a fixed generator, this rank's slice of each."""
    g = torch.Generator().manual_seed(42)
    ids = torch.randint(0, vocab, (steps, batch, seq + 1), generator=g)
    per = batch // world
    return [(s[rank * per:(rank + 1) * per, :-1], s[rank * per:(rank + 1) * per, 1:]) for s in ids]


def adamw(params, fused):
    """AdamW as the example's: fused (one kernel for all tensors) or foreach."""
    kind = {"fused": True} if fused else {"foreach": True}
    return torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01,
                             **kind)


def run(rank, world, model_name, strategy, threads, port, compiled, recompute, out):
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    warmup, measured = WARMUP, MEASURED
    if model_name.startswith("hf:"):
        path, _, lora = model_name.removeprefix("hf:").partition("+lora")
        # FSDP2 users build the model on the meta device and shard it before it has memory.
        meta = strategy == "fsdp_full_shard"
        model = Pretrained(path, int(lora) if lora else None, meta=meta)
        vocab, (batch, seq) = model.lm.config.vocab_size, HF_SHAPE
        warmup, measured = HF_WARMUP, HF_MEASURED
    elif model_name == "llama":
        model, vocab, batch, seq = Llama(), LLAMA["vocab_size"], LLAMA_BATCH, LLAMA_SEQ
    else:
        d = int(model_name.removeprefix("gpt-d"))
        model, vocab, batch, seq = Gpt(d), GPT_VOCAB, GPT_BATCH, GPT_BLOCK
    if recompute:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            checkpoint_wrapper)

        for i, block in enumerate(model.blocks):
            model.blocks[i] = checkpoint_wrapper(block, preserve_rng_state=False)
    if strategy == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    elif strategy == "fsdp_full_shard":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        if isinstance(model, Pretrained) and model_name.startswith("hf:"):
            model.materialize(rank)
    step_model = torch.compile(model) if compiled else model
    # Frozen weights (LoRA's base) have no optimizer state.
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        opt, optimizer = adamw(params, fused=True), "fused"
    except (RuntimeError, ValueError):
        opt, optimizer = adamw(params, fused=False), "foreach"
    times = []
    for ids, targets in batches(vocab, batch, seq, warmup + measured, rank, world):
        if rank == 0 and len(times) == warmup and model_name.startswith("hf:"):
            print(STEADY, flush=True)
        start = time.perf_counter()
        loss = step_model(ids, targets)
        loss.backward()
        try:
            opt.step()
        except (RuntimeError, ValueError):
            # Refused at its first step (the parameters' kind): foreach from here on, as
            # the same step; only a warm-up step can get here.
            if optimizer != "fused" or times:
                raise
            opt, optimizer = adamw(params, fused=False), "foreach"
            opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    # Peak resident memory of this rank's process, in bytes (Linux reports KiB).
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out.put((rank, (batch * seq) / statistics.median(times[warmup:]), optimizer, peak))
    if world > 1:
        dist.destroy_process_group()


def mm_peak_gflops(threads):
    """torch.mm's best f32 rate on square 1024 and 2048 matrices, best of 8 calls each, into
    an output made once: the BLAS torch was built with (MKL on x86 wheels) alone, beside
    the GEMM peak wick measures the same way."""
    torch.set_num_threads(threads)
    best = 0.0
    for n in (1024, 2048):
        a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
        for _ in range(8):
            start = time.perf_counter()
            torch.mm(a, b, out=c)
            best = max(best, 2 * n**3 / (time.perf_counter() - start) / 1e9)
    return best


def profile_gpt(d, threads, steps=5):
    """The single d-wide GPT's step under torch.profiler, as `throughput --profile` shows
    wick's: the median step of 10 after 3 warm-up steps, then each op's self time per step
    over `steps` profiled steps (`addmm` is the forward products with their biases, `mm`
    the backward products)."""
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    model = Gpt(d)
    opt = adamw(model.parameters(), fused=True)
    (ids, targets), = batches(GPT_VOCAB, GPT_BATCH, GPT_BLOCK, 1, 0, 1)

    def step():
        loss = model(ids, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(WARMUP):
        step()
    times = []
    for _ in range(MEASURED):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    print(f"profile impl=torch model=gpt-d{d} step_ms={statistics.median(times) * 1e3:.1f}")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    for event in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:15]:
        print(f"profile impl=torch model=gpt-d{d} op={event.key} "
              f"ms={event.self_cpu_time_total / 1e3 / steps:.1f} calls={event.count // steps}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("--d-model", type=int, nargs="*", default=[128, 512])
    p.add_argument("--llama", action="store_true")
    p.add_argument("--worlds", type=int, nargs="*", default=[1, 2])
    p.add_argument("--compile", action="store_true",
                   help="also the W=1 runs (and --hf's at every W) under torch.compile")
    p.add_argument("--compiled-only", action="store_true",
                   help="the compiled runs of --compile without the eager ones")
    p.add_argument("--hf", metavar="DIR",
                   help="also a Hugging Face directory's model (global batch 8, sequence 256)")
    p.add_argument("--lora", type=int, metavar="R",
                   help="--hf's model with peft's LoRA of rank R (needs peft)")
    p.add_argument("--strategies", nargs="*", default=["ddp", "fsdp_full_shard"],
                   help="the W>1 strategies to run (default both)")
    p.add_argument("--checkpoint-activations", action="store_true",
                   help="recompute each block in backward (checkpoint_wrapper, torchtitan's way)")
    p.add_argument("--profile", action="store_true",
                   help="only the --d-model GPTs' single step under torch.profiler, op by op")
    args = p.parse_args()
    cores = os.cpu_count() or 1
    if args.profile:
        for d in args.d_model:
            profile_gpt(d, cores)
        return
    models = [f"gpt-d{d}" for d in args.d_model] + (["llama"] if args.llama else [])
    lora = f"+lora{args.lora}" if args.lora else ""
    models += [f"hf:{args.hf}{lora}"] if args.hf else []
    print(f"impl=torch mm_peak_gflops={mm_peak_gflops(cores):.1f}", flush=True)
    ctx = mp.get_context("spawn")
    port = 29511
    for model in models:
        for world in args.worlds:
            strategies = ["single"] if world == 1 else args.strategies
            # Compiled FSDP2 is run for --hf's model only (the GPT's and Llama's W=2 rows
            # stay eager, as they always were).
            compile_here = world == 1 or model.startswith("hf:")
            modes = [False, True] if args.compile and compile_here else [False]
            if args.compiled_only:
                modes = [True] if compile_here else []
            for strategy in strategies:
                for compiled in modes:
                    out = ctx.Queue()
                    threads = max(1, cores // world)
                    port += 1
                    procs = [ctx.Process(target=run, args=(r, world, model, strategy, threads,
                                                           port, compiled,
                                                           args.checkpoint_activations, out))
                             for r in range(world)]
                    for proc in procs:
                        proc.start()
                    for proc in procs:
                        proc.join()
                        if proc.exitcode != 0:
                            raise SystemExit(f"{model} {strategy} W={world}: a rank failed "
                                             f"({proc.exitcode})")
                    rows = sorted(out.get() for _ in range(world))
                    _, tps, optimizer, _ = rows[0]
                    peak = sum(r[3] for r in rows)
                    ac = " activation_checkpointing=full" if args.checkpoint_activations else ""
                    print(f"impl=torch model={model} strategy={strategy}{ac} world={world} "
                          f"transport={'gloo' if world > 1 else 'none'} "
                          f"mode={'compiled' if compiled else 'eager'} optimizer={optimizer} "
                          f"tokens_per_s={tps:.0f} peak_rss_mb={peak / 1e6:.0f}", flush=True)


if __name__ == "__main__":
    main()
