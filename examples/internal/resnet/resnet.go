package resnet

import (
	"fmt"

	G "gorgonia.org/gorgonia"

	"github.com/stheno-ml/stheno/ops"
)

// Blocks50 are the bottleneck blocks of ResNet-50's four stages.
var Blocks50 = [4]int{3, 4, 6, 3}

// Layer is one ConvBN layer: a bias-free Kernel x Kernel convolution of
// Stride to Out channels (padding Kernel/2), BatchNorm, then Act after the
// residual, if the layer has one.
type Layer struct {
	// Name is "stem", "layerS.B.conv1" to "conv3" (stage S from 1, block
	// B from 0) or "layerS.B.down" (the shortcut's projection).
	Name string
	// Stage is 0 for the stem, S for layerS: builders that freeze the
	// first stages (Deformable-DETR's) decide by it.
	Stage               int
	Out, Kernel, Stride int
	Act                 ops.Activation
}

// Builder makes layers on a graph. Its methods return nil once the
// builder has failed (its first error sticks, and it reports it itself):
// ResNet50 then returns nil.
type Builder interface {
	// ConvBN makes layer l on x, adding residual (nil: none) before the
	// activation.
	ConvBN(x *G.Node, l Layer, residual *G.Node) *G.Node
	// Check records err, if any, and passes n through (nil after an
	// error).
	Check(n *G.Node, err error) *G.Node
}

// ResNet50 builds ResNet-50 of base width on x [N, 3, H, W]: a 7x7 stride-2
// stem of width channels, a 3x3 stride-2 max pooling, then the stages of
// Blocks50 bottleneck blocks of width<<s channels (four times that out).
// A block is a 1x1 ConvBN, a 3x3 ConvBN carrying the stage's stride (2 in
// the first block of stages 2 to 4), a 1x1 ConvBN to four times the width
// adding the shortcut before its ReLU; the shortcut is a 1x1 ConvBN ("down")
// where the shape changes. Layers are made in that order (the shortcut
// first in its block). It returns the four stages' outputs, at strides 4,
// 8, 16 and 32 (torchvision's C2 to C5).
func ResNet50(b Builder, x *G.Node, width int) []*G.Node {
	c := b.ConvBN(x, Layer{Name: "stem", Out: width, Kernel: 7, Stride: 2, Act: ops.ActReLU}, nil)
	if c == nil {
		return nil
	}
	c = b.Check(ops.MaxPool2d(c, ops.MaxPool2dConfig{Kernel: [2]int{3, 3}, Stride: [2]int{2, 2}, Pad: [2]int{1, 1}}))
	var feats []*G.Node
	for s, blocks := range Blocks50 {
		w := width << s
		for blk := range blocks {
			if c == nil {
				return nil
			}
			name := fmt.Sprintf("layer%d.%d", s+1, blk)
			stride := 1
			if blk == 0 && s > 0 {
				stride = 2
			}
			layer := func(suffix string, out, k, stride int, act ops.Activation) Layer {
				return Layer{Name: name + suffix, Stage: s + 1, Out: out, Kernel: k, Stride: stride, Act: act}
			}
			shortcut := c
			if stride != 1 || c.Shape()[1] != 4*w {
				shortcut = b.ConvBN(c, layer(".down", 4*w, 1, stride, ops.ActNone), nil)
			}
			y := b.ConvBN(c, layer(".conv1", w, 1, 1, ops.ActReLU), nil)
			y = b.ConvBN(y, layer(".conv2", w, 3, stride, ops.ActReLU), nil)
			c = b.ConvBN(y, layer(".conv3", 4*w, 1, 1, ops.ActReLU), shortcut)
		}
		if c == nil {
			return nil
		}
		feats = append(feats, c)
	}
	return feats
}
