"""How many RoIs torchvision's maskrcnn_resnet50_fpn (weights=None) runs its
mask head on in training, step by step, on the batch and schedule that
../shared/anchors/torchvision_maskrcnn/maskrcnn_step.py times (uniform
random images, 4 random boxes an image with box-shaped masks, AdamW at lr
1e-4, 5 warm-up steps then the timed ones): the work stheno's
BenchmarkGPUR50FPNStep (examples/maskrcnn/model) compares its own count
with ("mask RoIs per step"), and the memory PyTorch's allocator holds
(max_memory_reserved) beside what its tensors take (max_memory_allocated)
over the timed steps, which the benchmark's reserved-GiB and peak-GiB
compare with. Prints one line: the mean count over all steps and over the
timed ones, and the memory. gpu-check.sh's maskrcnn step runs it.

    python3 kernels/bench/anchors_maskrcnn_rois.py --size 512 --batch 8
"""
import argparse

import torch
from torchvision.models.detection import maskrcnn_resnet50_fpn

p = argparse.ArgumentParser()
p.add_argument("--size", type=int, default=512)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--warmup", type=int, default=5)
p.add_argument("--boxes", type=int, default=4, help="objects per image")
p.add_argument("--classes", type=int, default=4, help="including background")
a = p.parse_args()
dev = "cuda"

torch.manual_seed(0)
g = torch.Generator().manual_seed(0)
imgs, tg = [], []
for _ in range(a.batch):
    imgs.append(torch.rand(3, a.size, a.size, generator=g).to(dev))
    xy = torch.rand(a.boxes, 2, generator=g) * a.size * 0.6
    wh = torch.rand(a.boxes, 2, generator=g) * a.size * 0.3 + 16
    boxes = torch.cat([xy, xy + wh], 1).clamp(max=a.size - 1)
    masks = torch.zeros(a.boxes, a.size, a.size, dtype=torch.uint8)
    for i, b in enumerate(boxes.long()):
        masks[i, b[1]:b[3], b[0]:b[2]] = 1
    labels = torch.randint(1, a.classes, (a.boxes,), generator=g)
    tg.append(dict(boxes=boxes.to(dev), labels=labels.to(dev), masks=masks.to(dev)))
m = maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=a.classes,
                          min_size=a.size, max_size=a.size).to(dev).train()
opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=1e-4, fused=True)
counts = []
m.roi_heads.mask_head.register_forward_hook(lambda mod, i, o: counts.append(i[0].shape[0]))
for s in range(a.warmup + a.steps):
    if s == a.warmup:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    loss = sum(m(imgs, tg).values())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
timed = counts[a.warmup:]
print(f"anchor=torchvision_maskrcnn_r50fpn_mask_rois gpu={torch.cuda.get_device_name()} size={a.size} batch={a.batch} "
      f"mask_rois_per_step={sum(counts) / len(counts):.1f} timed={sum(timed) / len(timed):.1f} "
      f"min={min(counts)} max={max(counts)} peak_GiB={torch.cuda.max_memory_allocated() / 2**30:.2f} "
      f"reserved_GiB={torch.cuda.max_memory_reserved() / 2**30:.2f}", flush=True)
