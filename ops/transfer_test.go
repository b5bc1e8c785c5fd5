package ops

import (
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
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

// Scalars stay on the host, as gorgonia's own values.
func TestToHostScalar(t *testing.T) {
	g := G.NewGraph()
	x := G.NewScalar(g, tensor.Float64, G.WithName("x"))
	if _, err := ToHost(x); err == nil || !strings.Contains(err.Error(), "ops: ToHost: x must be a tensor, got a scalar") {
		t.Errorf("got error %v", err)
	}
}
