package ops

import (
	"fmt"
	"hash"

	"github.com/chewxy/hm"
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
	return G.ApplyOp(&upsampleOp{s}, x)
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
type upsampleOp struct{ upsampleShape }

func (op *upsampleOp) Arity() int            { return 1 }
func (op *upsampleOp) Type() hm.Type         { return fnType(4, 4) }
func (op *upsampleOp) ReturnsPtr() bool      { return false }
func (op *upsampleOp) CallsExtern() bool     { return false }
func (op *upsampleOp) OverwritesInput() int  { return -1 }
func (op *upsampleOp) String() string        { return "UpsampleNearest(" + op.upsampleShape.String() + ")" }
func (op *upsampleOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *upsampleOp) Hashcode() uint32      { return hashOf(op) }

func (op *upsampleOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.yShape(), nil }

func (op *upsampleOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

func (op *upsampleOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	const name = "UpsampleNearest"
	if len(in) != 1 {
		return nil, fmt.Errorf("ops: %v: want 1 input, got %d", op, len(in))
	}
	if err := hostOnly(name, []string{"x"}, in); err != nil {
		return nil, err
	}
	x, err := dense(name, "x", in[0], op.dt, op.x)
	if err != nil {
		return nil, err
	}
	y := output(prealloc, op.dt, op.yShape())
	switch op.dt {
	case tensor.Float32:
		upsampleNearest(x.Float32s(), y.Float32s(), op.x, op.factor)
	default:
		upsampleNearest(x.Float64s(), y.Float64s(), op.x, op.factor)
	}
	return y, nil
}

func upsampleNearest[T kernels.Float](x, y []T, xs tensor.Shape, f int) {
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
}

func (op *upsampleOp) DiffWRT(int) []bool { return []bool{true} }

func (op *upsampleOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if len(inputs) != 1 {
		return nil, fmt.Errorf("ops: %v: want 1 input, got %d", op, len(inputs))
	}
	dx, err := G.ApplyOp(&upsampleGradOp{op.upsampleShape}, grad)
	if err != nil {
		return nil, fmt.Errorf("ops: UpsampleNearest backward: %w", err)
	}
	return G.Nodes{dx}, nil
}

// upsampleGradOp is the backward op: dy -> dx, the sum over each block. It
// is the adjoint of the upsampling, so its own gradient is the upsampling.
type upsampleGradOp struct{ upsampleShape }

func (op *upsampleGradOp) Arity() int           { return 1 }
func (op *upsampleGradOp) Type() hm.Type        { return fnType(4, 4) }
func (op *upsampleGradOp) ReturnsPtr() bool     { return false }
func (op *upsampleGradOp) CallsExtern() bool    { return false }
func (op *upsampleGradOp) OverwritesInput() int { return -1 }
func (op *upsampleGradOp) String() string {
	return "UpsampleNearestGrad(" + op.upsampleShape.String() + ")"
}
func (op *upsampleGradOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *upsampleGradOp) Hashcode() uint32      { return hashOf(op) }

func (op *upsampleGradOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.x.Clone(), nil }

func (op *upsampleGradOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

func (op *upsampleGradOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	const name = "UpsampleNearest backward"
	if len(in) != 1 {
		return nil, fmt.Errorf("ops: %v: want 1 input, got %d", op, len(in))
	}
	if err := hostOnly(name, []string{"grad"}, in); err != nil {
		return nil, err
	}
	dy, err := dense(name, "grad", in[0], op.dt, op.yShape())
	if err != nil {
		return nil, err
	}
	dx := output(prealloc, op.dt, op.x)
	switch op.dt {
	case tensor.Float32:
		upsampleBlockSums(dy.Float32s(), dx.Float32s(), op.x, op.factor)
	default:
		upsampleBlockSums(dy.Float64s(), dx.Float64s(), op.x, op.factor)
	}
	return dx, nil
}

// upsampleBlockSums writes dx[p,i,j] = the sum of the f x f block of dy that pixel
// (i, j) was copied to, in row order.
func upsampleBlockSums[T kernels.Float](dy, dx []T, xs tensor.Shape, f int) {
	h, w := xs[2], xs[3]
	ow := w * f
	clear(dx)
	for p := range xs[0] * xs[1] {
		src, dst := dy[p*h*w*f*f:(p+1)*h*w*f*f], dx[p*h*w:(p+1)*h*w]
		for oi := range h * f {
			row, out := src[oi*ow:(oi+1)*ow], dst[oi/f*w:(oi/f+1)*w]
			for j := range out {
				var s T
				for _, v := range row[j*f : (j+1)*f] {
					s += v
				}
				out[j] += s
			}
		}
	}
}

func (op *upsampleGradOp) DiffWRT(int) []bool { return []bool{true} }

func (op *upsampleGradOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if len(inputs) != 1 {
		return nil, fmt.Errorf("ops: %v: want 1 input, got %d", op, len(inputs))
	}
	d, err := G.ApplyOp(&upsampleOp{op.upsampleShape}, grad)
	if err != nil {
		return nil, fmt.Errorf("ops: UpsampleNearest second derivative: %w", err)
	}
	return G.Nodes{d}, nil
}
