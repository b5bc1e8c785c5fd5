package ops

import (
	"fmt"
	"slices"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/kernels"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// Permute reorders the axes of x, as torch.permute followed by
// .contiguous(): output axis k is x's axis perm[k] (negative entries count
// from the end), and the output is a new contiguous tensor. [B, L, H, d]
// with perm (0, 2, 1, 3) gives attention's heads [B, H, L, d]; [N, C, H, W]
// with (0, 2, 3, 1) gives channels-last. Differentiable with respect to x:
// the gradient is the inverse permutation of the output's.
//
// On the GPU, a permutation that keeps the innermost axis innermost is a
// coalesced copy of rows (16 bytes an access where the rows allow); one
// that moves it goes through shared-memory tiles (layout.cu). Axes of size
// one and axes that stay neighbours are merged first, so at most
// cuda.LayoutMaxRank axes remain.
func Permute(x *G.Node, perm ...int) (*G.Node, error) {
	s, err := permuteShapeOf("Permute", x, perm)
	if err != nil {
		return nil, err
	}
	return G.ApplyOp(permuteOp(s), x)
}

// Transpose swaps axes a and b of x (negative from the end), as
// torch.transpose(...).contiguous(): a Permute.
func Transpose(x *G.Node, a, b int) (*G.Node, error) {
	if x == nil {
		return nil, fmt.Errorf("ops: Transpose: x is nil")
	}
	r := x.Shape().Dims()
	for _, v := range []int{a, b} {
		if _, err := axisOf("Transpose", "", v, x.Shape()); err != nil {
			return nil, err
		}
	}
	perm := make([]int, r)
	for i := range perm {
		perm[i] = i
	}
	a, b = (a+r)%r, (b+r)%r
	perm[a], perm[b] = perm[b], perm[a]
	s, err := permuteShapeOf("Transpose", x, perm)
	if err != nil {
		return nil, err
	}
	return G.ApplyOp(permuteOp(s), x)
}

// permuteShape is a permutation of x's axes.
type permuteShape struct {
	op   string
	x    tensor.Shape
	perm []int // non-negative
	out  tensor.Shape
	dt   tensor.Dtype
}

func (s permuteShape) String() string {
	return fmt.Sprintf("x=%v,perm=%v,%v", s.x, s.perm, s.dt)
}

func (s permuteShape) params() kernels.PermuteParams { return kernels.NewPermuteParams(s.x, s.perm) }

// inverse is the permutation that undoes s, on s's output.
func (s permuteShape) inverse() permuteShape {
	inv := make([]int, len(s.perm))
	for k, a := range s.perm {
		inv[a] = k
	}
	return permuteShape{op: s.op, x: s.out.Clone(), perm: inv, out: s.x.Clone(), dt: s.dt}
}

// permuteShapeOf checks Permute's operand and permutation.
func permuteShapeOf(op string, x *G.Node, perm []int) (permuteShape, error) {
	var none permuteShape
	xs, dt, err := floatTensor(op, x)
	if err != nil {
		return none, err
	}
	r := xs.Dims()
	if len(perm) != r {
		return none, fmt.Errorf("ops: %s: perm %v must have one entry per axis of x %v (%d)", op, perm, xs, r)
	}
	p := make([]int, r)
	seen := make([]bool, r)
	for k, a := range perm {
		a, err := axisOf(op, fmt.Sprintf("perm %v: ", perm), a, xs)
		if err != nil {
			return none, err
		}
		if seen[a] {
			return none, fmt.Errorf("ops: %s: perm %v names axis %d twice: want a permutation of 0..%d", op, perm, a, r-1)
		}
		seen[a], p[k] = true, a
	}
	out := make(tensor.Shape, r)
	for k, a := range p {
		out[k] = xs[a]
	}
	s := permuteShape{op: op, x: xs.Clone(), perm: p, out: out, dt: dt}
	if n := len(s.params().Dims); n > cuda.LayoutMaxRank {
		return none, fmt.Errorf("ops: %s: perm %v of x %v moves %d groups of axes; at most %d are supported", op, perm, xs, n, cuda.LayoutMaxRank)
	}
	return s, nil
}

func permuteOp(s permuteShape) *specOp {
	return newOp(&opSpec{
		name: s.op, kind: "Permute", config: s.String(),
		inputs: []argSpec{{name: "x", shape: s.x}}, out: s.out, dtype: s.dt,
		cpu:     floatTwin(s, permuteForward[float32], permuteForward[float64]),
		device:  s.device,
		diffWRT: []bool{true},
		grad: func(_ G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			dx, err := G.ApplyOp(permuteOp(s.inverse()), grad)
			if err != nil {
				return nil, fmt.Errorf("ops: %s backward: %w", s.op, err)
			}
			return G.Nodes{dx}, nil
		},
	})
}

func permuteForward[T kernels.Float](s permuteShape, in [][]T, out []T) error {
	kernels.Permute(s.params(), in[0], out)
	return nil
}

// Concat joins xs along axis (negative from the end), as torch.cat: they
// have x's rank, dtype and sizes except along axis. Differentiable with
// respect to every input: each one's gradient is its Slice of the
// output's.
func Concat(axis int, xs ...*G.Node) (*G.Node, error) {
	s, err := concatShapeOf(axis, xs)
	if err != nil {
		return nil, err
	}
	return G.ApplyOp(concatOp(s), xs...)
}

// concatShape is xs joined along axis.
type concatShape struct {
	xs   []tensor.Shape
	axis int
	out  tensor.Shape
	dt   tensor.Dtype
}

func (s concatShape) String() string { return fmt.Sprintf("xs=%v,axis=%d,%v", s.xs, s.axis, s.dt) }

// rows returns the tensors seen as [outer, n*inner] rows: outer, and the
// row length of each input and of the output.
func (s concatShape) rows() (outer int, cols []int, total int) {
	outer = s.out[:s.axis].TotalSize()
	inner := s.out[s.axis+1:].TotalSize()
	for _, x := range s.xs {
		cols = append(cols, x[s.axis]*inner)
		total += x[s.axis] * inner
	}
	return outer, cols, total
}

func concatShapeOf(axis int, xs []*G.Node) (concatShape, error) {
	const op = "Concat"
	var none concatShape
	if len(xs) == 0 {
		return none, fmt.Errorf("ops: %s: no inputs", op)
	}
	for i, x := range xs {
		if x == nil {
			return none, fmt.Errorf("ops: %s: xs[%d] is nil", op, i)
		}
	}
	first := xs[0].Shape()
	r := first.Dims()
	if r < 1 {
		return none, fmt.Errorf("ops: %s: xs[0] must have one dimension or more, got a scalar", op)
	}
	if axis < -r || axis >= r {
		return none, fmt.Errorf("ops: %s: axis %d is out of range for inputs of rank %d: want %d to %d", op, axis, r, -r, r-1)
	}
	axis = (axis + r) % r
	dt, err := floatDtype(op, "xs[0]", xs[0])
	if err != nil {
		return none, err
	}
	s := concatShape{axis: axis, dt: dt, out: first.Clone()}
	s.out[axis] = 0
	for i, x := range xs {
		name := fmt.Sprintf("xs[%d]", i)
		if err := sameDtype(op, dt, map[string]*G.Node{name: x}); err != nil {
			return none, err
		}
		xsh := x.Shape()
		if err := positiveSizes(op, name, xsh); err != nil {
			return none, err
		}
		if xsh.Dims() != r {
			return none, fmt.Errorf("ops: %s: %s has shape %v, want rank %d like xs[0] %v", op, name, xsh, r, first)
		}
		for k := range r {
			if k != axis && xsh[k] != first[k] {
				return none, fmt.Errorf("ops: %s: %s has shape %v, want xs[0]'s sizes %v except along axis %d", op, name, xsh, first, axis)
			}
		}
		s.xs = append(s.xs, xsh.Clone())
		s.out[axis] += xsh[axis]
	}
	return s, nil
}

func concatOp(s concatShape) *specOp {
	inputs := make([]argSpec, len(s.xs))
	for i, x := range s.xs {
		inputs[i] = argSpec{name: fmt.Sprintf("xs[%d]", i), shape: x}
	}
	diff := make([]bool, len(s.xs))
	for i := range diff {
		diff[i] = true
	}
	return newOp(&opSpec{
		name: "Concat", config: s.String(),
		inputs: inputs, out: s.out, dtype: s.dt,
		cpu:     floatTwin(s, concatForward[float32], concatForward[float64]),
		device:  s.device,
		diffWRT: diff,
		grad: func(_ G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			dxs := make(G.Nodes, len(s.xs))
			start := 0
			for i, x := range s.xs {
				sl := sliceShape{x: s.out, axis: s.axis, start: start, end: start + x[s.axis], dt: s.dt}
				start += x[s.axis]
				var err error
				if dxs[i], err = G.ApplyOp(sliceOp(sl), grad); err != nil {
					return nil, fmt.Errorf("ops: Concat backward: %w", err)
				}
			}
			return dxs, nil
		},
	})
}

func concatForward[T kernels.Float](s concatShape, in [][]T, out []T) error {
	outer, cols, total := s.rows()
	off := 0
	for i, x := range in {
		kernels.CopyRows(outer, cols[i], cols[i], total, x, out[off:])
		off += cols[i]
	}
	return nil
}

// Slice returns x's elements start <= i < end along axis (negative from the
// end), as x.narrow(axis, start, end-start).contiguous() in PyTorch: a new
// contiguous tensor. Differentiable with respect to x: the gradient is the
// output's gradient in place in zeros of x's shape.
func Slice(x *G.Node, axis, start, end int) (*G.Node, error) {
	s, err := sliceShapeOf(x, axis, start, end)
	if err != nil {
		return nil, err
	}
	return G.ApplyOp(sliceOp(s), x)
}

// Split cuts x along axis into pieces of the given sizes, which must add
// up to x's size there, as torch.split with a list of sizes: Slices.
func Split(x *G.Node, axis int, sizes ...int) (G.Nodes, error) {
	if x == nil {
		return nil, fmt.Errorf("ops: Split: x is nil")
	}
	axis, err := axisOf("Split", "", axis, x.Shape())
	if err != nil {
		return nil, err
	}
	total := 0
	for _, n := range sizes {
		if n <= 0 {
			return nil, fmt.Errorf("ops: Split: sizes %v must be positive", sizes)
		}
		total += n
	}
	if n := x.Shape()[axis]; total != n {
		return nil, fmt.Errorf("ops: Split: sizes %v add up to %d, want x's size %d along axis %d", sizes, total, n, axis)
	}
	var out G.Nodes
	start := 0
	for _, n := range sizes {
		p, err := Slice(x, axis, start, start+n)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
		start += n
	}
	return out, nil
}

// sliceShape is the part start:end of x along axis.
type sliceShape struct {
	x          tensor.Shape
	axis       int
	start, end int
	dt         tensor.Dtype
}

func (s sliceShape) String() string {
	return fmt.Sprintf("x=%v,axis=%d,range=%d:%d,%v", s.x, s.axis, s.start, s.end, s.dt)
}

func (s sliceShape) out() tensor.Shape {
	o := s.x.Clone()
	o[s.axis] = s.end - s.start
	return o
}

// rows returns x as [outer, n*inner] rows: outer, x's row length, the
// slice's row length and where it starts in x's row.
func (s sliceShape) rows() (outer, xCols, cols, first int) {
	inner := s.x[s.axis+1:].TotalSize()
	return s.x[:s.axis].TotalSize(), s.x[s.axis] * inner, (s.end - s.start) * inner, s.start * inner
}

func sliceShapeOf(x *G.Node, axis, start, end int) (sliceShape, error) {
	const op = "Slice"
	var none sliceShape
	xs, dt, err := floatTensor(op, x)
	if err != nil {
		return none, err
	}
	if axis, err = axisOf(op, "", axis, xs); err != nil {
		return none, err
	}
	if !(0 <= start && start < end && end <= xs[axis]) {
		return none, fmt.Errorf("ops: %s: range %d:%d of axis %d of x %v: want 0 <= start < end <= %d", op, start, end, axis, xs, xs[axis])
	}
	return sliceShape{x: xs.Clone(), axis: axis, start: start, end: end, dt: dt}, nil
}

func sliceOp(s sliceShape) *specOp {
	return newOp(&opSpec{
		name: "Slice", config: s.String(),
		inputs: []argSpec{{name: "x", shape: s.x}}, out: s.out(), dtype: s.dt,
		cpu:     floatTwin(s, sliceForward[float32], sliceForward[float64]),
		device:  s.device,
		diffWRT: []bool{true},
		grad: func(_ G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			dx, err := G.ApplyOp(sliceGradOp(s), grad)
			if err != nil {
				return nil, fmt.Errorf("ops: Slice backward: %w", err)
			}
			return G.Nodes{dx}, nil
		},
	})
}

// sliceGradOp puts the slice's gradient in place in zeros of x's shape.
// It is linear: its own gradient is the Slice again.
func sliceGradOp(s sliceShape) *specOp {
	return newOp(&opSpec{
		name: "Slice backward", config: s.String(),
		inputs: []argSpec{{name: "grad", shape: s.out()}}, out: s.x, dtype: s.dt,
		cpu:     floatTwin(s, sliceBackward[float32], sliceBackward[float64]),
		device:  s.backwardDevice,
		diffWRT: []bool{true},
		grad: func(_ G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			d, err := G.ApplyOp(sliceOp(s), grad)
			if err != nil {
				return nil, fmt.Errorf("ops: Slice backward's gradient: %w", err)
			}
			return G.Nodes{d}, nil
		},
	})
}

func sliceForward[T kernels.Float](s sliceShape, in [][]T, out []T) error {
	outer, xCols, cols, first := s.rows()
	kernels.CopyRows(outer, cols, xCols, cols, in[0][first:], out)
	return nil
}

func sliceBackward[T kernels.Float](s sliceShape, in [][]T, dx []T) error {
	outer, xCols, cols, first := s.rows()
	clear(dx)
	kernels.CopyRows(outer, cols, cols, xCols, in[0], dx[first:])
	return nil
}

// Reshape gives x another shape of as many elements, as torch.reshape;
// one size may be -1, worked out from the others. The output is a new
// tensor, on the device a copy: a view would share x's memory, which the
// tape machine may hand to a later op as its output buffer while x is
// still needed. (Gorgonia's own G.Reshape returns such a view of a device
// tensor.) Differentiable with respect to x: the gradient is the output's
// reshaped back.
func Reshape(x *G.Node, shape ...int) (*G.Node, error) {
	s, err := reshapeShapeOf(x, shape)
	if err != nil {
		return nil, err
	}
	return G.ApplyOp(reshapeOp(s), x)
}

// reshapeShape is x seen with shape out.
type reshapeShape struct {
	x, out tensor.Shape
	dt     tensor.Dtype
}

func (s reshapeShape) String() string { return fmt.Sprintf("x=%v,out=%v,%v", s.x, s.out, s.dt) }

func reshapeShapeOf(x *G.Node, shape []int) (reshapeShape, error) {
	const op = "Reshape"
	var none reshapeShape
	xs, dt, err := floatTensor(op, x)
	if err != nil {
		return none, err
	}
	if len(shape) == 0 {
		return none, fmt.Errorf("ops: %s: the new shape has no dimensions; want one or more", op)
	}
	out := slices.Clone(shape)
	free, known := -1, 1
	for i, d := range out {
		switch {
		case d == -1 && free < 0:
			free = i
		case d == -1:
			return none, fmt.Errorf("ops: %s: shape %v has more than one -1", op, shape)
		case d <= 0:
			return none, fmt.Errorf("ops: %s: shape %v: sizes must be positive (or one -1)", op, shape)
		default:
			known *= d
		}
	}
	n := xs.TotalSize()
	if free >= 0 {
		if n%known != 0 {
			return none, fmt.Errorf("ops: %s: x %v has %d elements, not a multiple of %d for shape %v", op, xs, n, known, shape)
		}
		out[free] = n / known
		known = n
	}
	if known != n {
		return none, fmt.Errorf("ops: %s: x %v has %d elements, shape %v holds %d", op, xs, n, shape, known)
	}
	return reshapeShape{x: xs.Clone(), out: out, dt: dt}, nil
}

func reshapeOp(s reshapeShape) *specOp {
	return newOp(&opSpec{
		name: "Reshape", config: s.String(),
		inputs: []argSpec{{name: "x", shape: s.x}}, out: s.out, dtype: s.dt,
		cpu:     floatTwin(s, copyForward[float32, reshapeShape], copyForward[float64, reshapeShape]),
		device:  func(a *deviceArgs) (*tensor.Dense, error) { return copyDevice("Reshape", a) },
		diffWRT: []bool{true},
		grad: func(_ G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			dx, err := G.ApplyOp(reshapeOp(reshapeShape{x: s.out, out: s.x, dt: s.dt}), grad)
			if err != nil {
				return nil, fmt.Errorf("ops: Reshape backward: %w", err)
			}
			return G.Nodes{dx}, nil
		},
	})
}

// Detach returns x's value with no gradient flowing back through it, as
// torch's detach (a stop-gradient): a copy of x, for the same reason as
// Reshape's, that G.Grad treats as a constant.
func Detach(x *G.Node) (*G.Node, error) {
	const op = "Detach"
	xs, dt, err := floatTensor(op, x)
	if err != nil {
		return nil, err
	}
	s := reshapeShape{x: xs.Clone(), out: xs.Clone(), dt: dt}
	return G.ApplyOp(newOp(&opSpec{
		name: op, config: s.String(),
		inputs: []argSpec{{name: "x", shape: s.x}}, out: s.out, dtype: s.dt,
		cpu:    floatTwin(s, copyForward[float32, reshapeShape], copyForward[float64, reshapeShape]),
		device: func(a *deviceArgs) (*tensor.Dense, error) { return copyDevice(op, a) },
		// diffWRT nil: nothing flows back.
	}), x)
}

func copyForward[T kernels.Float, S any](_ S, in [][]T, out []T) error {
	copy(out, in[0])
	return nil
}
