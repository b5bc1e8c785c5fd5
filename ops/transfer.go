package ops

import (
	"fmt"
	"hash"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

// ToDevice returns a node holding x's value copied to dev. Gradients flow
// back to wherever x lives. Put it after graph inputs that hold host values
// (RoIs sampled on the host, say) so that the ops after it run on the GPU.
func ToDevice(x *G.Node, dev *backend.Device) (*G.Node, error) {
	if x == nil || dev == nil {
		return nil, fmt.Errorf("ops: ToDevice: x and dev must not be nil")
	}
	return G.ApplyOp(&moveOp{dev: dev, rank: x.Shape().Dims()}, x)
}

// ToHost returns a node holding x's value copied to host memory; a host
// value is copied as is. Gradients flow back to wherever x lives. Put it
// before gorgonia ops that only run on the host, such as a loss.
func ToHost(x *G.Node) (*G.Node, error) {
	if x == nil {
		return nil, fmt.Errorf("ops: ToHost: x must not be nil")
	}
	return G.ApplyOp(&moveOp{rank: x.Shape().Dims()}, x)
}

// moveOp copies its input to dev (to the host when dev is nil).
type moveOp struct {
	dev  *backend.Device
	rank int
}

func (op *moveOp) Arity() int            { return 1 }
func (op *moveOp) Type() hm.Type         { return fnType(op.rank, op.rank) }
func (op *moveOp) ReturnsPtr() bool      { return false }
func (op *moveOp) CallsExtern() bool     { return false }
func (op *moveOp) OverwritesInput() int  { return -1 }
func (op *moveOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *moveOp) Hashcode() uint32      { return hashOf(op) }
func (op *moveOp) String() string {
	if op.dev == nil {
		return "ToHost"
	}
	// The pointer keeps two devices (or two opened handles) apart.
	return fmt.Sprintf("ToDevice(%v@%p)", op.dev, op.dev)
}

func (op *moveOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("ops: %v: want 1 input, got %d", op, len(in))
	}
	s, err := shapeOf(op.String(), in[0])
	if err != nil {
		return nil, err
	}
	return s.Clone(), nil
}

func (op *moveOp) Do(in ...G.Value) (G.Value, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("ops: %v: want 1 input, got %d", op, len(in))
	}
	return move(op.String(), in[0], op.dev)
}

// move copies v to dev, or to the host when dev is nil.
func move(op string, v G.Value, dev *backend.Device) (G.Value, error) {
	t, ok := v.(*tensor.Dense)
	if !ok {
		return nil, fmt.Errorf("ops: %s: want a *tensor.Dense, got %T", op, v)
	}
	from, err := backend.DeviceOf(t)
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", op, err)
	}
	var out *tensor.Dense
	switch {
	case dev != nil:
		out, err = dev.ToDevice(t)
	case from != nil:
		out, err = from.ToHost(t)
	default:
		out = t.Clone().(*tensor.Dense)
	}
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", op, err)
	}
	return out, nil
}

func (op *moveOp) DiffWRT(int) []bool { return []bool{true} }

// The gradient goes back to where the input lives.
func (op *moveOp) SymDiff(in G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("ops: %v: want 1 input, got %d", op, len(in))
	}
	g, err := G.ApplyOp(&moveLikeOp{rank: op.rank}, grad, in[0])
	if err != nil {
		return nil, fmt.Errorf("ops: %v backward: %w", op, err)
	}
	return G.Nodes{g}, nil
}

// moveLikeOp copies its first input to wherever its second input lives (a
// device, or the host). Its second input is only looked at, not read.
type moveLikeOp struct{ rank int }

func (op *moveLikeOp) Arity() int            { return 2 }
func (op *moveLikeOp) Type() hm.Type         { return fnType(op.rank, op.rank, op.rank) }
func (op *moveLikeOp) ReturnsPtr() bool      { return false }
func (op *moveLikeOp) CallsExtern() bool     { return false }
func (op *moveLikeOp) OverwritesInput() int  { return -1 }
func (op *moveLikeOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *moveLikeOp) Hashcode() uint32      { return hashOf(op) }
func (op *moveLikeOp) String() string        { return "MoveLike" }

func (op *moveLikeOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("ops: %v: want 2 inputs, got %d", op, len(in))
	}
	s, err := shapeOf(op.String(), in[0])
	if err != nil {
		return nil, err
	}
	return s.Clone(), nil
}

func (op *moveLikeOp) Do(in ...G.Value) (G.Value, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("ops: %v: want 2 inputs, got %d", op, len(in))
	}
	dev, err := backend.DeviceOf(in[1])
	if err != nil {
		return nil, fmt.Errorf("ops: %v: %w", op, err)
	}
	return move(op.String(), in[0], dev)
}

func (op *moveLikeOp) DiffWRT(int) []bool { return []bool{true, false} }

func (op *moveLikeOp) SymDiff(in G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("ops: %v: want 2 inputs, got %d", op, len(in))
	}
	g, err := G.ApplyOp(&moveLikeOp{rank: op.rank}, grad, in[0])
	if err != nil {
		return nil, fmt.Errorf("ops: %v backward: %w", op, err)
	}
	return G.Nodes{g, nil}, nil
}
