#!/usr/bin/python3
"""Reference values for the Softmax and LogSoftmax tests
(ops/softmax_test.go), computed by PyTorch in float64.

Regenerate from the repository root with (Debian: apt-get install
python3-torch)

    /usr/bin/python3 ops/testdata/gen_softmax.py > ops/testdata/softmax.json

(written against Debian's python3-torch 1.13; any PyTorch with
torch.softmax and torch.log_softmax gives the same numbers to rounding).
The draws are seeded, so the output only changes when this script does.

The references are torch.softmax(x, axis) and torch.log_softmax(x, axis)
on x of several ranks and axes (negative ones counted from the end, as
PyTorch counts them), among them a row of 1030 (longer than the GPU's warp
kernels take) and axes of length 1. x is a multiple of 1/16 in [-6, 6] and
the projection R of the loss sum(y * R) a multiple of 1/8 in [-1, 1]: both
exact in float32. Each case records x's shape and values, the axis, whether
it is log_softmax, R, the output y and the gradient of the loss with
respect to x. (JSON holds no infinities or NaN: ops/softmax_test.go checks
those against PyTorch's answers by hand.)
"""

import json
import sys

import torch

torch.set_default_dtype(torch.float64)
GEN = torch.Generator().manual_seed(20260226)


def grid(shape, lo, hi, den):
    """Uniform draws of k/den for integers k in [lo, hi]."""
    return torch.randint(lo, hi + 1, shape, generator=GEN).double() / den


def flat(t):
    return t.detach().reshape(-1).tolist()


def case(shape, axis, log):
    x = grid(shape, -96, 96, 16).requires_grad_(True)
    f = torch.log_softmax if log else torch.softmax
    y = f(x, axis)
    proj = grid(y.shape, -8, 8, 8)
    (grad,) = torch.autograd.grad((y * proj).sum(), [x])
    name = f"{'log_softmax' if log else 'softmax'} {list(shape)} axis={axis}"
    return {
        "name": name, "shape": list(shape), "axis": axis, "log": log,
        "x": flat(x), "proj": flat(proj), "y": flat(y), "grad": flat(grad),
    }


def main():
    shapes = [
        ((5,), 0),
        ((4, 7), -1),
        ((4, 7), 0),
        ((2, 3, 4, 5), 1),
        ((2, 3, 4, 5), -1),
        ((2, 3, 4, 5), 0),
        ((2, 3, 4, 5), -2),
        ((2, 1, 6), 1),
        ((2, 300), -1),
        ((2, 2, 5, 16), -1),
        ((1, 1030), 1),
        ((2, 40, 3), -2),
    ]
    cases = [case(s, a, log) for s, a in shapes for log in (False, True)]
    json.dump({"torch": torch.__version__, "cases": cases}, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
