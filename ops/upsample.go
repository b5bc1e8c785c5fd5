package ops

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/kernels"
)

// UpsampleNearest enlarges the spatial dimensions of x [N,C,H,W] by an
// integer factor, each pixel becoming a factor x factor block of copies:
// y[n,c,i,j] = x[n,c,i/factor,j/factor], as PyTorch's interpolate with
// mode="nearest" and an integer scale. It is the top-down path of a feature
// pyramid network. Differentiable with respect to x: the gradient sums
// each block, row by row, in a fixed order and without atomics, so the GPU
// gives the CPU's bits (kernels/upsample.cu).
//
// gorgonia's Upsample2D computes the same thing, one boxed At and SetAt per
// element; this op runs on plain slices.
func UpsampleNearest(x *G.Node, factor int) (*G.Node, error) {
	const op = "UpsampleNearest"
	if factor < 1 {
		return nil, fmt.Errorf("ops: %s: factor must be at least 1, got %d", op, factor)
	}
	if err := checkRank(op, "x", x, 4, "[N C H W]"); err != nil {
		return nil, err
	}
	dt, err := floatDtype(op, "x", x)
	if err != nil {
		return nil, err
	}
	s := upsampleShape{x: x.Shape().Clone(), factor: factor, dt: dt}
	for i, d := range s.x {
		if d <= 0 {
			return nil, fmt.Errorf("ops: %s: x must have positive sizes, got %v (dimension %d)", op, s.x, i)
		}
	}
	return G.ApplyOp(upsampleOp(s), x)
}

type upsampleShape struct {
	x      tensor.Shape
	factor int
	dt     tensor.Dtype
}

func (s upsampleShape) yShape() tensor.Shape {
	return tensor.Shape{s.x[0], s.x[1], s.x[2] * s.factor, s.x[3] * s.factor}
}

// params is the kernels' view of x: N*C*H rows of W pixels.
func (s upsampleShape) params() kernels.UpsampleParams {
	return kernels.UpsampleParams{Rows: s.x[0] * s.x[1] * s.x[2], W: s.x[3], Factor: s.factor}
}

func (s upsampleShape) String() string {
	return fmt.Sprintf("x=%v,factor=%d,%v", s.x, s.factor, s.dt)
}

// upsampleOp is the forward op: x -> y.
func upsampleOp(s upsampleShape) *specOp {
	return newOp(&opSpec{
		name: "UpsampleNearest", config: s.String(),
		inputs: []argSpec{{name: "x", shape: s.x}}, out: s.yShape(), dtype: s.dt,
		cpu:     floatTwin(s, upsampleForward[float32], upsampleForward[float64]),
		device:  s.forwardDevice,
		diffWRT: []bool{true},
		grad: func(_ G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			dx, err := G.ApplyOp(upsampleGradOp(s), grad)
			if err != nil {
				return nil, fmt.Errorf("ops: UpsampleNearest backward: %w", err)
			}
			return G.Nodes{dx}, nil
		},
	})
}

// upsampleGradOp is the backward op: dy -> dx, the sum over each block. It
// is the adjoint of the upsampling, so its own gradient is the upsampling.
func upsampleGradOp(s upsampleShape) *specOp {
	return newOp(&opSpec{
		name: "UpsampleNearest backward", config: s.String(),
		inputs: []argSpec{{name: "grad", shape: s.yShape()}}, out: s.x, dtype: s.dt,
		cpu:     floatTwin(s, upsampleBackward[float32], upsampleBackward[float64]),
		device:  s.backwardDevice,
		diffWRT: []bool{true},
		grad: func(_ G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			d, err := G.ApplyOp(upsampleOp(s), grad)
			if err != nil {
				return nil, fmt.Errorf("ops: UpsampleNearest second derivative: %w", err)
			}
			return G.Nodes{d}, nil
		},
	})
}

func upsampleForward[T kernels.Float](s upsampleShape, in [][]T, y []T) error {
	kernels.UpsampleNearestForward(s.params(), in[0], y)
	return nil
}

func upsampleBackward[T kernels.Float](s upsampleShape, in [][]T, dx []T) error {
	kernels.UpsampleNearestBackward(s.params(), in[0], dx)
	return nil
}
