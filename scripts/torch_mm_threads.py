"""The peer's side of `cargo bench --bench gemm_threads`: `torch.mm` (MKL on x86) at one
and two threads on the throughput example's d512 GPT shapes, 1024 rows, each linear
layer's forward x W^T and the two products of its backward, g W and g^T x. One and two
threads alternate for 7 rounds; each timing is the best of 5 runs, the median round is
printed.

    python scripts/torch_mm_threads.py
"""

import time

import torch

ROWS, D, ROUNDS = 1024, 512, 7


def best(f):
    f()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    gen = torch.Generator().manual_seed(0)
    for inp, out in [(D, 3 * D), (D, D), (D, 4 * D), (4 * D, D)]:
        x = torch.rand(ROWS, inp, generator=gen)
        w = torch.rand(out, inp, generator=gen)
        g = torch.rand(ROWS, out, generator=gen)
        y, dx, dw = torch.empty(ROWS, out), torch.empty(ROWS, inp), torch.empty(out, inp)
        gflop = 2 * ROWS * inp * out / 1e9
        directions = [
            ("forward x·Wᵀ", lambda: torch.mm(x, w.t(), out=y)),
            ("backward g·W", lambda: torch.mm(g, w, out=dx)),
            ("backward gᵀ·x", lambda: torch.mm(g.t(), x, out=dw)),
        ]
        for name, run in directions:
            one, two = [], []
            for _ in range(ROUNDS):
                torch.set_num_threads(1)
                one.append(best(run))
                torch.set_num_threads(2)
                two.append(best(run))
            one, two = sorted(one)[ROUNDS // 2], sorted(two)[ROUNDS // 2]
            print(
                f"torch in={inp} out={out} {name}: 1 thread {gflop / one:.1f} GFLOP/s, "
                f"2 threads {gflop / two:.1f}, speedup {one / two:.2f}"
            )


if __name__ == "__main__":
    main()
