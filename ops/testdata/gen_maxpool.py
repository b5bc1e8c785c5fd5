#!/usr/bin/python3
"""Reference values for the MaxPool2d tests (ops/maxpool_test.go),
computed by PyTorch in float64.

Regenerate from the repository root with (Debian: apt-get install
python3-torch)

    /usr/bin/python3 ops/testdata/gen_maxpool.py > ops/testdata/maxpool.json

(written against Debian's python3-torch 1.13). The draws are seeded, so the
output only changes when this script does.

The reference is torch.nn.functional.max_pool2d(x, kernel, stride,
padding) with dilation 1 and ceil_mode False, on the CPU, and the gradient
of the loss sum(y * R) with respect to x, R a projection.

x is drawn from a few multiples of 1/4 so that windows often hold ties
(PyTorch gives the gradient to the first maximum in scan order), and some
cases plant NaN (written as null: the output is NaN, the gradient goes to
the last NaN of the window) and -inf (a window of -inf only gives -inf and
sends its gradient to its first element). Every value is exact in float32,
and so is every sum of projections (multiples of 1/8), so the float32 runs
agree with these values exactly.

Each case records the shape of x, kernel, stride and padding ([H, W]
pairs), x, the projection R, y, y's shape and dx.
"""

import json
import math
import sys

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
GEN = torch.Generator().manual_seed(20260126)


def grid(shape, lo, hi, den):
    """Uniform draws of k/den for integers k in [lo, hi]."""
    return torch.randint(lo, hi + 1, shape, generator=GEN).double() / den


def flat(t):
    return [None if math.isnan(v) else v for v in t.detach().reshape(-1).tolist()]


def case(name, shape, kernel, stride, padding, nans=0, neg_infs=0, levels=4):
    x = grid(shape, 0, levels - 1, 4)
    n = x.numel()
    if nans or neg_infs:
        idx = torch.randperm(n, generator=GEN)
        x.view(-1)[idx[:nans]] = float("nan")
        x.view(-1)[idx[nans:nans + neg_infs]] = float("-inf")
    x.requires_grad_(True)
    y = F.max_pool2d(x, kernel, stride, padding)
    proj = grid(y.shape, -8, 8, 8)
    (dx,) = torch.autograd.grad((y * proj).sum(), [x])
    return {
        "name": name,
        "shape": list(shape),
        "kernel": list(kernel),
        "stride": list(stride),
        "padding": list(padding),
        "x": [v if math.isfinite(v) else (None if math.isnan(v) else "-inf") for v in x.detach().reshape(-1).tolist()],
        "proj": flat(proj),
        "yshape": list(y.shape),
        "y": [v if math.isfinite(v) else (None if math.isnan(v) else "-inf") for v in y.detach().reshape(-1).tolist()],
        "dx": flat(dx),
    }


def main():
    cases = [
        case("ResNet stem (3, 2, 1)", (2, 3, 9, 12), (3, 3), (2, 2), (1, 1)),
        case("FPN P6 (1, 2, 0)", (1, 4, 7, 9), (1, 1), (2, 2), (0, 0)),
        case("disjoint 2x2 windows", (2, 2, 6, 8), (2, 2), (2, 2), (0, 0)),
        case("overlapping, stride 1", (1, 3, 6, 6), (3, 3), (1, 1), (1, 1)),
        case("rectangular", (1, 2, 7, 9), (3, 2), (1, 3), (1, 1)),
        case("window as large as the padded input", (1, 1, 5, 5), (5, 5), (1, 1), (2, 2)),
        case("all ties", (1, 2, 6, 6), (3, 3), (2, 2), (1, 1), levels=1),
        case("NaN and -inf", (2, 2, 8, 8), (3, 3), (2, 2), (1, 1), nans=6, neg_infs=40),
        case("-inf windows", (1, 1, 6, 6), (2, 2), (2, 2), (0, 0), neg_infs=30),
    ]
    json.dump({"torch": torch.__version__, "cases": cases}, sys.stdout, separators=(",", ":"), allow_nan=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
