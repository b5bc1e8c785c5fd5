package ops

import (
	"fmt"
	"hash"
	"hash/fnv"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

// fnType builds the hm function type of an op from the ranks of its inputs
// and of its output: tensors whose element type is the type variable a,
// shared by all of them. Rank 0 is a scalar, which gorgonia types by its
// element type alone.
func fnType(ranks ...int) hm.Type {
	a := hm.TypeVariable('a')
	ts := make([]hm.Type, len(ranks))
	for i, r := range ranks {
		if r == 0 {
			ts[i] = a
		} else {
			ts[i] = G.TensorType{Dims: r, Of: a}
		}
	}
	return hm.NewFnType(ts...)
}

// hashOf hashes an op through its String form. Every op's String must
// therefore name every parameter: gorgonia merges nodes whose ops hash alike.
func hashOf(op fmt.Stringer) uint32 {
	h := fnv.New32a()
	writeHash(h, op)
	return h.Sum32()
}

func writeHash(h hash.Hash, op fmt.Stringer) {
	fmt.Fprint(h, "stheno.", op.String())
}

// floatDtype returns the dtype of n, or an error naming op and arg when it is
// not float32 or float64.
func floatDtype(op, arg string, n *G.Node) (tensor.Dtype, error) {
	dt, err := dtypeOf(n)
	if err != nil {
		return dt, fmt.Errorf("ops: %s: %s: %w", op, arg, err)
	}
	if dt != tensor.Float32 && dt != tensor.Float64 {
		return dt, fmt.Errorf("ops: %s: %s must be float32 or float64, got %v", op, arg, dt)
	}
	return dt, nil
}

func dtypeOf(n *G.Node) (dt tensor.Dtype, err error) {
	if n == nil {
		return dt, fmt.Errorf("node is nil")
	}
	// Node.Dtype panics when the type holds no dtype (an unresolved type
	// variable, say); turn that into an error.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cannot tell the dtype of %v: %v", n.Type(), r)
		}
	}()
	return n.Dtype(), nil
}

// sameDtype checks that every named node has dtype dt.
func sameDtype(op string, dt tensor.Dtype, args map[string]*G.Node) error {
	for name, n := range args {
		got, err := floatDtype(op, name, n)
		if err != nil {
			return err
		}
		if got != dt {
			return fmt.Errorf("ops: %s: %s has dtype %v, want %v like the first input", op, name, got, dt)
		}
	}
	return nil
}

// checkRank returns an error unless n has the given rank. want describes the
// expected shape for the message, e.g. "[N C H W]".
func checkRank(op, arg string, n *G.Node, rank int, want string) error {
	if n == nil {
		return fmt.Errorf("ops: %s: %s is nil, want shape %s", op, arg, want)
	}
	if s := n.Shape(); len(s) != rank {
		return fmt.Errorf("ops: %s: %s must have shape %s, got %v", op, arg, want, s)
	}
	return nil
}

// tensorArg returns v as a *tensor.Dense after checking its dtype and shape
// against dt and want: the checks of every tensor input, on the host
// (dense) or on a device (deviceTensor).
func tensorArg(op, arg string, v G.Value, dt tensor.Dtype, want tensor.Shape) (*tensor.Dense, error) {
	d, ok := v.(*tensor.Dense)
	if !ok {
		return nil, fmt.Errorf("ops: %s: %s must be a *tensor.Dense, got %T", op, arg, v)
	}
	if d.Dtype() != dt {
		return nil, fmt.Errorf("ops: %s: %s has dtype %v, want %v", op, arg, d.Dtype(), dt)
	}
	if !d.Shape().Eq(want) {
		return nil, fmt.Errorf("ops: %s: %s has shape %v, want %v", op, arg, d.Shape(), want)
	}
	return d, nil
}

// dense returns v as a contiguous *tensor.Dense of dtype dt and shape want,
// materialising views. Kernels index raw backing slices, so anything else
// would be read as garbage.
func dense(op, arg string, v G.Value, dt tensor.Dtype, want tensor.Shape) (*tensor.Dense, error) {
	d, err := tensorArg(op, arg, v, dt, want)
	if err != nil {
		return nil, err
	}
	if d.IsView() || !d.DataOrder().IsRowMajor() {
		m, ok := d.Materialize().(*tensor.Dense)
		if !ok {
			return nil, fmt.Errorf("ops: %s: %s could not be made contiguous", op, arg)
		}
		d = m
	}
	return d, nil
}

// hostScalar returns the scalar input v as a tensor of shape () and dtype
// dt. Gorgonia hands a scalar op its output gradient as a *G.F32 or *G.F64
// (its host constant onef32 even when the op's other inputs are on a
// device), or as a tensor of one element.
func hostScalar(op, arg string, v G.Value, dt tensor.Dtype) (*tensor.Dense, error) {
	var f float64
	switch s := v.(type) {
	case *G.F64:
		f = float64(*s)
	case *G.F32:
		f = float64(*s)
	case *tensor.Dense:
		if s.Shape().TotalSize() != 1 || backend.IsDevice(s) {
			return nil, fmt.Errorf("ops: %s: %s must be a float scalar on the host, got %v of shape %v", op, arg, s.Dtype(), s.Shape())
		}
		// Get, not Data: tensor's Data hides the backing array from the
		// collector while it builds its result (see backend.HostData).
		switch d := s.Get(0).(type) {
		case float64:
			f = d
		case float32:
			f = float64(d)
		default:
			return nil, fmt.Errorf("ops: %s: %s must be a float scalar, got %v", op, arg, s.Dtype())
		}
	default:
		return nil, fmt.Errorf("ops: %s: %s must be a float scalar, got %T", op, arg, v)
	}
	if dt == tensor.Float32 {
		return tensor.New(tensor.FromScalar(float32(f))), nil
	}
	return tensor.New(tensor.FromScalar(f)), nil
}

// scalarValue returns the element of a tensor of shape () as gorgonia's
// scalar value of its dtype.
func scalarValue(d *tensor.Dense) G.Value {
	if d.Dtype() == tensor.Float32 {
		return G.NewF32(d.Float32s()[0])
	}
	return G.NewF64(d.Float64s()[0])
}

// output returns prealloc when it is a *tensor.Dense of the right dtype and
// shape, and a new tensor otherwise. Kernels overwrite every element of their
// outputs, so a reused buffer needs no clearing.
func output(prealloc G.Value, dt tensor.Dtype, shape tensor.Shape) *tensor.Dense {
	if d, ok := prealloc.(*tensor.Dense); ok && d.Dtype() == dt && d.Shape().Eq(shape) && !d.IsView() {
		return d
	}
	return tensor.New(tensor.Of(dt), tensor.WithShape(shape...))
}

// errNoSecondDerivative is what the backward ops of op, which are not
// differentiable again, answer for a second derivative.
func errNoSecondDerivative(op string) error {
	return fmt.Errorf("ops: %s: second derivatives are not implemented", op)
}

// noSecondDerivative is the opSpec.grad of the backward ops of op, which
// are not differentiable again.
func noSecondDerivative(op string) func(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return func(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) { return nil, errNoSecondDerivative(op) }
}

// floatTensor checks the tensor operand of an op that takes one of any
// rank: not nil, one dimension or more, float32 or float64, no empty
// dimension. It returns its shape and dtype.
func floatTensor(op string, x *G.Node) (xs tensor.Shape, dt tensor.Dtype, err error) {
	if x == nil {
		return nil, dt, fmt.Errorf("ops: %s: x is nil", op)
	}
	xs = x.Shape()
	if xs.Dims() < 1 {
		return nil, dt, fmt.Errorf("ops: %s: x must have one dimension or more, got a scalar", op)
	}
	if dt, err = floatDtype(op, "x", x); err != nil {
		return nil, dt, err
	}
	if err := positiveSizes(op, "x", xs); err != nil {
		return nil, dt, err
	}
	return xs, dt, nil
}

// axisOf returns axis of x's shape xs in [0, rank), negative axes counting
// from the end as PyTorch counts them, or an error naming op (after what,
// a prefix such as "perm [1 0]: ") and the axes allowed.
func axisOf(op, what string, axis int, xs tensor.Shape) (int, error) {
	r := xs.Dims()
	if axis < -r || axis >= r {
		return 0, fmt.Errorf("ops: %s: %saxis %d is out of range for x of shape %v: want %d to %d", op, what, axis, xs, -r, r-1)
	}
	return (axis + r) % r, nil
}

// positiveSizes returns an error naming op and arg unless every dimension
// of shape is at least 1 (the tape machine cannot allocate empty tensors).
func positiveSizes(op, arg string, shape tensor.Shape) error {
	for i, d := range shape {
		if d <= 0 {
			return fmt.Errorf("ops: %s: %s must have positive sizes, got %v (dimension %d)", op, arg, shape, i)
		}
	}
	return nil
}
