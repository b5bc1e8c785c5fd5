#!/usr/bin/python3
"""Reference values for the MultiHeadAttention tests (ops/attention_test.go),
computed by PyTorch's torch.nn.MultiheadAttention in float64.

Regenerate from the repository root with (Debian: apt-get install
python3-torch)

    /usr/bin/python3 ops/testdata/gen_attention.py > ops/testdata/attention.json

(written against Debian's python3-torch 1.13). The draws are seeded, so the
output only changes when this script does.

Each case is one forward of torch.nn.MultiheadAttention(E, H, dropout=0,
bias=True, batch_first=...) with its weights set to fixed draws (in_proj
weight and bias, out_proj weight and bias): self-attention (query, key and
value one tensor) or cross-attention (query [L, N, E], key and value
[S, N, E], or batch first), with or without a bool key_padding_mask [N, S]
(true: ignore; no query loses all its keys), need_weights=True with the
weights averaged over the heads. Values are multiples of 1/16 in [-1, 1]
(weights of 1/32 in [-0.5, 0.5]), exact in float32, so that the
projections and scores stay of order 1, the sizes TolForward32 bounds the
float32 rounding of (larger inputs make the softmax near one-hot and its
gradients amplify the rounding of the scores). The loss is sum(out * R)
+ sum(weights * Rw); each case records the inputs, the weights, R, Rw, the
outputs and the gradients of the loss with respect to the inputs (x alone
for self-attention) and the four parameters.
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


def case(name, e, h, l, s, n, self_attn, batch_first, masked):
    mha = torch.nn.MultiheadAttention(e, h, dropout=0.0, bias=True, batch_first=batch_first)
    params = {
        "in_proj_weight": grid((3 * e, e), -16, 16, 32),
        "in_proj_bias": grid((3 * e,), -16, 16, 32),
        "out_proj_weight": grid((e, e), -16, 16, 32),
        "out_proj_bias": grid((e,), -16, 16, 32),
    }
    with torch.no_grad():
        mha.in_proj_weight.copy_(params["in_proj_weight"])
        mha.in_proj_bias.copy_(params["in_proj_bias"])
        mha.out_proj.weight.copy_(params["out_proj_weight"])
        mha.out_proj.bias.copy_(params["out_proj_bias"])
    qshape = (n, l, e) if batch_first else (l, n, e)
    kshape = (n, s, e) if batch_first else (s, n, e)
    if self_attn:
        x = grid(qshape, -16, 16, 16).requires_grad_(True)
        inputs = [x]
        q = k = v = x
    else:
        inputs = [grid(qshape, -16, 16, 16).requires_grad_(True), grid(kshape, -16, 16, 16).requires_grad_(True),
                  grid(kshape, -16, 16, 16).requires_grad_(True)]
        q, k, v = inputs
    mask = None
    if masked:
        mask = torch.zeros((n, s), dtype=torch.bool)
        for i in range(n):
            mask[i, (i + 1) % s] = True
            mask[i, s - 1 - i % s] = True
            mask[i, 0] = False
    out, weights = mha(q, k, v, key_padding_mask=mask, need_weights=True)
    r = grid(out.shape, -8, 8, 8)
    rw = grid(weights.shape, -8, 8, 8)
    loss = (out * r).sum() + (weights * rw).sum()
    wrt = inputs + [mha.in_proj_weight, mha.in_proj_bias, mha.out_proj.weight, mha.out_proj.bias]
    grads = torch.autograd.grad(loss, wrt)
    return {
        "name": name, "e": e, "h": h, "l": l, "s": s, "n": n, "self": self_attn, "batch_first": batch_first,
        "inputs": [flat(t) for t in inputs], "mask": flat(mask) if masked else None,
        "params": [flat(params[k]) for k in ("in_proj_weight", "in_proj_bias", "out_proj_weight", "out_proj_bias")],
        "r": flat(r), "rw": flat(rw), "out": flat(out), "weights": flat(weights),
        "grads": [flat(g) for g in grads],
    }


def main():
    cases = [
        case("self", 8, 2, 4, 4, 2, True, False, False),
        case("self batch_first masked", 8, 4, 5, 5, 3, True, True, True),
        case("cross", 6, 3, 3, 5, 2, False, False, False),
        case("cross masked", 8, 2, 3, 6, 2, False, False, True),
        case("cross batch_first masked", 8, 2, 4, 3, 2, False, True, True),
        case("one head", 4, 1, 2, 3, 1, False, True, False),
    ]
    json.dump({"torch": torch.__version__, "cases": cases}, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
