package ops

import (
	"math/rand/v2"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
)

func upsampleBy(f int) func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
	return func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) { return UpsampleNearest(in[0], f) }
}

func TestUpsampleNearestHandValues(t *testing.T) {
	x := tensor.New(tensor.WithShape(1, 2, 1, 2), tensor.WithBacking([]float64{1, 2, 3, 4}))
	got, shape, err := runGraph(t, []*tensor.Dense{x}, upsampleBy(2))
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{
		1, 1, 2, 2,
		1, 1, 2, 2,
		3, 3, 4, 4,
		3, 3, 4, 4,
	}
	if !shape.Eq(tensor.Shape{1, 2, 2, 4}) || !equalFloats(got, want) {
		t.Errorf("got %v %v, want (1, 2, 2, 4) %v", shape, got, want)
	}
	// The gradient of sum(y ⊙ p) sums p over each block.
	p := tensor.New(tensor.WithShape(1, 2, 2, 4), tensor.WithBacking([]float64{
		1, 2, 3, 4,
		5, 6, 7, 8,
		0, 0, 1, 0,
		0, 10, 0, 100,
	}))
	grads := gradOf(t, []*tensor.Dense{x}, p, []int{0}, upsampleBy(2))
	if want := []float64{14, 22, 10, 101}; !equalFloats(grads[0], want) {
		t.Errorf("gradient %v, want %v", grads[0], want)
	}
}

// Against gorgonia's Upsample2D, which computes the same thing.
func TestUpsampleNearestMatchesGorgonia(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, f := range []int{1, 2, 3} {
		x := randTensor(rng, tensor.Float32, -1, 1, 2, 3, 4, 5)
		got, _, err := runGraph(t, []*tensor.Dense{x}, upsampleBy(f))
		if err != nil {
			t.Fatal(err)
		}
		want, _, err := runGraph(t, []*tensor.Dense{x}, func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
			return G.Upsample2D(in[0], f)
		})
		if err != nil {
			t.Fatal(err)
		}
		if !equalFloats(got, want) {
			t.Errorf("factor %d: differs from gorgonia's Upsample2D", f)
		}
	}
}

func TestUpsampleNearestGradCheck(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, f := range []int{2, 3} {
		x := randTensor(rng, tensor.Float64, -1, 1, 2, 2, 3, 4)
		if _, err := autograd.CheckGrad(upsampleBy(f), []autograd.Input{{Name: "x", Value: x}}, uint64(f)); err != nil {
			t.Errorf("factor %d: %v", f, err)
		}
	}
}

func TestUpsampleNearestBadInput(t *testing.T) {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float32, 4, G.WithShape(1, 2, 3, 3), G.WithName("x"))
	x3 := G.NewTensor(g, tensor.Float32, 3, G.WithShape(2, 3, 3), G.WithName("x3"))
	xi := G.NewTensor(g, tensor.Int, 4, G.WithShape(1, 2, 3, 3), G.WithName("xi"))
	for _, c := range []struct {
		name   string
		x      *G.Node
		factor int
		want   string
	}{
		{"factor", x, 0, "factor must be at least 1"},
		{"rank", x3, 2, "x must have shape [N C H W]"},
		{"dtype", xi, 2, "x must be float32 or float64"},
	} {
		_, err := UpsampleNearest(c.x, c.factor)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got error %v, want one containing %q", c.name, err, c.want)
		}
	}
}
