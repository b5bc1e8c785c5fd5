package ops

import (
	"fmt"

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
	if err := checkMovable("ToDevice", x); err != nil {
		return nil, err
	}
	return G.ApplyOp(moveOp(x.Shape().Clone(), dev), x)
}

// ToHost returns a node holding x's value copied to host memory; a host
// value is copied as is. x may be a scalar: a loss on the device. Gradients flow back to wherever x lives. Put it
// before gorgonia ops that only run on the host, such as a loss.
func ToHost(x *G.Node) (*G.Node, error) {
	if x == nil {
		return nil, fmt.Errorf("ops: ToHost: x must not be nil")
	}
	// A scalar may live on a device: a loss of this package's.
	return G.ApplyOp(moveOp(x.Shape().Clone(), nil), x)
}

// checkMovable refuses scalars for ToDevice: gorgonia's own scalars live on
// the host as *F32 and *F64 values, which have no device form.
func checkMovable(op string, x *G.Node) error {
	if x.Shape().Dims() == 0 {
		return fmt.Errorf("ops: %s: x must be a tensor, got a scalar", op)
	}
	return nil
}

// moveOp copies its input, of the given shape, to dev (to the host when dev
// is nil).
func moveOp(shape tensor.Shape, dev *backend.Device) *specOp {
	name, config := "ToHost", fmt.Sprintf("x=%v", shape)
	if dev != nil {
		// The pointer keeps two devices (or two opened handles) apart.
		name, config = "ToDevice", fmt.Sprintf("x=%v,dev=%v@%p", shape, dev, dev)
	}
	return newOp(&opSpec{
		name: name, config: config,
		inputs: []argSpec{{name: "x", shape: shape}}, out: shape,
		run: func(in []G.Value, _ G.Value) (G.Value, error) {
			return move(name, in[0], dev)
		},
		moveTo:  dev,
		diffWRT: []bool{true},
		// The gradient goes back to where the input lives.
		grad: func(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			g, err := G.ApplyOp(moveLikeOp(grad.Shape().Clone()), grad, in[0])
			if err != nil {
				return nil, fmt.Errorf("ops: %s backward: %w", name, err)
			}
			return G.Nodes{g}, nil
		},
	})
}

// moveLikeOp copies its first input, of the given shape, to wherever its
// second input lives (a device, or the host). Its second input is only
// looked at, not read.
func moveLikeOp(shape tensor.Shape) *specOp {
	const name = "MoveLike"
	return newOp(&opSpec{
		name: name, config: fmt.Sprintf("x=%v", shape),
		inputs: []argSpec{{name: "x", shape: shape}, {name: "like", shape: shape}}, out: shape,
		moveLike: true,
		run: func(in []G.Value, _ G.Value) (G.Value, error) {
			dev, err := backend.DeviceOf(in[1])
			if err != nil {
				return nil, fmt.Errorf("ops: %s: %w", name, err)
			}
			return move(name, in[0], dev)
		},
		diffWRT: []bool{true, false},
		grad: func(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			g, err := G.ApplyOp(moveLikeOp(grad.Shape().Clone()), grad, in[0])
			if err != nil {
				return nil, fmt.Errorf("ops: %s backward: %w", name, err)
			}
			return G.Nodes{g, nil}, nil
		},
	})
}

// move copies v to dev, or to the host when dev is nil.
func move(op string, v G.Value, dev *backend.Device) (G.Value, error) {
	if dev == nil {
		// A host scalar (a loss of gorgonia's) is copied as is.
		switch s := v.(type) {
		case *G.F32:
			c := *s
			return &c, nil
		case *G.F64:
			c := *s
			return &c, nil
		}
	}
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
