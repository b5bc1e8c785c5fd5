// Package ops holds the Gorgonia ops stheno adds to train object detectors:
//   - detection: RoIAlign and MultiLevelRoIAlign, multi-scale deformable
//     attention (MSDeformAttn), MultiHeadAttention;
//   - layers: Conv (with bias and ReLU), ConvBN (with BatchNorm, a residual
//     and ReLU), ConvTranspose, Linear, MatMul, BatchedMatMul, MaxPool2d,
//     Dropout, UpsampleNearest;
//   - normalisation: LayerNorm, GroupNorm, Softmax and LogSoftmax along any
//     axis;
//   - elementwise ops with broadcasting (Add, Sub, Mul, Div, Scale, ReLU,
//     Sigmoid, InverseSigmoid, Exp, Log, Sqrt, Square) and sums over axes
//     (Sum, Mean);
//   - layout: Permute, Transpose, Concat, Slice, Split, Reshape, Detach,
//     GatherRows;
//   - losses, each a sum with per-element weights: SigmoidBCE, SmoothL1,
//     SoftmaxCrossEntropy, SigmoidFocalLoss, L1Loss, GIoULoss (with the box
//     conversions BoxCxCyWHToXYXY and BoxXYXYToCxCyWH), and SumLosses;
//   - placement: ToDevice and ToHost, which move values and their gradients
//     between the host and a GPU inside a graph, and CheckPlacement.
//
// AdamW is a gorgonia.Solver that updates parameters where they live, host
// or GPU.
//
// Each constructor checks shapes, dtypes and its config while the graph is
// built and returns an error naming the op, the argument and the shape it
// expected; the kernels behind the ops (package kernels) assume valid input.
// Problems that depend on the data, such as a RoI whose batch index is out of
// range, are reported when the graph runs (on the GPU, by the next call that
// waits for it).
//
// Every op is differentiable through gorgonia.Grad (it implements
// gorgonia.SDOp); its backward pass is made of ops of this package. Ops run
// where their inputs live: host tensors take the Go CPU kernels; device
// tensors (package backend, build tag stheno_cuda) take the CUDA kernels
// and give device tensors, with no host round trip; every op has both.
// CheckPlacement (and NewTapeMachine, which runs it) finds a device value
// that would reach an op that cannot take it (most of gorgonia's) while
// the graph is still being compiled. All ops accept float32 and float64.
//
// Semantics follow the references exactly:
//   - RoIAlign: torchvision.ops.roi_align (average pooling);
//     MultiLevelRoIAlign: torchvision's MultiScaleRoIAlign level assignment.
//   - MSDeformAttn: Deformable-DETR's multi-scale deformable attention, i.e.
//     grid_sample (bilinear, zero padding, align_corners=False) per level,
//     weighted and summed over levels and points.
//   - Conv, ConvBN and ConvTranspose: PyTorch's conv2d and conv_transpose2d
//     (NCHW, groups=1) and BatchNorm2d.
//   - Linear, MatMul and BatchedMatMul: torch.nn.functional.linear, torch.mm
//     and torch.bmm (with optional transposes of either operand).
//   - Softmax and LogSoftmax: torch.softmax and torch.log_softmax (a NaN, a
//     +inf or a line of -inf only makes its line NaN).
//   - LayerNorm: torch.nn.functional.layer_norm over the last dimension,
//     with optional weight (gamma) and bias (beta).
//   - Add, Sub, Mul, Div: torch's with its broadcasting; InverseSigmoid:
//     Deformable-DETR's inverse_sigmoid; Sum and Mean: torch.sum and
//     torch.mean over a set of axes, with keepdim.
//   - Permute, Concat, Slice, Reshape, GatherRows: x.permute(...).contiguous(),
//     torch.cat, x.narrow, torch.reshape and torch.index_select(x, 0, idx);
//     each returns a new contiguous tensor (on the device too, never a view).
//   - MultiHeadAttention: torch.nn.MultiheadAttention's forward with dropout
//     0 (kdim = vdim = E, an additive key-padding mask).
//   - AdamW: torch.optim.AdamW with param_groups (learning rate and weight
//     decay per group), after torch.nn.utils.clip_grad_norm_ when
//     AdamWConfig.MaxGradNorm is set.
//   - GroupNorm: torch.nn.functional.group_norm over groups of channels of
//     x [N, C, ...], with optional per-channel weight and bias.
//   - MaxPool2d: torch.nn.functional.max_pool2d (dilation 1, ceil_mode
//     False; the first maximum wins a tie, a NaN wins, as PyTorch).
//   - Dropout: torch.nn.functional.dropout; its masks come from a seeded
//     counter-based generator (DropoutRNG), not PyTorch's.
//   - SigmoidBCE, SmoothL1, L1Loss, SoftmaxCrossEntropy: PyTorch's
//     binary_cross_entropy_with_logits, smooth_l1_loss, l1_loss and
//     cross_entropy with reduction "sum" and per-element weights;
//     SigmoidFocalLoss and GIoULoss: torchvision.ops.sigmoid_focal_loss and
//     generalized_box_iou_loss; the box conversions: torchvision.ops.box_convert.
package ops
