// Package model is the Deformable-DETR of the example, built as Gorgonia
// graphs of stheno's ops: a small ResNet-style backbone of ConvBN layers
// whose last three stages, and a stride-2 convolution of the last, give
// four feature levels; input projections (1x1 convolution and GroupNorm);
// the sine position embedding (package posembed) plus a learned level
// embedding; a post-norm encoder of multi-scale deformable attention and
// FFN layers; a decoder of self-attention, deformable cross-attention and
// FFN layers from learned queries and reference points; per-layer class
// and box heads, with optional iterative box refinement (Config.BoxRefine);
// two-stage query selection (Config.TwoStage: the encoder's tokens
// propose boxes, the best-scored become the decoder's queries and
// reference boxes); and the reference's SetCriterion: Hungarian matching
// on the host, focal, L1 and GIoU losses on every decoder layer (and on
// the proposals under TwoStage), normalised by the number of objects.
//
// The semantics are those of the reference implementation (fundamentalvision's
// Deformable-DETR): initialisations, the sampling-offset direction grid,
// the reference points, the matching costs and the losses' normalisation.
// Differences: the backbone is trained from scratch with BatchNorm in
// training mode (the reference's is a pretrained ResNet-50 with frozen
// BatchNorm); the decoder's self-attention has no dropout of its
// attention weights (ops.MultiHeadAttention has none); batches are not
// padded, so every valid ratio is 1 (EncoderReferencePoints keeps the
// general formula).
//
// # Fixed shapes
//
// A Gorgonia graph has fixed shapes, and the matching's result depends on
// the data. A host op (hostOp, not differentiated through, as the
// reference's matcher runs under no_grad) takes every decoder layer's
// logits and boxes, matches each layer and image on its own, and emits per
// query targets and weights in the layout of the predictions: one-hot
// classes [B, Q, C], box targets [B, Q, 4] with per-coordinate weights,
// and corner targets [B*Q, 4] with per-box weights for GIoU (under
// TwoStage also the proposals', in the same layout). Unmatched
// queries weigh 0 in the box losses, so the losses are per-element
// weighted ops with no gather. The loss weights and 1/num_boxes are folded
// into those weights (buildTargets says how this reproduces the
// reference's focal loss, mean(1).sum()/num_boxes times Q). Two-stage's
// top-k selection is a host op too: the proposals' first-class logits
// and boxes go to the host, the selected boxes and their sine embedding
// come back, detached as the reference detaches them.
//
// # Devices and training
//
// Params holds the state where it lives: NewParams(seed, dev) makes the
// learnable tensors and BatchNorm's running statistics on dev (nil: the
// host), and every graph Build makes (training and inference) binds those
// same tensors, as examples/maskrcnn's model does; HostValue, SetValue,
// HostRunningStats and SetRunningStats go through the host for
// checkpoints, and Free gives the device memory back. On a device the
// graph's constants are copied there once, the images move in with
// ops.ToDevice, the predictions reach the matching op (package
// examples/internal/hostop) through ops.ToHost, and its targets return
// through ops.ToDevice and autograd.Unpack; the machine is
// ops.NewTapeMachine, which checks the placement.
//
// Net.NewOptimizer makes an ops.AdamW over ParamGroups' groups, its state
// beside the parameters; Net.TrainStep runs forward, backward and the
// optimiser's step inside a backend.Scope, and draws the dropout masks for
// the step it is given, so that a run depends only on its seed and
// iteration numbers. OptimizerState and SetOptimizerState read and restore
// the optimiser for checkpoints.
package model
