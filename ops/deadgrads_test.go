package ops

import (
	"slices"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// TestNewTapeMachinePrunesUnreadGradients: G.Grad of a loss with respect
// to x makes the gradient of the broadcast constant c too (Sum over the
// broadcast dims) and of the frozen weight w; NewTapeMachine removes them
// and what only they read, and x's gradient comes out as before.
func TestNewTapeMachinePrunesUnreadGradients(t *testing.T) {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float64, 2, G.WithShape(4, 3), G.WithName("x"),
		G.WithValue(tensor.New(tensor.WithShape(4, 3), tensor.WithBacking([]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}))))
	c := G.NewTensor(g, tensor.Float64, 2, G.WithShape(1, 3), G.WithName("c"),
		G.WithValue(tensor.New(tensor.WithShape(1, 3), tensor.WithBacking([]float64{0.5, -1, 2}))))
	w := G.NewTensor(g, tensor.Float64, 2, G.WithShape(4, 3), G.WithName("w"),
		G.WithValue(tensor.New(tensor.WithShape(4, 3), tensor.WithBacking([]float64{1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4}))))
	sum := G.Must(Add(x, c))
	prod := G.Must(Mul(sum, w))
	loss := G.Must(Sum(prod, nil, false))
	grads, err := G.Grad(loss, x)
	if err != nil {
		t.Fatal(err)
	}
	before := len(g.AllNodes())
	vm, err := NewTapeMachine(g)
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	after := g.AllNodes()
	// The gradient of c (a Sum to [1, 3] of dsum) and of w (sum * dprod)
	// are unread: at least those two go.
	if before-len(after) < 2 {
		t.Fatalf("%d nodes before NewTapeMachine, %d after: the unread gradients were not removed", before, len(after))
	}
	for _, n := range []*G.Node{x, c, w, sum, prod, loss, grads[0]} {
		if !slices.Contains(after, n) {
			t.Errorf("node %v was removed", n)
		}
	}
	for _, n := range after {
		if s := n.String(); strings.Contains(s, "Sum") && n.Shape().Eq(tensor.Shape{1, 3}) {
			t.Errorf("c's gradient %v is still in the graph", n)
		}
	}
	// Every node is found by its ID: gorgonia's index of them was rebuilt.
	for _, n := range after {
		if got := g.Node(n.ID()); got != n {
			t.Fatalf("node %d (%v) looks up as %v", n.ID(), n, got)
		}
	}
	if err := vm.RunAll(); err != nil {
		t.Fatal(err)
	}
	if got, want := grads[0].Value().Data().([]float64), []float64{1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4}; !slices.Equal(got, want) {
		t.Errorf("dloss/dx = %v, want w %v", got, want)
	}
}
