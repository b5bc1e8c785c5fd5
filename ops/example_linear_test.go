package ops_test

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/ops"
)

// Map two tokens of three features to two outputs, y = x·wᵀ + b, and take
// the gradients of the sum of y.
func ExampleLinear() {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float64, 3, G.WithShape(1, 2, 3), G.WithName("x"), G.WithValue(
		tensor.New(tensor.WithShape(1, 2, 3), tensor.WithBacking([]float64{
			1, 2, 3,
			4, 5, 6,
		}))))
	w := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 3), G.WithName("w"), G.WithValue(
		tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float64{
			1, 0, -1, // output 0: x0 - x2
			0, 1, 0, // output 1: x1
		}))))
	b := G.NewVector(g, tensor.Float64, G.WithShape(2), G.WithName("b"), G.WithValue(
		tensor.New(tensor.WithShape(2), tensor.WithBacking([]float64{10, 20}))))
	y, err := ops.Linear(x, w, b)
	if err != nil {
		panic(err)
	}
	loss := G.Must(G.Sum(y))
	if _, err := G.Grad(loss, x, w, b); err != nil {
		panic(err)
	}
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		panic(err)
	}
	fmt.Println("y:", y.Shape(), y.Value().Data())
	for _, n := range []*G.Node{x, w, b} {
		d, _ := n.Grad()
		fmt.Printf("dloss/d%s: %v\n", n.Name(), d.Data())
	}
	// Output:
	// y: (1, 2, 2) [8 22 8 25]
	// dloss/dx: [1 1 -1 1 1 -1]
	// dloss/dw: [5 7 9 5 7 9]
	// dloss/db: [2 2]
}
