package ops_test

import (
	"errors"
	"fmt"
	"math/rand/v2"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/ops"
)

// A whole training loop on the GPU, as README shows it: parameters that
// live on the device, a batch bound to input nodes each step and moved to
// the device in the graph, G.Grad, ParamsWithGrads and AdamW, one Scope
// per step. It fits y = 2*x0 - x1 + 0.5 with a Linear layer. Where there
// is no GPU (or the build lacks the stheno_cuda tag) the same loop runs on
// the host: every value that would live on the device stays there.
func Example_trainingLoop() {
	dev, err := backend.Open(0)
	if err != nil && !errors.Is(err, backend.ErrNoDevice) {
		panic(err)
	}
	if dev != nil {
		defer dev.Close()
	}
	must := func(n *G.Node, err error) *G.Node {
		if err != nil {
			panic(err)
		}
		return n
	}
	// onDevice puts a parameter's first value where the parameters live.
	onDevice := func(t *tensor.Dense) *tensor.Dense {
		if dev == nil {
			return t
		}
		d, err := dev.ToDevice(t)
		if err != nil {
			panic(err)
		}
		return d
	}
	// toDevice moves a step's input into the device part of the graph.
	toDevice := func(n *G.Node) *G.Node {
		if dev == nil {
			return n
		}
		return must(ops.ToDevice(n, dev))
	}

	g := G.NewGraph()
	w := G.NodeFromAny(g, onDevice(tensor.New(tensor.WithShape(1, 2), tensor.WithBacking([]float32{0.1, 0.1}))), G.WithName("w"))
	b := G.NodeFromAny(g, onDevice(tensor.New(tensor.WithShape(1), tensor.WithBacking([]float32{0}))), G.WithName("b"))
	x := G.NewMatrix(g, tensor.Float32, G.WithShape(64, 2), G.WithName("x"))
	y := G.NewMatrix(g, tensor.Float32, G.WithShape(64, 1), G.WithName("y"))
	pred := must(ops.Linear(toDevice(x), w, b))
	loss := must(ops.Mean(must(ops.Square(must(ops.Sub(pred, toDevice(y))))), nil, false))
	grads, err := G.Grad(loss, w, b)
	if err != nil {
		panic(err)
	}
	params, err := ops.ParamsWithGrads(G.Nodes{w, b}, grads)
	if err != nil {
		panic(err)
	}
	cfg := ops.DefaultAdamWConfig()
	cfg.KeepGrads = true // every run computes the gradients afresh
	// Before any Scope opens: the optimiser's state outlives the steps.
	opt, err := ops.NewAdamW([]ops.ParamGroup{{Params: params, LR: 0.05}}, cfg)
	if err != nil {
		panic(err)
	}
	var opts []G.VMOpt
	if dev != nil {
		opts = append(opts, G.WithEngine(dev.Engine()))
	}
	m, err := ops.NewTapeMachine(g, opts...)
	if err != nil {
		panic(err)
	}
	defer m.Close()

	rng := rand.New(rand.NewPCG(1, 2))
	batch := func() (xs, ys *tensor.Dense) {
		xv, yv := make([]float32, 128), make([]float32, 64)
		for i := range yv {
			x0, x1 := rng.Float32()*2-1, rng.Float32()*2-1
			xv[2*i], xv[2*i+1], yv[i] = x0, x1, 2*x0-x1+0.5
		}
		return tensor.New(tensor.WithShape(64, 2), tensor.WithBacking(xv)), tensor.New(tensor.WithShape(64, 1), tensor.WithBacking(yv))
	}
	var first, last float32
	for step := range 300 {
		xs, ys := batch()
		if err := G.Let(x, xs); err != nil {
			panic(err)
		}
		if err := G.Let(y, ys); err != nil {
			panic(err)
		}
		var scope *backend.Scope
		if dev != nil {
			if scope, err = dev.BeginScope(); err != nil {
				panic(err)
			}
		}
		if err := m.RunAll(); err != nil {
			panic(err)
		}
		if step == 0 || step == 299 {
			// Reading the loss is the step's one wait for the GPU.
			l := lossValue(dev, loss.Value())
			if step == 0 {
				first = l
			} else {
				last = l
			}
		}
		if err := opt.Step(params); err != nil {
			panic(err)
		}
		if scope != nil {
			if err := scope.End(); err != nil { // the step's device memory goes back to the cache
				panic(err)
			}
		}
		m.Reset()
	}
	fmt.Printf("the loss fell below a hundredth of its first value: %v\n", last < first/100)
	// Output:
	// the loss fell below a hundredth of its first value: true
}

// lossValue reads a scalar loss: from the device (a copy, which waits for
// the GPU) or the host.
func lossValue(dev *backend.Device, v G.Value) float32 {
	if d, ok := v.(*tensor.Dense); ok && backend.IsDevice(d) {
		h, err := dev.ToHost(d)
		if err != nil {
			panic(err)
		}
		return h.Float32s()[0]
	}
	return v.Data().(float32)
}
