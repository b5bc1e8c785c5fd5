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
// a step of the detector that is not differentiable (decoding proposals,
// sampling RoIs, NMS) but depends on values computed earlier in the same
// run. It writes a float32 vector; autograd.Unpack carves it into the
// tensors the rest of the graph reads.
//
// It claims to be differentiable with respect to none of its inputs: gorgonia
// then leaves it out of backpropagation, instead of refusing a graph in
// which a node without derivatives sits between the loss and the
// parameters (the RPN's outputs feed both the losses and this op).
type hostOp struct {
	name string
	in   []tensor.Shape
	size int
	run  func(in [][]float32, out []float32) error
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
	vals := make([][]float32, len(in))
	for i, v := range in {
		d, ok := v.(*tensor.Dense)
		if !ok || d.Dtype() != tensor.Float32 || !d.Shape().Eq(op.in[i]) {
			return nil, fmt.Errorf("model: %s: input %d must be a float32 tensor of shape %v, got %T %v", op.name, i, op.in[i], v, v.Shape())
		}
		if d.IsView() {
			d = d.Materialize().(*tensor.Dense)
		}
		vals[i] = d.Float32s()
	}
	out := make([]float32, op.size)
	if err := op.run(vals, out); err != nil {
		return nil, fmt.Errorf("model: %s: %w", op.name, err)
	}
	return tensor.New(tensor.WithShape(op.size), tensor.WithBacking(out)), nil
}

func (op *hostOp) DiffWRT(inputs int) []bool { return make([]bool, inputs) }

func (op *hostOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("model: %s is not differentiable", op.name)
}
