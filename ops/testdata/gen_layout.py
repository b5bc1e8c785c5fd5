#!/usr/bin/python3
"""Reference values for the layout tests (ops/layout_test.go and
ops/gather_test.go), computed by PyTorch in float64.

Regenerate from the repository root with (Debian: apt-get install
python3-torch)

    /usr/bin/python3 ops/testdata/gen_layout.py > ops/testdata/layout.json

(written against Debian's python3-torch 1.13). The draws are seeded, so the
output only changes when this script does.

Each case is one op on inputs x (several for cat) of multiples of 1/16 in
[-6, 6], and the projection R of the loss sum(y * R), multiples of 1/8 in
[-1, 1], all exact in float32: x.permute(perm).contiguous(), torch.cat(xs,
axis), x.narrow(axis, start, length), x.reshape(shape) and
torch.index_select(x, 0, idx) (idx with repeats). Each records the
inputs, the op's arguments, R, the output and the gradients of the loss
with respect to the float inputs.
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


def run(op, shapes, f, **args):
    xs = [grid(s, -96, 96, 16).requires_grad_(True) for s in shapes]
    y = f(*xs)
    proj = grid(y.shape, -8, 8, 8)
    grads = torch.autograd.grad((y * proj).sum(), xs)
    c = {
        "op": op, "shapes": [list(s) for s in shapes], "xs": [flat(x) for x in xs],
        "out_shape": list(y.shape), "proj": flat(proj), "y": flat(y), "grads": [flat(g) for g in grads],
    }
    c.update(args)
    return c


def main():
    cases = []
    for shape, perm in [
        ((2, 5, 3, 4), (0, 2, 1, 3)),
        ((2, 6, 4, 5), (0, 2, 3, 1)),
        ((3, 33, 35), (0, 2, 1)),
        ((2, 3, 4, 5, 2), (4, 2, 0, 3, 1)),
        ((4, 1, 6), (2, 1, 0)),
        ((5, 7), (-1, -2)),
    ]:
        cases.append(run("permute", [shape], lambda x: x.permute(perm).contiguous(), perm=list(perm)))
    for shapes, axis in [
        ([(2, 3, 4), (2, 5, 4), (2, 1, 4)], 1),
        ([(2, 30, 8), (2, 12, 8), (2, 5, 8), (2, 3, 8)], -2),
        ([(3, 2), (1, 2)], 0),
        ([(2, 3), (2, 4)], -1),
    ]:
        cases.append(run("concat", shapes, lambda *xs: torch.cat(xs, axis), axis=axis))
    for shape, axis, start, end in [
        ((4, 6, 3), 1, 2, 5),
        ((5, 4), 0, 0, 2),
        ((3, 7), -1, 6, 7),
    ]:
        cases.append(run("slice", [shape], lambda x: x.narrow(axis, start, end - start), axis=axis, start=start, end=end))
    for shape, new in [
        ((2, 3, 4), (6, 4)),
        ((2, 3, 4), (4, -1)),
        ((24,), (2, 3, 2, 2)),
    ]:
        cases.append(run("reshape", [shape], lambda x: x.reshape(new), new=list(new)))
    for shape, idx in [
        ((7, 5), [3, 0, 3, 6, 3, 1]),
        ((6, 2, 3), [5, 5, 5, 0]),
        ((4,), [1, 3, 2, 0]),
    ]:
        t = torch.tensor(idx)
        cases.append(run("gather", [shape], lambda x: torch.index_select(x, 0, t), idx=idx))
    json.dump({"torch": torch.__version__, "cases": cases}, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
