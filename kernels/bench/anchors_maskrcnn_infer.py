"""Prediction throughput of torchvision's maskrcnn_resnet50_fpn (weights=None,
nothing downloaded) in eval mode, on the GPU: the anchor of stheno's
BenchmarkGPUR50FPNInfer (examples/maskrcnn/model), on the same kind of
input (uniform random images). Prints one line: ms per batch, images/s,
peak memory. gpu-check.sh's maskrcnn step runs it.

    python3 kernels/bench/anchors_maskrcnn_infer.py --size 512 --batch 8
"""
import argparse
import time

import torch
from torchvision.models.detection import maskrcnn_resnet50_fpn

p = argparse.ArgumentParser()
p.add_argument("--size", type=int, default=512)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--classes", type=int, default=4, help="including background")
a = p.parse_args()

torch.manual_seed(0)
m = maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=a.classes,
                          min_size=a.size, max_size=a.size).cuda().eval()
g = torch.Generator().manual_seed(0)
imgs = [torch.rand(3, a.size, a.size, generator=g).cuda() for _ in range(a.batch)]
with torch.no_grad():
    for _ in range(3):
        m(imgs)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    for _ in range(a.steps):
        out = m(imgs)
    torch.cuda.synchronize()
ms = (time.perf_counter() - t) / a.steps * 1000
dets = sum(len(o["boxes"]) for o in out)
print(f"anchor=torchvision_maskrcnn_r50fpn_eval gpu={torch.cuda.get_device_name()} size={a.size} batch={a.batch} "
      f"ms_per_batch={ms:.1f} img_per_s={a.batch * 1000 / ms:.1f} detections={dets} "
      f"peak_GiB={torch.cuda.max_memory_allocated() / 2**30:.2f}", flush=True)
