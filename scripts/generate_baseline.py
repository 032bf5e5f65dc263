"""transformers' greedy `generate` speed on a model directory, f32, on this machine's
cores: the counterpart of examples/generation_speed.rs, printing the same line per round
(tokens/s; the time of the new token around the 10th and the 500th, from the gaps between
consecutive steps). End tokens are held off (`min_new_tokens`), so that every round
generates the same number of tokens as wick's.

    python scripts/generate_baseline.py DIR [--new 500] [--prompt 10] [--rounds 5]
"""

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList


class Stamps(LogitsProcessor):
    """Records the time of each step (called once per new token, before it is picked)."""

    def __init__(self):
        self.times = []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter())
        return scores


def token_ms(gaps, k):
    lo, hi = max(k - 5, 2), min(k + 5, len(gaps))
    return statistics.median(gaps[lo - 1:hi]) * 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--new", type=int, default=500)
    p.add_argument("--prompt", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    model = AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.float32).eval()
    prompt = torch.tensor([list(range(1, a.prompt + 1))])
    for r in range(1, a.rounds + 1):
        stamps = Stamps()
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(prompt, max_new_tokens=a.new, min_new_tokens=a.new,
                                 do_sample=False, logits_processor=LogitsProcessorList([stamps]))
        total = time.perf_counter() - start
        new = out.shape[1] - a.prompt
        # The picks happen right after each stamp: gap k is the time of new token k.
        times = [start] + stamps.times
        gaps = [b - c for b, c in zip(times[1:], times[:-1])]
        late = min(a.new, 500)
        print(f"torch round {r}: {new / total:.1f} tokens/s, token 10 {token_ms(gaps, 10):.2f} ms, "
              f"token {late} {token_ms(gaps, late):.2f} ms")


if __name__ == "__main__":
    main()
