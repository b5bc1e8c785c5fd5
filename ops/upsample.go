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
// pyramid network. Differentiable with respect to x (the gradient sums each
// block).
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

func (s upsampleShape) String() string {
	return fmt.Sprintf("x=%v,factor=%d,%v", s.x, s.factor, s.dt)
}

// upsampleOp is the forward op: x -> y.
func upsampleOp(s upsampleShape) *specOp {
	return newOp(&opSpec{
		name: "UpsampleNearest", config: s.String(),
		inputs: []argSpec{{name: "x", shape: s.x}}, out: s.yShape(), dtype: s.dt,
		cpu:     floatTwin(s, upsampleNearest[float32], upsampleNearest[float64]),
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
		cpu:     floatTwin(s, upsampleBlockSums[float32], upsampleBlockSums[float64]),
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

// upsampleNearest writes y, each pixel of x = in[0] copied to its f x f
// block.
func upsampleNearest[T kernels.Float](s upsampleShape, in [][]T, y []T) error {
	x, xs, f := in[0], s.x, s.factor
	h, w := xs[2], xs[3]
	ow := w * f
	for p := range xs[0] * xs[1] {
		src, dst := x[p*h*w:(p+1)*h*w], y[p*h*w*f*f:(p+1)*h*w*f*f]
		for i := range h {
			row := dst[i*f*ow : i*f*ow+ow]
			for j, v := range src[i*w : (i+1)*w] {
				for k := range f {
					row[j*f+k] = v
				}
			}
			// The other f-1 output rows of this input row are copies.
			for k := 1; k < f; k++ {
				copy(dst[(i*f+k)*ow:(i*f+k+1)*ow], row)
			}
		}
	}
	return nil
}

// upsampleBlockSums writes dx[p,i,j] = the sum of the f x f block of dy =
// in[0] that pixel (i, j) was copied to, in row order.
func upsampleBlockSums[T kernels.Float](s upsampleShape, in [][]T, dx []T) error {
	dy, xs, f := in[0], s.x, s.factor
	h, w := xs[2], xs[3]
	ow := w * f
	clear(dx)
	for p := range xs[0] * xs[1] {
		src, dst := dy[p*h*w*f*f:(p+1)*h*w*f*f], dx[p*h*w:(p+1)*h*w]
		for oi := range h * f {
			row, out := src[oi*ow:(oi+1)*ow], dst[oi/f*w:(oi/f+1)*w]
			for j := range out {
				var sum T
				for _, v := range row[j*f : (j+1)*f] {
					sum += v
				}
				out[j] += sum
			}
		}
	}
	return nil
}
