#!/usr/bin/env python3
"""Times torch.softmax and torch.log_softmax, forward and backward, in
PyTorch eager on the shapes of ops' BenchmarkGPUSoftmax and prints them
beside stheno's, from the same run on the same GPU.

    # 1. stheno (ops' benchmark, built by `make gpu-bins`):
    (cd ops && ../bin/ops.test -test.run '^$' -test.bench GPUSoftmax -test.benchtime 30x) | tee /tmp/softmax.log
    # 2. the anchor and the side-by-side table:
    python3 kernels/bench/anchors_softmax.py --stheno /tmp/softmax.log

Timing as stheno's suite: CUDA events around each call, median of 30 after
5 warm-up calls; float32, x uniform in [-4, 4), dy in [-1, 1), softmax
along the last axis. The forward is torch.softmax / torch.log_softmax; the
backward is PyTorch's backward kernel alone (aten's _softmax_backward_data
and _log_softmax_backward_data on the forward's output), as stheno's
backward op is timed alone. GB/s counts the bytes each pass must move
(forward x and y, backward y, dy and dx), as the benchmark does; speed-up
is torch's time over stheno's.
"""
import argparse
import re

import torch

from timing import median_ms

DEV = "cuda"
# name: shape, as BenchmarkGPUSoftmax's softmaxBenchCases.
CASES = {
    "attn_4800x300": (2 * 8 * 300, 300),
    "msdeform_2x8x22223x16": (2, 8, 22223, 16),
}


def backward_fn(op, y, dy, dim):
    """PyTorch's backward kernel of op on its output y: aten's
    _softmax_backward_data / _log_softmax_backward_data (their last argument
    is the input's dtype since PyTorch 1.11, the input itself before)."""
    f = torch.ops.aten._log_softmax_backward_data if op == "log_softmax" else torch.ops.aten._softmax_backward_data
    try:
        f(dy, y, dim, y.dtype)
        return lambda: f(dy, y, dim, y.dtype)
    except (RuntimeError, TypeError):
        return lambda: f(dy, y, dim, y)


def time_case(shape, op):
    gen = torch.Generator(device=DEV).manual_seed(1)
    x = torch.rand(shape, device=DEV, generator=gen) * 8 - 4
    dy = torch.rand(shape, device=DEV, generator=gen) * 2 - 1
    f = torch.log_softmax if op == "log_softmax" else torch.softmax
    y = f(x, -1)
    fwd = median_ms(lambda: f(x, -1))
    bwd = median_ms(backward_fn(op, y, dy, -1))
    return fwd, bwd


def stheno_times(path):
    out = {}
    for line in open(path):
        m = re.match(r"^BenchmarkGPUSoftmax/impl=cuda/case=(\S+)/op=(\S+)/pass=(\S+?)-\d+\s.*?([\d.]+) ms\b", line)
        if m:
            out[(m.group(1), m.group(2), m.group(3))] = float(m.group(4))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stheno", help="ops' BenchmarkGPUSoftmax log of the same run")
    args = ap.parse_args()
    ours = stheno_times(args.stheno) if args.stheno else {}
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{'case':24s} {'op':12s} {'pass':4s} {'torch ms':>9s} {'GB/s':>7s} {'stheno ms':>9s} {'GB/s':>7s} {'speed-up':>8s}")
    for name, shape in CASES.items():
        elems = 1
        for d in shape:
            elems *= d
        for op in ("softmax", "log_softmax"):
            fwd, bwd = time_case(shape, op)
            for pss, t, tensors in (("fwd", fwd, 2), ("bwd", bwd, 3)):
                nbytes = 4 * elems * tensors
                s = ours.get((name, op, pss))
                ratio = f"{t / s:7.2f}x" if s else "   (n/a)"
                sgbs = nbytes / s / 1e6 if s else float("nan")
                print(f"{name:24s} {op:12s} {pss:4s} {t:9.4f} {nbytes / t / 1e6:7.0f} "
                      f"{s if s else float('nan'):9.4f} {sgbs:7.0f} {ratio}")


if __name__ == "__main__":
    main()
