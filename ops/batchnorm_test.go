package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
)

// bnLayer describes the BatchNorm of a test: its inputs come from the
// graph's input nodes 2 (gamma) and 3 (beta); the running statistics are
// copied into each graph built, so graphs never share them.
type bnLayer struct {
	rm, rv        []float64
	momentum, eps float64
	training      bool
}

// convBNWith builds ConvBN(in[0], in[1], bn, in[4] if present, cfg) and
// stores the layer it makes in *made, when made is non-nil.
func convBNWith(cfg ConvConfig, l bnLayer, made **BatchNorm) convBuilder {
	return func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
		dt := in[0].Dtype()
		bn := &BatchNorm{
			Gamma: in[2], Beta: in[3],
			RunningMean: fromFloat64s(dt, l.rm, len(l.rm)),
			RunningVar:  fromFloat64s(dt, l.rv, len(l.rv)),
			Momentum:    l.momentum, Eps: l.eps, Training: l.training,
		}
		if made != nil {
			*made = bn
		}
		var res *G.Node
		if len(in) > 4 {
			res = in[4]
		}
		return ConvBN(in[0], in[1], bn, res, cfg)
	}
}

// Two channels of four values, through an identity 1x1 convolution. Both
// channels have biased variance 1.25 (channel 0: 1 2 3 4, mean 2.5; channel
// 1: 2 -1 1 0, mean 0.5), so with Eps 2.75 each normalises by exactly 2:
// y0 = 2*(x-2.5)/2 + 1, y1 = -(x-0.5)/2. The running statistics move half
// way (Momentum 0.5) to the means and to the unbiased variance 1.25*4/3.
func TestConvBNHandValues(t *testing.T) {
	x := []float64{1, 2, 3, 4, 2, -1, 1, 0}
	ident := []float64{1, 0, 0, 1}
	gamma, beta := []float64{2, -1}, []float64{1, 0}
	ones := []float64{1, 1, 1, 1, 1, 1, 1, 1}
	train := bnLayer{rm: []float64{0, 1}, rv: []float64{1, 2}, momentum: 0.5, eps: 2.75, training: true}
	eval := bnLayer{rm: []float64{1, 0.5}, rv: []float64{3, 4}, eps: 1}
	// In evaluation, channel 0: 2*(x-1)/2 + 1 = x; channel 1: -(x-0.5)/sqrt(5).
	s5 := math.Sqrt(5)
	cases := []struct {
		name     string
		layer    bnLayer
		act      Activation
		residual bool
		want     []float64
		rm, rv   []float64 // after the run
	}{
		{"train", train, ActNone, false, []float64{-0.5, 0.5, 1.5, 2.5, -0.75, 0.75, -0.25, 0.25},
			[]float64{1.25, 0.75}, []float64{4.0 / 3, 11.0 / 6}},
		{"train relu", train, ActReLU, false, []float64{0, 0.5, 1.5, 2.5, 0, 0.75, 0, 0.25},
			[]float64{1.25, 0.75}, []float64{4.0 / 3, 11.0 / 6}},
		{"train residual relu", train, ActReLU, true, []float64{0.5, 1.5, 2.5, 3.5, 0.25, 1.75, 0.75, 1.25},
			[]float64{1.25, 0.75}, []float64{4.0 / 3, 11.0 / 6}},
		{"eval", eval, ActNone, false, []float64{1, 2, 3, 4, -1.5 / s5, 1.5 / s5, -0.5 / s5, 0.5 / s5},
			[]float64{1, 0.5}, []float64{3, 4}},
		{"eval residual relu", eval, ActReLU, true, []float64{2, 3, 4, 5, 1 - 1.5/s5, 1 + 1.5/s5, 1 - 0.5/s5, 1 + 0.5/s5},
			[]float64{1, 0.5}, []float64{3, 4}},
	}
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		for _, c := range cases {
			t.Run(fmt.Sprintf("%v/%s", dt, c.name), func(t *testing.T) {
				in := []*tensor.Dense{
					fromFloat64s(dt, x, 1, 2, 1, 4), fromFloat64s(dt, ident, 2, 2, 1, 1),
					fromFloat64s(dt, gamma, 2), fromFloat64s(dt, beta, 2),
				}
				if c.residual {
					in = append(in, fromFloat64s(dt, ones, 1, 2, 1, 4))
				}
				var bn *BatchNorm
				got, _, err := runGraph(t, in, convBNWith(ConvConfig{Act: c.act}, c.layer, &bn))
				if err != nil {
					t.Fatal(err)
				}
				tol := forwardTol(dt)
				if err := tol.Compare(got, c.want); err != nil {
					t.Errorf("y = %v, want %v: %v", got, c.want, err)
				}
				if err := tol.Compare(toFloat64s(t, bn.RunningMean), c.rm); err != nil {
					t.Errorf("running mean %v, want %v: %v", bn.RunningMean.Data(), c.rm, err)
				}
				if err := tol.Compare(toFloat64s(t, bn.RunningVar), c.rv); err != nil {
					t.Errorf("running variance %v, want %v: %v", bn.RunningVar.Data(), c.rv, err)
				}
			})
		}
	}
}

// With loss = sum(y) and no activation, training-mode BatchNorm's output
// sums to M*beta whatever z is: dz and dgamma vanish and dbeta = M. In
// evaluation y is affine in z: dz = gamma/sqrt(rv+eps), dgamma = sum of
// (z-rm)/sqrt(rv+eps), dbeta = M.
func TestConvBNBackwardHandValues(t *testing.T) {
	x := []float64{1, 2, 3, 4}
	cases := []struct {
		name              string
		layer             bnLayer
		dx, dgamma, dbeta []float64
	}{
		{"train", bnLayer{rm: []float64{0}, rv: []float64{1}, eps: 2.75, training: true},
			[]float64{0, 0, 0, 0}, []float64{0}, []float64{4}},
		// rv+eps = 4: dz = 2/2; dgamma = (0+1+2+3)/2.
		{"eval", bnLayer{rm: []float64{1}, rv: []float64{3}, eps: 1},
			[]float64{1, 1, 1, 1}, []float64{3}, []float64{4}},
	}
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		for _, c := range cases {
			in := []*tensor.Dense{
				fromFloat64s(dt, x, 1, 1, 1, 4), fromFloat64s(dt, []float64{1}, 1, 1, 1, 1),
				fromFloat64s(dt, []float64{2}, 1), fromFloat64s(dt, []float64{1}, 1),
			}
			proj := fromFloat64s(dt, []float64{1, 1, 1, 1}, 1, 1, 1, 4)
			_, grads, err := runWithGrads(t, in, proj, convBNWith(ConvConfig{}, c.layer, nil))
			if err != nil {
				t.Fatal(err)
			}
			for i, want := range [][]float64{c.dx, nil, c.dgamma, c.dbeta} {
				if want == nil {
					continue
				}
				if err := forwardTol(dt).Compare(grads[i], want); err != nil {
					t.Errorf("%v %s: gradient %d is %v, want %v: %v", dt, c.name, i, grads[i], want, err)
				}
			}
		}
	}
}

func TestConvBNMatchesPyTorch(t *testing.T) {
	for _, c := range loadConvRef(t, "convbn") {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			t.Run(fmt.Sprintf("%v/%s", dt, c.Name), func(t *testing.T) {
				names := []string{"x", "w", "gamma", "beta"}
				if _, ok := c.Inputs["residual"]; ok {
					names = append(names, "residual")
				}
				var in []*tensor.Dense
				for _, n := range names {
					in = append(in, c.Inputs[n].dense(dt))
				}
				layer := bnLayer{rm: c.RunningMean, rv: c.RunningVar, momentum: c.Momentum, eps: c.Eps, training: c.Training}
				var bn *BatchNorm
				proj := fromFloat64s(dt, c.Proj, c.Y.Shape...)
				y, grads, err := runWithGrads(t, in, proj, convBNWith(c.config(), layer, &bn))
				if err != nil {
					t.Fatal(err)
				}
				tol := forwardTol(dt)
				if err := tol.Compare(y, c.Y.Data); err != nil {
					t.Errorf("y: %v", err)
				}
				for i, n := range names {
					if err := tol.Compare(grads[i], c.Grads[n]); err != nil {
						t.Errorf("gradient of %s: %v", n, err)
					}
				}
				if err := tol.Compare(toFloat64s(t, bn.RunningMean), c.RunningMeanAfter); err != nil {
					t.Errorf("running mean: %v", err)
				}
				if err := tol.Compare(toFloat64s(t, bn.RunningVar), c.RunningVarAfter); err != nil {
					t.Errorf("running variance: %v", err)
				}
			})
		}
	}
}

// One graph, run on two training batches and then, with Training flipped,
// on a third in evaluation: the running statistics after each run and the
// outputs match PyTorch's, and evaluation leaves the statistics alone.
func TestConvBNTrainThenEvalOnOneGraph(t *testing.T) {
	for _, c := range loadConvRef(t, "convbn_steps") {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			t.Run(fmt.Sprintf("%v/%s", dt, c.Name), func(t *testing.T) {
				g := G.NewGraph()
				x := G.NewTensor(g, dt, 4, G.WithShape(c.XShape...), G.WithName("x"))
				w := G.NodeFromAny(g, c.W.dense(dt), G.WithName("w"))
				bn := &BatchNorm{
					Gamma:       G.NodeFromAny(g, fromFloat64s(dt, c.Gamma, len(c.Gamma)), G.WithName("gamma")),
					Beta:        G.NodeFromAny(g, fromFloat64s(dt, c.Beta, len(c.Beta)), G.WithName("beta")),
					RunningMean: fromFloat64s(dt, c.RunningMean, len(c.RunningMean)),
					RunningVar:  fromFloat64s(dt, c.RunningVar, len(c.RunningVar)),
					Momentum:    c.Momentum, Eps: c.Eps, Training: true,
				}
				y, err := ConvBN(x, w, bn, nil, c.config())
				if err != nil {
					t.Fatal(err)
				}
				var yv G.Value
				G.Read(y, &yv)
				m := G.NewTapeMachine(g)
				defer m.Close()
				tol := forwardTol(dt)
				for step, batch := range c.Batches {
					bn.Training = step < 2
					if err := G.Let(x, fromFloat64s(dt, batch, c.XShape...)); err != nil {
						t.Fatal(err)
					}
					if err := m.RunAll(); err != nil {
						t.Fatal(err)
					}
					if err := tol.Compare(toFloat64s(t, yv), c.Outputs[step]); err != nil {
						t.Errorf("step %d (training %t): y: %v", step, bn.Training, err)
					}
					if err := tol.Compare(toFloat64s(t, bn.RunningMean), c.RunningMeans[step]); err != nil {
						t.Errorf("step %d: running mean: %v", step, err)
					}
					if err := tol.Compare(toFloat64s(t, bn.RunningVar), c.RunningVars[step]); err != nil {
						t.Errorf("step %d: running variance: %v", step, err)
					}
					m.Reset()
				}
			})
		}
	}
}

func TestConvBNGradCheck(t *testing.T) {
	configs := []struct {
		name     string
		xs, ws   []int
		cfg      ConvConfig
		training bool
		residual bool
	}{
		{"train", []int{2, 2, 4, 5}, []int{3, 2, 3, 3}, ConvConfig{Pad: [2]int{1, 1}}, true, false},
		{"train relu", []int{2, 2, 4, 5}, []int{3, 2, 3, 3}, ConvConfig{Pad: [2]int{1, 1}, Act: ActReLU}, true, false},
		{"train residual", []int{2, 2, 4, 5}, []int{3, 2, 3, 3}, ConvConfig{Pad: [2]int{1, 1}}, true, true},
		{"train residual relu stride 2", []int{2, 2, 6, 5}, []int{3, 2, 3, 3}, ConvConfig{Stride: [2]int{2, 2}, Pad: [2]int{1, 1}, Act: ActReLU}, true, true},
		{"eval", []int{2, 2, 4, 5}, []int{3, 2, 3, 3}, ConvConfig{Pad: [2]int{1, 1}}, false, false},
		{"eval residual relu", []int{2, 2, 4, 5}, []int{3, 2, 1, 1}, ConvConfig{Act: ActReLU}, false, true},
	}
	for _, c := range configs {
		for seed := uint64(1); seed <= 2; seed++ {
			t.Run(fmt.Sprintf("%s/seed=%d", c.name, seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 23))
				cout := c.ws[0]
				layer := bnLayer{
					rm:       randTensor(rng, tensor.Float64, -0.5, 0.5, cout).Float64s(),
					rv:       randTensor(rng, tensor.Float64, 0.5, 2, cout).Float64s(),
					momentum: 0.2, eps: 1e-3, training: c.training,
				}
				draw := func() []*tensor.Dense {
					x := randTensor(rng, tensor.Float64, -1, 1, c.xs...)
					w := randTensor(rng, tensor.Float64, -0.5, 0.5, c.ws...)
					in := []*tensor.Dense{x, w,
						randTensor(rng, tensor.Float64, 0.5, 1.5, cout),
						randTensor(rng, tensor.Float64, -0.5, 0.5, cout)}
					if c.residual {
						_, shape, err := runGraph(t, in[:4], convBNWith(ConvConfig{Stride: c.cfg.Stride, Pad: c.cfg.Pad}, layer, nil))
						if err != nil {
							t.Fatal(err)
						}
						in = append(in, randTensor(rng, tensor.Float64, -1, 1, shape...))
					}
					return in
				}
				var in []*tensor.Dense
				if c.cfg.Act == ActReLU {
					linear := c.cfg
					linear.Act = ActNone
					in = drawAwayFromKink(t, draw, func(in []*tensor.Dense) []float64 {
						y, _, err := runGraph(t, in, convBNWith(linear, layer, nil))
						if err != nil {
							t.Fatal(err)
						}
						return y
					})
				} else {
					in = draw()
				}
				inputs := []autograd.Input{
					{Name: "x", Value: in[0]}, {Name: "w", Value: in[1]},
					{Name: "gamma", Value: in[2]}, {Name: "beta", Value: in[3]},
				}
				if c.residual {
					inputs = append(inputs, autograd.Input{Name: "residual", Value: in[4]})
				}
				results, err := autograd.CheckGrad(convBNWith(c.cfg, layer, nil), inputs, seed)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range results {
					if r.Scale == 0 {
						t.Errorf("%s: all gradients are zero: the check proves nothing", r.Name)
					}
				}
			})
		}
	}
}

func TestConvBNBadInput(t *testing.T) {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float32, 4, G.WithShape(2, 3, 8, 8), G.WithName("x"))
	w := G.NewTensor(g, tensor.Float32, 4, G.WithShape(4, 3, 3, 3), G.WithName("w"))
	wCin := G.NewTensor(g, tensor.Float32, 4, G.WithShape(4, 2, 3, 3), G.WithName("wCin"))
	vec := func(name string, dt tensor.Dtype, n int) *G.Node {
		return G.NewVector(g, dt, G.WithShape(n), G.WithName(name))
	}
	res := G.NewTensor(g, tensor.Float32, 4, G.WithShape(2, 4, 8, 8), G.WithName("res"))
	res7 := G.NewTensor(g, tensor.Float32, 4, G.WithShape(2, 4, 7, 8), G.WithName("res7"))
	res64 := G.NewTensor(g, tensor.Float64, 4, G.WithShape(2, 4, 8, 8), G.WithName("res64"))
	res3 := G.NewTensor(g, tensor.Float32, 3, G.WithShape(4, 8, 8), G.WithName("res3"))
	stat := func(dt tensor.Dtype, n int) *tensor.Dense { return tensor.New(tensor.Of(dt), tensor.WithShape(n)) }
	okBN := func() *BatchNorm {
		return &BatchNorm{Gamma: vec("gamma", tensor.Float32, 4), Beta: vec("beta", tensor.Float32, 4),
			RunningMean: stat(tensor.Float32, 4), RunningVar: stat(tensor.Float32, 4), Training: true}
	}
	with := func(f func(*BatchNorm)) *BatchNorm { bn := okBN(); f(bn); return bn }
	view, err := stat(tensor.Float32, 8).Slice(tensor.S(0, 8, 2))
	if err != nil {
		t.Fatal(err)
	}
	cfg := ConvConfig{Pad: [2]int{1, 1}}
	cases := []struct {
		name string
		w    *G.Node
		bn   *BatchNorm
		res  *G.Node
		cfg  ConvConfig
		want string
	}{
		{"nil bn", w, nil, nil, cfg, "bn is nil"},
		{"Cin mismatch", wCin, okBN(), nil, cfg, "w must have shape [Cout 3 KH KW] to match the 3 channels of x, got (4, 2, 3, 3)"},
		{"bad config", w, okBN(), nil, ConvConfig{Pad: [2]int{-1, 0}}, "Pad must be non-negative, got [-1 0]"},
		{"unknown activation", w, okBN(), nil, ConvConfig{Act: -1}, "unknown Activation -1"},
		{"nil gamma", w, with(func(b *BatchNorm) { b.Gamma = nil }), nil, cfg, "bn.Gamma is nil, want shape [4]"},
		{"gamma shape", w, with(func(b *BatchNorm) { b.Gamma = vec("g5", tensor.Float32, 5) }), nil, cfg, "bn.Gamma must have shape [4], got (5)"},
		{"beta rank", w, with(func(b *BatchNorm) { b.Beta = G.NewMatrix(g, tensor.Float32, G.WithShape(4, 1)) }), nil, cfg, "bn.Beta must have shape [4], got (4, 1)"},
		{"beta dtype", w, with(func(b *BatchNorm) { b.Beta = vec("b64", tensor.Float64, 4) }), nil, cfg, "bn.Beta has dtype float64, want float32"},
		{"nil running mean", w, with(func(b *BatchNorm) { b.RunningMean = nil }), nil, cfg, "bn.RunningMean is nil, want a [4] tensor"},
		{"running var shape", w, with(func(b *BatchNorm) { b.RunningVar = stat(tensor.Float32, 3) }), nil, cfg, "bn.RunningVar must have shape [4], got (3)"},
		{"running var dtype", w, with(func(b *BatchNorm) { b.RunningVar = stat(tensor.Float64, 4) }), nil, cfg, "bn.RunningVar has dtype float64, want float32 like x"},
		{"running mean view", w, with(func(b *BatchNorm) { b.RunningMean = view.(*tensor.Dense) }), nil, cfg, "bn.RunningMean must be a contiguous tensor, not a view"},
		{"momentum above 1", w, with(func(b *BatchNorm) { b.Momentum = 1.5 }), nil, cfg, "bn.Momentum must be in [0, 1], got 1.5"},
		{"momentum negative", w, with(func(b *BatchNorm) { b.Momentum = -0.1 }), nil, cfg, "bn.Momentum must be in [0, 1], got -0.1"},
		{"momentum NaN", w, with(func(b *BatchNorm) { b.Momentum = math.NaN() }), nil, cfg, "bn.Momentum must be in [0, 1], got NaN"},
		{"eps negative", w, with(func(b *BatchNorm) { b.Eps = -1e-5 }), nil, cfg, "bn.Eps must be non-negative and finite, got -1e-05"},
		{"eps infinite", w, with(func(b *BatchNorm) { b.Eps = math.Inf(1) }), nil, cfg, "bn.Eps must be non-negative and finite, got +Inf"},
		{"residual shape", w, okBN(), res7, cfg, "residual must have shape (2, 4, 8, 8) like the output, got (2, 4, 7, 8)"},
		{"residual rank", w, okBN(), res3, cfg, "residual must have shape (2, 4, 8, 8) like the output, got (4, 8, 8)"},
		{"residual dtype", w, okBN(), res64, cfg, "residual has dtype float64, want float32"},
	}
	for _, c := range cases {
		_, err := ConvBN(x, c.w, c.bn, c.res, c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "ops: ConvBN: ") {
			t.Errorf("%s: got error %v, want one containing %q", c.name, err, c.want)
		}
	}
	if _, err := ConvBN(x, w, okBN(), res, cfg); err != nil {
		t.Errorf("valid layer: %v", err)
	}
	if _, err := NewBatchNorm(g, tensor.Float32, 0, "bn"); err == nil || !strings.Contains(err.Error(), "ops: NewBatchNorm: channels must be positive, got 0") {
		t.Errorf("NewBatchNorm with no channels: %v", err)
	}
	if _, err := NewBatchNorm(g, tensor.Int, 4, "bn"); err == nil || !strings.Contains(err.Error(), "ops: NewBatchNorm: dtype must be float32 or float64, got int") {
		t.Errorf("NewBatchNorm of ints: %v", err)
	}
}

// What depends on the mode or on the running statistics is checked when the
// graph runs: a one-value batch cannot train (PyTorch refuses it too) but
// evaluates fine; running statistics swapped for ones of the wrong shape are
// reported, not read past their end.
func TestConvBNRunTimeErrors(t *testing.T) {
	g := G.NewGraph()
	x := G.NodeFromAny(g, fromFloat64s(tensor.Float64, []float64{1, 2, 3, 4}, 1, 1, 2, 2), G.WithName("x"))
	w := G.NodeFromAny(g, fromFloat64s(tensor.Float64, []float64{1, 1, 1, 1}, 1, 1, 2, 2), G.WithName("w"))
	bn, err := NewBatchNorm(g, tensor.Float64, 1, "bn")
	if err != nil {
		t.Fatal(err)
	}
	y, err := ConvBN(x, w, bn, nil, ConvConfig{})
	if err != nil {
		t.Fatal(err)
	}
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err == nil || !strings.Contains(err.Error(), "ops: ConvBN: training needs more than one value per channel, got N*OutH*OutW = 1") {
		t.Errorf("training on one value: got %v", err)
	}
	m.Reset()
	bn.Training = false
	if err := m.RunAll(); err != nil {
		t.Errorf("evaluation on one value: %v", err)
	}
	// 10/sqrt(1+1e-5) with the initial running statistics.
	if got, want := toFloat64s(t, y.Value()), []float64{10 / math.Sqrt(1+DefaultEps)}; autograd.TolForward64.Compare(got, want) != nil {
		t.Errorf("evaluation: y = %v, want %v", got, want)
	}
	m.Reset()
	bn.RunningVar = tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(2))
	if err := m.RunAll(); err == nil || !strings.Contains(err.Error(), "ops: ConvBN: bn.RunningVar must have shape [1], got (2)") {
		t.Errorf("running variance replaced by a wrong shape: got %v", err)
	}
}

// Two BatchNorm layers on the same input are different nodes (each has its
// own running statistics), and configs that differ give different nodes.
func TestConvBNHashDistinguishesLayers(t *testing.T) {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float64, 4, G.WithShape(2, 2, 5, 5), G.WithName("x"))
	w := G.NewTensor(g, tensor.Float64, 4, G.WithShape(3, 2, 3, 3), G.WithName("w"))
	res := G.NewTensor(g, tensor.Float64, 4, G.WithShape(2, 3, 5, 5), G.WithName("res"))
	bn1, _ := NewBatchNorm(g, tensor.Float64, 3, "bn1")
	bn2, _ := NewBatchNorm(g, tensor.Float64, 3, "bn2")
	// Same nodes for gamma and beta: only the layer's identity differs.
	bn2.Gamma, bn2.Beta = bn1.Gamma, bn1.Beta
	cfg := ConvConfig{Pad: [2]int{1, 1}}
	seen := map[*G.Node]string{}
	for _, v := range []struct {
		name string
		bn   *BatchNorm
		res  *G.Node
		cfg  ConvConfig
		eps  float64
	}{
		{"bn1", bn1, nil, cfg, 0},
		{"bn2", bn2, nil, cfg, 0},
		{"bn1 relu", bn1, nil, ConvConfig{Pad: [2]int{1, 1}, Act: ActReLU}, 0},
		{"bn1 residual", bn1, res, cfg, 0},
		{"bn1 eps 1e-3", bn1, nil, cfg, 1e-3},
	} {
		saved := v.bn.Eps
		if v.eps != 0 {
			v.bn.Eps = v.eps
		}
		n, err := ConvBN(x, w, v.bn, v.res, v.cfg)
		v.bn.Eps = saved
		if err != nil {
			t.Fatal(err)
		}
		if prev, ok := seen[n]; ok {
			t.Errorf("%s merged with %s", v.name, prev)
		}
		seen[n] = v.name
	}
	// The ops of one layer, and dz for the GEMMs or exact.
	hashes := map[uint32]string{}
	s := bnShape{n: 2, c: 3, h: 5, w: 5, dt: tensor.Float32, bn: bn1}
	ready := s
	ready.gemmDz = true
	for _, op := range []G.Op{bnCoefOp(s), bnOp(s), bnGradStatsOp(s), bnGradApplyOp(s), bnGradApplyOp(ready), reluMaskOp(s.zShape(), s.dt)} {
		h := op.Hashcode()
		if prev, ok := hashes[h]; ok {
			t.Errorf("%v hashes like %v", op, prev)
		}
		hashes[h] = fmt.Sprint(op)
	}
}

// A small network of ConvBN and Conv learns a fixed target under
// gorgonia's own training machinery: dual values, a tape machine and Adam.
func TestConvBNTrainsWithAdam(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	dt := tensor.Float32
	g := G.NewGraph()
	x := G.NodeFromAny(g, randTensor(rng, dt, -1, 1, 4, 3, 8, 8), G.WithName("x"))
	target := G.NodeFromAny(g, randTensor(rng, dt, -1, 1, 4, 2, 8, 8), G.WithName("target"))
	w1 := G.NodeFromAny(g, randTensor(rng, dt, -0.3, 0.3, 8, 3, 3, 3), G.WithName("w1"))
	w2 := G.NodeFromAny(g, randTensor(rng, dt, -0.2, 0.2, 2, 8, 3, 3), G.WithName("w2"))
	b2 := G.NodeFromAny(g, randTensor(rng, dt, -0.1, 0.1, 2), G.WithName("b2"))
	bn, err := NewBatchNorm(g, dt, 8, "bn1")
	if err != nil {
		t.Fatal(err)
	}
	h, err := ConvBN(x, w1, bn, nil, ConvConfig{Pad: [2]int{1, 1}, Act: ActReLU})
	if err != nil {
		t.Fatal(err)
	}
	out, err := Conv(h, w2, b2, ConvConfig{Pad: [2]int{1, 1}})
	if err != nil {
		t.Fatal(err)
	}
	loss := G.Must(G.Mean(G.Must(G.Square(G.Must(G.Sub(out, target))))))
	learnables := G.Nodes{w1, bn.Gamma, bn.Beta, w2, b2}
	losses := adamLosses(t, g, loss, learnables, 0.02, 40)
	first, last := losses[0], losses[len(losses)-1]
	t.Logf("loss %.4f -> %.4f", first, last)
	if !(last < 0.5*first) {
		t.Errorf("loss went from %v to %v in %d Adam steps, want it at least halved: %v", first, last, len(losses), losses)
	}
	rm := toFloat64s(t, bn.RunningMean)
	if slicesAllZero(rm) {
		t.Error("training left the running mean at zero")
	}
}

func slicesAllZero(v []float64) bool {
	for _, x := range v {
		if x != 0 {
			return false
		}
	}
	return true
}

// BenchmarkConvBN times ConvBN in training mode with ReLU (and a residual on
// the shapes that keep their size) on the backbone's shapes, float32.
func BenchmarkConvBN(b *testing.B) {
	for _, s := range convBenchShapes {
		for _, pass := range []string{"fwd", "fwdbwd"} {
			b.Run(fmt.Sprintf("shape=%s/pass=%s", s.name, pass), func(b *testing.B) {
				benchGraph(b, pass == "fwdbwd", convFlops(s.xs, s.ws, s.cfg), func(g *G.ExprGraph) (*G.Node, G.Nodes, error) {
					rng := rand.New(rand.NewPCG(1, 1))
					x := benchNode(g, rng, "x", -1, 1, s.xs...)
					w := benchNode(g, rng, "w", -0.1, 0.1, s.ws...)
					bn, err := NewBatchNorm(g, tensor.Float32, s.ws[0], "bn")
					if err != nil {
						return nil, nil, err
					}
					var res *G.Node
					if s.ws[0] == s.xs[1] && s.cfg.Stride == [2]int{} {
						res = benchNode(g, rng, "res", -1, 1, s.xs...)
					}
					y, err := ConvBN(x, w, bn, res, s.cfg)
					wrt := G.Nodes{x, w, bn.Gamma, bn.Beta}
					if res != nil {
						wrt = append(wrt, res)
					}
					return y, wrt, err
				})
			})
		}
	}
}

// Zero Momentum and Eps stand for PyTorch's defaults: a layer left at zero
// computes exactly what one set to 0.1 and 1e-5 does, and hashes alike.
func TestConvBNZeroMeansDefaults(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	in := []*tensor.Dense{
		randTensor(rng, tensor.Float64, -1, 1, 2, 2, 4, 5), randTensor(rng, tensor.Float64, -1, 1, 3, 2, 3, 3),
		randTensor(rng, tensor.Float64, 0.5, 1.5, 3), randTensor(rng, tensor.Float64, -0.5, 0.5, 3),
	}
	rm, rv := []float64{0.1, -0.2, 0.3}, []float64{0.5, 1, 2}
	cfg := ConvConfig{Pad: [2]int{1, 1}}
	for _, training := range []bool{true, false} {
		var zero, explicit *BatchNorm
		y0, _, err := runGraph(t, in, convBNWith(cfg, bnLayer{rm: rm, rv: rv, training: training}, &zero))
		if err != nil {
			t.Fatal(err)
		}
		y1, _, err := runGraph(t, in, convBNWith(cfg, bnLayer{rm: rm, rv: rv, momentum: DefaultMomentum, eps: DefaultEps, training: training}, &explicit))
		if err != nil {
			t.Fatal(err)
		}
		for i, pair := range [][2][]float64{
			{y0, y1},
			{toFloat64s(t, zero.RunningMean), toFloat64s(t, explicit.RunningMean)},
			{toFloat64s(t, zero.RunningVar), toFloat64s(t, explicit.RunningVar)},
		} {
			if err := autograd.TolForward64.Compare(pair[0], pair[1]); err != nil {
				t.Errorf("training %t, output %d: zero Momentum/Eps differ from the defaults: %v", training, i, err)
			}
		}
		if training && autograd.TolForward64.Compare(toFloat64s(t, zero.RunningMean), rm) == nil {
			t.Error("training left the running mean unchanged")
		}
	}
	// The same layer built with zeros and then with the defaults spelled out
	// is one computation: gorgonia merges the two nodes.
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float64, 4, G.WithShape(2, 2, 4, 5), G.WithName("x"))
	w := G.NewTensor(g, tensor.Float64, 4, G.WithShape(3, 2, 3, 3), G.WithName("w"))
	bn, err := NewBatchNorm(g, tensor.Float64, 3, "bn")
	if err != nil {
		t.Fatal(err)
	}
	bn.Momentum, bn.Eps = 0, 0
	a, err := ConvBN(x, w, bn, nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	bn.Momentum, bn.Eps = DefaultMomentum, DefaultEps
	b, err := ConvBN(x, w, bn, nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Errorf("zero Momentum/Eps built %v, the defaults %v", a.Op(), b.Op())
	}
}

// The batch statistics reach a ConvBN layer's constants through the graph:
// the constants op takes the convolution's node, whose value is
// [z | statistics] with the records 8-byte aligned after z. On the CPU the
// ops read z where it lies and nothing of the tail, and the gradient of the
// packed value is [dz | zeros].
func TestConvBNStatisticsInTheGraph(t *testing.T) {
	for _, c := range []struct {
		dt         tensor.Dtype
		n, ch, hw  int
		off, slots int
	}{
		{tensor.Float32, 2, 3, 5 * 5, 150, 1}, // z of 150 floats: the records follow at once
		{tensor.Float32, 1, 3, 3 * 5, 46, 1},  // 45: one float of padding
		{tensor.Float32, 2, 4, 100 * 100, 80000, 157},
		{tensor.Float64, 1, 3, 3 * 5, 45, 1},
		{tensor.Float64, 2, 4, 100 * 100, 80000, 313},
	} {
		l := convStatsOf(c.dt, c.n, c.ch, c.hw)
		words := 8 / int(c.dt.Size())
		if l.off != c.off || l.slots != c.slots || l.off*int(c.dt.Size())%8 != 0 || l.size != l.off+l.slots*c.ch*bnRecForward*words {
			t.Errorf("%v N=%d C=%d HW=%d: layout %+v, want the records from %d in %d slots", c.dt, c.n, c.ch, c.hw, l, c.off, c.slots)
		}
	}

	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float64, 4, G.WithShape(2, 2, 4, 5), G.WithName("x"))
	w := G.NewTensor(g, tensor.Float64, 4, G.WithShape(3, 2, 3, 3), G.WithName("w"))
	bn, err := NewBatchNorm(g, tensor.Float64, 3, "bn")
	if err != nil {
		t.Fatal(err)
	}
	y, err := ConvBN(x, w, bn, nil, ConvConfig{Pad: [2]int{1, 1}})
	if err != nil {
		t.Fatal(err)
	}
	s := bnShape{n: 2, c: 3, h: 4, w: 5, eps: DefaultEps, momentum: DefaultMomentum, dt: tensor.Float64, bn: bn}
	kind := func(n *G.Node) string {
		if op, ok := n.Op().(*specOp); ok {
			return op.kindName()
		}
		return fmt.Sprint(n.Op())
	}
	var coef *G.Node
	for _, n := range g.AllNodes() {
		if kind(n) == "BatchNormCoef" {
			coef = n
		}
	}
	if coef == nil {
		t.Fatalf("no BatchNorm constants in the graph of %v", y)
	}
	var fromConv bool
	for it := g.From(coef.ID()); it.Next(); {
		z := it.Node().(*G.Node)
		if kind(z) == "Conv" {
			fromConv = true
			if want := (tensor.Shape{convStatsOf(s.dt, 2, 3, 20).size}); !z.Shape().Eq(want) {
				t.Errorf("the convolution's output has shape %v, want %v: [z | statistics]", z.Shape(), want)
			}
		}
	}
	if !fromConv {
		t.Error("the BatchNorm constants do not take the convolution's output")
	}

	rng := rand.New(rand.NewPCG(7, 7))
	packed := s
	packed.convStats = true
	nz := s.zShape().TotalSize()
	zv := randTensor(rng, tensor.Float64, -1, 1, s.zShape()...)
	pv := randTensor(rng, tensor.Float64, 5, 6, packed.zInShape()...) // a tail of garbage
	copy(pv.Float64s(), zv.Float64s())
	gamma, beta := randTensor(rng, tensor.Float64, 0.5, 1.5, 3), randTensor(rng, tensor.Float64, -0.5, 0.5, 3)
	dy := randTensor(rng, tensor.Float64, -1, 1, s.zShape()...)
	run := func(op G.Op, in ...G.Value) *tensor.Dense {
		t.Helper()
		v, err := op.Do(in...)
		if err != nil {
			t.Fatal(err)
		}
		return v.(*tensor.Dense)
	}
	for _, training := range []bool{false, true} {
		bn.Training = training
		cPlain, cPacked := run(bnCoefOp(s), zv, gamma, beta), run(bnCoefOp(packed), pv, gamma, beta)
		if err := autograd.TolForward64.Compare(toFloat64s(t, cPacked), toFloat64s(t, cPlain)); err != nil {
			t.Errorf("training %t: constants from [z | statistics]: %v", training, err)
		}
		yPlain, yPacked := run(bnOp(s), zv, gamma, beta, cPlain), run(bnOp(packed), pv, gamma, beta, cPlain)
		if err := autograd.TolForward64.Compare(toFloat64s(t, yPacked), toFloat64s(t, yPlain)); err != nil {
			t.Errorf("training %t: y from [z | statistics]: %v", training, err)
		}
		st := run(bnGradStatsOp(s), zv, gamma, cPlain, dy)
		if err := autograd.TolForward64.Compare(toFloat64s(t, run(bnGradStatsOp(packed), pv, gamma, cPlain, dy)), toFloat64s(t, st)); err != nil {
			t.Errorf("training %t: backward statistics from [z | statistics]: %v", training, err)
		}
		dz := run(bnGradApplyOp(s), zv, cPlain, dy, st)
		stale := randTensor(rng, tensor.Float64, 5, 6, packed.zInShape()...)
		dp, err := bnGradApplyOp(packed).UsePreallocDo(stale, pv, cPlain, dy, st)
		if err != nil {
			t.Fatal(err)
		}
		got := toFloat64s(t, dp)
		if err := autograd.TolForward64.Compare(got[:nz], toFloat64s(t, dz)); err != nil {
			t.Errorf("training %t: dz from [z | statistics]: %v", training, err)
		}
		if err := autograd.TolForward64.Compare(got[nz:], make([]float64, len(got)-nz)); err != nil {
			t.Errorf("training %t: the gradient of the statistics: %v", training, err)
		}
	}
}

// The running statistics' methods on a layer whose statistics are in host
// memory: CopyRunningStats gives copies, RunningStatsToHost leaves the
// layer's own tensors in place; and the errors.
func TestBatchNormRunningStatsMethods(t *testing.T) {
	g := G.NewGraph()
	bn, err := NewBatchNorm(g, tensor.Float64, 3, "bn")
	if err != nil {
		t.Fatal(err)
	}
	copy(bn.RunningMean.Float64s(), []float64{1, 2, 3})
	rm, rv := bn.RunningMean, bn.RunningVar
	mean, variance, err := bn.CopyRunningStats()
	if err != nil {
		t.Fatal(err)
	}
	if !equalFloats(mean.Float64s(), []float64{1, 2, 3}) || !equalFloats(variance.Float64s(), []float64{1, 1, 1}) {
		t.Errorf("copies %v and %v, want [1 2 3] and [1 1 1]", mean.Data(), variance.Data())
	}
	mean.Float64s()[0] = 7
	if rm.Float64s()[0] != 1 {
		t.Error("CopyRunningStats returned the layer's own tensor")
	}
	if err := bn.RunningStatsToHost(); err != nil || bn.RunningMean != rm || bn.RunningVar != rv {
		t.Errorf("RunningStatsToHost of host statistics: %v, same tensors %t", err, bn.RunningMean == rm && bn.RunningVar == rv)
	}
	if err := bn.RunningStatsToDevice(nil); err == nil || !strings.Contains(err.Error(), "ops: BatchNorm.RunningStatsToDevice: dev is nil") {
		t.Errorf("RunningStatsToDevice(nil): %v", err)
	}
	view, err := tensor.New(tensor.WithShape(6), tensor.WithBacking(make([]float64, 6))).Slice(tensor.S(0, 3))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		bn   *BatchNorm
		want string
	}{
		{"nil layer", nil, "bn is nil"},
		{"nil mean", &BatchNorm{RunningVar: rv}, "bn.RunningMean is nil"},
		{"view", &BatchNorm{RunningMean: rm, RunningVar: view.(*tensor.Dense)}, "bn.RunningVar must be a contiguous tensor"},
		{"dtypes", &BatchNorm{RunningMean: rm, RunningVar: tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(3))}, "differ"},
	} {
		if _, _, err := c.bn.CopyRunningStats(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: CopyRunningStats: %v, want an error containing %q", c.name, err, c.want)
		}
	}
}
