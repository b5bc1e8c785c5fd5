package autograd_test

import (
	"slices"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
)

// TestUnpackedPartFeedsADifferentiableOp: a part of a packed vector (a host
// step's output, say) may be an operand of a differentiable op: G.Grad
// treats it as data, the other operand gets its gradient, and the parts
// hold the packed values.
func TestUnpackedPartFeedsADifferentiableOp(t *testing.T) {
	g := G.NewGraph()
	packed := G.NewVector(g, tensor.Float64, G.WithShape(5), G.WithName("packed"),
		G.WithValue(tensor.New(tensor.WithBacking([]float64{1, 2, 3, 4, 5}))))
	w := G.NewVector(g, tensor.Float64, G.WithShape(3), G.WithName("w"),
		G.WithValue(tensor.New(tensor.WithBacking([]float64{0.5, -1, 2}))))
	parts, err := autograd.Unpack(packed, tensor.Shape{2}, tensor.Shape{3})
	if err != nil {
		t.Fatal(err)
	}
	loss := G.Must(G.Sum(G.Must(G.HadamardProd(parts[1], w))))
	grads, err := G.Grad(loss, w)
	if err != nil {
		t.Fatal(err)
	}
	var first G.Value
	G.Read(parts[0], &first)
	vm := G.NewTapeMachine(g)
	defer vm.Close()
	if err := vm.RunAll(); err != nil {
		t.Fatal(err)
	}
	if got := grads[0].Value().Data().([]float64); !slices.Equal(got, []float64{3, 4, 5}) {
		t.Errorf("dloss/dw = %v, want the part [3 4 5]", got)
	}
	if got := first.Data().([]float64); !slices.Equal(got, []float64{1, 2}) {
		t.Errorf("first part %v, want [1 2]", got)
	}
	if _, err := G.Grad(loss, packed); err == nil {
		t.Error("G.Grad took a gradient with respect to the packed vector")
	}
}
