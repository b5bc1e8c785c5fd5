package ops

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/kernels"
)

// Activation is the activation a fused layer applies to its output.
type Activation int

const (
	ActNone Activation = iota // identity
	ActReLU                   // max(x, 0); its gradient at 0 is 0, as PyTorch's
)

func (a Activation) String() string {
	switch a {
	case ActNone:
		return "none"
	case ActReLU:
		return "relu"
	}
	return fmt.Sprintf("Activation(%d)", int(a))
}

// ConvConfig configures Conv and ConvBN. Each pair is [H, W], and the fields
// mean what PyTorch's conv2d arguments of the same names mean.
type ConvConfig struct {
	Stride, Pad, Dilation [2]int // zero Stride or Dilation means 1
	Act                   Activation
	// NoInputGrad says that x needs no gradient (it depends on no
	// learnable tensor: images, or a frozen backbone's output). The layer
	// is then not differentiable with respect to x, and its backward makes
	// no data gradient: G.Grad differentiates an op with respect to all of
	// its differentiable inputs at once, and the tape machine would
	// compute one that nothing reads.
	NoInputGrad bool
}

// withDefaults returns c with zero strides and dilations set to 1.
func (c ConvConfig) withDefaults() ConvConfig {
	for i := range 2 {
		if c.Stride[i] == 0 {
			c.Stride[i] = 1
		}
		if c.Dilation[i] == 0 {
			c.Dilation[i] = 1
		}
	}
	return c
}

// convParams checks x, w and cfg and returns the kernels' description of
// the convolution (without activation) and the dtype of x. op names the
// calling constructor in errors.
func convParams(op string, x, w *G.Node, cfg ConvConfig) (p kernels.ConvParams, dt tensor.Dtype, err error) {
	cfg = cfg.withDefaults()
	if cfg.Stride[0] < 0 || cfg.Stride[1] < 0 {
		return p, dt, fmt.Errorf("ops: %s: Stride must be positive (or 0 for 1), got %v", op, cfg.Stride)
	}
	if cfg.Dilation[0] < 0 || cfg.Dilation[1] < 0 {
		return p, dt, fmt.Errorf("ops: %s: Dilation must be positive (or 0 for 1), got %v", op, cfg.Dilation)
	}
	if cfg.Pad[0] < 0 || cfg.Pad[1] < 0 {
		return p, dt, fmt.Errorf("ops: %s: Pad must be non-negative, got %v", op, cfg.Pad)
	}
	if cfg.Act != ActNone && cfg.Act != ActReLU {
		return p, dt, fmt.Errorf("ops: %s: unknown Activation %d", op, int(cfg.Act))
	}
	if err := checkRank(op, "x", x, 4, "[N Cin H W]"); err != nil {
		return p, dt, err
	}
	if err := checkRank(op, "w", w, 4, "[Cout Cin KH KW]"); err != nil {
		return p, dt, err
	}
	if dt, err = floatDtype(op, "x", x); err != nil {
		return p, dt, err
	}
	if err := sameDtype(op, dt, map[string]*G.Node{"w": w}); err != nil {
		return p, dt, err
	}
	xs, ws := x.Shape(), w.Shape()
	for i := range 4 {
		if xs[i] <= 0 {
			return p, dt, fmt.Errorf("ops: %s: x must have positive sizes, got %v", op, xs)
		}
		if ws[i] <= 0 {
			return p, dt, fmt.Errorf("ops: %s: w must have positive sizes, got %v", op, ws)
		}
	}
	if ws[1] != xs[1] {
		return p, dt, fmt.Errorf("ops: %s: w must have shape [Cout %d KH KW] to match the %d channels of x, got %v", op, xs[1], xs[1], ws)
	}
	p = kernels.ConvParams{
		N: xs[0], Cin: xs[1], H: xs[2], W: xs[3],
		Cout: ws[0], KH: ws[2], KW: ws[3],
		StrideH: cfg.Stride[0], StrideW: cfg.Stride[1],
		PadH: cfg.Pad[0], PadW: cfg.Pad[1],
		DilationH: cfg.Dilation[0], DilationW: cfg.Dilation[1],
	}
	// The span of the dilated kernel must fit in the padded input, or
	// there is no output pixel at all.
	spanH, spanW := p.DilationH*(p.KH-1)+1, p.DilationW*(p.KW-1)+1
	inH, inW := p.H+2*p.PadH, p.W+2*p.PadW
	if spanH > inH || spanW > inW {
		return p, dt, fmt.Errorf("ops: %s: the dilated kernel spans %dx%d, more than the padded input %dx%d", op, spanH, spanW, inH, inW)
	}
	p.OutH = (inH-spanH)/p.StrideH + 1
	p.OutW = (inW-spanW)/p.StrideW + 1
	return p, dt, nil
}

// Conv computes y = act(conv2d(x, w) + bias) in one pass: the bias and the
// activation are applied as each output tile leaves the GEMM, with no
// separate elementwise pass.
//
// x: [N,Cin,H,W]; w: [Cout,Cin,KH,KW]; bias: [Cout] or nil. Returns
// [N,Cout,OutH,OutW] with OutH = (H+2*Pad[0]-Dilation[0]*(KH-1)-1)/Stride[0]+1
// (likewise OutW), exactly PyTorch's conv2d (cross-correlation, groups=1)
// followed by the activation. Differentiable with respect to x, w and bias.
// The backward pass makes one elementwise pass over the gradient (with a
// ReLU: it masks it, sums the bias gradient and, on a GPU, leaves it in the
// TF32 precision of the tensor cores unless the device's GemmMath is
// GemmExact), and its two GEMMs (data and weight gradients) read the result
// where it lies. On a device in GemmExact every float32 convolution GEMM,
// forward and backward, multiplies in full float32.
func Conv(x, w, bias *G.Node, cfg ConvConfig) (*G.Node, error) {
	p, dt, err := convParams("Conv", x, w, cfg)
	if err != nil {
		return nil, err
	}
	p.ReLU = cfg.Act == ActReLU
	inputs := G.Nodes{x, w}
	if bias != nil {
		if err := checkRank("Conv", "bias", bias, 1, fmt.Sprintf("[%d]", p.Cout)); err != nil {
			return nil, err
		}
		if s := bias.Shape(); s[0] != p.Cout {
			return nil, fmt.Errorf("ops: Conv: bias must have shape [%d], got %v", p.Cout, s)
		}
		if err := sameDtype("Conv", dt, map[string]*G.Node{"bias": bias}); err != nil {
			return nil, err
		}
		inputs = append(inputs, bias)
	}
	return G.ApplyOp(convOp(convShape{p: p, bias: bias != nil, dt: dt, noDx: cfg.NoInputGrad}), inputs...)
}

// convShape is what the convolution ops know at graph-build time.
type convShape struct {
	p    kernels.ConvParams
	bias bool
	dt   tensor.Dtype
	// bn is set on a ConvBN layer's convolution, whose output is the
	// packed [y | statistics] (convStatsOf) that the layer's BatchNorm ops
	// take: on a GPU in training (bn.Training when it runs) the epilogue
	// reduces the batch statistics into its tail, from which the BatchNorm
	// constants are worked out without another read of y.
	bn *BatchNorm
	// gradReady says that the gradient reaching the backward ops comes
	// from the layer's one pass over it (convGradOp, or bnGradApplyOp in a
	// ConvBN layer): already masked and, on a GPU whose float32
	// convolutions multiply in TF32 (convTF32), rounded to TF32, so that
	// the wgrad takes no pass of its own over it.
	gradReady bool
	// gradPacked says that the gradient the backward ops take is
	// convGradOp's packed [g | dbias]: they read g, its first
	// N*Cout*OutH*OutW elements, where it lies.
	gradPacked bool
	// noDx is ConvConfig.NoInputGrad.
	noDx bool
}

func (s convShape) xShape() tensor.Shape { return tensor.Shape{s.p.N, s.p.Cin, s.p.H, s.p.W} }
func (s convShape) wShape() tensor.Shape { return tensor.Shape{s.p.Cout, s.p.Cin, s.p.KH, s.p.KW} }
func (s convShape) bShape() tensor.Shape { return tensor.Shape{s.p.Cout} }
func (s convShape) yShape() tensor.Shape { return tensor.Shape{s.p.N, s.p.Cout, s.p.OutH, s.p.OutW} }

// stats is the layout of a ConvBN layer's convolution output.
func (s convShape) stats() convStatsLayout {
	return convStatsOf(s.dt, s.p.N, s.p.Cout, s.p.OutH*s.p.OutW)
}

// outShape is the forward op's output: y, or a ConvBN layer's packed
// [y | statistics].
func (s convShape) outShape() tensor.Shape {
	if s.bn != nil {
		return tensor.Shape{s.stats().size}
	}
	return s.yShape()
}

// gradShape is the shape of the gradient the backward GEMM ops take: dy,
// convGradOp's packed [g | dbias] (gradPacked), or in a ConvBN layer the
// gradient of its packed output.
func (s convShape) gradShape() tensor.Shape {
	if s.gradPacked {
		return tensor.Shape{s.yShape().TotalSize() + s.p.Cout}
	}
	return s.outShape()
}

func (s convShape) String() string {
	p := s.p
	act := ActNone
	if p.ReLU {
		act = ActReLU
	}
	str := fmt.Sprintf("x=%v,w=%v,%v,stride=%dx%d,pad=%dx%d,dilation=%dx%d,bias=%t,act=%v,gradReady=%t,gradPacked=%t",
		s.xShape(), s.wShape(), s.dt, p.StrideH, p.StrideW, p.PadH, p.PadW, p.DilationH, p.DilationW, s.bias, act,
		s.gradReady, s.gradPacked)
	if s.bn != nil {
		// The layer's identity: it decides, by its mode, whether the
		// statistics are reduced.
		str += fmt.Sprintf(",bn=%p", s.bn)
	}
	if s.noDx {
		str += ",noDx"
	}
	return str
}

// convStatsLayout is a ConvBN layer's convolution output, [y | statistics]:
// y's elements, then (from element off, 8-byte aligned) slots records a
// channel of bnRecForward float64s, one slot per column tile of the forward
// GEMM, in size elements of the layer's dtype in all. The GPU's epilogue
// fills the records in training; elsewhere they are not read (the CPU
// leaves them zero).
type convStatsLayout struct {
	off, slots, size int
}

func convStatsOf(dt tensor.Dtype, n, c, hw int) convStatsLayout {
	elem := int(dt.Size())
	slots := ceilDiv(n*hw, convTileN(dt))
	off := ceilDiv(n*c*hw*elem, 8) * 8 / elem
	return convStatsLayout{off: off, slots: slots, size: off + slots*c*bnRecForward*8/elem}
}

// convOp is the forward op: (x, w[, bias]) -> y (or a ConvBN layer's
// [y | statistics]).
func convOp(s convShape) *specOp {
	in := []argSpec{{name: "x", shape: s.xShape()}, {name: "w", shape: s.wShape()}}
	if s.bias {
		in = append(in, argSpec{name: "bias", shape: s.bShape()})
	}
	return newOp(&opSpec{
		name: "Conv", config: s.String(),
		inputs: in, out: s.outShape(), dtype: s.dt,
		cpu:     floatTwin(s, convForward[float32], convForward[float64]),
		device:  s.forwardDevice,
		diffWRT: []bool{!s.noDx, true, true}[:len(in)],
		grad:    s.backward,
	})
}

func convForward[T kernels.Float](s convShape, in [][]T, out []T) error {
	ny := s.yShape().TotalSize()
	kernels.ConvForward(s.p, in[0], in[1], optional(in, 2), out[:ny])
	clear(out[ny:]) // a ConvBN layer's statistics: only the GPU's epilogue reduces them
	return nil
}

// backward is Conv's SymDiff.
func (s convShape) backward(in G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	// With a ReLU, one pass over dy (convGradOp) masks it for both GEMMs,
	// rounds it to TF32 on a GPU whose convolutions multiply in TF32 (the
	// precision they read it in) and sums the bias gradient; the GEMMs then
	// read it as it is. The fast GPU kernels copy their operands with
	// cp.async or read them from shared memory with wgmma, and cannot mask
	// or round as they do.
	back := s
	var db *G.Node
	if back.p.ReLU {
		g, err := G.ApplyOp(convGradOp(s), output, grad)
		if err != nil {
			return nil, fmt.Errorf("ops: Conv backward: %w", err)
		}
		grad = g
		if s.bias {
			// The GEMMs read g inside the packed vector; only the bias
			// gradient is carved out.
			parts, err := autograd.UnpackAt(g, s.yShape().TotalSize(), s.bShape())
			if err != nil {
				return nil, fmt.Errorf("ops: Conv backward: %w", err)
			}
			db = parts[0]
		}
		back.p.ReLU, back.bias, back.gradReady, back.gradPacked = false, false, true, s.bias
	}
	var dx *G.Node // nil with NoInputGrad: x is not differentiated
	if !s.noDx {
		var err error
		if dx, err = G.ApplyOp(convDgradOp(back), in[1], output, grad); err != nil {
			return nil, fmt.Errorf("ops: Conv backward: %w", err)
		}
	}
	dw, err := G.ApplyOp(convWgradOp(back), in[0], output, grad)
	if err != nil {
		return nil, fmt.Errorf("ops: Conv backward: %w", err)
	}
	switch {
	case !s.bias:
		return G.Nodes{dx, dw}, nil
	case db != nil:
		return G.Nodes{dx, dw, db}, nil
	}
	parts, err := autograd.Unpack(dw, s.wShape(), s.bShape())
	if err != nil {
		return nil, fmt.Errorf("ops: Conv backward: %w", err)
	}
	return G.Nodes{dx, parts[0], parts[1]}, nil
}

// convDgradOp is the data-gradient op: (w, y, dy) -> dx, with dy masked by
// y > 0 as it is read when the layer ends in a ReLU (y is not read
// otherwise). It is what a fused dgrad kernel with a ReLU prologue computes.
//
// Its DiffWRT claims every input so that a second derivative reaches
// SymDiff and its error, rather than gorgonia's report of a
// non-differentiable path.
func convDgradOp(s convShape) *specOp {
	return newOp(&opSpec{
		name: "Conv backward", kind: "ConvDgrad", config: s.String(),
		inputs: []argSpec{{name: "w", shape: s.wShape()}, {name: "y", shape: s.outShape()}, {name: "grad", shape: s.gradShape()}},
		out:    s.xShape(), dtype: s.dt,
		cpu:     floatTwin(s, convDgradTwin[float32], convDgradTwin[float64]),
		device:  s.dgradDevice,
		diffWRT: []bool{true, false, true},
		grad:    noSecondDerivative("Conv"),
	})
}

func convDgradTwin[T kernels.Float](s convShape, in [][]T, dx []T) error {
	ny := s.yShape().TotalSize()
	kernels.ConvBackwardData(s.p, in[0], in[1][:ny], in[2][:ny], dx)
	return nil
}

// convWgradOp is the weight-gradient op: (x, y, dy) -> dw, or the packed
// vector [dw | dbias] when the layer has a bias (carved out by
// autograd.Unpack), with dy masked by y > 0 as it is read when the layer
// ends in a ReLU. It is what a fused wgrad kernel computes: the bias gradient
// comes from the same reads of dy.
func convWgradOp(s convShape) *specOp {
	return newOp(&opSpec{
		name: "Conv backward", kind: "ConvWgrad", config: s.String(),
		inputs: []argSpec{{name: "x", shape: s.xShape()}, {name: "y", shape: s.outShape()}, {name: "grad", shape: s.gradShape()}},
		out:    s.wgradShape(), dtype: s.dt,
		cpu:     floatTwin(s, convWgradTwin[float32], convWgradTwin[float64]),
		device:  s.wgradDevice,
		diffWRT: []bool{true, false, true},
		grad:    noSecondDerivative("Conv"),
	})
}

// wgradShape is convWgradOp's output: dw, or [dw | dbias].
func (s convShape) wgradShape() tensor.Shape {
	if s.bias {
		return tensor.Shape{autograd.PackedSize(s.wShape(), s.bShape())}
	}
	return s.wShape()
}

func convWgradTwin[T kernels.Float](s convShape, in [][]T, out []T) error {
	nw, ny := s.wShape().TotalSize(), s.yShape().TotalSize()
	var db []T
	if s.bias {
		db = out[nw:]
	}
	kernels.ConvBackwardFilter(s.p, in[0], in[1][:ny], in[2][:ny], out[:nw], db)
	return nil
}
