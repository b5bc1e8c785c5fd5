package ops

import (
	"math"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

// The training graphs of every op family with device kernels, built as a
// user builds them (README): parameters that live on the device, a step's
// data moved there inside the graph, a loss on the device, G.Grad. Package
// tests run them through CheckPlacement and the release plan without a
// GPU (TestTrainingGraphsPlace); the GPU tests train them through
// NewTapeMachine, ParamsWithGrads and AdamW (TestGPUTrainingGraphs).

// familyEnv is what a family's builder gets: the graph, the dtype, a
// seeded source of values and the ways to make parameters and inputs.
type familyEnv struct {
	g   *G.ExprGraph
	dt  tensor.Dtype
	rng *rand.Rand
	dev *backend.Device
	// adopt makes n, an input node holding a learnable's initial value on
	// the host, a parameter (appended to params) and returns the node the
	// graph reads it from: n itself, holding the value on the device on
	// a GPU; a ToDevice of it where there is no GPU to hold it.
	adopt  func(n *G.Node) *G.Node
	params G.Nodes
	t      testing.TB
}

// param makes a learnable of the given shape with values in [-s, s].
func (e *familyEnv) param(name string, s float64, shape ...int) *G.Node {
	return e.adopt(G.NodeFromAny(e.g, randTensor(e.rng, e.dt, -s, s, shape...), G.WithName(name)))
}

// must fails the test on a graph-building error.
func (e *familyEnv) must(n *G.Node, err error) *G.Node {
	e.t.Helper()
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// data is a step's input: a host node holding v, moved to the device
// (kept on the host when the family trains on the host, dev nil).
func (e *familyEnv) data(name string, v *tensor.Dense) *G.Node {
	e.t.Helper()
	n := G.NodeFromAny(e.g, v, G.WithName(name))
	if e.dev == nil {
		return n
	}
	return e.must(ToDevice(n, e.dev))
}

// uniform is data of the given shape with values in [lo, hi).
func (e *familyEnv) uniform(name string, lo, hi float64, shape ...int) *G.Node {
	return e.data(name, randTensor(e.rng, e.dt, lo, hi, shape...))
}

// meanSquare is the loss mean(x²), a device scalar.
func (e *familyEnv) meanSquare(x *G.Node) *G.Node {
	return e.must(Mean(e.must(Square(x)), nil, false))
}

// batchNorm is a BatchNorm whose Gamma and Beta are parameters.
func (e *familyEnv) batchNorm(name string, channels int) *BatchNorm {
	bn, err := NewBatchNorm(e.g, e.dt, channels, name)
	if err != nil {
		e.t.Fatal(err)
	}
	bn.Gamma, bn.Beta = e.adopt(bn.Gamma), e.adopt(bn.Beta)
	return bn
}

// trainingFamily builds one family's graph and returns its loss.
type trainingFamily struct {
	name  string
	build func(e *familyEnv) *G.Node
	// batchNorm: the family updates BatchNorm's running statistics, which
	// NewBatchNorm leaves in host memory: a training step on a GPU waits
	// once per layer for them unless BatchNorm.RunningStatsToDevice moves
	// them there.
	batchNorm bool
}

var trainingFamilies = []trainingFamily{
	{name: "linear", build: func(e *familyEnv) *G.Node {
		x := e.uniform("x", -1, 1, 2, 6, 8)
		h := e.must(ReLU(e.must(Linear(x, e.param("w1", 0.3, 16, 8), e.param("b1", 0.1, 16)))))
		y := e.must(Linear(h, e.param("w2", 0.3, 8, 16), e.param("b2", 0.1, 8)))
		m := e.must(MatMul(e.must(Reshape(y, 12, 8)), e.param("w3", 0.3, 8, 4)))
		bm := e.must(BatchedMatMul(e.must(Reshape(m, 2, 6, 4)), e.must(Reshape(m, 2, 6, 4)), true, false))
		return e.meanSquare(bm)
	}},
	{name: "conv", batchNorm: true, build: func(e *familyEnv) *G.Node {
		x := e.uniform("x", -1, 1, 2, 3, 12, 12)
		c := e.must(Conv(x, e.param("w1", 0.3, 8, 3, 3, 3), e.param("b1", 0.1, 8), ConvConfig{Pad: [2]int{1, 1}, Act: ActReLU}))
		p := e.must(MaxPool2d(c, MaxPool2dConfig{Kernel: [2]int{2, 2}}))
		bn := e.batchNorm("bn", 8)
		y := e.must(ConvBN(p, e.param("w2", 0.3, 8, 8, 3, 3), bn, p, ConvConfig{Pad: [2]int{1, 1}, Act: ActReLU}))
		return e.meanSquare(y)
	}},
	{name: "roialign", build: func(e *familyEnv) *G.Node {
		x := e.uniform("x", -1, 1, 2, 4, 10, 10)
		f := e.must(Conv(x, e.param("w", 0.3, 4, 4, 1, 1), nil, ConvConfig{}))
		rois := e.data("rois", randomRoIs(e.rng, e.dt, 6, 2, 20, 20))
		p := e.must(RoIAlign(f, rois, RoIAlignConfig{PooledH: 3, PooledW: 3, SpatialScale: 0.5, SamplingRatio: 2, Aligned: true}))
		return e.meanSquare(p)
	}},
	{name: "pyramid", build: func(e *familyEnv) *G.Node {
		x := e.uniform("x", -1, 1, 2, 3, 8, 8)
		p3 := e.must(Conv(x, e.param("w3", 0.3, 4, 3, 3, 3), nil, ConvConfig{Pad: [2]int{1, 1}, Act: ActReLU}))
		p4 := e.must(Conv(p3, e.param("w4", 0.3, 4, 4, 3, 3), nil, ConvConfig{Stride: [2]int{2, 2}, Pad: [2]int{1, 1}}))
		top := e.must(Add(p3, e.must(UpsampleNearest(p4, 2))))
		rois := e.data("rois", fromFloat64s(e.dt, []float64{0, 1, 1, 5, 6, 1, 0, 2, 30, 31, 1, 4, 4, 9, 8}, 3, 5))
		cfg := MultiLevelRoIAlignConfig{PooledH: 2, PooledW: 2, SamplingRatio: 2, Aligned: true,
			Scales: []float64{1, 0.5}, CanonicalSize: 8, CanonicalLevel: 0, Columns: true}
		pooled := e.must(MultiLevelRoIAlign([]*G.Node{top, p4}, rois, cfg))
		return e.must(SumLosses(e.meanSquare(top), e.meanSquare(pooled)))
	}},
	{name: "maskhead", build: func(e *familyEnv) *G.Node {
		x := e.uniform("x", -1, 1, 2, 4, 8, 8)
		rois := e.data("rois", fromFloat64s(e.dt, []float64{0, 1, 1, 5, 6, 1, 0, 2, 7, 7}, 2, 5))
		cfg := MultiLevelRoIAlignConfig{PooledH: 4, PooledW: 4, SamplingRatio: 2, Aligned: true,
			Scales: []float64{1}, CanonicalSize: 8, CanonicalLevel: 0}
		m := e.must(MultiLevelRoIAlign([]*G.Node{x}, rois, cfg))
		m = e.must(ConvBN(m, e.param("w1", 0.3, 4, 4, 3, 3), e.batchNorm("bn", 4), nil, ConvConfig{Pad: [2]int{1, 1}, Act: ActReLU}))
		up := e.must(ConvTranspose(m, e.param("wt", 0.3, 4, 4, 2, 2), e.param("bt", 0.1, 4),
			ConvTransposeConfig{Stride: [2]int{2, 2}, Act: ActReLU}))
		odd := e.must(ConvTranspose(m, e.param("wo", 0.3, 4, 2, 3, 3), nil,
			ConvTransposeConfig{Stride: [2]int{2, 2}, Pad: [2]int{1, 1}, OutputPad: [2]int{1, 1}}))
		logits := e.must(Conv(up, e.param("wl", 0.3, 2, 4, 1, 1), nil, ConvConfig{}))
		return e.must(SumLosses(e.meanSquare(logits), e.meanSquare(odd)))
	}, batchNorm: true},
	{name: "msdeform", build: func(e *familyEnv) *G.Node {
		levels := []Level{{6, 6}, {3, 3}}
		const n, q, heads, d, l, pts = 2, 5, 2, 4, 2, 2
		tokens := e.uniform("tokens", -1, 1, n, 45, heads*d)
		value := e.must(Reshape(e.must(Linear(tokens, e.param("wv", 0.3, heads*d, heads*d), nil)), n, 45, heads, d))
		query := e.uniform("query", -1, 1, n, q, heads*d)
		off := e.must(Linear(query, e.param("woff", 0.3, heads*l*pts*2, heads*d), e.param("boff", 0.3, heads*l*pts*2)))
		loc := e.must(Reshape(e.must(Sigmoid(off)), n, q, heads, l, pts, 2))
		aw := e.must(Linear(query, e.param("waw", 0.3, heads*l*pts, heads*d), nil))
		w := e.must(Reshape(e.must(Softmax(e.must(Reshape(aw, n, q, heads, l*pts)), -1)), n, q, heads, l, pts))
		return e.meanSquare(e.must(MSDeformAttn(value, loc, w, levels)))
	}},
	{name: "norms", build: func(e *familyEnv) *G.Node {
		x := e.uniform("x", -1, 1, 2, 8, 4, 4)
		gn := e.must(GroupNorm(x, 4, e.param("gn.gamma", 0.5, 8), e.param("gn.beta", 0.5, 8), 1e-5))
		t := e.must(Reshape(e.must(Permute(gn, 0, 2, 3, 1)), 2, 16, 8))
		ln := e.must(LayerNorm(t, e.param("ln.gamma", 0.5, 8), e.param("ln.beta", 0.5, 8), 1e-5))
		return e.meanSquare(e.must(Mul(ln, e.param("scale", 1, 8))))
	}},
	{name: "attention", build: func(e *familyEnv) *G.Node {
		const n, l, s, emb = 2, 3, 5, 8
		q := e.uniform("q", -1, 1, n, l, emb)
		kv := e.uniform("kv", -1, 1, n, s, emb)
		w := AttentionWeights{
			InProjWeight: e.param("in.w", 0.3, 3*emb, emb), InProjBias: e.param("in.b", 0.1, 3*emb),
			OutProjWeight: e.param("out.w", 0.3, emb, emb), OutProjBias: e.param("out.b", 0.1, emb),
		}
		self, _, err := MultiHeadAttention(q, q, q, w, nil, AttentionConfig{NumHeads: 2, BatchFirst: true})
		e.must(self, err)
		cross, _, err := MultiHeadAttention(self, kv, kv, w, nil, AttentionConfig{NumHeads: 2, BatchFirst: true})
		return e.meanSquare(e.must(cross, err))
	}},
	{name: "layout", build: func(e *familyEnv) *G.Node {
		x := e.must(Mul(e.uniform("x", -1, 1, 4, 3, 6), e.param("w", 1, 4, 3, 6)))
		parts, err := Split(x, 2, 2, 4)
		if err != nil {
			e.t.Fatal(err)
		}
		c := e.must(Concat(1, e.must(Transpose(parts[0], 1, 2)), e.must(Slice(e.must(Permute(parts[1], 0, 2, 1)), 1, 0, 3))))
		idx := G.NodeFromAny(e.g, tensor.New(tensor.WithShape(5), tensor.WithBacking([]int{3, 0, 3, 1, 2})), G.WithName("idx"))
		if e.dev != nil {
			idx = e.must(ToDevice(idx, e.dev))
		}
		rows := e.must(GatherRows(c, idx))
		return e.meanSquare(e.must(Mul(rows, e.must(Detach(rows)))))
	}},
	{name: "pointwise", build: func(e *familyEnv) *G.Node {
		x := e.uniform("x", 0.1, 1, 3, 5)
		w := e.param("w", 1, 3, 5)
		b := e.param("b", 0.2, 5)
		a := e.must(Add(e.must(Mul(x, w)), b))
		s := e.must(Sub(e.must(Exp(e.must(Scale(a, 0.5)))), e.must(Sigmoid(a))))
		r := e.must(Div(e.must(Sqrt(e.must(Add(e.must(Square(s)), e.must(Exp(b)))))), e.must(Add(e.must(Exp(b)), b))))
		lg := e.must(Log(e.must(Add(e.must(Exp(r)), e.must(Square(e.must(InverseSigmoid(e.must(Sigmoid(w)), DefaultInverseSigmoidEps))))))))
		return e.must(Mean(e.must(Sum(lg, []int{1}, true)), nil, false))
	}},
	{name: "losses", build: func(e *familyEnv) *G.Node {
		x := e.uniform("x", -1, 1, 6, 8)
		logits := e.must(Linear(x, e.param("w", 0.3, 3, 8), e.param("b", 0.1, 3)))
		boxes := e.must(BoxCxCyWHToXYXY(e.must(Sigmoid(e.must(Linear(x, e.param("wb", 0.3, 4, 8), nil))))))
		labels := e.data("labels", fromFloat64s(e.dt, []float64{0, 2, 1, 1, 0, 2}, 6))
		ones := e.data("ones", fromFloat64s(e.dt, []float64{1, 1, 1, 0, 1, 1}, 6))
		targets := e.uniform("targets", 0, 1, 6, 3)
		wt := e.uniform("wt", 0, 1, 6, 3)
		tb := e.data("tboxes", fromFloat64s(e.dt, []float64{.1, .1, .5, .6, .2, .3, .9, .8, .0, .0, .3, .3, .4, .4, .6, .9, .1, .5, .3, .7, .5, .5, .9, .9}, 6, 4))
		wb := e.uniform("wb", 0, 1, 6, 4)
		return e.must(SumLosses(
			e.must(SoftmaxCrossEntropy(logits, labels, ones)),
			e.must(SigmoidFocalLoss(logits, targets, wt, DefaultFocalAlpha, DefaultFocalGamma)),
			e.must(SigmoidBCE(logits, targets, wt)),
			e.must(GIoULoss(boxes, tb, ones)),
			e.must(L1Loss(e.must(BoxXYXYToCxCyWH(boxes)), tb, wb)),
			e.must(SmoothL1(boxes, tb, wb, 0.1)),
		))
	}},
	{name: "dropout", build: func(e *familyEnv) *G.Node {
		x := e.uniform("x", -1, 1, 4, 16)
		h := e.must(Dropout(e.must(Linear(x, e.param("w", 0.3, 16, 16), nil)), 0.25, NewDropoutRNG(3)))
		return e.meanSquare(e.must(LogSoftmax(h, 0)))
	}},
}

// TestTrainingGraphsPlace: every family's training graph, with G.Grad's
// backward, passes CheckPlacement, and its release plan frees every device
// intermediate once, after all of its readers, and never an input, a
// result nobody reads, or a value sharing memory with one.
func TestTrainingGraphsPlace(t *testing.T) {
	dev := new(backend.Device) // never opened: placement only compares the pointer
	for _, f := range trainingFamilies {
		t.Run(f.name, func(t *testing.T) {
			e := &familyEnv{g: G.NewGraph(), dt: tensor.Float32, rng: rand.New(rand.NewPCG(1, 2)), dev: dev, t: t}
			e.adopt = func(p *G.Node) *G.Node {
				e.params = append(e.params, p)
				return e.must(ToDevice(p, dev))
			}
			loss := f.build(e)
			if _, err := G.Grad(loss, e.params...); err != nil {
				t.Fatal(err)
			}
			order, places, err := placements(e.g)
			if err != nil {
				t.Fatal(err)
			}
			onDevice := func(n *G.Node) bool { return places[n].kind == placeDevice }
			planReleases(e.g, order, onDevice)
			checkReleasePlan(t, e.g, order, onDevice)
		})
	}
}

// TestTrainingGraphsTrain trains every family's graph on the host, as the
// GPU test does on the device: NewTapeMachine, ParamsWithGrads, AdamW;
// the loss stays a number and falls.
func TestTrainingGraphsTrain(t *testing.T) {
	for _, f := range trainingFamilies {
		t.Run(f.name, func(t *testing.T) {
			e := &familyEnv{g: G.NewGraph(), dt: tensor.Float32, rng: rand.New(rand.NewPCG(1, 2)), t: t}
			e.adopt = func(p *G.Node) *G.Node {
				e.params = append(e.params, p)
				return p
			}
			loss := f.build(e)
			grads, err := G.Grad(loss, e.params...)
			if err != nil {
				t.Fatal(err)
			}
			m, err := NewTapeMachine(e.g)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			pg, opt := familyOptimizer(t, e.params, grads)
			var losses []float64
			for step := range 8 {
				if err := m.RunAll(); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				l := toFloat64s(t, loss.Value())[0]
				if math.IsNaN(l) || math.IsInf(l, 0) {
					t.Fatalf("step %d: loss %v", step, l)
				}
				losses = append(losses, l)
				if err := opt.Step(pg); err != nil {
					t.Fatal(err)
				}
				m.Reset()
			}
			if !(losses[len(losses)-1] < losses[0]) {
				t.Errorf("losses %v: the loss did not fall", losses)
			}
		})
	}
}

// familyOptimizer pairs a family's parameters with their gradients and
// makes the AdamW that trains them (clipped at 1, the gradients kept: each
// run computes them afresh).
func familyOptimizer(t *testing.T, params, grads G.Nodes) ([]G.ValueGrad, *AdamW) {
	t.Helper()
	pg, err := ParamsWithGrads(params, grads)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultAdamWConfig()
	cfg.MaxGradNorm, cfg.KeepGrads = 1, true
	opt, err := NewAdamW([]ParamGroup{{Params: pg, LR: 1e-2, WeightDecay: 1e-4}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return pg, opt
}

// checkReleasePlan checks the plan planReleases recorded in g's ops.
func checkReleasePlan(t *testing.T, g *G.ExprGraph, order G.Nodes, onDevice func(*G.Node) bool) {
	t.Helper()
	pos := map[*G.Node]int{}
	for i, n := range order {
		pos[n] = i
	}
	releasedBy := map[*G.Node]*G.Node{}
	for _, n := range order {
		o, ok := n.Op().(*specOp)
		if !ok {
			continue
		}
		for _, r := range o.releases {
			if by, twice := releasedBy[r]; twice {
				t.Errorf("%s is released by %s and by %s", nodeName(r), nodeName(by), nodeName(n))
			}
			releasedBy[r] = n
			readers := g.To(r.ID())
			if r.Op() == nil || readers.Len() == 0 {
				t.Errorf("%s, an input or a result nobody reads, is released by %s", nodeName(r), nodeName(n))
			}
			for readers.Next() {
				if rd := readers.Node().(*G.Node); pos[rd] > pos[n] {
					t.Errorf("%s is released by %s before its reader %s runs", nodeName(r), nodeName(n), nodeName(rd))
				}
			}
		}
	}
	// Memory shared through gorgonia's ops goes as one: an op that does
	// not write a fresh tensor is released with its inputs, or neither is.
	for _, n := range order {
		if n.Op() == nil || writesFresh(n.Op()) {
			continue
		}
		for _, c := range children(g, n) {
			if releasedBy[c] != releasedBy[n] {
				t.Errorf("%s (gorgonia's %q) and its input %s are released apart", nodeName(n), opName(n.Op()), nodeName(c))
			}
		}
	}
	// Every device value made by this package's ops whose readers are all
	// this package's ops, and which something reads, is released.
	released, freshDevice := 0, 0
	for _, n := range order {
		readers := g.To(n.ID())
		if n.Op() == nil || !onDevice(n) || !writesFresh(n.Op()) || readers.Len() == 0 {
			continue
		}
		allOurs := true
		for readers.Next() {
			allOurs = allOurs && writesFresh(readers.Node().(*G.Node).Op())
		}
		if !allOurs {
			continue
		}
		freshDevice++
		if _, ok := releasedBy[n]; ok {
			released++
		} else {
			t.Errorf("%s, a device intermediate read only by this package's ops, is never released", nodeName(n))
		}
	}
	if freshDevice == 0 {
		t.Error("the graph has no device intermediate to release")
	}
	t.Logf("%d nodes, %d released early (%d device intermediates read only by this package's ops)", len(order), len(releasedBy), freshDevice)
}

// TestReleasePlanKeepsWhatUsersRead: the loss, the gradients and a host
// copy made with ToHost are never released, nor an intermediate that
// shares memory with a result through gorgonia's Reshape.
func TestReleasePlanKeepsWhatUsersRead(t *testing.T) {
	dev := new(backend.Device)
	g := G.NewGraph()
	rng := rand.New(rand.NewPCG(3, 4))
	must := func(n *G.Node, err error) *G.Node {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	w := G.NodeFromAny(g, randTensor(rng, tensor.Float32, -1, 1, 4, 4), G.WithName("w"))
	x := must(ToDevice(G.NodeFromAny(g, randTensor(rng, tensor.Float32, -1, 1, 3, 4), G.WithName("x")), dev))
	wd := must(ToDevice(w, dev))
	h := must(Linear(x, wd, nil))
	logits := must(ReLU(h))
	flat := must(G.Reshape(logits, tensor.Shape{12})) // gorgonia's: shares logits' memory
	loss := must(Mean(must(Square(flat)), nil, false))
	onHost := must(ToHost(h))
	probs := must(Softmax(h, -1))
	kept := must(G.Reshape(probs, tensor.Shape{12})) // a result: nothing reads it
	grads, err := G.Grad(loss, w)
	if err != nil {
		t.Fatal(err)
	}
	order, places, err := placements(g)
	if err != nil {
		t.Fatal(err)
	}
	onDevice := func(n *G.Node) bool { return places[n].kind == placeDevice }
	planReleases(g, order, onDevice)
	released := map[*G.Node]bool{}
	for _, n := range order {
		if o, ok := n.Op().(*specOp); ok {
			for _, r := range o.releases {
				released[r] = true
			}
		}
	}
	for _, n := range append(G.Nodes{loss, onHost, w, kept, probs}, grads...) {
		if released[n] {
			t.Errorf("%s is released", nodeName(n))
		}
	}
	if released[logits] != released[flat] {
		t.Errorf("logits released %v, its reshape %v", released[logits], released[flat])
	}
	if !released[x] || !released[wd] {
		t.Errorf("the device copies of x and w, read by Linear and its backward only, released: %v, %v", released[x], released[wd])
	}
	checkReleasePlan(t, g, order, onDevice)
}
