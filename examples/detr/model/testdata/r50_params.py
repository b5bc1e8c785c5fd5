"""Counts the trainable parameters of the reference's R50 Deformable-DETR
(91 classes, 6+6 layers, 300 queries, d_model 256, 4 levels, 8 heads, 4
points, d_ffn 1024), the numbers TestR50TrainableParams checks: without
two stage, then with box refinement and two stage. The backbone is torchvision's resnet50 with frozen BatchNorm,
layer2 to layer4 trainable; the transformer's layers are built here from
torch.nn modules of the sizes the reference's modules have.

    python3 examples/detr/model/testdata/r50_params.py

prints the count without and with box refinement, and with both box
refinement and two stage (no reference_points or query_embed; enc_output
and pos_trans with their LayerNorms; one more pair of heads, for the
encoder's proposals)."""
import torch
from torch import nn
import torchvision
from torchvision.ops.misc import FrozenBatchNorm2d

d, ffn, heads, levels, points, queries, classes, layers = 256, 1024, 8, 4, 4, 300, 91, 6


def count(m):
    return sum(p.numel() for p in m.parameters() if p.requires_grad)


backbone = torchvision.models.resnet50(norm_layer=FrozenBatchNorm2d)
for name, p in backbone.named_parameters():
    p.requires_grad_(any(s in name for s in ("layer2", "layer3", "layer4")))


def msdeform():
    return nn.ModuleList([nn.Linear(d, heads * levels * points * 2), nn.Linear(d, heads * levels * points),
                          nn.Linear(d, d), nn.Linear(d, d)])


def ffn_norms(n):
    return nn.ModuleList([nn.Linear(d, ffn), nn.Linear(ffn, d)] + [nn.LayerNorm(d) for _ in range(n)])


encoder = nn.ModuleList([nn.ModuleList([msdeform(), ffn_norms(2)]) for _ in range(layers)])
decoder = nn.ModuleList([nn.ModuleList([msdeform(), nn.MultiheadAttention(d, heads), ffn_norms(3)])
                         for _ in range(layers)])
input_proj = nn.ModuleList([nn.Sequential(nn.Conv2d(c, d, 1), nn.GroupNorm(32, d)) for c in (512, 1024, 2048)] +
                           [nn.Sequential(nn.Conv2d(2048, d, 3, 2, 1), nn.GroupNorm(32, d))])
rest = nn.ParameterList([nn.Parameter(torch.zeros(levels, d))])  # level_embed
other = nn.ModuleList([nn.Linear(d, 2), nn.Embedding(queries, 2 * d)])  # reference_points, query_embed
head = nn.ModuleList([nn.Linear(d, classes), nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, 4)])

shared = sum(count(m) for m in (backbone, encoder, decoder, input_proj, rest, other))
print("box_refine=False", shared + count(head))
print("box_refine=True", shared + layers * count(head))
two_stage = nn.ModuleList([nn.Linear(d, d), nn.LayerNorm(d), nn.Linear(2 * d, 2 * d), nn.LayerNorm(2 * d)])
print("box_refine=True two_stage=True", shared - count(other) + count(two_stage) + (layers + 1) * count(head))
