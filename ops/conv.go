package ops

import (
	"fmt"
	"hash"

	"github.com/chewxy/hm"
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
// TF32 precision of the tensor cores), and its two GEMMs (data and weight
// gradients) read the result where it lies.
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
	return G.ApplyOp(&convOp{convShape{p: p, bias: bias != nil, dt: dt}}, inputs...)
}

// convShape is what the three convolution ops know at graph-build time.
type convShape struct {
	p    kernels.ConvParams
	bias bool
	dt   tensor.Dtype
	// stats is set on a ConvBN layer's convolution: on the GPU, its
	// epilogue reduces the batch statistics for the layer's BatchNorm op.
	stats *bnStatsLink
	// gradReady says that the gradient reaching the backward ops comes
	// from the layer's one pass over it (convGradOp, or bnGradApplyOp in a
	// ConvBN layer): already masked and, on a GPU in float32, rounded to
	// TF32, so that the wgrad takes no pass of its own over it.
	gradReady bool
	// gradPacked says that the gradient the backward ops take is
	// convGradOp's packed [g | dbias]: they read g, its first
	// N*Cout*OutH*OutW elements, where it lies.
	gradPacked bool
}

func (s convShape) xShape() tensor.Shape { return tensor.Shape{s.p.N, s.p.Cin, s.p.H, s.p.W} }
func (s convShape) wShape() tensor.Shape { return tensor.Shape{s.p.Cout, s.p.Cin, s.p.KH, s.p.KW} }
func (s convShape) bShape() tensor.Shape { return tensor.Shape{s.p.Cout} }
func (s convShape) yShape() tensor.Shape { return tensor.Shape{s.p.N, s.p.Cout, s.p.OutH, s.p.OutW} }

// gradShape is the shape of the gradient the backward GEMM ops take: dy,
// or convGradOp's packed [g | dbias] (gradPacked).
func (s convShape) gradShape() tensor.Shape {
	if s.gradPacked {
		return tensor.Shape{s.yShape().TotalSize() + s.p.Cout}
	}
	return s.yShape()
}

func (s convShape) String() string {
	p := s.p
	act := ActNone
	if p.ReLU {
		act = ActReLU
	}
	return fmt.Sprintf("x=%v,w=%v,%v,stride=%dx%d,pad=%dx%d,dilation=%dx%d,bias=%t,act=%v,gradReady=%t,gradPacked=%t",
		s.xShape(), s.wShape(), s.dt, p.StrideH, p.StrideW, p.PadH, p.PadW, p.DilationH, p.DilationW, s.bias, act,
		s.gradReady, s.gradPacked)
}

// convOp is the forward op: (x, w[, bias]) -> y.
type convOp struct{ convShape }

func (op *convOp) Arity() int {
	if op.bias {
		return 3
	}
	return 2
}

func (op *convOp) Type() hm.Type {
	if op.bias {
		return fnType(4, 4, 1, 4)
	}
	return fnType(4, 4, 4)
}

func (op *convOp) ReturnsPtr() bool      { return false }
func (op *convOp) CallsExtern() bool     { return false }
func (op *convOp) OverwritesInput() int  { return -1 }
func (op *convOp) String() string        { return "Conv(" + op.convShape.String() + ")" }
func (op *convOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *convOp) Hashcode() uint32      { return hashOf(op) }

func (op *convOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.yShape(), nil }

func (op *convOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

func (op *convOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	if len(in) != op.Arity() {
		return nil, fmt.Errorf("ops: %v: want %d inputs, got %d", op, op.Arity(), len(in))
	}
	dev, err := inputsDevice("Conv", []string{"x", "w", "bias"}[:len(in)], in)
	if err != nil {
		return nil, err
	}
	if dev != nil {
		return op.doDevice(dev, prealloc, in)
	}
	x, err := dense("Conv", "x", in[0], op.dt, op.xShape())
	if err != nil {
		return nil, err
	}
	w, err := dense("Conv", "w", in[1], op.dt, op.wShape())
	if err != nil {
		return nil, err
	}
	var b *tensor.Dense
	if op.bias {
		if b, err = dense("Conv", "bias", in[2], op.dt, op.bShape()); err != nil {
			return nil, err
		}
	}
	y := output(prealloc, op.dt, op.yShape())
	switch op.dt {
	case tensor.Float32:
		kernels.ConvForward(op.p, x.Float32s(), w.Float32s(), f32sOrNil(b), y.Float32s())
	default:
		kernels.ConvForward(op.p, x.Float64s(), w.Float64s(), f64sOrNil(b), y.Float64s())
	}
	return y, nil
}

func (op *convOp) DiffWRT(inputs int) []bool {
	d := make([]bool, inputs)
	for i := range d {
		d[i] = true
	}
	return d
}

func (op *convOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if len(inputs) != op.Arity() {
		return nil, fmt.Errorf("ops: %v: want %d inputs, got %d", op, op.Arity(), len(inputs))
	}
	// With a ReLU, one pass over dy (convGradOp) masks it for both GEMMs,
	// rounds it to TF32 on a GPU (the precision they read it in) and sums
	// the bias gradient; the GEMMs then read it as it is. The fast GPU
	// kernels copy their operands with cp.async or read them from shared
	// memory with wgmma, and cannot mask or round as they do.
	back := op.convShape
	var db *G.Node
	if back.p.ReLU {
		prep := &convGradOp{op.convShape}
		g, err := G.ApplyOp(prep, output, grad)
		if err != nil {
			return nil, fmt.Errorf("ops: Conv backward: %w", err)
		}
		grad = g
		if op.bias {
			// The GEMMs read g inside the packed vector; only the bias
			// gradient is carved out.
			parts, err := autograd.UnpackAt(g, op.yShape().TotalSize(), op.bShape())
			if err != nil {
				return nil, fmt.Errorf("ops: Conv backward: %w", err)
			}
			db = parts[0]
		}
		back.p.ReLU, back.bias, back.gradReady, back.gradPacked = false, false, true, op.bias
	}
	dx, err := G.ApplyOp(&convDgradOp{back}, inputs[1], output, grad)
	if err != nil {
		return nil, fmt.Errorf("ops: Conv backward: %w", err)
	}
	dw, err := G.ApplyOp(&convWgradOp{back}, inputs[0], output, grad)
	if err != nil {
		return nil, fmt.Errorf("ops: Conv backward: %w", err)
	}
	switch {
	case !op.bias:
		return G.Nodes{dx, dw}, nil
	case db != nil:
		return G.Nodes{dx, dw, db}, nil
	}
	parts, err := autograd.Unpack(dw, op.wShape(), op.bShape())
	if err != nil {
		return nil, fmt.Errorf("ops: Conv backward: %w", err)
	}
	return G.Nodes{dx, parts[0], parts[1]}, nil
}

// convDgradOp is the data-gradient op: (w, y, dy) -> dx, with dy masked by
// y > 0 as it is read when the layer ends in a ReLU (y is not read
// otherwise). It is what a fused dgrad kernel with a ReLU prologue computes.
type convDgradOp struct{ convShape }

func (op *convDgradOp) Arity() int            { return 3 }
func (op *convDgradOp) Type() hm.Type         { return fnType(4, 4, op.gradShape().Dims(), 4) }
func (op *convDgradOp) ReturnsPtr() bool      { return false }
func (op *convDgradOp) CallsExtern() bool     { return false }
func (op *convDgradOp) OverwritesInput() int  { return -1 }
func (op *convDgradOp) String() string        { return "ConvDgrad(" + op.convShape.String() + ")" }
func (op *convDgradOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *convDgradOp) Hashcode() uint32      { return hashOf(op) }

func (op *convDgradOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.xShape(), nil }

func (op *convDgradOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

func (op *convDgradOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	if len(in) != 3 {
		return nil, fmt.Errorf("ops: %v: want 3 inputs, got %d", op, len(in))
	}
	dev, err := inputsDevice("Conv backward", []string{"w", "y", "grad"}, in)
	if err != nil {
		return nil, err
	}
	if dev != nil {
		return op.doDevice(dev, prealloc, in)
	}
	w, err := dense("Conv backward", "w", in[0], op.dt, op.wShape())
	if err != nil {
		return nil, err
	}
	y, err := dense("Conv backward", "y", in[1], op.dt, op.yShape())
	if err != nil {
		return nil, err
	}
	dy, err := dense("Conv backward", "grad", in[2], op.dt, op.gradShape())
	if err != nil {
		return nil, err
	}
	dx := output(prealloc, op.dt, op.xShape())
	ny := op.yShape().TotalSize()
	switch op.dt {
	case tensor.Float32:
		kernels.ConvBackwardData(op.p, w.Float32s(), y.Float32s(), dy.Float32s()[:ny], dx.Float32s())
	default:
		kernels.ConvBackwardData(op.p, w.Float64s(), y.Float64s(), dy.Float64s()[:ny], dx.Float64s())
	}
	return dx, nil
}

// DiffWRT claims every input so that a second derivative reaches SymDiff and
// its error, rather than gorgonia's report of a non-differentiable path.
func (op *convDgradOp) DiffWRT(inputs int) []bool { return []bool{true, false, true} }

func (op *convDgradOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, errNoSecondDerivative("Conv")
}

// convWgradOp is the weight-gradient op: (x, y, dy) -> dw, or the packed
// vector [dw | dbias] when the layer has a bias (carved out by
// autograd.Unpack), with dy masked by y > 0 as it is read when the layer
// ends in a ReLU. It is what a fused wgrad kernel computes: the bias gradient
// comes from the same reads of dy.
type convWgradOp struct{ convShape }

func (op *convWgradOp) Arity() int { return 3 }

func (op *convWgradOp) Type() hm.Type {
	if op.bias {
		return fnType(4, 4, op.gradShape().Dims(), 1)
	}
	return fnType(4, 4, op.gradShape().Dims(), 4)
}

func (op *convWgradOp) ReturnsPtr() bool      { return false }
func (op *convWgradOp) CallsExtern() bool     { return false }
func (op *convWgradOp) OverwritesInput() int  { return -1 }
func (op *convWgradOp) String() string        { return "ConvWgrad(" + op.convShape.String() + ")" }
func (op *convWgradOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *convWgradOp) Hashcode() uint32      { return hashOf(op) }

func (op *convWgradOp) outShape() tensor.Shape {
	if op.bias {
		return tensor.Shape{autograd.PackedSize(op.wShape(), op.bShape())}
	}
	return op.wShape()
}

func (op *convWgradOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.outShape(), nil }

func (op *convWgradOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

func (op *convWgradOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	if len(in) != 3 {
		return nil, fmt.Errorf("ops: %v: want 3 inputs, got %d", op, len(in))
	}
	dev, err := inputsDevice("Conv backward", []string{"x", "y", "grad"}, in)
	if err != nil {
		return nil, err
	}
	if dev != nil {
		return op.doDevice(dev, prealloc, in)
	}
	x, err := dense("Conv backward", "x", in[0], op.dt, op.xShape())
	if err != nil {
		return nil, err
	}
	y, err := dense("Conv backward", "y", in[1], op.dt, op.yShape())
	if err != nil {
		return nil, err
	}
	dy, err := dense("Conv backward", "grad", in[2], op.dt, op.gradShape())
	if err != nil {
		return nil, err
	}
	out := output(prealloc, op.dt, op.outShape())
	nw, ny := op.wShape().TotalSize(), op.yShape().TotalSize()
	switch op.dt {
	case tensor.Float32:
		o := out.Float32s()
		var db []float32
		if op.bias {
			db = o[nw:]
		}
		kernels.ConvBackwardFilter(op.p, x.Float32s(), y.Float32s(), dy.Float32s()[:ny], o[:nw], db)
	default:
		o := out.Float64s()
		var db []float64
		if op.bias {
			db = o[nw:]
		}
		kernels.ConvBackwardFilter(op.p, x.Float64s(), y.Float64s(), dy.Float64s()[:ny], o[:nw], db)
	}
	return out, nil
}

func (op *convWgradOp) DiffWRT(inputs int) []bool { return []bool{true, false, true} }

func (op *convWgradOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, errNoSecondDerivative("Conv")
}

// f32sOrNil and f64sOrNil return the data of an optional tensor, nil for nil.
func f32sOrNil(d *tensor.Dense) []float32 {
	if d == nil {
		return nil
	}
	return d.Float32s()
}

func f64sOrNil(d *tensor.Dense) []float64 {
	if d == nil {
		return nil
	}
	return d.Float64s()
}
