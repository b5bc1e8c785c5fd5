#!/usr/bin/env python3
"""Times PyTorch eager's layout ops at the shapes of ops' BenchmarkGPULayout
and prints them beside stheno's, from the same run on the same GPU.

    # 1. stheno (ops' benchmark, built by `make gpu-bins`):
    (cd ops && ../bin/ops.test -test.run '^$' -test.bench GPULayout -test.benchtime 30x) | tee /tmp/layout.log
    # 2. the anchor and the side-by-side table:
    python3 kernels/bench/anchors_layout.py --stheno /tmp/layout.log

Timing as stheno's suite: CUDA events around each call, median of 30 after
5 warm-up calls; float32. The anchors: x.permute(perm).contiguous() (heads
[2, 20000, 8, 32] -> [2, 8, 20000, 32]; a feature map [2, 256, 100, 150] to
tokens [2, 15000, 256]), torch.cat of Deformable-DETR's four levels'
tokens [2, L, 256] along L, torch.index_select of 300 of 20,000 rows of
256, and its backward alone (index_add_ of dy's rows into zeros, what
autograd runs for index_select). GB/s counts the bytes each op must move,
as the benchmark does (each element read once and written once; the
gather's backward also writes dx's zeros); speed-up is torch's time over
stheno's.
"""
import argparse
import re

import torch

from timing import median_ms

DEV = "cuda"
LEVELS = [100 * 134, 50 * 67, 25 * 34, 13 * 17]


def cases():
    """(benchmark name, fn, bytes) for each of BenchmarkGPULayout's runs."""
    gen = torch.Generator(device=DEV).manual_seed(1)
    out = []
    for name, shape, perm in (
        ("case=heads_2x20000x8x32/op=permute", (2, 20000, 8, 32), (0, 2, 1, 3)),
        ("case=tokens_2x256x100x150/op=permute", (2, 256, 100, 150), (0, 2, 3, 1)),
    ):
        x = torch.rand(shape, device=DEV, generator=gen)
        out.append((name, lambda x=x, perm=perm: x.permute(perm).contiguous(), 8 * x.numel()))
    levels = [torch.rand((2, n, 256), device=DEV, generator=gen) for n in LEVELS]
    out.append(("case=levels_2x17821x256/op=concat", lambda: torch.cat(levels, 1), 8 * sum(t.numel() for t in levels)))
    tokens = torch.cat(levels, 1)
    d_level = torch.rand_like(levels[0])

    def slice_backward():
        dx = torch.zeros_like(tokens)
        dx.narrow(1, 0, LEVELS[0]).copy_(d_level)
        return dx

    out.append(("case=level0_of_2x17821x256/op=slice/pass=fwd",
                lambda: tokens.narrow(1, 0, LEVELS[0]).contiguous(), 8 * levels[0].numel()))
    out.append(("case=level0_of_2x17821x256/op=slice/pass=bwd", slice_backward, 4 * levels[0].numel() + 4 * tokens.numel()))
    n, k, d = 20000, 300, 256
    x = torch.rand((n, d), device=DEV, generator=gen)
    idx = torch.randint(0, n, (k,), device=DEV, generator=gen)
    dy = torch.rand((k, d), device=DEV, generator=gen)
    out.append(("case=select_300_of_20000x256/op=gather/pass=fwd", lambda: torch.index_select(x, 0, idx), 8 * k * d + 8 * k))
    out.append(("case=select_300_of_20000x256/op=gather/pass=bwd",
                lambda: torch.zeros((n, d), device=DEV).index_add_(0, idx, dy), 4 * k * d + 4 * n * d + 8 * k))
    return out


def stheno_times(path):
    res = {}
    for line in open(path):
        m = re.match(r"^BenchmarkGPULayout/impl=cuda/(\S+?)-\d+\s.*?([\d.]+) ms\b", line)
        if m:
            res[m.group(1)] = float(m.group(2))
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stheno", help="ops' BenchmarkGPULayout log of the same run")
    args = ap.parse_args()
    ours = stheno_times(args.stheno) if args.stheno else {}
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{'run':52s} {'torch ms':>9s} {'GB/s':>7s} {'stheno ms':>9s} {'GB/s':>7s} {'speed-up':>8s}")
    for name, fn, nbytes in cases():
        t = median_ms(fn)
        s = ours.get(name)
        ratio = f"{t / s:7.2f}x" if s else "   (n/a)"
        sgbs = nbytes / s / 1e6 if s else float("nan")
        print(f"{name:52s} {t:9.4f} {nbytes / t / 1e6:7.0f} {s if s else float('nan'):9.4f} {sgbs:7.0f} {ratio}")


if __name__ == "__main__":
    main()
