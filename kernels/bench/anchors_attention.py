#!/usr/bin/env python3
"""Times torch.nn.MultiheadAttention forward and backward in PyTorch eager
at the shape of ops' BenchmarkGPUMultiHeadAttention and prints it beside
stheno's, from the same run on the same GPU.

    # 1. stheno (ops' benchmark, built by `make gpu-bins`):
    (cd ops && ../bin/ops.test -test.run '^$' -test.bench GPUMultiHeadAttention -test.benchtime 30x) | tee /tmp/attention.log
    # 2. the anchor and the side-by-side table:
    python3 kernels/bench/anchors_attention.py --stheno /tmp/attention.log

The shape is DETR's decoder self-attention: 300 queries, E = 256, 8 heads,
2 images, [L, N, E], float32, dropout 0, no mask, need_weights=False (the
benchmark's graph does not average the weights either). One timed
iteration is the forward and the backward of every gradient (the input
and the four parameters), the output's gradient given, as stheno's tape
machine run: CUDA events around it, the median of 30 after 5 warm-up
iterations. TF32 is left at PyTorch's default for matmuls (off in 1.12 and
later); the stheno run's GEMM math is its Device's (backend.GemmMath).
"""
import argparse
import re

import torch

from timing import median_ms

DEV = "cuda"
E, H, L, N = 256, 8, 300, 2


def stheno_ms(path):
    for line in open(path):
        m = re.match(r"^BenchmarkGPUMultiHeadAttention/impl=cuda/\S+\s.*?([\d.]+) ms\b", line)
        if m:
            return float(m.group(1))
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stheno", help="ops' BenchmarkGPUMultiHeadAttention log of the same run")
    args = ap.parse_args()
    gen = torch.Generator(device=DEV).manual_seed(1)
    mha = torch.nn.MultiheadAttention(E, H, dropout=0.0).to(DEV)
    x = (torch.rand((L, N, E), device=DEV, generator=gen) * 2 - 1).requires_grad_(True)
    r = torch.rand((L, N, E), device=DEV, generator=gen) * 2 - 1
    params = [x] + list(mha.parameters())

    def step():
        out, _ = mha(x, x, x, need_weights=False)
        torch.autograd.grad(out, params, r)

    t = median_ms(step)
    s = stheno_ms(args.stheno) if args.stheno else None
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{'case':36s} {'torch ms':>9s} {'stheno ms':>9s} {'speed-up':>8s}")
    ratio = f"{t / s:7.2f}x" if s else "   (n/a)"
    print(f"{'decoder_self_300x2x256_h8 fwd+bwd':36s} {t:9.4f} {s if s else float('nan'):9.4f} {ratio}")


if __name__ == "__main__":
    main()
