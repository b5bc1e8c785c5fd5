#!/usr/bin/python3
"""Reference values for the loss and box-conversion tests (ops/losses_test.go,
ops/boxes_test.go), computed by PyTorch and torchvision in float64.

Regenerate from the repository root with (Debian: apt-get install
python3-torch python3-torchvision)

    /usr/bin/python3 ops/testdata/gen_losses_device.py > ops/testdata/losses.json

(written against Debian's python3-torch 1.13 and python3-torchvision 0.14).
The draws are seeded, so the output only changes when this script does.

Each loss case is reduction="sum" with a weight per element (per row for
cross_entropy and the GIoU loss), as ops' losses take it:
sum(w * loss(x, t, reduction="none")), and records x, t, w, the loss and its
gradient with respect to x (PyTorch's autograd). The losses are
F.binary_cross_entropy_with_logits, F.smooth_l1_loss, F.l1_loss,
torchvision.ops.sigmoid_focal_loss (several alpha and gamma, alpha = -1 for
none), F.cross_entropy and torchvision.ops.generalized_box_iou_loss (eps
1e-7, boxes that overlap, touch, nest, tie with the target on some
coordinates, are empty or inverted). Box conversions are
torchvision.ops.box_convert between cxcywh and xyxy, with the gradient of
sum(y * R). Inputs are multiples of 1/16 (targets of 1/4), exact in float32;
some weights are 0.
"""

import json
import sys

import torch
import torch.nn.functional as F
from torchvision.ops import box_convert, generalized_box_iou_loss, sigmoid_focal_loss

torch.set_default_dtype(torch.float64)
GEN = torch.Generator().manual_seed(20261125)


def grid(shape, lo, hi, den):
    """Uniform draws of k/den for integers k in [lo, hi]."""
    return torch.randint(lo, hi + 1, shape, generator=GEN).double() / den


def flat(t):
    return t.detach().reshape(-1).tolist()


def weights(n):
    w = grid((n,), 0, 8, 4)
    w[::5] = 0
    return w


def loss_case(name, kind, x, t, w, f, **params):
    x = x.clone().requires_grad_(True)
    loss = (w * f(x, t)).sum()
    (grad,) = torch.autograd.grad(loss, [x])
    c = {
        "name": name, "kind": kind, "shape": list(x.shape),
        "x": flat(x), "t": flat(t), "w": flat(w), "loss": loss.item(), "grad": flat(grad),
    }
    c.update(params)
    return c


def elementwise_cases():
    cases = []
    shape = (6, 7)
    x = grid(shape, -80, 80, 16)
    t01 = grid(shape, 0, 1, 1)
    tsoft = grid(shape, 0, 4, 4)
    w = weights(42).reshape(shape)
    cases.append(loss_case("bce", "bce", x, tsoft, w,
                           lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction="none")))
    tr = grid(shape, -80, 80, 16)
    tr[0, :3] = x[0, :3]  # d = 0
    for beta in (1.0, 1 / 9):
        cases.append(loss_case(f"smoothl1 beta={beta:.4g}", "smoothl1", x, tr, w,
                               lambda a, b: F.smooth_l1_loss(a, b, reduction="none", beta=beta), beta=beta))
    cases.append(loss_case("l1", "l1", x, tr, w, lambda a, b: F.l1_loss(a, b, reduction="none")))
    for alpha, gamma in ((0.25, 2.0), (-1.0, 2.0), (0.5, 0.0), (0.25, 1.5), (0.75, 3.0), (0.0, 1.0), (1.0, 0.5)):
        for tname, t in (("binary", t01), ("soft", tsoft)):
            cases.append(loss_case(f"focal alpha={alpha} gamma={gamma} {tname}", "focal", x, t, w,
                                   lambda a, b: sigmoid_focal_loss(a, b, alpha=alpha, gamma=gamma, reduction="none"),
                                   alpha=alpha, gamma=gamma))
    return cases


def ce_cases():
    k, c = 9, 5
    x = grid((k, c), -80, 80, 16)
    labels = torch.randint(0, c, (k,), generator=GEN)
    w = weights(k)
    case = loss_case("cross_entropy", "ce", x, labels.double(), w,
                     lambda a, b: F.cross_entropy(a, b.long(), reduction="none"))
    return [case]


def giou_boxes():
    """Boxes against targets: random ones, and the special arrangements."""
    n = 24
    xy = grid((n, 2), -64, 64, 16)
    wh = grid((n, 2), 1, 64, 16)
    b1 = torch.cat([xy, xy + wh], 1)
    xy2 = xy + grid((n, 2), -32, 32, 16)
    wh2 = grid((n, 2), 1, 64, 16)
    b2 = torch.cat([xy2, xy2 + wh2], 1)
    special = [
        ([0, 0, 1, 1], [0, 0, 1, 1]),          # the same box: every coordinate ties
        ([0, 0, 2, 2], [1, 1, 3, 3]),          # overlap
        ([0, 0, 1, 1], [1, 0, 2, 1]),          # touching: no overlap
        ([0, 0, 1, 1], [2, 2, 3, 3]),          # apart
        ([0, 0, 4, 4], [1, 1, 2, 2]),          # nested
        ([0, 0, 2, 2], [0, 1, 3, 2]),          # ties on x1 and y2
        ([0.5, 0.5, 0.5, 1.5], [0, 0, 1, 1]),  # empty (zero width)
        ([1, 1, 1, 1], [1, 1, 1, 1]),          # two points
        ([2, 0, 1, 1], [0, 0, 1, 1]),          # inverted: x2 < x1
        ([0, 0, 3, 1], [1, -1, 2, 2]),         # a cross
    ]
    s1 = torch.tensor([a for a, _ in special])
    s2 = torch.tensor([b for _, b in special])
    return torch.cat([b1, s1]), torch.cat([b2, s2])


def giou_cases():
    b1, b2 = giou_boxes()
    w = weights(b1.shape[0])
    w[-10:] = 1  # every special arrangement counts
    f = lambda a, b: generalized_box_iou_loss(a, b, reduction="none")
    return [loss_case("giou", "giou", b1, b2, w, f)]


def box_cases():
    cases = []
    for fmt_in, fmt_out in (("cxcywh", "xyxy"), ("xyxy", "cxcywh")):
        for shape in ((7, 4), (2, 3, 4)):
            x = grid(shape, -64, 64, 16).requires_grad_(True)
            y = box_convert(x, fmt_in, fmt_out)
            proj = grid(shape, -8, 8, 8)
            (grad,) = torch.autograd.grad((y * proj).sum(), [x])
            cases.append({
                "name": f"{fmt_in}->{fmt_out} {list(shape)}", "in": fmt_in, "out": fmt_out,
                "shape": list(shape), "x": flat(x), "proj": flat(proj), "y": flat(y), "grad": flat(grad),
            })
    return cases


def main():
    out = {
        "torch": torch.__version__,
        "losses": elementwise_cases() + ce_cases() + giou_cases(),
        "boxes": box_cases(),
    }
    json.dump(out, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
