package ops_test

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/ops"
)

// Normalise two tokens of four features, scale and shift them, and take
// the gradients of the sum of every token's first and last features (the
// values PyTorch's F.layer_norm gives).
func ExampleLayerNorm() {
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 4), G.WithName("x"), G.WithValue(
		tensor.New(tensor.WithShape(2, 4), tensor.WithBacking([]float64{
			1, 2, 3, 4, // mean 2.5, variance 1.25
			0, 0, 4, 4, // mean 2, variance 4
		}))))
	gamma := G.NewVector(g, tensor.Float64, G.WithShape(4), G.WithName("gamma"), G.WithValue(
		tensor.New(tensor.WithShape(4), tensor.WithBacking([]float64{1, 1, 2, 2}))))
	beta := G.NewVector(g, tensor.Float64, G.WithShape(4), G.WithName("beta"), G.WithValue(
		tensor.New(tensor.WithShape(4), tensor.WithBacking([]float64{0, 0, 0, 10}))))
	y, err := ops.LayerNorm(x, gamma, beta, ops.DefaultEps)
	if err != nil {
		panic(err)
	}
	ends := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 4), G.WithName("ends"), G.WithValue(
		tensor.New(tensor.WithShape(2, 4), tensor.WithBacking([]float64{1, 0, 0, 1, 1, 0, 0, 1}))))
	loss := G.Must(G.Sum(G.Must(G.HadamardProd(y, ends))))
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
	// y: [-1.3416 -0.4472 0.8944 12.6833 -1.0000 -1.0000 2.0000 12.0000]
	// dloss/dx: [0.6261 -0.5367 -0.8050 0.7155 0.2500 -0.2500 -0.5000 0.5000]
	// dloss/dgamma: [-2.3416 0.0000 0.0000 2.3416]
	// dloss/dbeta: [2.0000 0.0000 0.0000 2.0000]
}
