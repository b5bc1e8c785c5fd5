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

// ConvTransposeConfig configures ConvTranspose. Each pair is [H, W], and the
// fields mean what PyTorch's conv_transpose2d arguments of the same names
// mean.
type ConvTransposeConfig struct {
	Stride, Pad, Dilation [2]int // zero Stride or Dilation means 1
	// OutputPad adds rows and columns at the bottom and right of the
	// output; it must be smaller than the stride.
	OutputPad [2]int
	Act       Activation
}

// ConvTranspose computes y = act(conv_transpose2d(x, w) + bias), the
// transposed ("fractionally strided") convolution that Mask R-CNN's mask
// head upsamples with.
//
// x: [N,Cin,H,W]; w: [Cin,Cout,KH,KW] (PyTorch's layout for
// ConvTranspose2d); bias: [Cout] or nil. Returns [N,Cout,OutH,OutW] with
// OutH = (H-1)*Stride[0] - 2*Pad[0] + Dilation[0]*(KH-1) + OutputPad[0] + 1
// (likewise OutW). Differentiable with respect to x, w and bias.
//
// A transposed convolution is the data gradient of the convolution it
// transposes, so it runs on the convolution kernels: the forward pass is
// kernels.ConvBackwardData, the input gradient kernels.ConvForward and the
// weight gradient kernels.ConvBackwardFilter, with the roles of input and
// output swapped. Only the bias and the activation take a pass of their own.
func ConvTranspose(x, w, bias *G.Node, cfg ConvTransposeConfig) (*G.Node, error) {
	const op = "ConvTranspose"
	s, err := convTransposeParams(x, w, cfg)
	if err != nil {
		return nil, err
	}
	inputs := G.Nodes{x, w}
	if bias != nil {
		want := fmt.Sprintf("[%d]", s.p.Cin)
		if err := checkRank(op, "bias", bias, 1, want); err != nil {
			return nil, err
		}
		if bias.Shape()[0] != s.p.Cin {
			return nil, fmt.Errorf("ops: %s: bias must have shape %s, got %v", op, want, bias.Shape())
		}
		if err := sameDtype(op, s.dt, map[string]*G.Node{"bias": bias}); err != nil {
			return nil, err
		}
		s.bias = true
		inputs = append(inputs, bias)
	}
	return G.ApplyOp(&convTOp{s}, inputs...)
}

// convTransposeParams checks x, w and cfg and describes the convolution
// that ConvTranspose transposes: its input is ConvTranspose's output and
// its output ConvTranspose's input.
func convTransposeParams(x, w *G.Node, cfg ConvTransposeConfig) (s convTShape, err error) {
	const op = "ConvTranspose"
	for i := range 2 {
		if cfg.Stride[i] == 0 {
			cfg.Stride[i] = 1
		}
		if cfg.Dilation[i] == 0 {
			cfg.Dilation[i] = 1
		}
	}
	switch {
	case cfg.Stride[0] < 0 || cfg.Stride[1] < 0:
		return s, fmt.Errorf("ops: %s: Stride must be positive (or 0 for 1), got %v", op, cfg.Stride)
	case cfg.Dilation[0] < 0 || cfg.Dilation[1] < 0:
		return s, fmt.Errorf("ops: %s: Dilation must be positive (or 0 for 1), got %v", op, cfg.Dilation)
	case cfg.Pad[0] < 0 || cfg.Pad[1] < 0:
		return s, fmt.Errorf("ops: %s: Pad must be non-negative, got %v", op, cfg.Pad)
	case cfg.OutputPad[0] < 0 || cfg.OutputPad[1] < 0 ||
		cfg.OutputPad[0] >= cfg.Stride[0] || cfg.OutputPad[1] >= cfg.Stride[1]:
		// Beyond the stride the convolution being transposed would have a
		// larger output than x: there is no such transpose.
		return s, fmt.Errorf("ops: %s: OutputPad must be in [0, Stride), got %v with Stride %v", op, cfg.OutputPad, cfg.Stride)
	case cfg.Act != ActNone && cfg.Act != ActReLU:
		return s, fmt.Errorf("ops: %s: unknown Activation %d", op, int(cfg.Act))
	}
	if err := checkRank(op, "x", x, 4, "[N Cin H W]"); err != nil {
		return s, err
	}
	if err := checkRank(op, "w", w, 4, "[Cin Cout KH KW]"); err != nil {
		return s, err
	}
	if s.dt, err = floatDtype(op, "x", x); err != nil {
		return s, err
	}
	if err := sameDtype(op, s.dt, map[string]*G.Node{"w": w}); err != nil {
		return s, err
	}
	xs, ws := x.Shape(), w.Shape()
	for i := range 4 {
		if xs[i] <= 0 {
			return s, fmt.Errorf("ops: %s: x must have positive sizes, got %v", op, xs)
		}
		if ws[i] <= 0 {
			return s, fmt.Errorf("ops: %s: w must have positive sizes, got %v", op, ws)
		}
	}
	if ws[0] != xs[1] {
		return s, fmt.Errorf("ops: %s: w must have shape [%d Cout KH KW] to match the %d channels of x, got %v", op, xs[1], xs[1], ws)
	}
	outH := (xs[2]-1)*cfg.Stride[0] - 2*cfg.Pad[0] + cfg.Dilation[0]*(ws[2]-1) + cfg.OutputPad[0] + 1
	outW := (xs[3]-1)*cfg.Stride[1] - 2*cfg.Pad[1] + cfg.Dilation[1]*(ws[3]-1) + cfg.OutputPad[1] + 1
	if outH <= 0 || outW <= 0 {
		return s, fmt.Errorf("ops: %s: the padding leaves an empty output (%dx%d)", op, outH, outW)
	}
	s.p = kernels.ConvParams{
		N: xs[0], Cin: ws[1], H: outH, W: outW,
		Cout: ws[0], KH: ws[2], KW: ws[3],
		StrideH: cfg.Stride[0], StrideW: cfg.Stride[1],
		PadH: cfg.Pad[0], PadW: cfg.Pad[1],
		DilationH: cfg.Dilation[0], DilationW: cfg.Dilation[1],
		OutH: xs[2], OutW: xs[3],
	}
	s.outPad, s.act = cfg.OutputPad, cfg.Act
	return s, nil
}

// convTShape is what the transposed-convolution ops know at graph-build
// time. p describes the convolution being transposed (p.ReLU stays false:
// the activation is applied, and undone, outside the kernels).
type convTShape struct {
	p      kernels.ConvParams
	outPad [2]int
	act    Activation
	bias   bool
	dt     tensor.Dtype
}

func (s convTShape) xShape() tensor.Shape { return tensor.Shape{s.p.N, s.p.Cout, s.p.OutH, s.p.OutW} }
func (s convTShape) wShape() tensor.Shape { return tensor.Shape{s.p.Cout, s.p.Cin, s.p.KH, s.p.KW} }
func (s convTShape) bShape() tensor.Shape { return tensor.Shape{s.p.Cin} }
func (s convTShape) yShape() tensor.Shape { return tensor.Shape{s.p.N, s.p.Cin, s.p.H, s.p.W} }

func (s convTShape) String() string {
	p := s.p
	return fmt.Sprintf("x=%v,w=%v,%v,stride=%dx%d,pad=%dx%d,outpad=%dx%d,dilation=%dx%d,bias=%t,act=%v",
		s.xShape(), s.wShape(), s.dt, p.StrideH, p.StrideW, p.PadH, p.PadW, s.outPad[0], s.outPad[1],
		p.DilationH, p.DilationW, s.bias, s.act)
}

// convTOp is the forward op: (x, w[, bias]) -> y.
type convTOp struct{ convTShape }

func (op *convTOp) Arity() int {
	if op.bias {
		return 3
	}
	return 2
}

func (op *convTOp) Type() hm.Type {
	if op.bias {
		return fnType(4, 4, 1, 4)
	}
	return fnType(4, 4, 4)
}

func (op *convTOp) ReturnsPtr() bool      { return false }
func (op *convTOp) CallsExtern() bool     { return false }
func (op *convTOp) OverwritesInput() int  { return -1 }
func (op *convTOp) String() string        { return "ConvTranspose(" + op.convTShape.String() + ")" }
func (op *convTOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *convTOp) Hashcode() uint32      { return hashOf(op) }

func (op *convTOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.yShape(), nil }

func (op *convTOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

func (op *convTOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	const name = "ConvTranspose"
	if len(in) != op.Arity() {
		return nil, fmt.Errorf("ops: %v: want %d inputs, got %d", op, op.Arity(), len(in))
	}
	if err := hostOnly(name, []string{"x", "w", "bias"}[:len(in)], in); err != nil {
		return nil, err
	}
	x, err := dense(name, "x", in[0], op.dt, op.xShape())
	if err != nil {
		return nil, err
	}
	w, err := dense(name, "w", in[1], op.dt, op.wShape())
	if err != nil {
		return nil, err
	}
	var b *tensor.Dense
	if op.bias {
		if b, err = dense(name, "bias", in[2], op.dt, op.bShape()); err != nil {
			return nil, err
		}
	}
	y := output(prealloc, op.dt, op.yShape())
	switch op.dt {
	case tensor.Float32:
		kernels.ConvBackwardData(op.p, w.Float32s(), nil, x.Float32s(), y.Float32s())
		convTBiasAct(y.Float32s(), f32sOrNil(b), op.p.N, op.p.Cin, op.p.H*op.p.W, op.act == ActReLU)
	default:
		kernels.ConvBackwardData(op.p, w.Float64s(), nil, x.Float64s(), y.Float64s())
		convTBiasAct(y.Float64s(), f64sOrNil(b), op.p.N, op.p.Cin, op.p.H*op.p.W, op.act == ActReLU)
	}
	return y, nil
}

// convTBiasAct adds bias[c] (when there is one) to every pixel of channel c of
// y [N,C,HW] and applies the ReLU, in place.
func convTBiasAct[T kernels.Float](y, bias []T, n, c, hw int, relu bool) {
	if bias == nil && !relu {
		return
	}
	for i := range n * c {
		plane := y[i*hw : (i+1)*hw]
		var b T
		if bias != nil {
			b = bias[i%c]
		}
		for j, v := range plane {
			v += b
			if relu && !(v > 0) {
				v = 0 // NaN too, as the fused convolutions do
			}
			plane[j] = v
		}
	}
}

func (op *convTOp) DiffWRT(inputs int) []bool {
	d := make([]bool, inputs)
	for i := range d {
		d[i] = true
	}
	return d
}

func (op *convTOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if len(inputs) != op.Arity() {
		return nil, fmt.Errorf("ops: %v: want %d inputs, got %d", op, op.Arity(), len(inputs))
	}
	// The ReLU's mask is applied once, and both gradients read the masked
	// gradient.
	dy := grad
	if op.act == ActReLU {
		var err error
		if dy, err = G.ApplyOp(&reluMaskOp{shape: op.yShape(), dt: op.dt}, output, grad); err != nil {
			return nil, fmt.Errorf("ops: ConvTranspose backward: %w", err)
		}
	}
	dx, err := G.ApplyOp(&convTDgradOp{op.convTShape}, inputs[1], dy)
	if err != nil {
		return nil, fmt.Errorf("ops: ConvTranspose backward: %w", err)
	}
	dw, err := G.ApplyOp(&convTWgradOp{op.convTShape}, inputs[0], dy)
	if err != nil {
		return nil, fmt.Errorf("ops: ConvTranspose backward: %w", err)
	}
	if !op.bias {
		return G.Nodes{dx, dw}, nil
	}
	parts, err := autograd.Unpack(dw, op.wShape(), op.bShape())
	if err != nil {
		return nil, fmt.Errorf("ops: ConvTranspose backward: %w", err)
	}
	return G.Nodes{dx, parts[0], parts[1]}, nil
}

// convTDgradOp is the input-gradient op: (w, dy) -> dx, the convolution
// that ConvTranspose transposes, applied to dy (already masked by the
// activation).
type convTDgradOp struct{ convTShape }

func (op *convTDgradOp) Arity() int            { return 2 }
func (op *convTDgradOp) Type() hm.Type         { return fnType(4, 4, 4) }
func (op *convTDgradOp) ReturnsPtr() bool      { return false }
func (op *convTDgradOp) CallsExtern() bool     { return false }
func (op *convTDgradOp) OverwritesInput() int  { return -1 }
func (op *convTDgradOp) String() string        { return "ConvTransposeDgrad(" + op.convTShape.String() + ")" }
func (op *convTDgradOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *convTDgradOp) Hashcode() uint32      { return hashOf(op) }

func (op *convTDgradOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.xShape(), nil }

func (op *convTDgradOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

func (op *convTDgradOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	const name = "ConvTranspose backward"
	if len(in) != 2 {
		return nil, fmt.Errorf("ops: %v: want 2 inputs, got %d", op, len(in))
	}
	if err := hostOnly(name, []string{"w", "grad"}, in); err != nil {
		return nil, err
	}
	w, err := dense(name, "w", in[0], op.dt, op.wShape())
	if err != nil {
		return nil, err
	}
	dy, err := dense(name, "grad", in[1], op.dt, op.yShape())
	if err != nil {
		return nil, err
	}
	dx := output(prealloc, op.dt, op.xShape())
	switch op.dt {
	case tensor.Float32:
		kernels.ConvForward(op.p, dy.Float32s(), w.Float32s(), nil, dx.Float32s())
	default:
		kernels.ConvForward(op.p, dy.Float64s(), w.Float64s(), nil, dx.Float64s())
	}
	return dx, nil
}

func (op *convTDgradOp) DiffWRT(inputs int) []bool { return []bool{true, true} }

func (op *convTDgradOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, errNoSecondDerivative("ConvTranspose")
}

// convTWgradOp is the weight-gradient op: (x, dy) -> dw, or the packed
// vector [dw | dbias] when the layer has a bias, with dy already masked by
// the activation.
type convTWgradOp struct{ convTShape }

func (op *convTWgradOp) Arity() int { return 2 }

func (op *convTWgradOp) Type() hm.Type {
	if op.bias {
		return fnType(4, 4, 1)
	}
	return fnType(4, 4, 4)
}

func (op *convTWgradOp) ReturnsPtr() bool      { return false }
func (op *convTWgradOp) CallsExtern() bool     { return false }
func (op *convTWgradOp) OverwritesInput() int  { return -1 }
func (op *convTWgradOp) String() string        { return "ConvTransposeWgrad(" + op.convTShape.String() + ")" }
func (op *convTWgradOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *convTWgradOp) Hashcode() uint32      { return hashOf(op) }

func (op *convTWgradOp) outShape() tensor.Shape {
	if op.bias {
		return tensor.Shape{autograd.PackedSize(op.wShape(), op.bShape())}
	}
	return op.wShape()
}

func (op *convTWgradOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.outShape(), nil }

func (op *convTWgradOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

func (op *convTWgradOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	const name = "ConvTranspose backward"
	if len(in) != 2 {
		return nil, fmt.Errorf("ops: %v: want 2 inputs, got %d", op, len(in))
	}
	if err := hostOnly(name, []string{"x", "grad"}, in); err != nil {
		return nil, err
	}
	x, err := dense(name, "x", in[0], op.dt, op.xShape())
	if err != nil {
		return nil, err
	}
	dy, err := dense(name, "grad", in[1], op.dt, op.yShape())
	if err != nil {
		return nil, err
	}
	out := output(prealloc, op.dt, op.outShape())
	nw := op.wShape().TotalSize()
	hw := op.p.H * op.p.W
	switch op.dt {
	case tensor.Float32:
		o := out.Float32s()
		// The transposed convolution's input is the data of the
		// convolution's output gradient, and its output gradient that of
		// the convolution's input.
		kernels.ConvBackwardFilter(op.p, dy.Float32s(), nil, x.Float32s(), o[:nw], nil)
		if op.bias {
			convTChannelSums(o[nw:], dy.Float32s(), op.p.N, op.p.Cin, hw)
		}
	default:
		o := out.Float64s()
		kernels.ConvBackwardFilter(op.p, dy.Float64s(), nil, x.Float64s(), o[:nw], nil)
		if op.bias {
			convTChannelSums(o[nw:], dy.Float64s(), op.p.N, op.p.Cin, hw)
		}
	}
	return out, nil
}

// convTChannelSums writes sums[c] = the sum of channel c of v [N,C,HW], images in
// order, so that the result does not depend on any blocking.
func convTChannelSums[T kernels.Float](sums, v []T, n, c, hw int) {
	clear(sums)
	for i := range n * c {
		var s T
		for _, x := range v[i*hw : (i+1)*hw] {
			s += x
		}
		sums[i%c] += s
	}
}

func (op *convTWgradOp) DiffWRT(inputs int) []bool { return []bool{true, true} }

func (op *convTWgradOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, errNoSecondDerivative("ConvTranspose")
}
