"""Prints the learnable scalars of torchvision's maskrcnn_resnet50_fpn for the
r50fpn preset's classes (3 foreground + background), per module and in all:
TestR50FPNPreset's r50fpnParams. Debian's python3-torchvision suffices:

    python3 examples/maskrcnn/model/testdata/count_r50fpn.py
"""
import collections

from torchvision.models.detection import maskrcnn_resnet50_fpn

m = maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=4)
per = collections.Counter()
for name, p in m.named_parameters():
    per[".".join(name.split(".")[:2])] += p.numel()
for name, n in sorted(per.items()):
    print(f"{name:28s} {n:>10d}")
print(f"{'total':28s} {sum(p.numel() for p in m.parameters() if p.requires_grad):>10d}")
