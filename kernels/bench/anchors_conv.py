#!/usr/bin/env python3
"""Times the fused-convolution anchors of ../shared/TARGETS.md on the GPU
machine: cuDNN through PyTorch on the three cases, CUDA events, median of 30
runs after warm-up, one line per case and variant:

    anchor=cudnn_tf32   conv2d+bias+ReLU, fp32 storage, TF32 math
    anchor=cudnn_bf16   conv2d+bias+ReLU, bf16, channels-last (NHWC)
    anchor=cudnn_fp32   conv2d+bias+ReLU, fp32 without TF32
    anchor=eager_bn     conv2d -> batch_norm(training) -> ReLU, TF32, each op
                        its own kernel(s): how a PyTorch user trains the layer
    anchor=cudnn_tf32_bare  conv2d alone (no bias, no ReLU), TF32: not a
                        TARGETS.md anchor; the convolution that eager_bn
                        runs, to show what the fused layers' GEMMs compete
                        with once the elementwise passes are set aside

    python3 kernels/bench/anchors_conv.py [--stheno bench.log] [case ...]

With --stheno (the output of stheno's GPU suite, BenchmarkSuiteConv, from
the same run) it also prints the side-by-side table: Conv against
cudnn_tf32 (targets >= 0.9x forward, >= 0.8x backward) and ConvBN in
training against eager_bn (>= 1.2x both ways), speed-up = anchor / stheno.

Backward is torch.autograd.grad of the forward's output with respect to
every input and parameter; its TFLOP/s count the dgrad and wgrad GEMMs, twice
the forward's FLOPs, as BenchmarkSuiteConv does. cudnn.benchmark is on, so cuDNN
times its algorithms on first use and keeps the fastest: the strongest anchor.
"""
import argparse
import re

import torch
import torch.nn.functional as F

from timing import median_ms

DEV = "cuda"
CASES = [
    ("resnet_c3_3x3", (8, 128, 56, 56), (128, 128, 3, 3), 1),
    ("fpn_p2_3x3", (2, 256, 200, 336), (256, 256, 3, 3), 1),
    ("resnet_c4_1x1", (8, 1024, 28, 28), (256, 1024, 1, 1), 0),
]


def conv_flops(xs, ws, pad):
    n, _, h, w = xs
    co, ci, kh, kw = ws
    oh, ow = h + 2 * pad - kh + 1, w + 2 * pad - kw + 1
    return 2.0 * n * co * oh * ow * ci * kh * kw


MEASURED = {}  # (anchor, case): (fwd ms, bwd ms)


def report(anchor, name, flops, fwd, bwd):
    f, b = median_ms(fwd), median_ms(bwd)
    MEASURED[(anchor, name)] = (f, b)
    print(f"anchor={anchor} case={name} fwd_ms={f:.4f} bwd_ms={b:.4f} "
          f"fwd_tflops={flops / f / 1e9:.1f} bwd_tflops={2 * flops / b / 1e9:.1f}", flush=True)


def leaf(t, dtype, channels_last):
    t = t.to(DEV, dtype)
    if channels_last:
        t = t.contiguous(memory_format=torch.channels_last)
    return t.requires_grad_(True)


def bench_conv(anchor, name, xs, ws, pad, dtype, channels_last, tf32, gen, bare=False):
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    x = leaf(torch.rand(xs, generator=gen) * 2 - 1, dtype, channels_last)
    w = leaf((torch.rand(ws, generator=gen) * 2 - 1) * 0.05, dtype, channels_last)
    b = leaf((torch.rand(ws[0], generator=gen) * 2 - 1) * 0.1, dtype, False)
    if bare:
        fwd = lambda: F.conv2d(x, w, None, padding=pad)
    else:
        fwd = lambda: F.relu(F.conv2d(x, w, b, padding=pad))
    y = fwd()
    g = torch.rand_like(y) * 2 - 1
    bwd = lambda: torch.autograd.grad(y, (x, w) if bare else (x, w, b), g, retain_graph=True)
    report(anchor, name, conv_flops(xs, ws, pad), fwd, bwd)


def bench_eager_bn(name, xs, ws, pad, gen):
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = True
    co = ws[0]
    x = leaf(torch.rand(xs, generator=gen) * 2 - 1, torch.float32, False)
    w = leaf((torch.rand(ws, generator=gen) * 2 - 1) * 0.05, torch.float32, False)
    gamma = leaf(torch.rand(co, generator=gen) + 0.5, torch.float32, False)
    beta = leaf(torch.rand(co, generator=gen) - 0.5, torch.float32, False)
    rm, rv = torch.zeros(co, device=DEV), torch.ones(co, device=DEV)
    fwd = lambda: F.relu(F.batch_norm(F.conv2d(x, w, None, padding=pad), rm, rv, gamma, beta,
                                      training=True, momentum=0.1, eps=1e-5))
    y = fwd()
    g = torch.rand_like(y) * 2 - 1
    bwd = lambda: torch.autograd.grad(y, (x, w, gamma, beta), g, retain_graph=True)
    report("eager_bn", name, conv_flops(xs, ws, pad), fwd, bwd)


def stheno_times(log):
    """Median ms per (case, pass) of BenchmarkSuiteConv in the Go suite's output."""
    times = {}
    pat = re.compile(r"BenchmarkSuiteConv/impl=cuda/dtype=float32/case=(\w+)/pass=(\w+?)(?:-\d+)?\s+\d+\s+.*?([\d.]+) ms\b")
    for line in open(log):
        mt = pat.search(line)
        if mt:
            times[(mt.group(1), mt.group(2))] = float(mt.group(3))
    return times


def table(anchors, st):
    print(f"\nstheno against its anchors, same run, {torch.cuda.get_device_name()}:")
    print("\n| layer | case | pass | anchor | anchor ms | stheno ms | speed-up | target |")
    print("|---|---|---|---|---|---|---|---|")
    rows = (("Conv+bias+ReLU", "cudnn_tf32", "", {"fwd": 0.9, "bwd": 0.8}),
            ("ConvBN+ReLU, training", "eager_bn", "convbn_", {"fwd": 1.2, "bwd": 1.2}))
    for layer, anchor, prefix, target in rows:
        for name, _, _, _ in CASES:
            for i, pas in enumerate(("fwd", "bwd")):
                a = anchors.get((anchor, name))
                s = st.get((name, prefix + pas))
                if a is None:
                    continue
                sp = f"{a[i] / s:.2f}x" if s else "-"
                print(f"| {layer} | {name} | {pas} | {anchor} | {a[i]:.4f} | {s if s else '-'} | {sp} | >= {target[pas]}x |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--stheno", help="output of stheno's GPU suite, for the side-by-side table")
    ap.add_argument("cases", nargs="*")
    args = ap.parse_args()
    which = args.cases
    torch.backends.cudnn.benchmark = True
    print("gpu:", torch.cuda.get_device_name(), "torch", torch.__version__,
          "cudnn", torch.backends.cudnn.version(), flush=True)
    gen = torch.Generator().manual_seed(3)
    for name, xs, ws, pad in CASES:
        if which and name not in which:
            continue
        bench_conv("cudnn_tf32", name, xs, ws, pad, torch.float32, False, True, gen)
        bench_conv("cudnn_bf16", name, xs, ws, pad, torch.bfloat16, True, True, gen)
        bench_conv("cudnn_fp32", name, xs, ws, pad, torch.float32, False, False, gen)
        bench_eager_bn(name, xs, ws, pad, gen)
        bench_conv("cudnn_tf32_bare", name, xs, ws, pad, torch.float32, False, True, gen, bare=True)
    if args.stheno:
        table(MEASURED, stheno_times(args.stheno))
