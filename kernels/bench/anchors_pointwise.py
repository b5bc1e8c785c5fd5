#!/usr/bin/env python3
"""Times PyTorch eager on the elementwise ops and the sums at the shapes of
ops' BenchmarkGPUPointwise and BenchmarkGPUReduce, with a torch copy of the
same bytes (the bandwidth an elementwise op could reach), and prints them
beside stheno's, from the same run on the same GPU.

    # 1. stheno (ops' benchmarks, built by `make gpu-bins`):
    (cd ops && ../bin/ops.test -test.run '^$' -test.bench 'GPU(Pointwise|Reduce)$' -test.benchtime 30x) | tee /tmp/pointwise.log
    # 2. the anchor and the side-by-side table:
    python3 kernels/bench/anchors_pointwise.py --stheno /tmp/pointwise.log

Timing as stheno's suite (timing.median_ms): CUDA events around each call,
median of 30 after 5 warm-up calls; float32. GB/s counts the bytes each op must move (every
operand read once, the output written once), as the benchmarks do; copy
GB/s is a torch copy_ of the output's size (read and write), and %copy the
op's GB/s over it; speed-up is torch's time over stheno's.
"""
import argparse
import re

import torch
from timing import median_ms

DEV = "cuda"


def relu_backward(y, dy):
    return torch.ops.aten.threshold_backward(dy, y, 0)


def inverse_sigmoid(x, eps=1e-5):
    """Deformable-DETR's util/misc.py inverse_sigmoid, as its models call it."""
    x = x.clamp(min=0, max=1)
    x1 = x.clamp(min=eps)
    x2 = (1 - x).clamp(min=eps)
    return torch.log(x1 / x2)


T = (2, 20000, 256)
# name: (torch function, operand shapes), as pointwiseBenchCases.
POINTWISE = {
    "add_2x20000x256": (torch.add, [T, T]),
    "add_bias_2x20000x256+256": (torch.add, [T, (256,)]),
    "sub_2x20000x256": (torch.sub, [T, T]),
    "div_2x20000x256": (torch.div, [T, T]),
    "scale_2x20000x256": (lambda x: x * 0.5, [T]),
    "relu_2x20000x256": (torch.relu, [T]),
    "sigmoid_2x20000x256": (torch.sigmoid, [T]),
    "inverse_sigmoid_2x20000x256": (inverse_sigmoid, [T]),
    "log_2x20000x256": (torch.log, [T]),
    "sqrt_2x20000x256": (torch.sqrt, [T]),
    "square_2x20000x256": (torch.square, [T]),
    "relu_bwd_2x20000x256": (relu_backward, [(2, 20000, 256), (2, 20000, 256)]),
    "exp_2x8x300x300": (torch.exp, [(2, 8, 300, 300)]),
    "mul_2x8x300x300": (torch.mul, [(2, 8, 300, 300), (2, 8, 300, 300)]),
    "add_mask_2x8x300x300+2x1x300x300": (torch.add, [(2, 8, 300, 300), (2, 1, 300, 300)]),
}

# name: (shape, dims), as reduceBenchCases (None: every dim).
REDUCE = {
    "bias_grad_2x20000x256": ((2, 20000, 256), (0, 1)),
    "rows_2x8x300x300": ((2, 8, 300, 300), (-1,)),
    "all_2x20000x256": ((2, 20000, 256), None),
    "channels_2x256x100x152": ((2, 256, 100, 152), (0, 2, 3)),
    "mean_tokens_2x20000x256": ((2, 20000, 256), (1,)),
}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def copy_ms(elems):
    src = torch.empty(elems, device=DEV)
    dst = torch.empty(elems, device=DEV)
    return median_ms(lambda: dst.copy_(src))


def stheno_times(path):
    out = {}
    for line in open(path):
        m = re.match(r"^BenchmarkGPU(Pointwise|Reduce)/impl=cuda/dtype=float32/case=(\S+?)-\d+\s.*?([\d.]+) ms\b", line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def row(name, t, nbytes, copy, ours):
    ratio = f"{t / ours:7.2f}x" if ours else "   (n/a)"
    sgbs = nbytes / ours / 1e6 if ours else float("nan")
    cgbs = 2 * 4 * copy[0] / copy[1] / 1e6
    print(f"{name:34s} {t:9.4f} {nbytes / t / 1e6:7.0f} {ours if ours else float('nan'):9.4f} {sgbs:7.0f} "
          f"{cgbs:7.0f} {100 * sgbs / cgbs:6.1f} {ratio}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stheno", help="ops' BenchmarkGPUPointwise / BenchmarkGPUReduce log of the same run")
    args = ap.parse_args()
    ours = stheno_times(args.stheno) if args.stheno else {}
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    head = f"{'case':34s} {'torch ms':>9s} {'GB/s':>7s} {'stheno ms':>9s} {'GB/s':>7s} {'copy':>7s} {'%copy':>6s} {'speed-up':>8s}"
    gen = torch.Generator(device=DEV).manual_seed(1)
    print(head)
    for name, (f, shapes) in POINTWISE.items():
        xs = [torch.rand(s, device=DEV, generator=gen) * 2 - 1 for s in shapes]
        y = f(*xs)
        t = median_ms(lambda: f(*xs))
        nbytes = 4 * (sum(numel(s) for s in shapes) + y.numel())
        elems = y.numel()
        row(name, t, nbytes, (elems, copy_ms(elems)), ours.get(("Pointwise", name)))
    print(head)
    for name, (shape, dims) in REDUCE.items():
        x = torch.rand(shape, device=DEV, generator=gen) * 2 - 1
        op = torch.mean if name.startswith("mean") else torch.sum
        f = (lambda: op(x)) if dims is None else (lambda: op(x, dims))
        y = f()
        t = median_ms(f)
        nbytes = 4 * (x.numel() + y.numel())
        # A copy of x's bytes: a sum reads them once, and writes next to nothing.
        elems = x.numel() // 2
        row(name, t, nbytes, (elems, copy_ms(elems)), ours.get(("Reduce", name)))


if __name__ == "__main__":
    main()
