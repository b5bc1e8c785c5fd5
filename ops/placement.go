package ops

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	G "gorgonia.org/gorgonia"

	"github.com/stheno-ml/stheno/backend"
)

// CheckPlacement finds, before anything runs, the nodes of g that would be
// handed device values they cannot take: a gorgonia op (they read their
// inputs on the host) or an op of this package without device kernels fed
// by a device-resident node, and an op fed by the host and a device at
// once. Each problem is one line naming the node, where its device input
// comes from, and the op of this package to use instead (or ops.ToHost).
//
// Where a node's values live is worked out from the graph: ToDevice puts
// them on its device and ToHost on the host; an input node holds what is
// bound to it now (unknown while nothing is, and then trusted); this
// package's ops with device kernels follow their inputs; gorgonia's ops
// leave values on the host. Two of gorgonia's ops take device values:
// Reshape, which changes only metadata, and the elementwise + that G.Grad
// inserts to sum the gradients of a node used twice (between tensors of
// one shape, or a tensor and a scalar), which backend's Engine runs; and
// SizeOf reads only a device value's shape. An op of another package that
// runs on device values says so by implementing DeviceOp (autograd's
// Unpack does).
//
// Call it on the finished graph, after G.Grad; NewTapeMachine does.
func CheckPlacement(g *G.ExprGraph) error {
	_, _, err := placements(g)
	return err
}

// DeviceOp is implemented by gorgonia ops of other packages that run on
// device values, as this package's ops do: RunsOnDevice reports true when
// the op takes its inputs on one device (scalars on the host) and writes
// its output, in memory of its own, on that device. CheckPlacement then
// lets the op take device values, and NewTapeMachine frees its inputs
// after it like those of this package's ops. autograd's Unpack is one.
type DeviceOp interface {
	G.Op
	RunsOnDevice() bool
}

// placements works out where every node's values live (CheckPlacement),
// and returns the nodes in the order the tape machine runs them.
func placements(g *G.ExprGraph) (G.Nodes, map[*G.Node]place, error) {
	if g == nil {
		return nil, nil, errors.New("ops: CheckPlacement: the graph is nil")
	}
	order, err := G.Sort(g)
	if err != nil {
		return nil, nil, fmt.Errorf("ops: CheckPlacement: %w", err)
	}
	// G.Sort puts the roots first; the tape machine, as the walk here,
	// starts from the leaves.
	slices.Reverse(order)
	places := make(map[*G.Node]place, len(order))
	var problems []error
	for _, n := range order {
		p, err := placeOf(n, children(g, n), places)
		if err != nil {
			problems = append(problems, err)
		}
		places[n] = p
	}
	return order, places, errors.Join(problems...)
}

// placeKind is where a node's values live, as far as the graph tells.
type placeKind int

const (
	placeUnknown placeKind = iota // an input with nothing bound yet
	placeHost
	placeDevice
)

// place is where a node's values live, and for device values the device.
type place struct {
	kind placeKind
	dev  *backend.Device
}

// children returns n's inputs in argument order.
func children(g *G.ExprGraph, n *G.Node) []*G.Node {
	it := g.From(n.ID())
	var out []*G.Node
	for it.Next() {
		out = append(out, it.Node().(*G.Node))
	}
	return out
}

// placeOf works out where n's values will live from its inputs' places,
// and reports an input that n cannot take.
func placeOf(n *G.Node, in []*G.Node, places map[*G.Node]place) (place, error) {
	if n.Op() == nil {
		// An input: what is bound to it, if anything.
		switch v := n.Value(); {
		case v == nil:
			return place{kind: placeUnknown}, nil
		case backend.IsDevice(v):
			dev, err := backend.DeviceOf(v)
			if err != nil {
				return place{}, fmt.Errorf("ops: %s: %w", nodeName(n), err)
			}
			return place{kind: placeDevice, dev: dev}, nil
		default:
			return place{kind: placeHost}, nil
		}
	}
	// The first device input, if any; a non-scalar host input beside it
	// is a mix no op takes.
	var dev place
	var devArg, hostArg *G.Node
	known := true
	for _, c := range in {
		p := places[c]
		switch {
		case p.kind == placeDevice && dev.kind != placeDevice:
			dev, devArg = p, c
		case p.kind == placeDevice && p.dev != dev.dev:
			return place{}, fmt.Errorf("ops: %s takes %s on %v and %s on %v: an op runs on one device",
				nodeName(n), nodeName(c), p.dev, nodeName(devArg), dev.dev)
		case p.kind == placeHost && !c.IsScalar():
			hostArg = c
		case p.kind == placeUnknown:
			known = false
		}
	}
	op, ours := n.Op().(*specOp)
	foreign, isForeign := n.Op().(DeviceOp)
	onDevice := isForeign && !ours && foreign.RunsOnDevice()
	if !ours && strings.HasPrefix(n.Op().String(), "SizeOf") {
		// A length, read from the shape: a host scalar.
		return place{kind: placeHost}, nil
	}
	if ours && op.run != nil {
		return op.placeMoved(in, places), nil
	}
	if dev.kind != placeDevice {
		if known {
			return place{kind: placeHost}, nil
		}
		return place{kind: placeUnknown}, nil
	}
	switch {
	case ours && op.device == nil:
		return place{}, fmt.Errorf("ops: %s takes device values from %s, but %s has no GPU kernel yet; move its inputs to the host with ops.ToHost",
			nodeName(n), nodeName(devArg), op.name)
	case (ours || onDevice) && hostArg != nil:
		return place{}, fmt.Errorf("ops: %s takes %s from the host and %s from %v; move it with ops.ToDevice",
			nodeName(n), nodeName(hostArg), nodeName(devArg), dev.dev)
	case ours, onDevice, hostArg == nil && takesDeviceValues(n, in):
		return dev, nil
	}
	return place{}, fmt.Errorf("ops: %s takes device values from %s, but gorgonia's %q runs on the host only; %s",
		nodeName(n), nodeName(devArg), opName(n.Op()), deviceAdvice(n, in, devArg))
}

// opName is a gorgonia op's String without the flag its elementwise ops
// print after their symbol ("+ false").
func opName(op G.Op) string {
	s := op.String()
	s = strings.TrimSuffix(s, " false")
	return strings.TrimSuffix(s, " true")
}

// placeMoved is where a placement op (ToDevice, ToHost, MoveLike) puts
// its output, given its inputs' places.
func (op *specOp) placeMoved(in []*G.Node, places map[*G.Node]place) place {
	switch {
	case op.moveTo != nil:
		return place{kind: placeDevice, dev: op.moveTo}
	case op.moveLike:
		return places[in[1]]
	}
	return place{kind: placeHost}
}

// takesDeviceValues says whether n, a gorgonia op fed by a device value
// and no host tensor, is one of the two that run on device values:
// Reshape, and + between tensors of one shape or of a tensor and a scalar.
func takesDeviceValues(n *G.Node, in []*G.Node) bool {
	s := n.Op().String()
	switch {
	case strings.HasPrefix(s, "Reshape"):
		return true
	case strings.HasPrefix(s, "+ ") && len(in) == 2:
		// Two scalars take gorgonia's scalar op, which reads host values.
		a, b := in[0], in[1]
		return a.IsScalar() != b.IsScalar() || !a.IsScalar() && a.Shape().Eq(b.Shape())
	}
	return false
}

// deviceAdviceByOp names this package's replacement for gorgonia's ops,
// keyed by the start of the op's String.
var deviceAdviceByOp = []struct{ prefix, use string }{
	{"+ ", "use ops.Add (it broadcasts)"},
	{"- ", "use ops.Sub"},
	{"⊙ ", "use ops.Mul, or ops.Scale for a constant factor"},
	{"÷ ", "use ops.Div (ops.Mean for a mean)"},
	{"A ××× B", "use ops.BatchedMatMul"},
	{"A × B", "use ops.MatMul, or ops.Linear"},
	{"Softmax", "use ops.Softmax or ops.LogSoftmax"},
	{"sigmoid", "use ops.Sigmoid"},
	{"exp", "use ops.Exp"},
	{"ln", "use ops.Log"},
	{"sqrt", "use ops.Sqrt"},
	{"square", "use ops.Square"},
	{"Σ", "use ops.Sum"},
	{"Aᵀ", "use ops.Permute"},
	{"Concat", "use ops.Concat"},
	{"T[", "use ops.Slice"},
	{"Dropout", "use ops.Dropout"},
	{"MaxPool", "use ops.MaxPool2d"},
}

// deviceAdvice says what to use instead of n, a gorgonia op, on device
// values; devArg is its first device input.
func deviceAdvice(n *G.Node, in []*G.Node, devArg *G.Node) string {
	if devArg.IsScalar() {
		// A loss: this package's ops take tensors, and ToHost too.
		return "add losses with ops.SumLosses and weigh them through their weights, or read one on the host with G.Reshape to [1] and ops.ToHost"
	}
	s := n.Op().String()
	for _, a := range deviceAdviceByOp {
		if strings.HasPrefix(s, a.prefix) {
			return a.use + ", or move the input to the host with ops.ToHost"
		}
	}
	return "move the input to the host with ops.ToHost"
}

// nodeName names n in an error: its id, and its name cut short (a node's
// name spells its whole expression).
func nodeName(n *G.Node) string {
	name := n.Name()
	if r := []rune(name); len(r) > 60 {
		name = string(r[:57]) + "..."
	}
	return fmt.Sprintf("node %d %q", n.ID(), name)
}
