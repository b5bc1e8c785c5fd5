#!/usr/bin/env python3
"""Times PyTorch's F.interpolate(mode="nearest") (eager, float32) on the
shapes of ops' BenchmarkGPUUpsampleNearest and prints them beside
stheno's, from the same run on the same GPU.

    # 1. stheno (ops' benchmark, kernels/upsample.cu):
    (cd ops && ../bin/ops.test -test.run '^$' -test.bench GPUUpsampleNearest -test.benchtime 30x) | tee /tmp/upsample.log
    # 2. the anchor and the side-by-side table:
    python3 kernels/bench/anchors_upsample.py --stheno /tmp/upsample.log

fwd is F.interpolate(x, scale_factor=2, mode="nearest") under no_grad;
bwd its backward alone (torch.autograd.grad of the output with respect to
x given dy, on a graph kept with retain_graph). Timing as stheno's suite
(timing.median_ms): CUDA events around each call, the median of 30 after
5 warm-up calls; inputs random in [-1, 1). GB/s count the compulsory
bytes, as stheno's benchmark does: x read and y written (fwd), dy read and
dx written (bwd): 5 times x's bytes either way.
"""
import argparse
import re

import torch
import torch.nn.functional as F

from timing import median_ms

DEV = "cuda"
# name: x shape, as BenchmarkGPUUpsampleNearest's cases (factor 2).
CASES = {
    "fpn_p5_2x256x25x38": (2, 256, 25, 38),
    "fpn_p4_2x256x50x76": (2, 256, 50, 76),
    "fpn_p3_2x256x100x152": (2, 256, 100, 152),
}


def time_case(shape):
    x = (torch.rand(shape, device=DEV) * 2 - 1).requires_grad_(True)
    with torch.no_grad():
        fwd = median_ms(lambda: F.interpolate(x, scale_factor=2, mode="nearest"))
    y = F.interpolate(x, scale_factor=2, mode="nearest")
    dy = torch.rand(y.shape, device=DEV) * 2 - 1
    bwd = median_ms(lambda: torch.autograd.grad(y, (x,), dy, retain_graph=True))
    return {"fwd": fwd, "bwd": bwd}, x.numel()


def stheno_times(path):
    out = {}
    for line in open(path):
        m = re.match(r"^BenchmarkGPUUpsampleNearest/impl=cuda/dtype=float32/case=(\S+)/pass=(\S+?)-\d+\s.*?([\d.]+) ms\b", line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stheno", help="ops' BenchmarkGPUUpsampleNearest log of the same run")
    args = ap.parse_args()
    ours = stheno_times(args.stheno) if args.stheno else {}
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{'case':26s} {'pass':7s} {'torch ms':>9s} {'GB/s':>7s} {'stheno ms':>9s} {'GB/s':>7s} {'speed-up':>8s}")
    for name, shape in CASES.items():
        times, nx = time_case(shape)
        gb = 5 * nx * 4 / 1e9
        for pas in ("fwd", "bwd"):
            t, st = times[pas], ours.get((name, pas))
            ratio = f"{t / st:7.2f}x" if st else "   (n/a)"
            sgbs = gb / (st / 1e3) if st else float("nan")
            print(f"{name:26s} {pas:7s} {t:9.4f} {gb / (t / 1e3):7.0f} {st if st else float('nan'):9.4f} {sgbs:7.0f} {ratio}")


if __name__ == "__main__":
    main()
