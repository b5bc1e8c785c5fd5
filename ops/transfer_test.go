package ops

import (
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

// ToHost copies a host value as is, and its gradient flows back (through
// MoveLike) to the host.
func TestToHostOnTheHost(t *testing.T) {
	x := tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float64{1, 2, 3, 4, 5, 6}))
	move := func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) { return ToHost(in[0]) }
	got, shape, err := runGraph(t, []*tensor.Dense{x}, move)
	if err != nil {
		t.Fatal(err)
	}
	if !shape.Eq(x.Shape()) || !equalFloats(got, x.Float64s()) {
		t.Errorf("got %v %v, want %v %v", shape, got, x.Shape(), x.Float64s())
	}
	p := tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float64{6, 5, 4, 3, 2, 1}))
	if g := gradOf(t, []*tensor.Dense{x}, p, []int{0}, move); !equalFloats(g[0], p.Float64s()) {
		t.Errorf("gradient %v, want %v", g[0], p.Float64s())
	}
}

// A scalar comes to the host too (a device loss does): a host scalar is
// copied as is. ToDevice refuses scalars, which gorgonia keeps on the host.
func TestToHostScalar(t *testing.T) {
	g := G.NewGraph()
	x := G.NewScalar(g, tensor.Float64, G.WithName("x"), G.WithValue(2.5))
	h, err := ToHost(x)
	if err != nil {
		t.Fatal(err)
	}
	var got G.Value
	G.Read(h, &got)
	m, err := NewTapeMachine(g)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.RunAll(); err != nil {
		t.Fatal(err)
	}
	if f, ok := got.(*G.F64); !ok || float64(*f) != 2.5 {
		t.Errorf("ToHost(2.5) = %v (%T)", got, got)
	}
	if _, err := ToDevice(x, new(backend.Device)); err == nil || !strings.Contains(err.Error(), "ops: ToDevice: x must be a tensor, got a scalar") {
		t.Errorf("ToDevice of a scalar: %v", err)
	}
}
