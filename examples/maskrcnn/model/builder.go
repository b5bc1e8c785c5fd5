package model

import (
	"fmt"
	"math"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/examples/internal/resnet"
	"github.com/stheno-ml/stheno/ops"
)

// builder assembles one graph. Its first error sticks: later calls do
// nothing and return nil, and Build reports the error once at the end, so
// that the architecture reads as a sequence of layers rather than a ladder
// of error checks.
type builder struct {
	net    *Net
	err    error
	nodes  map[string]*G.Node // learnable tensors of this graph, by name
	order  []string
	params G.Nodes
	bns    []*ops.BatchNorm
}

// check records err and passes n through.
func (b *builder) check(n *G.Node, err error) *G.Node {
	if b.err == nil && err != nil {
		b.err = err
	}
	if b.err != nil {
		return nil
	}
	return n
}

// add returns x+y (ops.Add: on the host or the device), or y when x is nil
// (the start of a sum).
func (b *builder) add(x, y *G.Node) *G.Node {
	if b.err != nil {
		return nil
	}
	if x == nil {
		return y
	}
	return b.check(ops.Add(x, y))
}

// toDevice moves a host value (an input, a host op's output) to the
// graph's device; on the host it is n itself.
func (b *builder) toDevice(n *G.Node) *G.Node {
	if b.err != nil || b.net.dev == nil {
		return n
	}
	return b.check(ops.ToDevice(n, b.net.dev))
}

// toHost brings a value to the host (a host op's input); on the host it is
// n itself.
func (b *builder) toHost(n *G.Node) *G.Node {
	if b.err != nil || b.net.dev == nil {
		return n
	}
	return b.check(ops.ToHost(n))
}

// toHostAll is toHost of each node.
func (b *builder) toHostAll(ns []*G.Node) G.Nodes {
	out := make(G.Nodes, len(ns))
	for i, n := range ns {
		out[i] = b.toHost(n)
	}
	return out
}

// param returns this graph's node of the named learnable tensor, bound to
// the Params' tensor. A name used twice (the RPN head, shared by the
// levels) is one node.
func (b *builder) param(name string, shape []int, in initializer, decay bool) *G.Node {
	if b.err != nil {
		return nil
	}
	if n, ok := b.nodes[name]; ok {
		return n
	}
	t, err := b.net.params.tensorFor(name, shape, in, decay)
	if err != nil {
		b.err = err
		return nil
	}
	return b.bind(name, t)
}

// bind returns a new node of this graph for the learnable tensor t of
// Params, under name: param's second half, for a tensor that exists.
func (b *builder) bind(name string, t *tensor.Dense) *G.Node {
	if b.err != nil {
		return nil
	}
	shape := t.Shape()
	n := G.NewTensor(b.net.g, tensor.Float32, len(shape), G.WithShape(shape...), G.WithName(name), G.WithValue(t))
	b.order = append(b.order, name)
	b.params = append(b.params, n)
	if b.net.dev != nil && b.net.params.Device() == nil {
		n = b.toDevice(n) // a placement test's graph (see build)
	}
	b.nodes[name] = n
	return n
}

// conv is a convolution with bias and optional ReLU. Weights are He-normal
// over fan_out (as torchvision's ResNet and mask head) unless w says
// otherwise.
func (b *builder) conv(x *G.Node, name string, cout, k, stride int, act ops.Activation, w *initializer) *G.Node {
	if b.err != nil {
		return nil
	}
	cin := x.Shape()[1]
	in := kaiming(cout * k * k)
	if w != nil {
		in = *w
	}
	wt := b.param(name+".w", []int{cout, cin, k, k}, in, true)
	bias := b.param(name+".b", []int{cout}, zeros(), false)
	if b.err != nil {
		return nil
	}
	cfg := ops.ConvConfig{Stride: [2]int{stride, stride}, Pad: [2]int{k / 2, k / 2}, Act: act}
	return b.check(ops.Conv(x, wt, bias, cfg))
}

// convBN is a bias-free convolution, BatchNorm, an optional residual and an
// optional ReLU, fused by ops.ConvBN.
func (b *builder) convBN(x *G.Node, name string, cout, k, stride int, act ops.Activation, residual *G.Node) *G.Node {
	if b.err != nil {
		return nil
	}
	cin := x.Shape()[1]
	wt := b.param(name+".w", []int{cout, cin, k, k}, kaiming(cout*k*k), true)
	gamma := b.param(name+".bn.gamma", []int{cout}, constant(1), false)
	beta := b.param(name+".bn.beta", []int{cout}, zeros(), false)
	mean, variance, err := b.net.params.StatsFor(name+".bn", cout)
	if err != nil {
		b.err = err
	}
	if b.err != nil {
		return nil
	}
	bn := &ops.BatchNorm{Gamma: gamma, Beta: beta, RunningMean: mean, RunningVar: variance,
		Momentum: ops.DefaultMomentum, Eps: ops.DefaultEps, Training: b.net.mode == Train}
	b.bns = append(b.bns, bn)
	cfg := ops.ConvConfig{Stride: [2]int{stride, stride}, Pad: [2]int{k / 2, k / 2}, Act: act}
	return b.check(ops.ConvBN(x, wt, bn, residual, cfg))
}

// backbone returns the outputs of the backbone's stages (Config.Backbone),
// finest first.
func (b *builder) backbone(x *G.Node) []*G.Node {
	if b.net.cfg.Backbone == BackboneResNet50 {
		return b.resNet50(x)
	}
	return b.basicResNet(x)
}

// basicResNet is BackboneBasic: a stride-2 3x3 stem, then three stages of
// basic blocks (two 3x3 ConvBN layers and a shortcut, 1x1 ConvBN where the
// shape changes) whose first block halves the resolution. It returns the
// outputs of the stages, at strides 4, 8 and 16.
func (b *builder) basicResNet(x *G.Node) []*G.Node {
	cfg := b.net.cfg
	c := b.convBN(x, "stem", cfg.Width, 3, 2, ops.ActReLU, nil)
	var feats []*G.Node
	for s := range 3 {
		ch := cfg.Width << (s + 1)
		for blk := range cfg.Depth {
			name := fmt.Sprintf("stage%d.%d", s+1, blk)
			stride := 1
			if blk == 0 {
				stride = 2
			}
			shortcut := c
			if b.err == nil && (stride != 1 || c.Shape()[1] != ch) {
				shortcut = b.convBN(c, name+".down", ch, 1, stride, ops.ActNone, nil)
			}
			y := b.convBN(c, name+".conv1", ch, 3, stride, ops.ActReLU, nil)
			c = b.convBN(y, name+".conv2", ch, 3, 1, ops.ActReLU, shortcut)
		}
		feats = append(feats, c)
	}
	return feats
}

// resNet50 is BackboneResNet50, laid out by resnet.ResNet50 (the 7x7
// stem and max pooling, then the bottleneck blocks), every layer a convBN
// of trainable BatchNorm. It returns the four stages' outputs, at strides
// 4 to 32.
func (b *builder) resNet50(x *G.Node) []*G.Node {
	return resnet.ResNet50(resNetLayers{b}, x, b.net.cfg.Width)
}

// resNetLayers makes resnet.ResNet50's layers with the builder's convBN.
type resNetLayers struct{ b *builder }

func (r resNetLayers) ConvBN(x *G.Node, l resnet.Layer, residual *G.Node) *G.Node {
	return r.b.convBN(x, l.Name, l.Out, l.Kernel, l.Stride, l.Act, residual)
}

func (r resNetLayers) Check(n *G.Node, err error) *G.Node { return r.b.check(n, err) }

// fpn is the feature pyramid: 1x1 lateral convolutions to FPNChannels, a
// top-down path of nearest-neighbour upsampling and sums, and a 3x3
// convolution on each level.
func (b *builder) fpn(feats []*G.Node) []*G.Node {
	if b.err != nil {
		return nil
	}
	f := b.net.cfg.FPNChannels
	// torchvision initialises the FPN with kaiming_uniform(a=1): variance
	// 1/fan_in.
	lat := make([]*G.Node, len(feats))
	for i, c := range feats {
		if b.err != nil {
			return nil
		}
		w := normal(1 / math.Sqrt(float64(c.Shape()[1])))
		lat[i] = b.conv(c, fmt.Sprintf("fpn.lateral%d", i), f, 1, 1, ops.ActNone, &w)
	}
	out := make([]*G.Node, len(feats))
	top := lat[len(lat)-1]
	for i := len(lat) - 1; i >= 0; i-- {
		if i < len(lat)-1 {
			top = b.add(lat[i], b.check(ops.UpsampleNearest(top, 2)))
		}
		w := normal(1 / math.Sqrt(float64(9*f)))
		out[i] = b.conv(top, fmt.Sprintf("fpn.output%d", i), f, 3, 1, ops.ActNone, &w)
	}
	if b.net.cfg.ExtraLevel && b.err == nil {
		// torchvision's LastLevelMaxPool: max_pool2d(kernel 1, stride 2).
		out = append(out, b.check(ops.MaxPool2d(out[len(out)-1], ops.MaxPool2dConfig{Kernel: [2]int{1, 1}, Stride: [2]int{2, 2}})))
	}
	return out
}

// rpnHead applies the RPN's shared head to every level: a 3x3 convolution
// and ReLU, then 1x1 convolutions to A objectness logits and A*4 deltas.
func (b *builder) rpnHead(pyramid []*G.Node) (obj, del []*G.Node) {
	a := b.net.cfg.NumAnchors()
	f := b.net.cfg.FPNChannels
	w := normal(0.01) // torchvision's RPN init
	for _, p := range pyramid {
		t := b.conv(p, "rpn.conv", f, 3, 1, ops.ActReLU, &w)
		obj = append(obj, b.conv(t, "rpn.obj", a, 1, 1, ops.ActNone, &w))
		del = append(del, b.conv(t, "rpn.delta", 4*a, 1, 1, ops.ActNone, &w))
	}
	return obj, del
}

// pool is the pyramid's MultiLevelRoIAlign with the model's level mapping.
func (b *builder) pool(pyramid []*G.Node, rois *G.Node, size int, columns bool) *G.Node {
	if b.err != nil {
		return nil
	}
	cfg := b.net.cfg
	levels := cfg.PoolLevels()
	scales := make([]float64, levels)
	for l, s := range cfg.Strides()[:levels] {
		scales[l] = 1 / float64(s)
	}
	return b.check(ops.MultiLevelRoIAlign(pyramid[:levels], rois, ops.MultiLevelRoIAlignConfig{
		PooledH: size, PooledW: size, SamplingRatio: 2, Aligned: true, Scales: scales,
		CanonicalSize: cfg.CanonicalSize, CanonicalLevel: cfg.CanonicalLevel, Columns: columns,
	}))
}

// boxHead pools each RoI to PoolSize x PoolSize and applies two fully
// connected layers with ReLU, then the class logits (background first) and
// the class-specific deltas. The RoIs are laid out as the pixels of a
// [1, D, K, 1] image, so each fully connected layer is a 1x1 convolution:
// one GEMM on the convolution kernels, bias and ReLU fused. It returns
// cls [1, NumClasses+1, K, 1] and reg [1, 4*NumClasses, K, 1].
func (b *builder) boxHead(pyramid []*G.Node, rois *G.Node) (cls, reg *G.Node) {
	cfg := b.net.cfg
	cols := b.pool(pyramid, rois, cfg.PoolSize, true)
	if b.err != nil {
		return nil, nil
	}
	s := cols.Shape()
	x := b.check(ops.Reshape(cols, 1, s[0], s[1], 1))
	if b.err != nil {
		return nil, nil
	}
	// torchvision's TwoMLPHead uses nn.Linear's default init, uniform of
	// variance 1/(3 fan_in); He init suits the ReLUs as well.
	fc1 := kaiming(s[0])
	x = b.conv(x, "box.fc1", cfg.BoxHeadDim, 1, 1, ops.ActReLU, &fc1)
	fc2 := kaiming(cfg.BoxHeadDim)
	x = b.conv(x, "box.fc2", cfg.BoxHeadDim, 1, 1, ops.ActReLU, &fc2)
	wc, wr := normal(0.01), normal(0.001) // torchvision's FastRCNNPredictor
	cls = b.conv(x, "box.cls", cfg.NumClasses+1, 1, 1, ops.ActNone, &wc)
	reg = b.conv(x, "box.reg", 4*cfg.NumClasses, 1, 1, ops.ActNone, &wr)
	return cls, reg
}

// maskHead pools each RoI to MaskPoolSize x MaskPoolSize and applies the
// mask head's layers (maskLayers): [K, NumClasses, 2*MaskPoolSize,
// 2*MaskPoolSize] logits.
func (b *builder) maskHead(pyramid []*G.Node, rois *G.Node) *G.Node {
	return b.maskLayers(b.pool(pyramid, rois, b.net.cfg.MaskPoolSize, false))
}

// maskLayers are the mask head's layers after the pooling: MaskConvs 3x3
// convolutions with ReLU (ConvBN, or with a bias when MaskConvBias), a
// 2x2 stride-2 transposed convolution with ReLU and a 1x1 convolution to
// one mask logit map per class.
func (b *builder) maskLayers(x *G.Node) *G.Node {
	cfg := b.net.cfg
	for i := range cfg.MaskConvs {
		name := fmt.Sprintf("mask.conv%d", i)
		if cfg.MaskConvBias {
			x = b.conv(x, name, cfg.MaskChannels, 3, 1, ops.ActReLU, nil)
		} else {
			x = b.convBN(x, name, cfg.MaskChannels, 3, 1, ops.ActReLU, nil)
		}
	}
	if b.err != nil {
		return nil
	}
	c := x.Shape()[1]
	w := b.param("mask.up.w", []int{c, cfg.MaskChannels, 2, 2}, kaiming(cfg.MaskChannels*4), true)
	bias := b.param("mask.up.b", []int{cfg.MaskChannels}, zeros(), false)
	if b.err != nil {
		return nil
	}
	x = b.check(ops.ConvTranspose(x, w, bias, ops.ConvTransposeConfig{Stride: [2]int{2, 2}, Act: ops.ActReLU}))
	if b.err != nil {
		return nil
	}
	return b.conv(x, "mask.logits", cfg.NumClasses, 1, 1, ops.ActNone, nil)
}

// sumLosses is the sum of scalar losses where they live (ops.SumLosses).
func (b *builder) sumLosses(losses ...*G.Node) *G.Node {
	if b.err != nil {
		return nil
	}
	if len(losses) == 1 {
		return losses[0]
	}
	return b.check(ops.SumLosses(losses...))
}

// readLosses has the net read scalar losses after each run, on the host:
// on a device, one small copy each (the first waits for the step's
// forward; the others find the GPU done with them).
func (b *builder) readLosses(losses ...*G.Node) {
	b.net.lossVals = make([]G.Value, len(losses))
	for i, l := range losses {
		if v := b.toHost(l); b.err == nil {
			G.Read(v, &b.net.lossVals[i])
		}
	}
}
