package ops_test

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/ops"
)

// Normalise an image of four channels of 1x2 pixels in two groups of two
// channels, scale and shift it per channel, and take the gradients of the
// sum of every channel's first pixel (the values PyTorch's F.group_norm
// gives).
func ExampleGroupNorm() {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float64, 4, G.WithShape(1, 4, 1, 2), G.WithName("x"), G.WithValue(
		tensor.New(tensor.WithShape(1, 4, 1, 2), tensor.WithBacking([]float64{
			1, 2, 3, 4, // group 0: mean 2.5, variance 1.25
			0, 0, 4, 4, // group 1: mean 2, variance 4
		}))))
	gamma := G.NewVector(g, tensor.Float64, G.WithShape(4), G.WithName("gamma"), G.WithValue(
		tensor.New(tensor.WithShape(4), tensor.WithBacking([]float64{1, 1, 2, 2}))))
	beta := G.NewVector(g, tensor.Float64, G.WithShape(4), G.WithName("beta"), G.WithValue(
		tensor.New(tensor.WithShape(4), tensor.WithBacking([]float64{0, 0, 0, 10}))))
	y, err := ops.GroupNorm(x, 2, gamma, beta, ops.DefaultEps)
	if err != nil {
		panic(err)
	}
	firsts := G.NewTensor(g, tensor.Float64, 4, G.WithShape(1, 4, 1, 2), G.WithName("firsts"), G.WithValue(
		tensor.New(tensor.WithShape(1, 4, 1, 2), tensor.WithBacking([]float64{1, 0, 1, 0, 1, 0, 1, 0}))))
	loss := G.Must(G.Sum(G.Must(G.HadamardProd(y, firsts))))
	if _, err := G.Grad(loss, x, gamma, beta); err != nil {
		panic(err)
	}
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		panic(err)
	}
	fmt.Printf("y: %.4f\n", y.Value().Data())
	for _, n := range []*G.Node{x, gamma, beta} {
		d, _ := n.Grad()
		fmt.Printf("dloss/d%s: %.4f\n", n.Name(), d.Data())
	}
	// Output:
	// y: [-1.3416 -0.4472 0.4472 1.3416 -2.0000 -2.0000 12.0000 12.0000]
	// dloss/dx: [0.1789 -0.5367 0.5367 -0.1789 0.5000 -0.5000 0.5000 -0.5000]
	// dloss/dgamma: [-1.3416 0.4472 -1.0000 1.0000]
	// dloss/dbeta: [1.0000 1.0000 1.0000 1.0000]
}
