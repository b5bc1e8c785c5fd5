#!/usr/bin/python3
"""Reference values for the Conv and ConvBN tests (ops/conv_test.go,
ops/batchnorm_test.go), computed by PyTorch in float64.

Regenerate from the repository root with

    /usr/bin/python3 ops/testdata/gen_conv.py > ops/testdata/conv.json

(written against Debian's python3-torch 1.13; any PyTorch with
F.conv2d/F.batch_norm gives the same numbers). The draws are seeded, so the
output only changes when this script does.

Every input is a small multiple of a power of two (x and the residual of
1/16, w of 1/32, ...) and is exactly representable in float32. With such
inputs every product and sum of the convolutions and of their gradients is
exact in float32 too, so the tests can hold float32 runs to the same
reference: what float32 rounding remains comes from BatchNorm's division and
square root, which the float32 tolerance covers.

Each case records its inputs, the projection R of the loss sum(y * R), the
output y, and the gradients of the loss with respect to every differentiable
input; BatchNorm cases also record the running statistics after the run.
"""

import json
import sys

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
GEN = torch.Generator().manual_seed(20240611)


def grid(shape, lo, hi, den):
    """Uniform draws of k/den for integers k in [lo, hi]."""
    return torch.randint(lo, hi + 1, shape, generator=GEN).double() / den


def flat(t):
    return t.detach().reshape(-1).tolist()


def conv_inputs(xs, ws):
    return grid(xs, -16, 16, 16), grid(ws, -16, 16, 32)


def conv_case(name, xs, ws, stride, pad, dilation, bias, act):
    x, w = conv_inputs(xs, ws)
    b = grid((ws[0],), -16, 16, 16) if bias else None
    leaves = [x, w] + ([b] if bias else [])
    for t in leaves:
        t.requires_grad_(True)
    y = F.conv2d(x, w, b, stride=stride, padding=pad, dilation=dilation)
    if act == "relu":
        y = F.relu(y)
    proj = grid(y.shape, -8, 8, 8)
    grads = torch.autograd.grad((y * proj).sum(), leaves)
    names = ["x", "w"] + (["bias"] if bias else [])
    return {
        "name": name, "kind": "conv",
        "stride": list(stride), "pad": list(pad), "dilation": list(dilation), "act": act,
        "inputs": {n: {"shape": list(t.shape), "data": flat(t)} for n, t in zip(names, leaves)},
        "proj": flat(proj),
        "y": {"shape": list(y.shape), "data": flat(y)},
        "grads": {n: flat(g) for n, g in zip(names, grads)},
    }


def bn_params(c):
    return {
        "gamma": grid((c,), 8, 24, 16),
        "beta": grid((c,), -8, 8, 8),
        "running_mean": grid((c,), -8, 8, 16),
        "running_var": grid((c,), 8, 24, 16),
    }


def convbn_forward(x, w, bn, rm, rv, res, cfg, training):
    z = F.conv2d(x, w, None, stride=cfg["stride"], padding=cfg["pad"], dilation=cfg["dilation"])
    y = F.batch_norm(z, rm, rv, weight=bn["gamma"], bias=bn["beta"], training=training,
                     momentum=cfg["momentum"], eps=cfg["eps"])
    if res is not None:
        y = y + res
    if cfg["act"] == "relu":
        y = F.relu(y)
    return y


def convbn_case(name, xs, ws, stride, pad, dilation, act, residual, training, momentum=0.1, eps=1e-5):
    cfg = {"stride": list(stride), "pad": list(pad), "dilation": list(dilation), "act": act,
           "momentum": momentum, "eps": eps}
    x, w = conv_inputs(xs, ws)
    bn = bn_params(ws[0])
    rm, rv = bn["running_mean"].clone(), bn["running_var"].clone()
    with torch.no_grad():
        z = F.conv2d(x, w, None, stride=stride, padding=pad, dilation=dilation)
    res = grid(z.shape, -16, 16, 16) if residual else None
    leaves = [x, w, bn["gamma"], bn["beta"]] + ([res] if residual else [])
    for t in leaves:
        t.requires_grad_(True)
    y = convbn_forward(x, w, bn, rm, rv, res, cfg, training)
    proj = grid(y.shape, -8, 8, 8)
    grads = torch.autograd.grad((y * proj).sum(), leaves)
    names = ["x", "w", "gamma", "beta"] + (["residual"] if residual else [])
    return {
        "name": name, "kind": "convbn", "training": training, **cfg,
        "inputs": {n: {"shape": list(t.shape), "data": flat(t)} for n, t in zip(names, leaves)},
        "running_mean": flat(bn["running_mean"]), "running_var": flat(bn["running_var"]),
        "proj": flat(proj),
        "y": {"shape": list(y.shape), "data": flat(y)},
        "grads": {n: flat(g) for n, g in zip(names, grads)},
        "running_mean_after": flat(rm), "running_var_after": flat(rv),
    }


def convbn_steps(name, xs, ws, momentum):
    """Two training steps on different batches, then evaluation on a third,
    all with one set of running statistics: their values after each step,
    and the evaluation output, which uses them."""
    cfg = {"stride": [1, 1], "pad": [1, 1], "dilation": [1, 1], "act": "relu",
           "momentum": momentum, "eps": 1e-5}
    _, w = conv_inputs(xs, ws)
    bn = bn_params(ws[0])
    rm, rv = bn["running_mean"].clone(), bn["running_var"].clone()
    batches, outputs, means, variances = [], [], [], []
    with torch.no_grad():
        for training in (True, True, False):
            x = grid(xs, -16, 16, 16)
            y = convbn_forward(x, w, bn, rm, rv, None, cfg, training)
            batches.append(flat(x))
            outputs.append(flat(y))
            means.append(flat(rm))
            variances.append(flat(rv))
    return {
        "name": name, "kind": "convbn_steps", **cfg,
        "x_shape": list(xs), "w": {"shape": list(ws), "data": flat(w)},
        "gamma": flat(bn["gamma"]), "beta": flat(bn["beta"]),
        "running_mean": flat(bn["running_mean"]), "running_var": flat(bn["running_var"]),
        "batches": batches, "outputs": outputs,
        "running_means": means, "running_vars": variances,
    }


def main():
    cases = [
        conv_case("1x1", (2, 3, 4, 5), (4, 3, 1, 1), (1, 1), (0, 0), (1, 1), True, "relu"),
        conv_case("3x3 pad 1", (2, 3, 6, 7), (5, 3, 3, 3), (1, 1), (1, 1), (1, 1), True, "relu"),
        conv_case("7x7 stride 2 pad 3", (1, 3, 13, 11), (4, 3, 7, 7), (2, 2), (3, 3), (1, 1), True, "relu"),
        conv_case("dilation 2", (2, 2, 9, 8), (3, 2, 3, 3), (1, 1), (2, 2), (2, 2), False, "relu"),
        conv_case("stride (2,1)", (2, 3, 7, 6), (4, 3, 3, 3), (2, 1), (1, 0), (1, 1), True, "none"),
        conv_case("non-square everything", (1, 2, 5, 9), (3, 2, 2, 4), (1, 2), (1, 2), (1, 2), True, "relu"),
        conv_case("no bias no act", (2, 4, 5, 5), (3, 4, 3, 3), (1, 1), (0, 0), (1, 1), False, "none"),
        convbn_case("train 3x3 residual relu", (2, 3, 6, 7), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), "relu", True, True),
        convbn_case("train 1x1", (2, 3, 4, 5), (5, 3, 1, 1), (1, 1), (0, 0), (1, 1), "none", False, True),
        convbn_case("train stride 2 relu momentum 0.3", (2, 2, 9, 7), (3, 2, 3, 3), (2, 2), (1, 1), (1, 1), "relu", False, True, 0.3, 1e-3),
        convbn_case("train dilation 2 residual", (1, 2, 8, 9), (3, 2, 3, 3), (1, 1), (2, 2), (2, 2), "none", True, True),
        convbn_case("eval 3x3 residual relu", (2, 3, 6, 7), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), "relu", True, False),
        convbn_case("eval stride (2,1) relu", (2, 3, 7, 6), (4, 3, 3, 3), (2, 1), (1, 0), (1, 1), "relu", False, False, 0.1, 1e-2),
        convbn_steps("two steps then eval", (2, 2, 5, 6), (3, 2, 3, 3), 0.25),
    ]
    json.dump({"torch": torch.__version__, "cases": cases}, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
