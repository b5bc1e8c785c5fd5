#!/usr/bin/env python3
"""Times the detection losses in PyTorch eager, forward and backward, on the
shapes of ops' BenchmarkGPULosses and prints them beside stheno's, from the
same run on the same GPU.

    # 1. stheno (ops' benchmark, built by `make gpu-bins`):
    (cd ops && ../bin/ops.test -test.run '^$' -test.bench GPULosses -test.benchtime 30x) | tee /tmp/losses.log
    # 2. the anchor and the side-by-side table:
    python3 kernels/bench/anchors_losses.py --stheno /tmp/losses.log

Timing as stheno's suite (timing.median_ms): CUDA events around each call,
median of 30 after 5 warm-up calls; float32. Each loss is reduction="sum" with a weight per
element (per row for cross_entropy and GIoU), as stheno's ops take it:
sum(w * loss(x, t, reduction="none")), so that PyTorch runs the same
arithmetic (its weighted forms: binary_cross_entropy_with_logits's
weight=, and a product and a sum for the others). The losses:
torchvision.ops.sigmoid_focal_loss (alpha 0.25, gamma 2), F.l1_loss,
torchvision.ops.generalized_box_iou_loss, F.binary_cross_entropy_with_logits,
F.smooth_l1_loss (beta 1/9) and F.cross_entropy. The forward is the loss
with x not requiring grad; the backward is torch.autograd.grad of the loss
with respect to x, as a training step runs it (PyTorch saves what the
backward reads during the forward; the timed backward is the backward
alone, replayed with retain_graph). GB/s counts the bytes each pass must
move (forward x, t and w; backward those and dx), as the benchmark does;
speed-up is torch's time over stheno's.
"""
import argparse
import re

import torch
import torch.nn.functional as F
from torchvision.ops import generalized_box_iou_loss, sigmoid_focal_loss

from timing import median_ms

DEV = "cuda"
# name: (kind, shape), as BenchmarkGPULosses's lossBenchCases.
CASES = {
    "focal_2x300x91": ("focal", (2, 300, 91)),
    "l1_600x4": ("l1", (600, 4)),
    "giou_600x4": ("giou", (600, 4)),
    "bce_mask_512x28x28": ("bce", (512, 28, 28)),
    "bce_rpn_2x360000": ("bce", (2, 360000)),
    "smoothl1_rpn_720000x4": ("smoothl1", (720000, 4)),
    "ce_roi_1024x91": ("ce", (1024, 91)),
}


def boxes(n, gen):
    xy = torch.rand(n, 2, device=DEV, generator=gen) * 4
    wh = 0.5 + torch.rand(n, 2, device=DEV, generator=gen) * 2.5
    return torch.cat([xy, xy + wh], 1)


def inputs(kind, shape, gen):
    """x, t, w like the benchmark's (newLossGPUCase): logits in [-6, 6],
    targets in [0, 1] (binary for focal), boxes, labels, weights in [0, 2]."""
    if kind == "giou":
        return boxes(shape[0], gen), boxes(shape[0], gen), torch.rand(shape[0], device=DEV, generator=gen) * 2
    x = torch.rand(shape, device=DEV, generator=gen) * 12 - 6
    if kind == "ce":
        t = torch.randint(0, shape[1], (shape[0],), device=DEV, generator=gen)
        return x, t, torch.rand(shape[0], device=DEV, generator=gen) * 2
    t = torch.rand(shape, device=DEV, generator=gen)
    if kind == "focal":
        t = t.round()
    return x, t, torch.rand(shape, device=DEV, generator=gen) * 2


def loss_fn(kind):
    if kind == "focal":
        return lambda x, t, w: (w * sigmoid_focal_loss(x, t, alpha=0.25, gamma=2, reduction="none")).sum()
    if kind == "l1":
        return lambda x, t, w: (w * F.l1_loss(x, t, reduction="none")).sum()
    if kind == "giou":
        return lambda x, t, w: (w * generalized_box_iou_loss(x, t, reduction="none")).sum()
    if kind == "bce":
        return lambda x, t, w: F.binary_cross_entropy_with_logits(x, t, weight=w, reduction="sum")
    if kind == "smoothl1":
        return lambda x, t, w: (w * F.smooth_l1_loss(x, t, reduction="none", beta=1 / 9)).sum()
    return lambda x, t, w: (w * F.cross_entropy(x, t, reduction="none")).sum()


def time_case(kind, shape):
    gen = torch.Generator(device=DEV).manual_seed(1)
    x, t, w = inputs(kind, shape, gen)
    f = loss_fn(kind)
    fwd = median_ms(lambda: f(x, t, w))
    xg = x.clone().requires_grad_(True)
    loss = f(xg, t, w)
    bwd = median_ms(lambda: torch.autograd.grad(loss, [xg], retain_graph=True))
    nbytes = sum(v.numel() * 4 for v in (x, t, w))
    return fwd, bwd, nbytes, x.numel() * 4


def stheno_times(path):
    out = {}
    for line in open(path):
        m = re.match(r"^BenchmarkGPULosses/impl=cuda/case=(\S+)/pass=(\S+?)-\d+\s.*?([\d.]+) ms\b", line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stheno", help="ops' BenchmarkGPULosses log of the same run")
    args = ap.parse_args()
    ours = stheno_times(args.stheno) if args.stheno else {}
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{'case':24s} {'pass':4s} {'torch ms':>9s} {'GB/s':>7s} {'stheno ms':>9s} {'GB/s':>7s} {'speed-up':>8s}")
    for name, (kind, shape) in CASES.items():
        fwd, bwd, nbytes, dxbytes = time_case(kind, shape)
        for pss, t, b in (("fwd", fwd, nbytes), ("bwd", bwd, nbytes + dxbytes)):
            s = ours.get((name, pss))
            ratio = f"{t / s:7.2f}x" if s else "   (n/a)"
            sgbs = b / s / 1e6 if s else float("nan")
            print(f"{name:24s} {pss:4s} {t:9.4f} {b / t / 1e6:7.0f} "
                  f"{s if s else float('nan'):9.4f} {sgbs:7.0f} {ratio}")


if __name__ == "__main__":
    main()
