// Package ops holds the Gorgonia ops stheno adds for object detection:
// RoIAlign, multi-scale deformable attention (MSDeformAttn) and fused
// convolution layers (Conv with bias and ReLU, ConvBN with BatchNorm, a
// residual and ReLU).
//
// Each constructor checks shapes, dtypes and its config while the graph is
// built and returns an error naming the op, the argument and the shape it
// expected; the kernels behind the ops (package kernels) assume valid input.
// Problems that depend on the data, such as a RoI whose batch index is out of
// range, are reported when the graph runs.
//
// Every op is differentiable through gorgonia.Grad (it implements
// gorgonia.SDOp); its backward pass is made of ops of this package, so that the
// same kernels serve training on the CPU and, with the cuda build tag, on the
// GPU. All ops accept float32 and float64.
//
// Semantics follow the references exactly:
//   - RoIAlign: torchvision.ops.roi_align (average pooling).
//   - MSDeformAttn: Deformable-DETR's multi-scale deformable attention, i.e.
//     grid_sample (bilinear, zero padding, align_corners=False) per level,
//     weighted and summed over levels and points.
//   - Conv and ConvBN: PyTorch's conv2d (NCHW, cross-correlation, groups=1)
//     and BatchNorm2d.
package ops
