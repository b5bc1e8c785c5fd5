#!/usr/bin/python3
"""Reference values for the elementwise ops and the sums
(ops/pointwise_test.go, ops/reduce_test.go), computed by PyTorch in
float64.

Regenerate from the repository root with (Debian: apt-get install
python3-torch)

    /usr/bin/python3 ops/testdata/gen_pointwise.py > ops/testdata/pointwise.json

(written against Debian's python3-torch 1.13; any PyTorch gives the same
numbers to rounding). The draws are seeded, so the output only changes when
this script does.

- binary: a + b, a - b, a * b, a / b on pairs of shapes that broadcast in
  every way PyTorch allows (equal shapes, a trailing vector, ones on either
  side, b of more dims than a), with the gradients of both operands.
- unary: relu, sigmoid, Deformable-DETR's inverse_sigmoid (util/misc.py,
  written out below as it is there), exp, log, sqrt, square, and x * c,
  with the gradient of x (torch.autograd through the expression as
  written: inverse_sigmoid's clamps give zero gradient where they act).
- reduce: torch.sum and torch.mean over sets of axes (negative ones
  too), with and without keepdim, with the gradient of x.

Values are multiples of 1/16 (x) and 1/8 (the projection R of the loss
sum(y * R)), exact in float32; Div's b, Log's and Sqrt's x are kept away
from 0. (JSON holds no NaN or infinities: the Go tests check those by
hand.)
"""

import json
import sys

import torch

torch.set_default_dtype(torch.float64)
GEN = torch.Generator().manual_seed(20261125)


def grid(shape, lo, hi, den):
    """Uniform draws of k/den for integers k in [lo, hi]."""
    return torch.randint(lo, hi + 1, shape, generator=GEN).double() / den


def flat(t):
    return t.detach().reshape(-1).tolist()


def inverse_sigmoid(x, eps=1e-5):
    x = x.clamp(min=0, max=1)
    x1 = x.clamp(min=eps)
    x2 = (1 - x).clamp(min=eps)
    return torch.log(x1 / x2)


def binary_case(op, sa, sb):
    a = grid(sa, -48, 48, 16).requires_grad_(True)
    if op == "div":
        mag = grid(sb, 8, 40, 16)
        sign = torch.randint(0, 2, sb, generator=GEN).double() * 2 - 1
        b = (mag * sign).requires_grad_(True)
    else:
        b = grid(sb, -48, 48, 16).requires_grad_(True)
    f = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}[op]
    y = f(a, b)
    proj = grid(y.shape, -8, 8, 8)
    ga, gb = torch.autograd.grad((y * proj).sum(), [a, b])
    return {
        "name": f"{op} {list(sa)} {list(sb)}", "op": op,
        "a_shape": list(sa), "b_shape": list(sb), "y_shape": list(y.shape),
        "a": flat(a), "b": flat(b), "proj": flat(proj), "y": flat(y),
        "grad_a": flat(ga), "grad_b": flat(gb),
    }


def unary_case(op, shape):
    if op in ("log", "sqrt"):
        x = grid(shape, 1, 64, 16)
    elif op == "inverse_sigmoid":
        x = grid(shape, -8, 24, 16)
        # The clamps' edges: 0 and 1 exactly, just inside eps and 1 - eps,
        # just outside.
        edges = torch.tensor([0.0, 1.0, 2 ** -20, 1 - 2 ** -20, 2 ** -14, 1 - 2 ** -14, -2 ** -10, 1 + 2 ** -10])
        x.view(-1)[: len(edges)] = edges
    elif op == "exp":
        x = grid(shape, -64, 48, 16)
    else:
        x = grid(shape, -48, 48, 16)
    x.requires_grad_(True)
    scale = -2.5
    y = {
        "relu": torch.relu, "sigmoid": torch.sigmoid, "inverse_sigmoid": inverse_sigmoid,
        "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "square": torch.square,
        "scale": lambda t: t * scale,
    }[op](x)
    proj = grid(y.shape, -8, 8, 8)
    (g,) = torch.autograd.grad((y * proj).sum(), [x])
    return {
        "name": f"{op} {list(shape)}", "op": op, "shape": list(shape), "scale": scale,
        "x": flat(x), "proj": flat(proj), "y": flat(y), "grad": flat(g),
    }


def reduce_case(op, shape, axes, keepdim):
    x = grid(shape, -48, 48, 16).requires_grad_(True)
    f = torch.sum if op == "sum" else torch.mean
    y = f(x, axes, keepdim=keepdim)
    proj = grid(y.shape, -8, 8, 8)
    (g,) = torch.autograd.grad((y * proj).sum(), [x])
    return {
        "name": f"{op} {list(shape)} axes={list(axes)} keepdim={keepdim}", "op": op,
        "shape": list(shape), "axes": list(axes), "keepdim": keepdim, "y_shape": list(y.shape),
        "x": flat(x), "proj": flat(proj), "y": flat(y), "grad": flat(g),
    }


def main():
    pairs = [
        ((2, 3), (2, 3)),
        ((2, 3, 4), (4,)),
        ((4,), (2, 3, 4)),
        ((2, 1, 4), (3, 1)),
        ((2, 3, 1, 5), (1, 3, 4, 1)),
        ((3, 1), (1,)),
        ((2, 3, 4, 5), (2, 1, 4, 1)),
        ((5, 300), (300,)),
    ]
    binary = [binary_case(op, sa, sb) for op in ("add", "sub", "mul", "div") for sa, sb in pairs]
    unary = [unary_case(op, s) for op in ("relu", "sigmoid", "inverse_sigmoid", "exp", "log", "sqrt", "square", "scale")
             for s in ((9,), (3, 4, 5))]
    reduces = [
        ((7,), (0,), False),
        ((7,), (-1,), True),
        ((3, 5), (1,), False),
        ((3, 5), (0,), True),
        ((2, 3, 4), (0, 2), False),
        ((2, 3, 4), (-2,), True),
        ((2, 3, 4, 5), (1, 3), True),
        ((2, 3, 4, 5), (0, 2, 3), False),
        ((2, 1, 4), (1,), False),
        ((3, 1100), (1,), False),
        ((1200, 3), (0,), True),
        ((2, 3, 4), (0, 1, 2), True),
    ]
    reduce = [reduce_case(op, s, a, k) for op in ("sum", "mean") for s, a, k in reduces]
    out = {"torch": torch.__version__, "binary": binary, "unary": unary, "reduce": reduce}
    json.dump(out, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
