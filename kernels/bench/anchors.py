#!/usr/bin/env python3
"""Times the anchors of ../shared/TARGETS.md on the GPU machine: torchvision's
roi_align and a pure-PyTorch grid_sample MSDeformAttn, forward and backward,
fp32, CUDA events, median of 30 runs after warm-up.

    python3 kernels/bench/anchors.py            # all cases
    python3 kernels/bench/anchors.py roialign   # one family

Inputs follow TARGETS.md's recipes (the same ones the Go benchmarks use);
the random draws differ from the Go side's, which does not move the times of
these kernels beyond run-to-run noise.
"""
import math
import sys

import torch
import torch.nn.functional as F
from torchvision.ops import roi_align

DEV = "cuda"


def median_ms(fn, warmup=5, reps=30):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def target_rois(k, n, img_h, img_w, gen):
    side = torch.exp(math.log(16) + torch.rand(k, generator=gen) * (math.log(512) - math.log(16)))
    aspect = torch.exp(-0.7 + 1.4 * torch.rand(k, generator=gen))
    w, h = side * aspect.sqrt(), side / aspect.sqrt()
    cx, cy = torch.rand(k, generator=gen) * img_w, torch.rand(k, generator=gen) * img_h
    b = torch.randint(0, n, (k,), generator=gen).float()
    return torch.stack([b, (cx - w / 2).clamp(min=0), (cy - h / 2).clamp(min=0),
                        (cx + w / 2).clamp(max=img_w), (cy + h / 2).clamp(max=img_h)], 1)


def bench_roialign():
    cases = [("box_head_P2", (2, 256, 200, 336), 1024, 7, 0.25, 2),
             ("mask_head_P2", (2, 256, 200, 336), 256, 14, 0.25, 2),
             ("box_head_P2_adaptive", (2, 256, 200, 336), 1024, 7, 0.25, 0),
             ("infer_1000_P3", (1, 256, 100, 168), 1000, 7, 0.125, 2)]
    gen = torch.Generator().manual_seed(1)
    for name, shape, k, pooled, scale, sampling in cases:
        x = (torch.rand(shape, generator=gen) * 2 - 1).to(DEV).requires_grad_(True)
        rois = target_rois(k, shape[0], 800, 1344, gen).to(DEV)
        fwd = lambda: roi_align(x, rois, pooled, scale, sampling, True)
        y = fwd()
        g = torch.rand_like(y) * 2 - 1
        bwd = lambda: torch.autograd.grad(y, x, g, retain_graph=True)
        print(f"anchor=torchvision case={name} fwd_ms={median_ms(fwd):.4f} bwd_ms={median_ms(bwd):.4f}", flush=True)


def msdeform_grid_sample(value, shapes, loc, weight):
    n, s, m, d = value.shape
    _, lq, _, l, p, _ = loc.shape
    values = value.split([h * w for h, w in shapes], dim=1)
    grids = 2 * loc - 1
    samples = []
    for i, (h, w) in enumerate(shapes):
        v = values[i].flatten(2).transpose(1, 2).reshape(n * m, d, h, w)
        gr = grids[:, :, :, i].transpose(1, 2).flatten(0, 1)
        samples.append(F.grid_sample(v, gr, mode="bilinear", padding_mode="zeros", align_corners=False))
    wt = weight.transpose(1, 2).reshape(n * m, 1, lq, l * p)
    out = (torch.stack(samples, dim=-2).flatten(-2) * wt).sum(-1).view(n, m * d, lq)
    return out.transpose(1, 2).contiguous()


def deform_locations(n, lq, m, p, shapes, encoder, gen):
    if encoder:
        refs = []
        for h, w in shapes:
            ys, xs = torch.meshgrid((torch.arange(h) + 0.5) / h, (torch.arange(w) + 0.5) / w, indexing="ij")
            refs.append(torch.stack([xs.flatten(), ys.flatten()], 1))
        ref = torch.cat(refs)[None].expand(n, lq, 2)
    else:
        ref = torch.rand(n, lq, 2, generator=gen)
    ang = 2 * math.pi * torch.arange(m) / m
    dirs = torch.stack([ang.cos(), ang.sin()], 1)
    dirs = dirs / dirs.abs().max(1, keepdim=True).values
    steps = torch.arange(1, p + 1).float()
    off = dirs[:, None, None, :] * steps[None, None, :, None]  # m,1,p,2
    off = off.expand(m, len(shapes), p, 2)
    noise = torch.randn(n, lq, m, len(shapes), p, 2, generator=gen)
    size = torch.tensor([[w, h] for h, w in shapes], dtype=torch.float32)[None, None, None, :, None, :]
    return ref[:, :, None, None, None, :] + (off[None, None] + noise) / size


def bench_msdeform():
    detr = [(100, 167), (50, 84), (25, 42), (13, 21)]
    seed = [(92, 160), (46, 80), (23, 40), (12, 20)]
    cases = [("detr_encoder", 2, 22223, detr, True), ("detr_decoder", 2, 300, detr, False),
             ("seed_full", 6, 15422, seed, False)]
    m, d, p = 8, 32, 4
    gen = torch.Generator().manual_seed(2)
    for name, n, lq, shapes, encoder in cases:
        s = sum(h * w for h, w in shapes)
        value = (torch.rand(n, s, m, d, generator=gen) * 2 - 1).to(DEV).requires_grad_(True)
        loc = deform_locations(n, lq, m, p, shapes, encoder, gen).to(DEV).requires_grad_(True)
        weight = torch.randn(n, lq, m, len(shapes) * p, generator=gen).softmax(-1)
        weight = weight.view(n, lq, m, len(shapes), p).to(DEV).requires_grad_(True)
        fwd = lambda: msdeform_grid_sample(value, shapes, loc, weight)
        y = fwd()
        g = torch.rand_like(y) * 2 - 1
        bwd = lambda: torch.autograd.grad(y, (value, loc, weight), g, retain_graph=True)
        print(f"anchor=grid_sample case={name} fwd_ms={median_ms(fwd):.4f} bwd_ms={median_ms(bwd):.4f}", flush=True)


if __name__ == "__main__":
    which = sys.argv[1:] or ["roialign", "msdeform"]
    print("gpu:", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    if "roialign" in which:
        bench_roialign()
    if "msdeform" in which:
        bench_msdeform()
