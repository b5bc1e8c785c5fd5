#!/usr/bin/python3
"""Reference values for the Linear, MatMul and BatchedMatMul tests
(ops/linear_test.go), computed by PyTorch in float64.

Regenerate from the repository root with (Debian: apt-get install
python3-torch)

    /usr/bin/python3 ops/testdata/gen_linear.py > ops/testdata/linear.json

(written against Debian's python3-torch 1.13; any PyTorch with F.linear,
torch.mm and torch.bmm gives the same numbers). The draws are seeded, so the
output only changes when this script does.

The references are torch.nn.functional.linear (x [..., in], w [out, in],
optional b [out]), torch.mm, and torch.bmm on the operands as
ops.BatchedMatMul stores them: with trans_a, a is [B, k, m] and the product
uses a.transpose(1, 2); with trans_b, b is [B, n, k] likewise. Gradients are
with respect to the stored tensors.

Every input is a small multiple of a power of two (x, a and b of 1/16, w
of 1/32, the bias of 1/16, the projection of 1/8) and is exactly
representable in float32; the sums are short enough that every product and
sum, forward and backward, is exact in float32 too.

Each case records its inputs in the order the op takes them ("order"), the
projection R of the loss sum(y * R), the output y, and the gradients of the
loss with respect to every input.
"""

import json
import sys

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
GEN = torch.Generator().manual_seed(20260126)


def grid(shape, lo, hi, den):
    """Uniform draws of k/den for integers k in [lo, hi]."""
    return torch.randint(lo, hi + 1, shape, generator=GEN).double() / den


def flat(t):
    return t.detach().reshape(-1).tolist()


def record(name, kind, names, leaves, y, extra):
    proj = grid(y.shape, -8, 8, 8)
    grads = torch.autograd.grad((y * proj).sum(), leaves)
    return {
        "name": name, "kind": kind, **extra,
        "order": names,
        "inputs": {n: {"shape": list(t.shape), "data": flat(t)} for n, t in zip(names, leaves)},
        "proj": flat(proj),
        "y": {"shape": list(y.shape), "data": flat(y)},
        "grads": {n: flat(g) for n, g in zip(names, grads)},
    }


def linear_case(name, xs, out, bias):
    x = grid(xs, -16, 16, 16).requires_grad_(True)
    w = grid((out, xs[-1]), -16, 16, 32).requires_grad_(True)
    leaves, names = [x, w], ["x", "w"]
    b = None
    if bias:
        b = grid((out,), -16, 16, 16).requires_grad_(True)
        leaves, names = leaves + [b], names + ["b"]
    return record(name, "linear", names, leaves, F.linear(x, w, b), {})


def matmul_case(name, m, k, n):
    a = grid((m, k), -16, 16, 16).requires_grad_(True)
    b = grid((k, n), -16, 16, 16).requires_grad_(True)
    return record(name, "matmul", ["a", "b"], [a, b], torch.mm(a, b), {})


def bmm_case(name, batch, m, k, n, trans_a, trans_b):
    a = grid((batch, k, m) if trans_a else (batch, m, k), -16, 16, 16).requires_grad_(True)
    b = grid((batch, n, k) if trans_b else (batch, k, n), -16, 16, 16).requires_grad_(True)
    opa = a.transpose(1, 2) if trans_a else a
    opb = b.transpose(1, 2) if trans_b else b
    return record(name, "bmm", ["a", "b"], [a, b], torch.bmm(opa, opb),
                  {"trans_a": trans_a, "trans_b": trans_b})


def main():
    cases = [
        linear_case("2-D x with bias", (5, 7), 4, True),
        linear_case("1-D x with bias", (6,), 3, True),
        linear_case("3-D x no bias", (2, 3, 8), 5, False),
        linear_case("4-D x with bias", (2, 2, 3, 6), 7, True),
        linear_case("in=300, two depth blocks", (4, 300), 9, True),
        linear_case("out=1", (3, 2, 5), 1, True),
        matmul_case("6x9 by 9x4", 6, 9, 4),
        matmul_case("row by column", 1, 5, 1),
        matmul_case("17x3 by 3x40", 17, 3, 40),
    ]
    for ta in (False, True):
        for tb in (False, True):
            cases.append(bmm_case(f"bmm transA={ta} transB={tb}", 3, 4, 5, 6, ta, tb))
    cases.append(bmm_case("attention scores q*k^T", 2, 10, 8, 10, False, True))
    cases.append(bmm_case("attention output p*v", 2, 10, 10, 8, False, False))
    json.dump({"torch": torch.__version__, "cases": cases}, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
