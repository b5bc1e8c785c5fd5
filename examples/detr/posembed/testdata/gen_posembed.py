#!/usr/bin/python3
"""Reference values for the sine position embedding tests
(examples/detr/posembed/posembed_test.go), computed by PyTorch in float64.

Regenerate from the repository root with (Debian: apt-get install
python3-torch)

    /usr/bin/python3 examples/detr/posembed/testdata/gen_posembed.py \
        > examples/detr/posembed/testdata/posembed.json

(written against Debian's python3-torch 1.13). The random mask is seeded,
so the output only changes when this script does.

The formula is PositionEmbeddingSine.forward with normalize=True from
Deformable-DETR's models/position_encoding.py, written out again here in
float64 rather than imported: cumulative sums of the valid (not padded)
pixels down the columns (y) and along the rows (x),
(embed - 0.5) / (last + 1e-6) * scale, divided by
temperature ** (2 * (i // 2) / F) for channel i of F, sin on even channels
and cos on odd ones, y's F channels then x's, as [N, 2F, H, W].

Each case records the sizes n, h, w, the config (feats, temperature,
scale; zero_config says the Go test passes the zero Config, whose defaults
these are), the mask [N, H, W] flattened (true = padded) and the embedding
pos [N, 2F, H, W] flattened.

On stderr it prints how far the reference's own float32 arithmetic lands
from these float64 values, on pixels whose row and column hold a valid
pixel (on a padded row or column the argument is about -3e6, where float32
keeps a quarter of a unit and sin and cos are rounding noise).
"""

import json
import math
import sys

import torch

GEN = torch.Generator().manual_seed(20260303)


def sine_embedding(mask, feats, temperature, scale, dtype):
    """[N, H, W] bool mask (True = padded) -> [N, 2*feats, H, W]."""
    valid = (~mask).to(dtype)
    y = valid.cumsum(1)
    x = valid.cumsum(2)
    eps = 1e-6
    y = (y - 0.5) / (y[:, -1:, :] + eps) * scale
    x = (x - 0.5) / (x[:, :, -1:] + eps) * scale
    i = torch.arange(feats, dtype=dtype)
    dim_t = temperature ** (2 * torch.div(i, 2, rounding_mode="floor") / feats)
    out = []
    for embed in (y, x):
        arg = embed[..., None] / dim_t  # [N, H, W, F]
        # Pairs (sin of channel 2k, cos of channel 2k+1), laid out in turn.
        pairs = torch.stack((arg[..., 0::2].sin(), arg[..., 1::2].cos()), dim=4)
        out.append(pairs.flatten(3))
    return torch.cat(out, dim=3).permute(0, 3, 1, 2).contiguous()


def padding_mask(h, w, sizes):
    """DETR's batch padding: image k valid on its top-left sizes[k]."""
    m = torch.ones(len(sizes), h, w, dtype=torch.bool)
    for k, (vh, vw) in enumerate(sizes):
        m[k, :vh, :vw] = False
    return m


def case(name, mask, feats=128, temperature=10000.0, scale=2 * math.pi, zero_config=False):
    n, h, w = mask.shape
    pos = sine_embedding(mask, feats, temperature, scale, torch.float64)
    assert pos.shape == (n, 2 * feats, h, w)
    pos32 = sine_embedding(mask, feats, temperature, scale, torch.float32).double()
    # Pixels off every all-padded row and column, for the float32 report.
    valid = ~mask
    col_ok = valid.any(1, keepdim=True).expand(n, h, w)
    row_ok = valid.any(2, keepdim=True).expand(n, h, w)
    ok = torch.cat([col_ok[:, None].expand(n, feats, h, w),
                    row_ok[:, None].expand(n, feats, h, w)], dim=1)
    err = (pos32 - pos).abs()[ok]
    worst = err.max().item() if err.numel() else 0.0
    print(f"{name}: float32 reference off by up to {worst:.3g}", file=sys.stderr)
    return {
        "name": name,
        "n": n, "h": h, "w": w,
        "feats": feats, "temperature": temperature, "scale": scale,
        "zero_config": zero_config,
        "mask": mask.flatten().tolist(),
        "pos": pos.flatten().tolist(),
    }


def main():
    rand_mask = torch.rand(3, 4, 6, generator=GEN) < 0.4
    rand_mask[1, :, 2] = True   # an all-padded column inside the image
    rand_mask[1, 3, :] = True   # and an all-padded row
    rand_mask[2] = True         # an image with no valid pixel
    cases = [
        case("all valid, F=8", padding_mask(3, 4, [(3, 4)]), feats=8),
        case("padded right and bottom, F=8",
             padding_mask(5, 7, [(5, 7), (3, 4), (5, 2), (1, 7)]), feats=8),
        case("odd sizes, F=6", padding_mask(7, 3, [(7, 3), (4, 1), (6, 2)]), feats=6),
        case("defaults (F=128, temperature 10000, scale 2pi)",
             padding_mask(3, 5, [(3, 5), (2, 3)]), zero_config=True),
        case("F=2, one row", padding_mask(1, 5, [(1, 5), (1, 3)]), feats=2),
        case("one pixel, F=2", padding_mask(1, 1, [(1, 1)]), feats=2),
        case("arbitrary mask, temperature 20, scale 1", rand_mask, feats=4,
             temperature=20.0, scale=1.0),
    ]
    json.dump({"cases": cases}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
