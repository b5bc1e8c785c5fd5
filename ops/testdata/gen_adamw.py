#!/usr/bin/python3
"""Reference trajectories for the AdamW tests (ops/adamw_test.go): steps of
torch.optim.AdamW, after torch.nn.utils.clip_grad_norm_ when a case clips,
computed by PyTorch in float64.

Regenerate from the repository root with (Debian: apt-get install
python3-torch)

    /usr/bin/python3 ops/testdata/gen_adamw.py > ops/testdata/adamw.json

(written against Debian's python3-torch 1.13, whose AdamW on the CPU takes
the single-tensor path; any PyTorch gives the same numbers to rounding).
The draws are seeded, so the output only changes when this script does.

Each case has four tensors in two parameter groups (tensors 0 and 2 at lr
1e-3 with weight decay 0.05, tensors 1 and 3 at lr 1e-2 with none, as DETR
splits its backbone from the rest and keeps biases out of the decay), its
betas, eps and clipping threshold (0: no clipping), the initial values and
four steps, each with the gradients handed in, the norm clip_grad_norm_
returned (clipping cases) and the parameters after the step; then the
moments (exp_avg, exp_avg_sq) after the last step. Values and gradients
are multiples of 1/64 in [-2, 2] (gradients scaled by a case's size):
exact in float32, so that a float32 run starts from the same numbers.
"""

import json
import sys

import torch

torch.set_default_dtype(torch.float64)
GEN = torch.Generator().manual_seed(20261125)

SHAPES = [[3, 4], [5], [2, 3, 2], [7]]
GROUPS = [{"lr": 1e-3, "wd": 0.05, "tensors": [0, 2]}, {"lr": 1e-2, "wd": 0.0, "tensors": [1, 3]}]
STEPS = 4


def grid(shape, scale=1.0):
    return torch.randint(-128, 129, shape, generator=GEN).double() / 64 * scale


def flat(t):
    return t.detach().reshape(-1).tolist()


def case(name, max_norm, betas=(0.9, 0.999), eps=1e-8, grad_scale=1.0):
    params = [torch.nn.Parameter(grid(s)) for s in SHAPES]
    init = [flat(p) for p in params]
    opt = torch.optim.AdamW(
        [{"params": [params[i] for i in g["tensors"]], "lr": g["lr"], "weight_decay": g["wd"]} for g in GROUPS],
        betas=betas, eps=eps)
    steps = []
    for _ in range(STEPS):
        grads = [grid(s, grad_scale) for s in SHAPES]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        step = {"grads": [flat(g) for g in grads]}
        if max_norm > 0:
            step["norm"] = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        opt.step()
        step["params"] = [flat(p) for p in params]
        steps.append(step)
    return {
        "name": name, "max_norm": max_norm, "beta1": betas[0], "beta2": betas[1], "eps": eps,
        "shapes": SHAPES, "groups": GROUPS, "init": init, "steps": steps,
        "exp_avg": [flat(opt.state[p]["exp_avg"]) for p in params],
        "exp_avg_sq": [flat(opt.state[p]["exp_avg_sq"]) for p in params],
    }


def main():
    cases = [
        case("clipped", 0.5),
        case("clip above the norm", 100.0),
        case("no clipping", 0.0),
        case("other betas and eps", 1.0, betas=(0.8, 0.99), eps=1e-6, grad_scale=0.25),
    ]
    json.dump({"torch": torch.__version__, "cases": cases}, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
