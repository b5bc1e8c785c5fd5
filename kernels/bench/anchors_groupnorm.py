#!/usr/bin/env python3
"""Times PyTorch's F.group_norm (eager, float32, 32 groups, with weight and
bias) on the shapes of ops' BenchmarkGPUGroupNorm and prints them beside
stheno's, from the same run on the same GPU.

    # 1. stheno (ops' benchmark, kernels/groupnorm.cu):
    (cd ops && ../bin/ops.test -test.run '^$' -test.bench GPUGroupNorm -test.benchtime 30x) | tee /tmp/groupnorm.log
    # 2. the anchor and the side-by-side table:
    python3 kernels/bench/anchors_groupnorm.py --stheno /tmp/groupnorm.log

fwd is F.group_norm(x, 32, weight, bias, 1e-5); bwd its backward alone
(torch.autograd.grad of the output with respect to x, weight and bias,
given dy, on a graph kept with retain_graph): PyTorch's kernels for the
per-channel sums, dx, and the weight and bias gradients. Timing as
stheno's suite: CUDA events around each call, the median of 30 after 5
warm-up calls; inputs random in [-1, 1) (weight in [0.5, 1.5)). GB/s count
the compulsory bytes, as stheno's benchmark does: x read and y written
(fwd), x and dy read and dx written (bwd). stheno's bwd_sums and bwd_dx,
the two big ops of its backward, are printed below the table.
"""
import argparse
import re

import torch
import torch.nn.functional as F

from timing import median_ms

DEV = "cuda"
GROUPS = 32
# name: x's shape, as BenchmarkGPUGroupNorm's cases.
CASES = {
    "fpn_p2_2x256x200x200": (2, 256, 200, 200),
    "fpn_p3_2x256x100x100": (2, 256, 100, 100),
    "fpn_p5_2x256x25x25": (2, 256, 25, 25),
    "map_2x512x64x64": (2, 512, 64, 64),
}


def time_case(shape):
    c = shape[1]
    x = (torch.rand(shape, device=DEV) * 2 - 1).requires_grad_(True)
    w = (torch.rand((c,), device=DEV) + 0.5).requires_grad_(True)
    b = (torch.rand((c,), device=DEV) * 2 - 1).requires_grad_(True)
    dy = torch.rand(shape, device=DEV) * 2 - 1
    with torch.no_grad():
        fwd = median_ms(lambda: F.group_norm(x, GROUPS, w, b, 1e-5))
    y = F.group_norm(x, GROUPS, w, b, 1e-5)
    bwd = median_ms(lambda: torch.autograd.grad(y, (x, w, b), dy, retain_graph=True))
    return {"fwd": fwd, "bwd": bwd}


def stheno_times(path):
    out = {}
    for line in open(path):
        m = re.match(r"^BenchmarkGPUGroupNorm/impl=cuda/dtype=float32/case=(\S+)/pass=(\S+?)-\d+\s.*?([\d.]+) ms\b", line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stheno", help="ops' BenchmarkGPUGroupNorm log of the same run")
    args = ap.parse_args()
    ours = stheno_times(args.stheno) if args.stheno else {}
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{'case':22s} {'pass':5s} {'torch ms':>9s} {'GB/s':>7s} {'stheno ms':>9s} {'GB/s':>7s} {'speed-up':>8s}")
    for name, shape in CASES.items():
        times = time_case(shape)
        n = 1
        for d in shape:
            n *= d
        for p, tensors in (("fwd", 2), ("bwd", 3)):
            gb = tensors * n * 4 / 1e9
            t, s = times[p], ours.get((name, p))
            ratio = f"{t / s:7.2f}x" if s else "   (n/a)"
            sgbs = gb / (s / 1e3) if s else float("nan")
            print(f"{name:22s} {p:5s} {t:9.4f} {gb / (t / 1e3):7.0f} {s if s else float('nan'):9.4f} {sgbs:7.0f} {ratio}")
    parts = [(k, v) for k, v in sorted(ours.items()) if k[1] in ("bwd_sums", "bwd_dx")]
    if parts:
        print("stheno's backward ops:")
        for (name, p), s in parts:
            print(f"  {name:22s} {p:8s} {s:9.4f} ms")


if __name__ == "__main__":
    main()
