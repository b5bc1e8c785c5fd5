package hostop

import (
	"fmt"
	"hash"
	"hash/fnv"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Float is the element type an Op's function works in.
type Float interface{ ~float32 | ~float64 }

// Op runs Run on its inputs' values and returns a vector of Size values,
// which autograd.Unpack carves into the tensors the rest of the graph
// reads. Its inputs are host tensors of the shapes In, all float32 or all
// float64; Run sees them as T (converted when their dtype is not T's,
// read in place when it is) and its output is made in the inputs' dtype.
//
// It claims to be differentiable with respect to none of its inputs:
// gorgonia then leaves it out of backpropagation, instead of refusing a
// graph in which a node without derivatives sits between the loss and the
// parameters. Its outputs are constants with respect to the parameters,
// as a matcher or sampler running under PyTorch's no_grad.
type Op[T Float] struct {
	Name string
	In   []tensor.Shape
	Size int
	Run  func(in [][]T, out []T) error
	// Reuse says that Run writes every value of out, every run: the op
	// then keeps out's memory from one run to the next rather than
	// allocating it afresh, and a run's output is overwritten by the
	// next run's (a graph's consumers copy it within the run: Unpack,
	// ToDevice). Without it out starts as zeros.
	Reuse bool

	buf []T // Reuse: the last run's out
}

func (op *Op[T]) Arity() int { return len(op.In) }

func (op *Op[T]) Type() hm.Type {
	a := hm.TypeVariable('a')
	ts := make([]hm.Type, 0, len(op.In)+1)
	for _, s := range op.In {
		ts = append(ts, G.TensorType{Dims: s.Dims(), Of: a})
	}
	return hm.NewFnType(append(ts, G.TensorType{Dims: 1, Of: a})...)
}

func (op *Op[T]) InferShape(...G.DimSizer) (tensor.Shape, error) { return tensor.Shape{op.Size}, nil }
func (op *Op[T]) ReturnsPtr() bool                               { return false }
func (op *Op[T]) CallsExtern() bool                              { return false }
func (op *Op[T]) OverwritesInput() int                           { return -1 }

// String names the op and its identity: two host ops never merge, even
// with the same inputs.
func (op *Op[T]) String() string        { return fmt.Sprintf("host:%s@%p", op.Name, op) }
func (op *Op[T]) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op *Op[T]) Hashcode() uint32 {
	h := fnv.New32a()
	op.WriteHash(h)
	return h.Sum32()
}

func (op *Op[T]) Do(in ...G.Value) (G.Value, error) {
	if len(in) != len(op.In) {
		return nil, fmt.Errorf("hostop: %s: want %d inputs, got %d", op.Name, len(op.In), len(in))
	}
	vals := make([][]T, len(in))
	var dt tensor.Dtype
	for i, v := range in {
		d, ok := v.(*tensor.Dense)
		if !ok || !d.Shape().Eq(op.In[i]) || (d.Dtype() != tensor.Float32 && d.Dtype() != tensor.Float64) {
			return nil, fmt.Errorf("hostop: %s: input %d must be a float32 or float64 host tensor of shape %v, got %T %v", op.Name, i, op.In[i], v, v.Shape())
		}
		if i > 0 && d.Dtype() != dt {
			return nil, fmt.Errorf("hostop: %s: input %d is %v, input 0 %v", op.Name, i, d.Dtype(), dt)
		}
		dt = d.Dtype()
		if d.IsView() {
			d = d.Materialize().(*tensor.Dense)
		}
		vals[i] = valuesAs[T](d)
		if vals[i] == nil && op.In[i].TotalSize() > 0 {
			return nil, fmt.Errorf("hostop: %s: input %d holds %T", op.Name, i, d.Data())
		}
	}
	out := op.buf
	if !op.Reuse || len(out) != op.Size {
		out = make([]T, op.Size)
	}
	if op.Reuse {
		op.buf = out
	}
	if err := op.Run(vals, out); err != nil {
		return nil, fmt.Errorf("hostop: %s: %w", op.Name, err)
	}
	if s, ok := any(out).([]float32); ok && dt == tensor.Float32 {
		return tensor.New(tensor.WithShape(op.Size), tensor.WithBacking(s)), nil
	}
	if s, ok := any(out).([]float64); ok && dt == tensor.Float64 {
		return tensor.New(tensor.WithShape(op.Size), tensor.WithBacking(s)), nil
	}
	if dt == tensor.Float32 {
		return tensor.New(tensor.WithShape(op.Size), tensor.WithBacking(convert[float32](out))), nil
	}
	return tensor.New(tensor.WithShape(op.Size), tensor.WithBacking(convert[float64](out))), nil
}

func (op *Op[T]) DiffWRT(inputs int) []bool { return make([]bool, inputs) }

func (op *Op[T]) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("hostop: %s is not differentiable", op.Name)
}

// valuesAs is d's values as T: its own backing when it holds T already,
// else a converted copy; nil for another dtype.
func valuesAs[T Float](d *tensor.Dense) []T {
	switch s := d.Data().(type) {
	case []T:
		return s
	case []float32:
		return convert[T](s)
	case []float64:
		return convert[T](s)
	}
	return nil
}

func convert[To, From Float](s []From) []To {
	out := make([]To, len(s))
	for i, v := range s {
		out[i] = To(v)
	}
	return out
}
