#!/usr/bin/env python3
"""Times PyTorch's F.layer_norm (eager, float32, with weight and bias) on
the shapes of ops' BenchmarkGPULayerNorm and prints them beside stheno's,
from the same run on the same GPU.

    # 1. stheno (ops' benchmark, kernels/layernorm.cu):
    (cd ops && ../bin/ops.test -test.run '^$' -test.bench GPULayerNorm -test.benchtime 30x) | tee /tmp/layernorm.log
    # 2. the anchor and the side-by-side table:
    python3 kernels/bench/anchors_layernorm.py --stheno /tmp/layernorm.log

fwd is F.layer_norm(x, [C], weight, bias, 1e-5); bwd its backward alone
(torch.autograd.grad of the output with respect to x, weight and bias,
given dy, on a graph kept with retain_graph): PyTorch's dx kernel and its
weight-and-bias gradient kernel. Timing as stheno's suite: CUDA events
around each call, the median of 30 after 5 warm-up calls; inputs random in
[-1, 1) (weight in [0.5, 1.5)). GB/s count the compulsory bytes, as
stheno's benchmark does: x read and y written (fwd), x and dy read and dx
written (bwd).
"""
import argparse
import re

import torch
import torch.nn.functional as F

from timing import median_ms

DEV = "cuda"
# name: (rows, C), as BenchmarkGPULayerNorm's cases.
CASES = {
    "detr_encoder_44446x256": (2 * 22223, 256),
    "detr_decoder_600x256": (2 * 300, 256),
}


def time_case(rows, c):
    x = (torch.rand((rows, c), device=DEV) * 2 - 1).requires_grad_(True)
    w = (torch.rand((c,), device=DEV) + 0.5).requires_grad_(True)
    b = (torch.rand((c,), device=DEV) * 2 - 1).requires_grad_(True)
    dy = torch.rand((rows, c), device=DEV) * 2 - 1
    with torch.no_grad():
        fwd = median_ms(lambda: F.layer_norm(x, [c], w, b, 1e-5))
    y = F.layer_norm(x, [c], w, b, 1e-5)
    bwd = median_ms(lambda: torch.autograd.grad(y, (x, w, b), dy, retain_graph=True))
    return {"fwd": fwd, "bwd": bwd}


def stheno_times(path):
    out = {}
    for line in open(path):
        m = re.match(r"^BenchmarkGPULayerNorm/impl=cuda/dtype=float32/case=(\S+)/pass=(\S+?)-\d+\s.*?([\d.]+) ms\b", line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stheno", help="ops' BenchmarkGPULayerNorm log of the same run")
    args = ap.parse_args()
    ours = stheno_times(args.stheno) if args.stheno else {}
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{'case':24s} {'pass':5s} {'torch ms':>9s} {'GB/s':>7s} {'stheno ms':>9s} {'GB/s':>7s} {'speed-up':>8s}")
    for name, (rows, c) in CASES.items():
        times = time_case(rows, c)
        for p, tensors in (("fwd", 2), ("bwd", 3)):
            gb = tensors * rows * c * 4 / 1e9
            t, s = times[p], ours.get((name, p))
            ratio = f"{t / s:7.2f}x" if s else "   (n/a)"
            sgbs = gb / (s / 1e3) if s else float("nan")
            print(f"{name:24s} {p:5s} {t:9.4f} {gb / (t / 1e3):7.0f} {s if s else float('nan'):9.4f} {sgbs:7.0f} {ratio}")


if __name__ == "__main__":
    main()
