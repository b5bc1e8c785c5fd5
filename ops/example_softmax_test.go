package ops_test

import (
	"fmt"
	"math"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/ops"
)

// Turn two rows of scores into probabilities along the last axis, and
// their logarithms; then take the gradient of the first row's first
// probability with respect to the scores.
func ExampleSoftmax() {
	g := G.NewGraph()
	scores := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 3), G.WithName("scores"), G.WithValue(
		tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float64{
			0, math.Log(2), math.Log(5), // probabilities 1/8, 2/8, 5/8
			1, 1, math.Inf(-1), // 1/2, 1/2 and 0
		}))))
	p, err := ops.Softmax(scores, -1)
	if err != nil {
		panic(err)
	}
	logp, err := ops.LogSoftmax(scores, -1)
	if err != nil {
		panic(err)
	}
	first := G.Must(G.Slice(p, G.S(0), G.S(0)))
	if _, err := G.Grad(first, scores); err != nil {
		panic(err)
	}
	var pv, lv G.Value
	G.Read(p, &pv)
	G.Read(logp, &lv)
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		panic(err)
	}
	d, _ := scores.Grad()
	fmt.Printf("p:      %.4f\n", pv.Data())
	fmt.Printf("log p:  %.4f\n", lv.Data())
	fmt.Printf("dp0/dx: %.4f\n", d.Data())
	// Output:
	// p:      [0.1250 0.2500 0.6250 0.5000 0.5000 0.0000]
	// log p:  [-2.0794 -1.3863 -0.4700 -0.6931 -0.6931 -Inf]
	// dp0/dx: [0.1094 -0.0312 -0.0781 0.0000 0.0000 0.0000]
}
