#!/usr/bin/env python3
"""Times torch.matmul in TF32 (and exact float32) on the GEMM shapes of
backend's BenchmarkGPUGemm and prints them beside stheno's, from the same
run on the same GPU.

    # 1. stheno (backend's benchmark, cuBLAS through backend.Gemm):
    (cd backend && ../bin/backend.test -test.run '^$' -test.bench GPUGemm -test.benchtime 30x) | tee /tmp/gemm.log
    # 2. the anchor and the side-by-side table:
    python3 kernels/bench/anchors_gemm.py --stheno /tmp/gemm.log

Timing as stheno's suite: CUDA events around each call, median of 30 after
5 warm-up calls; inputs random in [-1, 1), fp32 storage.
"""
import argparse
import re

import torch

from timing import median_ms

DEV = "cuda"
# name: (batch, m, n, k, transA, transB), as BenchmarkGPUGemm's cases.
CASES = {
    "linear_fwd_20000x256x256": (1, 20000, 256, 256, False, True),
    "linear_dx_20000x256x256": (1, 20000, 256, 256, False, False),
    "linear_dw_256x256x20000": (1, 256, 256, 20000, True, False),
    "attn_qk_8x300x300x32": (8, 300, 300, 32, False, True),
    "attn_av_8x300x32x300": (8, 300, 32, 300, False, False),
}


def operands(batch, m, n, k, ta, tb):
    a = torch.rand((batch, k, m) if ta else (batch, m, k), device=DEV) * 2 - 1
    b = torch.rand((batch, n, k) if tb else (batch, k, n), device=DEV) * 2 - 1
    return a, b


def time_case(spec, tf32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    batch, m, n, k, ta, tb = spec
    a, b = operands(*spec)
    a2 = a.transpose(1, 2) if ta else a
    b2 = b.transpose(1, 2) if tb else b
    if batch == 1:
        a2, b2 = a2[0], b2[0]
    return median_ms(lambda: torch.matmul(a2, b2))


def stheno_times(path):
    out = {}
    for line in open(path):
        m = re.match(r"^BenchmarkGPUGemm/(?:impl=cuda/)?case=(\S+)/math=(\S+?)-\d+\s.*?([\d.]+) ms\b", line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stheno", help="backend's BenchmarkGPUGemm log of the same run")
    args = ap.parse_args()
    ours = stheno_times(args.stheno) if args.stheno else {}
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{'case':28s} {'math':6s} {'torch ms':>9s} {'stheno ms':>9s} {'speed-up':>8s}")
    for name, spec in CASES.items():
        for tf32, math in ((True, "TF32"), (False, "exact")):
            t = time_case(spec, tf32)
            s = ours.get((name, math))
            ratio = f"{t / s:7.2f}x" if s else "   (n/a)"
            print(f"{name:28s} {math:6s} {t:9.4f} {s if s else float('nan'):9.4f} {ratio}")


if __name__ == "__main__":
    main()
