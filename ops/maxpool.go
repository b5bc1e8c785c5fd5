package ops

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/kernels"
)

// MaxPool2dConfig configures MaxPool2d. Each pair is [H, W], and the fields
// mean what torch.nn.functional.max_pool2d's arguments of the same names
// mean.
type MaxPool2dConfig struct {
	Kernel [2]int
	// Stride zero is Kernel, as PyTorch's stride=None.
	Stride [2]int
	// Pad pads with -inf (padding never wins), at most half the kernel,
	// as PyTorch requires.
	Pad [2]int
	// Dilation zero or 1: the only one implemented.
	Dilation [2]int
	// CeilMode false (floor the output size): the only one implemented.
	CeilMode bool
}

// MaxPool2d is torch.nn.functional.max_pool2d over x [N C H W]: each output
// pixel the max of its Kernel window, windows Stride apart on x padded by
// Pad, y [N C OutH OutW] with OutH = (H + 2*Pad[0] - Kernel[0])/Stride[0] +
// 1 (likewise OutW). The ResNet stem's is Kernel 3, Stride 2, Pad 1; FPN's
// P6 (Mask R-CNN) is Kernel 1, Stride 2.
//
// Which element wins is PyTorch's rule: the window is scanned row by row
// and an element wins when it is greater than the best so far or NaN. The
// first maximum wins a tie, a NaN makes the output NaN (the last NaN
// wins), and a window of -inf only gives -inf from its first element
// inside x.
//
// Differentiable with respect to x: the gradient of each output goes to
// the element that won its window. The backward op takes x and dy and
// finds the winners again (see kernels/maxpool.cu for why no indices are
// saved); each element of dx adds the gradients of the windows it won in
// a fixed order, with no atomics: the same bits on every run, on the GPU
// as on the CPU. Second derivatives are not implemented.
func MaxPool2d(x *G.Node, cfg MaxPool2dConfig) (*G.Node, error) {
	s, err := maxPoolShapeOf(x, cfg)
	if err != nil {
		return nil, err
	}
	return G.ApplyOp(maxPoolOp(s), x)
}

// maxPoolShape is a checked MaxPool2d: x's shape, the kernels' view of it
// and the dtype.
type maxPoolShape struct {
	x, y tensor.Shape
	p    kernels.MaxPool2dParams
	dt   tensor.Dtype
}

func (s maxPoolShape) String() string {
	return fmt.Sprintf("x=%v,kernel=%dx%d,stride=%dx%d,pad=%dx%d,%v", s.x,
		s.p.KH, s.p.KW, s.p.StrideH, s.p.StrideW, s.p.PadH, s.p.PadW, s.dt)
}

// maxPoolShapeOf checks MaxPool2d's operand and config.
func maxPoolShapeOf(x *G.Node, cfg MaxPool2dConfig) (maxPoolShape, error) {
	const op = "MaxPool2d"
	var none maxPoolShape
	for i := range 2 {
		if cfg.Stride[i] == 0 {
			cfg.Stride[i] = cfg.Kernel[i]
		}
	}
	if cfg.Kernel[0] < 1 || cfg.Kernel[1] < 1 {
		return none, fmt.Errorf("ops: %s: Kernel must be positive, got %v", op, cfg.Kernel)
	}
	if cfg.Stride[0] < 1 || cfg.Stride[1] < 1 {
		return none, fmt.Errorf("ops: %s: Stride must be positive (or 0 for Kernel), got %v", op, cfg.Stride)
	}
	if cfg.Pad[0] < 0 || cfg.Pad[1] < 0 || 2*cfg.Pad[0] > cfg.Kernel[0] || 2*cfg.Pad[1] > cfg.Kernel[1] {
		return none, fmt.Errorf("ops: %s: Pad must be between 0 and half of Kernel %v, got %v", op, cfg.Kernel, cfg.Pad)
	}
	if cfg.Dilation != [2]int{} && cfg.Dilation != [2]int{1, 1} {
		return none, fmt.Errorf("ops: %s: Dilation %v is not implemented: want [1 1] (or zero)", op, cfg.Dilation)
	}
	if cfg.CeilMode {
		return none, fmt.Errorf("ops: %s: CeilMode is not implemented: want false (the output size rounded down)", op)
	}
	if err := checkRank(op, "x", x, 4, "[N C H W]"); err != nil {
		return none, err
	}
	dt, err := floatDtype(op, "x", x)
	if err != nil {
		return none, err
	}
	xs := x.Shape()
	if err := positiveSizes(op, "x", xs); err != nil {
		return none, err
	}
	p := kernels.MaxPool2dParams{
		Planes: xs[0] * xs[1], H: xs[2], W: xs[3],
		KH: cfg.Kernel[0], KW: cfg.Kernel[1], StrideH: cfg.Stride[0], StrideW: cfg.Stride[1],
		PadH: cfg.Pad[0], PadW: cfg.Pad[1],
	}
	inH, inW := p.H+2*p.PadH, p.W+2*p.PadW
	if p.KH > inH || p.KW > inW {
		return none, fmt.Errorf("ops: %s: Kernel %v is larger than x %v padded by %v (%dx%d)", op, cfg.Kernel, xs, cfg.Pad, inH, inW)
	}
	p.OutH, p.OutW = (inH-p.KH)/p.StrideH+1, (inW-p.KW)/p.StrideW+1
	return maxPoolShape{x: xs.Clone(), y: tensor.Shape{xs[0], xs[1], p.OutH, p.OutW}, p: p, dt: dt}, nil
}

// maxPoolOp is the forward op: x -> y.
func maxPoolOp(s maxPoolShape) *specOp {
	return newOp(&opSpec{
		name: "MaxPool2d", config: s.String(),
		inputs: []argSpec{{name: "x", shape: s.x}}, out: s.y, dtype: s.dt,
		cpu:     floatTwin(s.p, maxPoolForward[float32], maxPoolForward[float64]),
		device:  s.forwardDevice,
		diffWRT: []bool{true},
		grad: func(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			dx, err := G.ApplyOp(maxPoolGradOp(s), in[0], grad)
			if err != nil {
				return nil, fmt.Errorf("ops: MaxPool2d backward: %w", err)
			}
			return G.Nodes{dx}, nil
		},
	})
}

// maxPoolGradOp is the backward op: (x, dy) -> dx. It is not
// differentiable again.
func maxPoolGradOp(s maxPoolShape) *specOp {
	return newOp(&opSpec{
		name: "MaxPool2d backward", config: s.String(),
		inputs: []argSpec{{name: "x", shape: s.x}, {name: "grad", shape: s.y}}, out: s.x, dtype: s.dt,
		cpu:     floatTwin(s.p, maxPoolBackward[float32], maxPoolBackward[float64]),
		device:  s.backwardDevice,
		diffWRT: []bool{true, true},
		grad:    noSecondDerivative("MaxPool2d"),
	})
}

func maxPoolForward[T kernels.Float](p kernels.MaxPool2dParams, in [][]T, y []T) error {
	kernels.MaxPool2dForward(p, in[0], y)
	return nil
}

func maxPoolBackward[T kernels.Float](p kernels.MaxPool2dParams, in [][]T, dx []T) error {
	kernels.MaxPool2dBackward(p, in[0], in[1], dx)
	return nil
}
