#!/usr/bin/python3
"""Reference outputs and gradients of multi-scale deformable attention.

Regenerate ops/testdata/msdeform.json from the repository root with

    /usr/bin/python3 ops/testdata/gen_msdeform.py

(Debian's python3-torch 1.13 made the checked-in file; it needs nothing but
torch). The inputs come from a seeded generator, so rerunning the script with
the same PyTorch rewrites the file byte for byte; another PyTorch version may
draw other inputs, which the Go test (ops.TestMSDeformAttnMatchesPyTorch)
accepts as they are, since it reads the inputs from the file too.

The reference is the pure-PyTorch formulation of Deformable-DETR's
MSDeformAttn, written from its definition: each level of value is viewed as a
[N*M, D, H, W] image and sampled with F.grid_sample (bilinear, zero padding,
align_corners=False) at grid = 2*loc - 1, which maps loc to the pixel
coordinate loc*size - 0.5; the samples are weighted by attnWeight and summed
over levels and points. Gradients come from torch.autograd, in float64.

Inputs are rounded to float32 before use, so the float32 run of the Go test
reads exactly the inputs the float64 reference used, and its error is the
kernel's own rounding only. Locations are drawn from [-0.15, 1.15], so some
points fall partly or entirely outside their map; none lands exactly on the
border of the sampling range, where grid_sample and the kernel may differ in
the gradient of a sample that is 0.

JSON layout: {"cases": [{"name", "N", "Lq", "M", "D", "P", "levels": [[H, W],
...], "value", "loc", "weight", "grad_out", "out", "grad_value", "grad_loc",
"grad_weight"}]}, every tensor flattened row-major in the shapes documented
by ops.MSDeformAttn; grad_* are the gradients of sum(out * grad_out).
"""

import json
import os

import torch
import torch.nn.functional as F


def ms_deform_attn(value, levels, loc, weight):
    """value [N,S,M,D], loc [N,Lq,M,L,P,2], weight [N,Lq,M,L,P] -> [N,Lq,M*D]."""
    n, _, m, d = value.shape
    _, lq, _, n_levels, p, _ = loc.shape
    per_level = value.split([h * w for h, w in levels], dim=1)
    grid = 2 * loc - 1
    out = value.new_zeros(n * m, d, lq)
    for lvl, (h, w) in enumerate(levels):
        # [N, H*W, M, D] -> [N*M, D, H, W], one image per (batch, head).
        img = per_level[lvl].permute(0, 2, 3, 1).reshape(n * m, d, h, w)
        # [N, Lq, M, P, 2] -> [N*M, Lq, P, 2]: grid_sample's [N, Hout, Wout, 2].
        g = grid[:, :, :, lvl].permute(0, 2, 1, 3, 4).reshape(n * m, lq, p, 2)
        s = F.grid_sample(img, g, mode="bilinear", padding_mode="zeros", align_corners=False)
        # s: [N*M, D, Lq, P]; weights of this level as [N*M, 1, Lq, P].
        a = weight[:, :, :, lvl].permute(0, 2, 1, 3).reshape(n * m, 1, lq, p)
        out = out + (s * a).sum(dim=-1)
    # [N*M, D, Lq] -> [N, Lq, M*D]
    return out.reshape(n, m, d, lq).permute(0, 3, 1, 2).reshape(n, lq, m * d)


def f32(t):
    return t.float().double()


def make_case(gen, name, n, lq, m, d, p, levels):
    s = sum(h * w for h, w in levels)
    n_levels = len(levels)

    def uniform(lo, hi, *shape):
        return f32(lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=torch.float64))

    value = uniform(-1, 1, n, s, m, d).requires_grad_()
    loc = uniform(-0.15, 1.15, n, lq, m, n_levels, p, 2).requires_grad_()
    # Softmaxed like Deformable-DETR's weights, with some negative ones mixed
    # in so that a sign error cannot hide.
    logits = torch.randn(n, lq, m, n_levels * p, generator=gen, dtype=torch.float64)
    w = logits.softmax(-1).reshape(n, lq, m, n_levels, p)
    sign = torch.where(torch.rand(w.shape, generator=gen, dtype=torch.float64) < 0.2, -1.0, 1.0)
    weight = f32(w * sign).requires_grad_()
    grad_out = uniform(-1, 1, n, lq, m * d)

    out = ms_deform_attn(value, levels, loc, weight)
    gv, gl, gw = torch.autograd.grad(out, (value, loc, weight), grad_out)

    def flat(t):
        return t.detach().reshape(-1).tolist()

    return {
        "name": name, "N": n, "Lq": lq, "M": m, "D": d, "P": p,
        "levels": [list(lv) for lv in levels],
        "value": flat(value), "loc": flat(loc), "weight": flat(weight), "grad_out": flat(grad_out),
        "out": flat(out), "grad_value": flat(gv), "grad_loc": flat(gl), "grad_weight": flat(gw),
    }


def main():
    gen = torch.Generator().manual_seed(20240607)
    cases = [
        make_case(gen, "one_level", n=1, lq=3, m=1, d=2, p=1, levels=[(3, 5)]),
        make_case(gen, "four_levels_odd", n=2, lq=4, m=2, d=3, p=3, levels=[(7, 9), (4, 5), (2, 3), (1, 1)]),
        make_case(gen, "wide_heads", n=1, lq=5, m=3, d=5, p=2, levels=[(5, 3), (3, 2)]),
        make_case(gen, "many_points", n=2, lq=2, m=1, d=4, p=6, levels=[(6, 4), (3, 2), (1, 2)]),
    ]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "msdeform.json")
    with open(path, "w") as f:
        # repr of a Python float round-trips, so the JSON holds the float64
        # values exactly.
        json.dump({"generator": "ops/testdata/gen_msdeform.py", "torch": torch.__version__, "cases": cases}, f)
        f.write("\n")
    print(f"wrote {path}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
