#!/usr/bin/python3
"""Reference values for the GroupNorm tests (ops/groupnorm_test.go),
computed by PyTorch in float64.

Regenerate from the repository root with (Debian: apt-get install
python3-torch)

    /usr/bin/python3 ops/testdata/gen_groupnorm.py > ops/testdata/groupnorm.json

(written against Debian's python3-torch 1.13; any PyTorch with
F.group_norm gives the same numbers). The draws are seeded, so the output
only changes when this script does.

The reference is torch.nn.functional.group_norm(x, groups, gamma, beta,
eps) over x [N, C, ...], gamma and beta optional.

Every input is a small multiple of a power of two (x, beta of 1/16, gamma
of 1/16 in [0.5, 1.5], the projection of 1/8) and so exactly
representable in float32. Groups spread by 0.3 at least (a group that does
not is drawn again), so that 1/sqrt(var + eps), which multiplies every
rounding error of its group, stays small: the float32 runs then agree with
these float64 values to autograd's TolForward32. One case has a mean of
1000 against that spread, for the shifted sums of the variance, and is for
float64 only; one has a NaN in a group, written as null.

Each case records x, groups, gamma and beta (null when absent), eps, the
projection R of the loss sum(y * R), the output y, and the gradients of the
loss with respect to x, gamma and beta.
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


def spread_groups(shape, groups):
    """x of 1/16 steps in [-1, 1], every group of two values or more with a
    standard deviation of 0.3 at least."""
    n, c = shape[0], shape[1]
    size = c // groups * math.prod(shape[2:])
    rows = []
    for _ in range(n * groups):
        while True:
            r = grid((size,), -16, 16, 16)
            if size == 1 or r.std(unbiased=False) >= 0.3:
                break
        rows.append(r)
    return torch.stack(rows).reshape(shape)


def flat(t):
    return [None if math.isnan(v) else v for v in t.detach().reshape(-1).tolist()]


def case(name, shape, groups, gamma=True, beta=True, eps=1e-5, offset=0.0, nan_at=None, dtypes=("float64", "float32")):
    x = spread_groups(shape, groups) + offset
    if nan_at is not None:
        x.view(-1)[nan_at] = float("nan")
    x.requires_grad_(True)
    c = shape[1]
    g = grid((c,), 8, 24, 16).requires_grad_(True) if gamma else None
    b = grid((c,), -16, 16, 16).requires_grad_(True) if beta else None
    # PyTorch 1.13's backward fails on a bias without a weight ("tensor does
    # not have a device"): a weight of ones that takes no gradient is the
    # same layer.
    w = g if gamma or not beta else torch.ones(c)
    y = F.group_norm(x, groups, w, b, eps)
    proj = grid(y.shape, -8, 8, 8)
    leaves = [t for t in (x, g, b) if t is not None]
    grads = list(torch.autograd.grad((y * proj).sum(), leaves))
    dx = grads.pop(0)
    dg = grads.pop(0) if gamma else None
    db = grads.pop(0) if beta else None
    return {
        "name": name,
        "dtypes": list(dtypes),
        "shape": list(shape),
        "groups": groups,
        "eps": eps,
        "x": flat(x),
        "gamma": flat(g) if gamma else None,
        "beta": flat(b) if beta else None,
        "proj": flat(proj),
        "y": flat(y),
        "dx": flat(dx),
        "dgamma": flat(dg) if gamma else None,
        "dbeta": flat(db) if beta else None,
    }


def main():
    cases = [
        case("NCHW, gamma and beta", (2, 6, 3, 4), 3),
        case("[N, C]", (5, 8), 4),
        case("[N, C, L], no gamma nor beta", (3, 4, 7), 2, gamma=False, beta=False),
        case("gamma only", (2, 4, 5, 5), 2, beta=False),
        case("beta only", (2, 6, 2, 3), 3, gamma=False),
        case("one group (LayerNorm over C, H, W)", (2, 5, 3, 3), 1),
        case("a group per channel (InstanceNorm)", (2, 3, 4, 4), 3),
        case("32 groups of 2 channels", (1, 64, 3, 3), 32),
        case("35 channels a group", (1, 70, 2, 1), 2),
        case("a plane of 4100, two tiles", (1, 1, 4100), 1),
        case("5-D", (2, 4, 2, 3, 2), 2),
        case("eps = 1e-3", (2, 4, 3, 3), 2, eps=1e-3),
        case("a mean of 1000", (2, 4, 3, 5), 2, offset=1000.0, dtypes=("float64",)),
        case("a NaN in group 1", (2, 4, 2, 2), 2, nan_at=9),
    ]
    json.dump({"torch": torch.__version__, "cases": cases}, sys.stdout, separators=(",", ":"), allow_nan=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
