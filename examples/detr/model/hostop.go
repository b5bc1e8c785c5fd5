package model

import (
	"fmt"
	"hash"
	"hash/fnv"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// hostOp runs a Go function on its inputs' values as one node of a graph:
// a step that is not differentiable (the Hungarian matching) but depends on
// values computed earlier in the same run. Its inputs are host tensors of
// the graph's dtype (float32 or float64), handed to run as float64; it
// writes a vector of that dtype, which autograd.Unpack carves into the
// tensors the rest of the graph reads.
//
// It claims to be differentiable with respect to none of its inputs, so
// that gorgonia leaves it out of backpropagation: its outputs are targets,
// constants with respect to the parameters, as the reference's matcher
// runs under torch.no_grad.
type hostOp struct {
	name string
	in   []tensor.Shape
	size int
	run  func(in [][]float64, out []float64) error
}

func (op *hostOp) Arity() int { return len(op.in) }

func (op *hostOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	ts := make([]hm.Type, 0, len(op.in)+1)
	for _, s := range op.in {
		ts = append(ts, G.TensorType{Dims: s.Dims(), Of: a})
	}
	return hm.NewFnType(append(ts, G.TensorType{Dims: 1, Of: a})...)
}

func (op *hostOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return tensor.Shape{op.size}, nil }
func (op *hostOp) ReturnsPtr() bool                               { return false }
func (op *hostOp) CallsExtern() bool                              { return false }
func (op *hostOp) OverwritesInput() int                           { return -1 }

// String names the op and its identity: two host ops never merge, even
// with the same inputs.
func (op *hostOp) String() string        { return fmt.Sprintf("host:%s@%p", op.name, op) }
func (op *hostOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op *hostOp) Hashcode() uint32 {
	h := fnv.New32a()
	op.WriteHash(h)
	return h.Sum32()
}

func (op *hostOp) Do(in ...G.Value) (G.Value, error) {
	if len(in) != len(op.in) {
		return nil, fmt.Errorf("model: %s: want %d inputs, got %d", op.name, len(op.in), len(in))
	}
	vals := make([][]float64, len(in))
	var dt tensor.Dtype
	for i, v := range in {
		d, ok := v.(*tensor.Dense)
		if !ok || !d.Shape().Eq(op.in[i]) || (d.Dtype() != tensor.Float32 && d.Dtype() != tensor.Float64) {
			return nil, fmt.Errorf("model: %s: input %d must be a float32 or float64 host tensor of shape %v, got %T %v", op.name, i, op.in[i], v, v.Shape())
		}
		if i > 0 && d.Dtype() != dt {
			return nil, fmt.Errorf("model: %s: input %d is %v, input 0 %v", op.name, i, d.Dtype(), dt)
		}
		dt = d.Dtype()
		f, err := float64sOf(d)
		if err != nil {
			return nil, fmt.Errorf("model: %s: input %d: %w", op.name, i, err)
		}
		vals[i] = f
	}
	out := make([]float64, op.size)
	if err := op.run(vals, out); err != nil {
		return nil, fmt.Errorf("model: %s: %w", op.name, err)
	}
	return denseOf(dt, out, op.size), nil
}

func (op *hostOp) DiffWRT(inputs int) []bool { return make([]bool, inputs) }

func (op *hostOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("model: %s is not differentiable", op.name)
}
