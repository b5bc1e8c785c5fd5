#!/usr/bin/python3
"""Reference values for the LayerNorm tests (ops/layernorm_test.go),
computed by PyTorch in float64.

Regenerate from the repository root with (Debian: apt-get install
python3-torch)

    /usr/bin/python3 ops/testdata/gen_layernorm.py > ops/testdata/layernorm.json

(written against Debian's python3-torch 1.13; any PyTorch with
F.layer_norm gives the same numbers). The draws are seeded, so the output
only changes when this script does.

The reference is torch.nn.functional.layer_norm(x, [C], gamma, beta, eps)
over x's last dimension C, gamma and beta optional.

Every input is a small multiple of a power of two (x, beta of 1/16, gamma
of 1/16 in [0.5, 1.5], the projection of 1/8) and so exactly
representable in float32. Rows spread by 0.3 at least (a row that does not
is drawn again), so that 1/sqrt(var + eps), which multiplies every rounding
error of its row, stays small: the float32 runs then agree with these
float64 values to autograd's TolForward32. One case has a mean of 100
against that spread, for the two-pass variance, and is for float64 only
(a float32 mean of 100 is off by up to 4e-6, which 1/sqrt(var) multiplies);
one has a NaN in a row, written as null.

Each case records x, gamma and beta (null when absent), eps, the
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


def spread_rows(shape):
    """x of 1/16 steps in [-1, 1], every row of two values or more with a
    standard deviation of 0.3 at least."""
    c = shape[-1]
    rows = []
    for _ in range(math.prod(shape[:-1])):
        while True:
            r = grid((c,), -16, 16, 16)
            if c == 1 or r.std(unbiased=False) >= 0.3:
                break
        rows.append(r)
    return torch.stack(rows).reshape(shape)


def flat(t):
    return [None if math.isnan(v) else v for v in t.detach().reshape(-1).tolist()]


def case(name, shape, gamma=True, beta=True, eps=1e-5, offset=0.0, nan_at=None, dtypes=("float64", "float32")):
    x = spread_rows(shape) + offset
    if nan_at is not None:
        x.view(-1, shape[-1])[nan_at] = float("nan")
    x.requires_grad_(True)
    c = shape[-1]
    g = grid((c,), 8, 24, 16).requires_grad_(True) if gamma else None
    b = grid((c,), -16, 16, 16).requires_grad_(True) if beta else None
    y = F.layer_norm(x, [c], g, b, eps)
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
        case("2-D, gamma and beta", (5, 7)),
        case("1-D x", (6,)),
        case("3-D, no gamma nor beta", (2, 3, 8), gamma=False, beta=False),
        case("gamma only", (4, 16), beta=False),
        case("beta only", (3, 5), gamma=False),
        case("C = 1", (4, 1)),
        case("C = 3", (6, 3)),
        case("DETR's d_model", (3, 256)),
        case("C = 1030", (2, 1030)),
        case("4-D x", (2, 2, 3, 12)),
        case("24 rows", (24, 9)),
        case("eps = 1e-3", (4, 33), eps=1e-3),
        case("a mean of 100", (3, 20), offset=100.0, dtypes=("float64",)),
        case("a NaN in row 1", (4, 6), nan_at=(1, 2)),
    ]
    json.dump({"torch": torch.__version__, "cases": cases}, sys.stdout, separators=(",", ":"), allow_nan=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
