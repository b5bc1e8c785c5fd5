#!/usr/bin/env python3
"""Times PyTorch's F.max_pool2d (eager, float32) on the shapes of ops'
BenchmarkGPUMaxPool2d and prints them beside stheno's, from the same run
on the same GPU.

    # 1. stheno (ops' benchmark, kernels/maxpool.cu):
    (cd ops && ../bin/ops.test -test.run '^$' -test.bench GPUMaxPool2d -test.benchtime 30x) | tee /tmp/maxpool.log
    # 2. the anchor and the side-by-side table:
    python3 kernels/bench/anchors_maxpool.py --stheno /tmp/maxpool.log

fwd is F.max_pool2d(x, kernel, stride, padding) under no_grad (PyTorch's
forward kernel then writes no indices); fwd_idx the forward of a graph
that needs the gradient (it also writes the int64 indices the backward
reads: what a training step runs); bwd its backward alone
(torch.autograd.grad of the output with respect to x given dy, on a graph
kept with retain_graph). Timing as stheno's suite (timing.median_ms):
CUDA events around each call, the median of 30 after 5 warm-up calls;
inputs random in [-1, 1). GB/s count the compulsory bytes, as stheno's
benchmark does: x read and y written (fwd); x and dy read and dx written
(bwd; PyTorch reads the saved indices instead of x, which these bytes do
not count).
"""
import argparse
import re

import torch
import torch.nn.functional as F

from timing import median_ms

DEV = "cuda"
# name: (x shape, kernel, stride, padding), as BenchmarkGPUMaxPool2d's cases.
CASES = {
    "resnet_stem_2x64x400x608": ((2, 64, 400, 608), 3, 2, 1),
    "fpn_p6_2x256x25x38": ((2, 256, 25, 38), 1, 2, 0),
}


def time_case(shape, k, s, p):
    x = (torch.rand(shape, device=DEV) * 2 - 1).requires_grad_(True)
    with torch.no_grad():
        fwd = median_ms(lambda: F.max_pool2d(x, k, s, p))
    fwd_idx = median_ms(lambda: F.max_pool2d(x, k, s, p))
    y = F.max_pool2d(x, k, s, p)
    dy = torch.rand(y.shape, device=DEV) * 2 - 1
    bwd = median_ms(lambda: torch.autograd.grad(y, (x,), dy, retain_graph=True))
    return {"fwd": fwd, "fwd_idx": fwd_idx, "bwd": bwd}, x.numel(), y.numel()


def stheno_times(path):
    out = {}
    for line in open(path):
        m = re.match(r"^BenchmarkGPUMaxPool2d/impl=cuda/dtype=float32/case=(\S+)/pass=(\S+?)-\d+\s.*?([\d.]+) ms\b", line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stheno", help="ops' BenchmarkGPUMaxPool2d log of the same run")
    args = ap.parse_args()
    ours = stheno_times(args.stheno) if args.stheno else {}
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{'case':26s} {'pass':7s} {'torch ms':>9s} {'GB/s':>7s} {'stheno ms':>9s} {'GB/s':>7s} {'speed-up':>8s}")
    for name, (shape, k, s, p) in CASES.items():
        times, nx, ny = time_case(shape, k, s, p)
        for pas, ours_pass, elems in (("fwd", "fwd", nx + ny), ("fwd_idx", "fwd", nx + ny), ("bwd", "bwd", 2 * nx + ny)):
            gb = elems * 4 / 1e9
            t, st = times[pas], ours.get((name, ours_pass))
            ratio = f"{t / st:7.2f}x" if st else "   (n/a)"
            sgbs = gb / (st / 1e3) if st else float("nan")
            print(f"{name:26s} {pas:7s} {t:9.4f} {gb / (t / 1e3):7.0f} {st if st else float('nan'):9.4f} {sgbs:7.0f} {ratio}")


if __name__ == "__main__":
    main()
