#!/usr/bin/python3
"""Reference values for the two-stage tests (examples/detr/model/
twostage_test.go), computed by PyTorch in float64.

Regenerate from the repository root with (Debian: apt-get install
python3-torch)

    /usr/bin/python3 examples/detr/model/testdata/gen_twostage.py \\
        > examples/detr/model/testdata/twostage.json

(written against Debian's python3-torch 1.13). The random inputs are
seeded, so the output only changes when this script does.

The formulas are DeformableTransformer.gen_encoder_output_proposals (for a
batch with no padding) and get_proposal_pos_embed from Deformable-DETR's
models/deformable_transformer.py, written out again here rather than
imported:

- proposals: for each level l of size (H, W), pixel (i, j) proposes the box
  ((j + 0.5) / W, (i + 0.5) / H, 0.05 * 2^l, 0.05 * 2^l); it is valid when
  every coordinate lies in (0.01, 0.99), and its output is log(p / (1 - p))
  per coordinate, +inf where invalid (the Go side writes its finite
  stand-in there and the test compares the validity instead);
- pos embed: for inverse-sigmoid box coordinates c [K, 4] and F features,
  sigmoid(c) * 2 pi / 10000 ** (2 * (f // 2) / F) for f < F, sin on even f
  and cos on odd f, interleaved, coordinate after coordinate: [K, 4F];
- topk: the indices of the k largest scores of a vector without ties.

Each proposals case records the level sizes, the proposals [S, 4] (null
where +inf) and the validity [S]; each embedding case F, the coordinates
and the embedding; each topk case k, the scores and torch.topk's indices.
"""

import json
import math

import torch

GEN = torch.Generator().manual_seed(20261127)


def proposals(levels):
    boxes = []
    for lvl, (h, w) in enumerate(levels):
        ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float64),
                                torch.arange(w, dtype=torch.float64), indexing="ij")
        centre = torch.stack([(xs + 0.5) / w, (ys + 0.5) / h], -1)
        size = torch.full_like(centre, 0.05 * 2.0 ** lvl)
        boxes.append(torch.cat([centre, size], -1).reshape(-1, 4))
    p = torch.cat(boxes, 0)
    valid = ((p > 0.01) & (p < 0.99)).all(-1)
    out = torch.log(p / (1 - p))
    out[~valid] = math.inf
    return out, valid


def pos_embed(coords, feats):
    f = torch.arange(feats, dtype=torch.float64)
    dim_t = 10000 ** (2 * torch.div(f, 2, rounding_mode="floor") / feats)
    x = coords.sigmoid() * 2 * math.pi
    x = x[:, :, None] / dim_t
    x = torch.stack([x[:, :, 0::2].sin(), x[:, :, 1::2].cos()], 3)
    return x.flatten(1)


def main():
    out = {"proposals": [], "embeddings": [], "topk": []}
    # The second case has centres within 0.01 of the border (W = 64), the
    # third sizes of 0.99 and more (levels 5 and 6).
    for levels in ([[8, 8], [4, 4], [2, 2], [1, 1]], [[2, 64], [1, 32]], [[1, 1]] * 7):
        p, valid = proposals(levels)
        out["proposals"].append({
            "levels": levels,
            "unact": [None if math.isinf(v) else v for v in p.flatten().tolist()],
            "valid": valid.tolist(),
        })
    for feats, k in ((16, 5), (128, 3)):
        coords = torch.randn(k, 4, generator=GEN, dtype=torch.float64) * 3
        coords[0, 1] = math.inf
        emb = pos_embed(coords, feats)
        coords[0, 1] = 1e4  # the Go side's stand-in for +inf
        out["embeddings"].append({"feats": feats, "unact": coords.flatten().tolist(), "embed": emb.flatten().tolist()})
    for n, k in ((50, 7), (300, 300)):
        scores = torch.randn(n, generator=GEN, dtype=torch.float64)
        out["topk"].append({"k": k, "scores": scores.tolist(), "indices": torch.topk(scores, k).indices.tolist()})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
