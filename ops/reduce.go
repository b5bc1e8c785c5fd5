package ops

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/kernels"
)

// Sum returns the sum of x over axes, as torch.sum(x, axes, keepdim):
// negative axes count from the end, no axis may repeat, and no axes (nil
// or empty) means every axis. keepDims keeps each summed axis as a dim of
// one; otherwise it is dropped, and a sum over every axis is a scalar
// (whose gradient gorgonia hands over on the host, as for the losses). On
// a GPU, keep the dims of a sum that is to leave the device: ToHost moves
// tensors, not scalars.
//
// The order of the additions is fixed (kernels/reduce.go, NewReducePlan):
// each sum is split between threads (a row's terms between up to 32 lanes,
// or 256 threads per part of a long row; a column's between the rows of a
// block), each thread adding its share in order in the dtype (float32 sums
// in float32, as PyTorch's CUDA sums), and the shares are added pairwise
// by fixed trees, so that no running sum holds more than a small share of
// the terms. The GPU (kernels/pointwise.cu) adds in the same order: the two
// give the same bits, on every run. A NaN makes its sum NaN, and +inf with
// -inf too.
//
// Differentiable with respect to x: the gradient broadcasts dy back over
// the summed axes.
func Sum(x *G.Node, axes []int, keepDims bool) (*G.Node, error) {
	return reduceOver("Sum", x, axes, keepDims, false)
}

// Mean returns the mean of x over axes, as torch.mean(x, axes, keepdim):
// Sum's sum multiplied by 1/count (count the number of terms, rounded to
// the dtype), axes as Sum's. Its gradient broadcasts dy/count back.
func Mean(x *G.Node, axes []int, keepDims bool) (*G.Node, error) {
	return reduceOver("Mean", x, axes, keepDims, true)
}

func reduceOver(op string, x *G.Node, axes []int, keepDims, mean bool) (*G.Node, error) {
	dt, err := tensorOperand(op, "x", x)
	if err != nil {
		return nil, err
	}
	xs := x.Shape().Clone()
	r := xs.Dims()
	summed := make([]bool, r)
	if len(axes) == 0 {
		for i := range summed {
			summed[i] = true
		}
	}
	for _, a := range axes {
		a, err := axisOf(op, "", a, xs)
		if err != nil {
			return nil, err
		}
		if summed[a] {
			return nil, fmt.Errorf("ops: %s: axis %d appears twice in %v", op, a, axes)
		}
		summed[a] = true
	}
	var out tensor.Shape
	count := 1
	for i, d := range xs {
		switch {
		case summed[i]:
			count *= d
			if keepDims {
				out = append(out, 1)
			}
		default:
			out = append(out, d)
		}
	}
	if out == nil {
		out = tensor.Shape{}
	}
	alpha := 1.0
	if mean {
		alpha = 1 / float64(count)
	}
	s := newReduceShape(op, xs, summed, out, alpha, dt)
	return G.ApplyOp(reduceOp(s), x)
}

// reduceShape is a sum of x over the summed dims, times alpha, written in
// the shape out (its kept dims, with or without ones where the summed
// ones were).
type reduceShape struct {
	name   string // in errors: "Sum", "Mean", "Add backward"
	x      tensor.Shape
	summed []bool
	out    tensor.Shape
	alpha  float64
	dt     tensor.Dtype
	plan   kernels.ReducePlan
}

func newReduceShape(name string, x tensor.Shape, summed []bool, out tensor.Shape, alpha float64, dt tensor.Dtype) reduceShape {
	return reduceShape{name: name, x: x, summed: summed, out: out, alpha: alpha, dt: dt,
		plan: kernels.NewReducePlan(x, summed, int(dt.Size()), alpha)}
}

func (s reduceShape) String() string {
	return fmt.Sprintf("x=%v,summed=%v,out=%v,alpha=%v,%v", s.x, s.summed, s.out, s.alpha, s.dt)
}

// keptShape is out with ones at the summed dims: the shape in which dy
// broadcasts back over x.
func (s reduceShape) keptShape() tensor.Shape {
	k := s.x.Clone()
	for i, sm := range s.summed {
		if sm {
			k[i] = 1
		}
	}
	return k
}

// reduceOp is the sum: x -> out.
func reduceOp(s reduceShape) *specOp {
	return newOp(&opSpec{
		name: s.name, kind: "Reduce", config: s.String(),
		inputs: []argSpec{{name: "x", shape: s.x}}, out: s.out, dtype: s.dt,
		cpu:     floatTwin(s, reduceRun[float32], reduceRun[float64]),
		device:  s.device,
		diffWRT: []bool{true},
		grad: func(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			dx, err := s.broadcastBack(in[0], grad)
			if err != nil {
				return nil, err
			}
			return G.Nodes{dx}, nil
		},
	})
}

func reduceRun[T kernels.Float](s reduceShape, in [][]T, out []T) error {
	kernels.ReduceSum(s.plan, in[0], out)
	return nil
}

// broadcastBack is the gradient of the sum: dy * alpha at every element of
// x. A scalar dy (gorgonia hands it over on the host) fills x's shape; the
// op takes x then, for its place only.
func (s reduceShape) broadcastBack(x, grad *G.Node) (*G.Node, error) {
	bwd := s.name + " backward"
	if s.out.Dims() == 0 {
		dx, err := G.ApplyOp(fillLikeOp(bwd, s.x, s.alpha, s.dt), x, grad)
		if err != nil {
			return nil, fmt.Errorf("ops: %s: %w", bwd, err)
		}
		return dx, nil
	}
	return applyPointwise(pointwiseShape{name: bwd, op: kernels.PointwiseScale, argA: "grad",
		a: s.out, aView: s.keptShape(), out: s.x, alpha: s.alpha, dt: s.dt}, grad)
}

// sumTo sums g (of some output's shape) over the dims along which an
// operand was broadcast, giving the operand's shape to: view is to as it
// broadcast, aligned with g's last dims (to itself, or to with ones where
// a sum dropped dims). It returns g itself when to is g's shape.
func sumTo(name string, g *G.Node, view, to tensor.Shape) (*G.Node, error) {
	from := g.Shape()
	if from.Eq(to) {
		return g, nil
	}
	summed := make([]bool, from.Dims())
	off := from.Dims() - view.Dims()
	for i, d := range from {
		summed[i] = i < off || (view[i-off] == 1 && d != 1)
	}
	return G.ApplyOp(reduceOp(newReduceShape(name, from.Clone(), summed, to.Clone(), 1, g.Dtype())), g)
}

// fillLikeOp is (x, c) -> alpha*c in x's shape, c a scalar on the host and x
// read for its place only. It is the gradient of a sum to a scalar, and
// not differentiable again.
func fillLikeOp(name string, x tensor.Shape, alpha float64, dt tensor.Dtype) *specOp {
	return newOp(&opSpec{
		name: name, kind: "FillLike", config: fmt.Sprintf("x=%v,alpha=%v,%v", x, alpha, dt),
		inputs: []argSpec{{name: "x", shape: x}, {name: "grad", shape: tensor.Shape{}}}, out: x, dtype: dt,
		cpu: func(in []*tensor.Dense, out *tensor.Dense) error {
			c := scalarOf(in[1])
			return floatTwin(alpha*c, fill[float32], fill[float64])(nil, out)
		},
		device: func(a *deviceArgs) (*tensor.Dense, error) {
			out, outPtr, err := a.output()
			if err != nil {
				return nil, err
			}
			if err := launchMap(name, a.dev, dt, kernels.PointwiseFill, alpha*scalarOf(a.in[1]), 0, 0, outPtr, x.TotalSize()); err != nil {
				return nil, err
			}
			return out, nil
		},
		diffWRT: []bool{false, true},
		grad:    noSecondDerivative(name),
	})
}

func fill[T kernels.Float](c float64, _ [][]T, out []T) error {
	kernels.PointwiseMap[T](kernels.PointwiseFill, c, nil, nil, out)
	return nil
}

// scalarOf is the value of a host tensor of one element (hostScalar's).
func scalarOf(d *tensor.Dense) float64 {
	if d.Dtype() == tensor.Float32 {
		return float64(d.Float32s()[0])
	}
	return d.Float64s()[0]
}
