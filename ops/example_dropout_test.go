package ops_test

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/ops"
)

// A graph built once and run for three training steps, then evaluated:
// Next draws a new mask for each step (kept elements are scaled by
// 1/(1-p) = 2), SetStep draws an old one again, and outside training
// Dropout is the identity.
func ExampleDropout() {
	g := G.NewGraph()
	x := G.NewVector(g, tensor.Float32, G.WithShape(8), G.WithName("x"), G.WithValue(
		tensor.New(tensor.WithShape(8), tensor.WithBacking([]float32{1, 1, 1, 1, 1, 1, 1, 1}))))
	rng := ops.NewDropoutRNG(2026)
	y, err := ops.Dropout(x, 0.5, rng)
	if err != nil {
		panic(err)
	}
	m := G.NewTapeMachine(g)
	defer m.Close()
	run := func(what string) {
		if err := m.RunAll(); err != nil {
			panic(err)
		}
		fmt.Printf("%-8s %v\n", what, y.Value().Data())
		m.Reset()
	}
	run("step 0:")
	rng.Next()
	run("step 1:")
	rng.Next()
	run("step 2:")
	rng.SetStep(0)
	run("step 0:")
	rng.SetTraining(false)
	run("eval:")
	// Output:
	// step 0:  [2 0 0 2 0 2 2 0]
	// step 1:  [0 2 0 0 0 0 0 0]
	// step 2:  [2 0 2 0 0 2 0 0]
	// step 0:  [2 0 0 2 0 2 2 0]
	// eval:    [1 1 1 1 1 1 1 1]
}
