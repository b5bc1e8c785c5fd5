#!/usr/bin/env python3
"""Reference values for ops.RoIAlign, computed by torchvision.ops.roi_align.

Regenerate with (Debian: apt-get install python3-torch python3-torchvision):

    /usr/bin/python3 ops/testdata/gen_roialign.py > ops/testdata/roialign.json

Each case holds the input, the RoIs, the config, torchvision's float64 output
and the float64 gradient of sum(output * proj) with respect to the input.
The boxes cover what RoIAlign must get right: boxes inside the map, crossing
the border, entirely outside, smaller than a feature pixel, of negative size,
in both images of the batch; aligned on and off; adaptive and fixed sampling.
"""
import json
import sys

import torch
from torchvision.ops import roi_align


def boxes(gen, k, n, img_h, img_w):
    out = []
    for i in range(k):
        u = torch.rand(5, generator=gen, dtype=torch.float64).tolist()
        cx = u[0] * img_w * 1.6 - 0.3 * img_w
        cy = u[1] * img_h * 1.6 - 0.3 * img_h
        w = u[2] * img_w * 0.8
        h = u[3] * img_h * 0.8
        kind = i % 5
        if kind == 1:  # below one feature pixel at these scales
            w, h = u[2] * 1.5, u[3] * 1.5
        elif kind == 2:  # entirely outside
            cx = img_w * 1.5 + w
        elif kind == 3:  # negative size
            w = -w / 4
        b = float(int(u[4] * n))
        out.append([b, cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
    return out


def case(gen, name, shape, k, pooled, scale, sampling, aligned):
    n, c, h, w = shape
    x = torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1
    rois = torch.tensor(boxes(gen, k, n, h / scale, w / scale), dtype=torch.float64)
    x.requires_grad_(True)
    y = roi_align(x, rois, output_size=pooled, spatial_scale=scale,
                  sampling_ratio=sampling, aligned=aligned)
    proj = torch.rand(y.shape, generator=gen, dtype=torch.float64) * 2 - 1
    (y * proj).sum().backward()
    return {
        "name": name,
        "x_shape": list(shape),
        "x": x.detach().flatten().tolist(),
        "rois": rois.flatten().tolist(),
        "k": k,
        "pooled_h": pooled[0],
        "pooled_w": pooled[1],
        "spatial_scale": scale,
        "sampling_ratio": sampling,
        "aligned": aligned,
        "out": y.detach().flatten().tolist(),
        "proj": proj.flatten().tolist(),
        "grad_x": x.grad.flatten().tolist(),
    }


def main():
    gen = torch.Generator().manual_seed(20261122)
    cases = []
    for aligned in (True, False):
        for sampling in (0, 2, 1):
            cases.append(case(gen, f"aligned={aligned}/sampling={sampling}",
                              (2, 3, 9, 11), 10, (3, 2), 0.25, sampling, aligned))
    cases.append(case(gen, "scale=1/pooled=7x7", (1, 2, 13, 10), 6, (7, 7), 1.0, 0, True))
    cases.append(case(gen, "scale=0.125/pooled=1x4", (2, 1, 6, 7), 8, (1, 4), 0.125, 3, False))
    json.dump({"generator": "ops/testdata/gen_roialign.py",
               "torch": torch.__version__, "cases": cases}, sys.stdout)


if __name__ == "__main__":
    main()
