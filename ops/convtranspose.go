package ops

import (
	"fmt"

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
// On the GPU the forward of one whose stride is its kernel, with no padding,
// dilation or output padding (Mask R-CNN's 2x2 stride-2 upsampling) is a
// 1x1 convolution to Cout*KH*KW channels, on the fast convolution kernels,
// whose output the bias and activation pass rearranges depth to space;
// other ones take the strided data-gradient GEMM (convtranspose_device.go).
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
	return G.ApplyOp(convTOp(s), inputs...)
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
func convTOp(s convTShape) *specOp {
	in := []argSpec{{name: "x", shape: s.xShape()}, {name: "w", shape: s.wShape()}}
	if s.bias {
		in = append(in, argSpec{name: "bias", shape: s.bShape()})
	}
	return newOp(&opSpec{
		name: "ConvTranspose", config: s.String(),
		inputs: in, out: s.yShape(), dtype: s.dt,
		cpu:     floatTwin(s, convTForward[float32], convTForward[float64]),
		device:  s.forwardDevice,
		diffWRT: []bool{true, true, true}[:len(in)],
		grad:    s.backward,
	})
}

func convTForward[T kernels.Float](s convTShape, in [][]T, y []T) error {
	kernels.ConvBackwardData(s.p, in[1], nil, in[0], y)
	kernels.ConvTransposeEpilogue(s.epilogue(1, 1), y, optional(in, 2), y)
	return nil
}

// epilogue is the bias and activation pass over y, with a depth-to-space
// rearrangement by (fh, fw) on the way from a 1x1 convolution's output.
func (s convTShape) epilogue(fh, fw int) kernels.ConvTransposeEpilogueParams {
	return kernels.ConvTransposeEpilogueParams{N: s.p.N, C: s.p.Cin, H: s.p.H / fh, W: s.p.W / fw, FH: fh, FW: fw, ReLU: s.act == ActReLU}
}

// backward is ConvTranspose's SymDiff.
func (s convTShape) backward(in G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	// The ReLU's mask is applied once, and both gradients read the masked
	// gradient.
	dy := grad
	if s.act == ActReLU {
		var err error
		if dy, err = G.ApplyOp(reluMaskOp(s.yShape(), s.dt), output, grad); err != nil {
			return nil, fmt.Errorf("ops: ConvTranspose backward: %w", err)
		}
	}
	dx, err := G.ApplyOp(convTDgradOp(s), in[1], dy)
	if err != nil {
		return nil, fmt.Errorf("ops: ConvTranspose backward: %w", err)
	}
	dw, err := G.ApplyOp(convTWgradOp(s), in[0], dy)
	if err != nil {
		return nil, fmt.Errorf("ops: ConvTranspose backward: %w", err)
	}
	if !s.bias {
		return G.Nodes{dx, dw}, nil
	}
	parts, err := autograd.Unpack(dw, s.wShape(), s.bShape())
	if err != nil {
		return nil, fmt.Errorf("ops: ConvTranspose backward: %w", err)
	}
	return G.Nodes{dx, parts[0], parts[1]}, nil
}

// convTDgradOp is the input-gradient op: (w, dy) -> dx, the convolution
// that ConvTranspose transposes, applied to dy (already masked by the
// activation).
func convTDgradOp(s convTShape) *specOp {
	return newOp(&opSpec{
		name: "ConvTranspose backward", kind: "ConvTransposeDgrad", config: s.String(),
		inputs: []argSpec{{name: "w", shape: s.wShape()}, {name: "grad", shape: s.yShape()}},
		out:    s.xShape(), dtype: s.dt,
		cpu:     floatTwin(s, convTDgrad[float32], convTDgrad[float64]),
		device:  s.dgradDevice,
		diffWRT: []bool{true, true},
		grad:    noSecondDerivative("ConvTranspose"),
	})
}

func convTDgrad[T kernels.Float](s convTShape, in [][]T, dx []T) error {
	kernels.ConvForward(s.p, in[1], in[0], nil, dx)
	return nil
}

// convTWgradOp is the weight-gradient op: (x, dy) -> dw, or the packed
// vector [dw | dbias] when the layer has a bias, with dy already masked by
// the activation.
func convTWgradOp(s convTShape) *specOp {
	out := s.wShape()
	if s.bias {
		out = tensor.Shape{autograd.PackedSize(s.wShape(), s.bShape())}
	}
	return newOp(&opSpec{
		name: "ConvTranspose backward", kind: "ConvTransposeWgrad", config: s.String(),
		inputs: []argSpec{{name: "x", shape: s.xShape()}, {name: "grad", shape: s.yShape()}},
		out:    out, dtype: s.dt,
		cpu:     floatTwin(s, convTWgrad[float32], convTWgrad[float64]),
		device:  s.wgradDevice,
		diffWRT: []bool{true, true},
		grad:    noSecondDerivative("ConvTranspose"),
	})
}

func convTWgrad[T kernels.Float](s convTShape, in [][]T, out []T) error {
	x, dy := in[0], in[1]
	nw := s.wShape().TotalSize()
	// The transposed convolution's input is the data of the convolution's
	// output gradient, and its output gradient that of the convolution's
	// input.
	kernels.ConvBackwardFilter(s.p, dy, nil, x, out[:nw], nil)
	if s.bias {
		kernels.ConvTransposeBiasGrad(s.p.N, s.p.Cin, s.p.H*s.p.W, dy, out[nw:])
	}
	return nil
}
