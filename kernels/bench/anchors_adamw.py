#!/usr/bin/env python3
"""Times torch.optim.AdamW(fused=True) steps, with and without
torch.nn.utils.clip_grad_norm_(foreach=True) before them, on the parameter
shapes of ops' BenchmarkGPUAdamW (DETR-R50: 352 tensors, 41.6M float32
parameters, in three param_groups) and prints them beside stheno's, from
the same run on the same GPU.

    # 1. stheno (ops' benchmark, built by `make gpu-bins`):
    (cd ops && ../bin/ops.test -test.run '^$' -test.bench GPUAdamW -test.benchtime 30x) | tee /tmp/adamw.log
    # 2. the anchor and the side-by-side table:
    python3 kernels/bench/anchors_adamw.py --stheno /tmp/adamw.log

Timing as stheno's suite: CUDA events around each step, median of 30 after
5 warm-up steps. The parameters are uniform in [-0.1, 0.1), the gradients
in [-1e-3, 1e-3); lr 1e-5 for the backbone and 1e-4 for the rest, weight
decay 1e-4 but 0 for the transformer's norms and biases, as the benchmark
has them; clipping at DETR's clip_max_norm 0.1. torch's step leaves the
gradients alone (training loops then set them to None, for free), so its
rows sit beside stheno's zero_grad=off ones; the zero_grad=on rows (what
gorgonia's solvers do: the gradients zeroed by the step, 4 bytes an
element more) are printed too. GB/s counts the bytes each must move: the
step reads param, grad, exp_avg and exp_avg_sq and writes param, exp_avg
and exp_avg_sq (28 bytes an element); torch's clipping reads the gradients
for their norm and then reads and writes them to scale them (12 more),
stheno's reads them once (4 more) and scales them as the step reads them;
zeroing writes them (4 more). speed-up is torch's time over stheno's.
"""
import argparse
import re

import torch

from timing import median_ms

DEV = "cuda"


def detr_r50_shapes():
    """The parameter shapes of DETR-R50 (facebookresearch/detr), split as
    ops' detrR50Shapes splits them: backbone (torchvision's resnet50 without
    fc, BatchNorm weights and biases included), the rest's weights, and its
    norms and biases."""
    backbone, weights, norms_biases = [], [], []

    def conv(out, inp, k):
        backbone.append((out, inp, k, k))

    def bn(c):
        backbone.extend([(c,), (c,)])

    conv(64, 3, 7)
    bn(64)
    inp = 64
    for stage, blocks in enumerate([3, 4, 6, 3]):
        w = 64 << stage
        for b in range(blocks):
            conv(w, inp, 1)
            bn(w)
            conv(w, w, 3)
            bn(w)
            conv(4 * w, w, 1)
            bn(4 * w)
            if b == 0:
                conv(4 * w, inp, 1)
                bn(4 * w)
            inp = 4 * w
    d, ffn = 256, 2048

    def linear(out, inp):
        weights.append((out, inp))
        norms_biases.append((out,))

    def norm():
        norms_biases.extend([(d,), (d,)])

    def attn():
        linear(3 * d, d)
        linear(d, d)

    weights.append((d, 2048, 1, 1))
    norms_biases.append((d,))
    for _ in range(6):
        attn()
        linear(ffn, d)
        linear(d, ffn)
        norm()
        norm()
    for _ in range(6):
        attn()
        attn()
        linear(ffn, d)
        linear(d, ffn)
        norm()
        norm()
        norm()
    norm()
    weights.append((100, d))
    linear(92, d)
    linear(d, d)
    linear(d, d)
    linear(4, d)
    return backbone, weights, norms_biases


def check_backbone(backbone):
    """The backbone's shapes against torchvision's resnet50, where it is
    installed."""
    try:
        import torchvision
    except ImportError:
        return "torchvision not installed: backbone shapes not cross-checked"
    ref = [tuple(p.shape) for n, p in torchvision.models.resnet50().named_parameters() if not n.startswith("fc.")]
    if sorted(ref) != sorted(backbone):
        raise SystemExit("the backbone's shapes differ from torchvision's resnet50")
    return "backbone shapes match torchvision's resnet50"


def make_groups(gen):
    backbone, weights, norms_biases = detr_r50_shapes()
    groups, params = [], []
    for shapes, lr, wd in ((backbone, 1e-5, 1e-4), (weights, 1e-4, 1e-4), (norms_biases, 1e-4, 0.0)):
        ps = []
        for s in shapes:
            p = torch.nn.Parameter((torch.rand(s, device=DEV, generator=gen) * 0.2 - 0.1))
            p.grad = torch.rand(s, device=DEV, generator=gen) * 2e-3 - 1e-3
            ps.append(p)
        groups.append({"params": ps, "lr": lr, "weight_decay": wd})
        params += ps
    return groups, params


def time_torch():
    gen = torch.Generator(device=DEV).manual_seed(1)
    groups, params = make_groups(gen)
    elems = sum(p.numel() for p in params)
    try:
        opt = torch.optim.AdamW(groups, fused=True)
        kind = "fused"
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(groups, foreach=True)
        kind = "foreach (no fused AdamW in this torch)"

    def clipped():
        torch.nn.utils.clip_grad_norm_(params, 0.1, foreach=True)
        opt.step()

    step = median_ms(opt.step)
    clip = median_ms(clipped)
    return kind, elems, len(params), step, clip


def stheno_times(path):
    out = {}
    for line in open(path):
        m = re.match(r"^BenchmarkGPUAdamW/impl=cuda/case=(\S+)/clip=(\w+)/zero_grad=(\w+?)-\d+\s.*?([\d.]+) ms\b", line)
        if m:
            out[(m.group(2), m.group(3))] = float(m.group(4))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stheno", help="ops' BenchmarkGPUAdamW log of the same run")
    args = ap.parse_args()
    ours = stheno_times(args.stheno) if args.stheno else {}
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(check_backbone(detr_r50_shapes()[0]))
    kind, elems, tensors, step, clip = time_torch()
    print(f"DETR-R50: {elems} parameters in {tensors} tensors; torch.optim.AdamW {kind}")
    print(f"{'clip':4s} {'zero_grad':9s} {'torch ms':>9s} {'GB/s':>7s} {'stheno ms':>9s} {'GB/s':>7s} {'speed-up':>8s}")
    for c, t, tbytes in (("off", step, 28), ("on", clip, 40)):
        for z in ("off", "on"):
            sbytes = 28 + (4 if c == "on" else 0) + (4 if z == "on" else 0)
            s = ours.get((c, z))
            ratio = f"{t / s:7.2f}x" if s else "   (n/a)"
            sgbs = sbytes * elems / s / 1e6 if s else float("nan")
            print(f"{c:4s} {z:9s} {t:9.4f} {tbytes * elems / t / 1e6:7.0f} "
                  f"{s if s else float('nan'):9.4f} {sgbs:7.0f} {ratio}")


if __name__ == "__main__":
    main()
