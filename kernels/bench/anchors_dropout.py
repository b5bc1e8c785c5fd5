#!/usr/bin/env python3
"""Times PyTorch's F.dropout (eager, float32, training, p = 0.1) on the
shape of ops' BenchmarkGPUDropout and prints it beside stheno's, from the
same run on the same GPU.

    # 1. stheno (ops' benchmark, kernels/dropout.cu):
    (cd ops && ../bin/ops.test -test.run '^$' -test.bench GPUDropout -test.benchtime 30x) | tee /tmp/dropout.log
    # 2. the anchor and the side-by-side table:
    python3 kernels/bench/anchors_dropout.py --stheno /tmp/dropout.log

fwd is F.dropout(x, 0.1, training=True) on a tensor that needs the
gradient (PyTorch's fused kernel draws the mask with Philox and also
writes it, a byte per element, for the backward); bwd its backward alone
(torch.autograd.grad of the output with respect to x given dy, on a graph
kept with retain_graph: dy times the saved mask and scale). Timing as
stheno's suite (timing.median_ms): CUDA events around each call, the
median of 30 after 5 warm-up calls; inputs random in [-1, 1). GB/s count
the compulsory bytes, as stheno's benchmark does: x (dy) read and y (dx)
written; PyTorch's mask bytes are not counted.
"""
import argparse
import re

import torch
import torch.nn.functional as F

from timing import median_ms

DEV = "cuda"
P = 0.1
# name: x shape, as BenchmarkGPUDropout's case.
CASES = {
    "detr_encoder_2x20000x256": (2, 20000, 256),
}


def time_case(shape):
    x = (torch.rand(shape, device=DEV) * 2 - 1).requires_grad_(True)
    fwd = median_ms(lambda: F.dropout(x, P, training=True))
    y = F.dropout(x, P, training=True)
    dy = torch.rand(shape, device=DEV) * 2 - 1
    bwd = median_ms(lambda: torch.autograd.grad(y, (x,), dy, retain_graph=True))
    return {"fwd": fwd, "bwd": bwd}, x.numel()


def stheno_times(path):
    out = {}
    for line in open(path):
        m = re.match(r"^BenchmarkGPUDropout/impl=cuda/dtype=float32/case=(\S+)/pass=(\S+?)-\d+\s.*?([\d.]+) ms\b", line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stheno", help="ops' BenchmarkGPUDropout log of the same run")
    args = ap.parse_args()
    ours = stheno_times(args.stheno) if args.stheno else {}
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{'case':26s} {'pass':5s} {'torch ms':>9s} {'GB/s':>7s} {'stheno ms':>9s} {'GB/s':>7s} {'speed-up':>8s}")
    for name, shape in CASES.items():
        times, n = time_case(shape)
        gb = 2 * n * 4 / 1e9
        for p in ("fwd", "bwd"):
            t, s = times[p], ours.get((name, p))
            ratio = f"{t / s:7.2f}x" if s else "   (n/a)"
            sgbs = gb / (s / 1e3) if s else float("nan")
            print(f"{name:26s} {p:5s} {t:9.4f} {gb / (t / 1e3):7.0f} {s if s else float('nan'):9.4f} {sgbs:7.0f} {ratio}")


if __name__ == "__main__":
    main()
