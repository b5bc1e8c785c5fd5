// Package model is the Mask R-CNN of the example: a ResNet backbone of
// ConvBN layers (a small one of basic blocks, or ResNet-50), a feature
// pyramid (FPN), a region proposal network (RPN), and box and mask heads
// on RoIs pooled from the pyramid with MultiLevelRoIAlign, all built as
// Gorgonia graphs of stheno's ops, together with the steps that are not differentiable and run
// on the host: anchors, box encoding, IoU, NMS, target assignment and
// sampling, mask targets, proposal decoding and detection post-processing.
//
// # Fixed shapes
//
// A Gorgonia graph has fixed shapes, and a detector's counts depend on the
// data. The graphs here keep every shape constant the way fixed-shape
// detectors do, except the mask head's:
//
//   - RPN targets (labels, regression targets and weights) are computed on
//     the host for every anchor, in the layout of the RPN's outputs, and the
//     losses take per-element weights: anchors that are not sampled weigh 0.
//   - Proposals, RoI sampling and the targets of the heads depend on the RPN's
//     outputs of the same step. They are computed by host ops inside the
//     graph (non-differentiable ops whose Do runs Go code), which emit a
//     fixed number of RoIs per image for the box head (RoIsPerImage),
//     padding with weight-0 dummies.
//   - The mask head trains on the sampled foreground RoIs only, as
//     torchvision's does (at most MaskRoIsPerImage an image), however many
//     there are: the training graph holds the head and its loss as one
//     node, which runs a graph of the head built for this step's number of
//     RoIs (rounded up, when the head has no BatchNorm, to one of eight
//     sizes an octave, with rows that weigh nothing; kept for the steps
//     with as many) and hands its gradients on to G.Grad's nodes. Padding the head to the most RoIs it may get
//     would cost, at the r50fpn preset's start, several times the head's
//     work and a third more of the step's memory.
//   - Class-specific outputs (box deltas, mask logits) are trained with
//     per-element weights that are non-zero only on the RoI's own class, so
//     no gather is needed.
//
// The inference graph chains the same way: proposals -> box head ->
// detections (a host op: per-class NMS, at most MaxDetections per image) ->
// mask head on the detections, in one run.
//
// # Devices
//
// A Net runs where its Params live (NewParams's device): on the host, or
// on one GPU, where every layer, loss and gradient, AdamW's step and
// BatchNorm's statistics run on the device and only the host steps' small
// inputs and outputs cross (Net's documentation says which). R50FPNConfig
// is torchvision's maskrcnn_resnet50_fpn layer for layer, for a GPU.
package model
