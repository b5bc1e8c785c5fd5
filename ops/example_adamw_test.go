package ops_test

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/ops"
)

// Train a weight and a bias of a graph with AdamW in two parameter groups:
// the weight at learning rate 0.1 with weight decay 0.5, the bias at 0.01
// without, the gradients clipped to a global norm of 1. The loss sum(w*x)
// + sum(b*10) has the constant gradients x = (1, -2) and 10, of norm
// sqrt(105) together. With constant gradients Adam's m_hat/sqrt(v_hat) is
// the gradient's sign, whatever the clipping: each step scales w by 1 -
// 0.1*0.5 and then moves each parameter by its learning rate against its
// gradient.
func ExampleAdamW() {
	g := G.NewGraph()
	vec := func(name string, v ...float64) *G.Node {
		return G.NewVector(g, tensor.Float64, G.WithShape(len(v)), G.WithName(name), G.WithValue(tensor.New(tensor.WithShape(len(v)), tensor.WithBacking(v))))
	}
	w, x := vec("w", 1, 1), vec("x", 1, -2)
	b, ten := vec("b", 0), vec("ten", 10)
	loss := G.Must(G.Add(G.Must(G.Sum(G.Must(G.HadamardProd(w, x)))), G.Must(G.Sum(G.Must(G.HadamardProd(b, ten))))))
	if _, err := G.Grad(loss, w, b); err != nil {
		panic(err)
	}
	m := G.NewTapeMachine(g, G.BindDualValues(w, b))
	defer m.Close()

	cfg := ops.DefaultAdamWConfig()
	cfg.MaxGradNorm = 1
	opt, err := ops.NewAdamW([]ops.ParamGroup{
		{Params: G.NodesToValueGrads(G.Nodes{w}), LR: 0.1, WeightDecay: 0.5},
		{Params: G.NodesToValueGrads(G.Nodes{b}), LR: 0.01},
	}, cfg)
	if err != nil {
		panic(err)
	}
	for step := 1; step <= 2; step++ {
		if err := m.RunAll(); err != nil {
			panic(err)
		}
		if err := opt.Step(G.NodesToValueGrads(G.Nodes{w, b})); err != nil {
			panic(err)
		}
		m.Reset()
		norm, err := opt.GradNorm()
		if err != nil {
			panic(err)
		}
		fmt.Printf("step %d: gradient norm %.4f, w = %.4f, b = %.4f\n", step, norm, w.Value().Data(), b.Value().Data())
	}
	// Output:
	// step 1: gradient norm 10.2470, w = [0.8500 1.0500], b = [-0.0100]
	// step 2: gradient norm 10.2470, w = [0.7075 1.0975], b = [-0.0200]
}
