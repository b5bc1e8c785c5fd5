package ops

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/kernels"
)

// Softmax normalises x along axis into probabilities, as torch.softmax:
//
//	y = exp(x - max) / sum exp(x - max)
//
// over each line of x along axis, max the line's largest element (so that
// no exp overflows). x may have any rank from 1; a negative axis counts
// from the end, as in PyTorch (-1 is the last dimension). A NaN in a line
// makes the whole line NaN, and so does a line of -inf only or one holding
// +inf; an -inf among finite values gives 0. Every sum runs in a fixed
// order, on the GPU too: the same bits on every run.
//
// Differentiable with respect to x: the backward op takes y and the
// gradient dy of y, dx = y*(dy - sum dy*y). Second derivatives are not
// implemented.
//
// gorgonia's own SoftMax allocates its output on the host (so it cannot
// run on a GPU) and hashes like its LogSoftMax (so the two merge in one
// graph); this op has neither problem.
func Softmax(x *G.Node, axis int) (*G.Node, error) {
	return softmax("Softmax", x, axis, false)
}

// LogSoftmax is the logarithm of Softmax, as torch.log_softmax, computed
// without forming the probabilities:
//
//	y = (x - max) - log(sum exp(x - max))
//
// which stays finite where log(Softmax(x)) would take the log of an
// underflowed 0. Its backward op takes y and dy: dx = dy - exp(y)*sum dy.
// Axis, special values and determinism as Softmax.
func LogSoftmax(x *G.Node, axis int) (*G.Node, error) {
	return softmax("LogSoftmax", x, axis, true)
}

func softmax(op string, x *G.Node, axis int, log bool) (*G.Node, error) {
	s, err := softmaxShapeOf(op, x, axis, log)
	if err != nil {
		return nil, err
	}
	return G.ApplyOp(softmaxOp(s), x)
}

// softmaxShapeOf checks Softmax's or LogSoftmax's operand and axis.
func softmaxShapeOf(op string, x *G.Node, axis int, log bool) (softmaxShape, error) {
	var none softmaxShape
	xs, dt, err := floatTensor(op, x)
	if err != nil {
		return none, err
	}
	if axis, err = axisOf(op, "", axis, xs); err != nil {
		return none, err
	}
	return softmaxShape{op: op, x: xs.Clone(), axis: axis, log: log, dt: dt}, nil
}

// softmaxShape is a softmax (or log-softmax) along one axis of x.
type softmaxShape struct {
	op   string // "Softmax" or "LogSoftmax", in errors
	x    tensor.Shape
	axis int // 0 <= axis < x.Dims()
	log  bool
	dt   tensor.Dtype
}

func (s softmaxShape) String() string {
	return fmt.Sprintf("x=%v,axis=%d,log=%t,%v", s.x, s.axis, s.log, s.dt)
}

// params is x as the kernels see it: [outer, n, inner], n the axis.
func (s softmaxShape) params() kernels.SoftmaxParams {
	p := kernels.SoftmaxParams{Outer: 1, N: s.x[s.axis], Inner: 1, Log: s.log}
	for _, d := range s.x[:s.axis] {
		p.Outer *= d
	}
	for _, d := range s.x[s.axis+1:] {
		p.Inner *= d
	}
	return p
}

// softmaxOp is the forward op: x -> y.
func softmaxOp(s softmaxShape) *specOp {
	return newOp(&opSpec{
		name: s.op, config: s.String(),
		inputs: []argSpec{{name: "x", shape: s.x}}, out: s.x, dtype: s.dt,
		cpu:     floatTwin(s, softmaxForward[float32], softmaxForward[float64]),
		device:  s.forwardDevice,
		diffWRT: []bool{true},
		grad: func(_ G.Nodes, out, grad *G.Node) (G.Nodes, error) {
			dx, err := G.ApplyOp(softmaxGradOp(s), out, grad)
			if err != nil {
				return nil, fmt.Errorf("ops: %s backward: %w", s.op, err)
			}
			return G.Nodes{dx}, nil
		},
	})
}

// softmaxGradOp is the backward op: (y, dy) -> dx, from the forward's
// output y. It is not differentiable again.
func softmaxGradOp(s softmaxShape) *specOp {
	return newOp(&opSpec{
		name: s.op + " backward", config: s.String(),
		inputs: []argSpec{{name: "y", shape: s.x}, {name: "grad", shape: s.x}}, out: s.x, dtype: s.dt,
		cpu:     floatTwin(s, softmaxBackward[float32], softmaxBackward[float64]),
		device:  s.backwardDevice,
		diffWRT: []bool{true, true},
		grad:    noSecondDerivative(s.op),
	})
}

func softmaxForward[T kernels.Float](s softmaxShape, in [][]T, y []T) error {
	kernels.SoftmaxForward(s.params(), in[0], y)
	return nil
}

func softmaxBackward[T kernels.Float](s softmaxShape, in [][]T, dx []T) error {
	kernels.SoftmaxBackward(s.params(), in[0], in[1], dx)
	return nil
}
