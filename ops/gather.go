package ops

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// GatherRows picks rows of x by index, as torch.index_select(x, 0, idx):
// x [N, ...] and idx [K] of dtype int (Go's int, PyTorch's int64) give
// out [K, ...] with out[i] = x[idx[i]]. Indices may repeat. An index
// outside [0, N) is an error: on the host when the op runs; on the GPU the
// kernel writes a zero row and the next synchronisation (ToHost, say)
// reports it.
//
// Differentiable with respect to x: dx is zeros of x's shape with dy's row
// i added onto row idx[i], for i in increasing order, on the GPU too
// (without atomics: the rows that share an index are chained and each
// chain is summed by one thread, so the bits are the same on every run).
// The chaining compares every pair of indices, O(K^2): meant for query
// selection and top-k, K up to a few thousand. idx is not differentiable.
func GatherRows(x, idx *G.Node) (*G.Node, error) {
	s, err := gatherShapeOf(x, idx)
	if err != nil {
		return nil, err
	}
	return G.ApplyOp(gatherOp(s), x, idx)
}

// gatherShape is GatherRows of k rows of x [n, d...].
type gatherShape struct {
	x    tensor.Shape
	k    int
	dt   tensor.Dtype
	n, d int // x's rows and their elements
}

func (s gatherShape) String() string { return fmt.Sprintf("x=%v,k=%d,%v", s.x, s.k, s.dt) }

func (s gatherShape) out() tensor.Shape {
	o := s.x.Clone()
	o[0] = s.k
	return o
}

func gatherShapeOf(x, idx *G.Node) (gatherShape, error) {
	const op = "GatherRows"
	var none gatherShape
	if x == nil {
		return none, fmt.Errorf("ops: %s: x is nil", op)
	}
	xs := x.Shape()
	if xs.Dims() < 1 {
		return none, fmt.Errorf("ops: %s: x must have shape [N ...], got a scalar", op)
	}
	dt, err := floatDtype(op, "x", x)
	if err != nil {
		return none, err
	}
	if err := positiveSizes(op, "x", xs); err != nil {
		return none, err
	}
	if err := checkRank(op, "idx", idx, 1, "[K]"); err != nil {
		return none, err
	}
	if idt, err := dtypeOf(idx); err != nil || idt != tensor.Int {
		return none, fmt.Errorf("ops: %s: idx must have dtype int, got %v", op, idt)
	}
	k := idx.Shape()[0]
	if k <= 0 {
		return none, fmt.Errorf("ops: %s: idx must have positive length, got %v", op, idx.Shape())
	}
	if k > 1<<31-2 {
		return none, fmt.Errorf("ops: %s: idx has %d entries, more than the kernels' 32-bit chains hold", op, k)
	}
	return gatherShape{x: xs.Clone(), k: k, dt: dt, n: xs[0], d: xs[1:].TotalSize()}, nil
}

func gatherOp(s gatherShape) *specOp {
	return newOp(&opSpec{
		name: "GatherRows", config: s.String(),
		inputs: []argSpec{{name: "x", shape: s.x}, {name: "idx", shape: tensor.Shape{s.k}, dtype: tensor.Int}},
		out:    s.out(), dtype: s.dt,
		cpu: func(in []*tensor.Dense, out *tensor.Dense) error {
			idx := in[1].Ints()
			if s.dt == tensor.Float32 {
				return kernels.GatherRows(s.n, s.d, in[0].Float32s(), idx, out.Float32s())
			}
			return kernels.GatherRows(s.n, s.d, in[0].Float64s(), idx, out.Float64s())
		},
		device:  s.forwardDevice,
		diffWRT: []bool{true, false},
		grad: func(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			dx, err := G.ApplyOp(gatherGradOp(s), grad, in[1])
			if err != nil {
				return nil, fmt.Errorf("ops: GatherRows backward: %w", err)
			}
			return G.Nodes{dx, nil}, nil
		},
	})
}

// gatherGradOp is the backward op: (dy, idx) -> dx. It is linear in dy,
// its gradient GatherRows again.
func gatherGradOp(s gatherShape) *specOp {
	return newOp(&opSpec{
		name: "GatherRows backward", config: s.String(),
		inputs: []argSpec{{name: "grad", shape: s.out()}, {name: "idx", shape: tensor.Shape{s.k}, dtype: tensor.Int}},
		out:    s.x, dtype: s.dt,
		cpu: func(in []*tensor.Dense, out *tensor.Dense) error {
			idx := in[1].Ints()
			if s.dt == tensor.Float32 {
				kernels.GatherRowsBackward(s.n, s.d, in[0].Float32s(), idx, out.Float32s())
			} else {
				kernels.GatherRowsBackward(s.n, s.d, in[0].Float64s(), idx, out.Float64s())
			}
			return nil
		},
		device:  s.backwardDevice,
		diffWRT: []bool{true, false},
		grad: func(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			d, err := G.ApplyOp(gatherOp(s), grad, in[1])
			if err != nil {
				return nil, fmt.Errorf("ops: GatherRows backward's gradient: %w", err)
			}
			return G.Nodes{d, nil}, nil
		},
	})
}

// statusError explains the status word's code for a bad index.
func (s gatherShape) statusError(op string, code int32) error {
	if code == cuda.LayoutStatusBadIndex {
		return fmt.Errorf("ops: %s: an index is outside [0, %d); its row is zero", op, s.n)
	}
	return nil
}

// forwardDevice is gatherOp's device launcher.
func (s gatherShape) forwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	const op = "GatherRows"
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	status, err := a.dev.StatusWord()
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", op, err)
	}
	a.dev.WatchStatus(func(code int32) error { return s.statusError(op, code) })
	elem := int(s.dt.Size())
	u := layoutUnit(elem, int64(s.d*elem), int64(a.ptr[0]), int64(outPtr))
	k := map[int]cuda.Kernel[cuda.GatherParams]{4: cuda.LayoutGatherRowsB4, 8: cuda.LayoutGatherRowsB8, 16: cuda.LayoutGatherRowsB16}[u]
	args := cuda.GatherParams{
		X: a.ptr[0], Idx: a.ptr[1], Out: outPtr, Status: status,
		N: int64(s.n), K: int64(s.k), D: int64(s.d * elem / u),
	}
	if err := k.Launch(a.dev, rowsLaunch(int(args.D), s.k), args); err != nil {
		return nil, fmt.Errorf("ops: %s: %w", op, err)
	}
	return out, nil
}

// backwardDevice is gatherGradOp's device launcher: zeros, the chains
// (gather_link, into a scratch tensor), then one sum per chain and column
// (gather_scatter).
func (s gatherShape) backwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	const op = "GatherRows backward"
	dx, dxPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	if err := a.dev.Zero(dx); err != nil {
		return nil, fmt.Errorf("ops: %s: %w", op, err)
	}
	link, err := a.dev.NewDense(tensor.Int32, s.k)
	if err != nil {
		return nil, fmt.Errorf("ops: %s: chains: %w", op, err)
	}
	// The stream orders the free after the kernels that use link.
	defer a.dev.FreeDense(link)
	linkPtr, err := a.dev.Ptr(link)
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", op, err)
	}
	args := cuda.GatherParams{X: a.ptr[0], Idx: a.ptr[1], Out: dxPtr, Link: linkPtr, N: int64(s.n), K: int64(s.k), D: int64(s.d)}
	cfg := backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(ceilDiv(s.k, cuda.LayoutThreads)), Y: 1, Z: 1},
		Block: backend.Dim3{X: cuda.LayoutThreads, Y: 1, Z: 1},
	}
	if err := cuda.LayoutGatherLink.Launch(a.dev, cfg, args); err != nil {
		return nil, fmt.Errorf("ops: %s: %w", op, err)
	}
	k, err := cuda.LayoutGatherScatter(s.dt)
	if err == nil {
		err = k.Launch(a.dev, rowsLaunch(s.d, s.k), args)
	}
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", op, err)
	}
	return dx, nil
}
