package ops

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/kernels"
)

// testParam is a parameter as a solver sees it, without a graph.
type testParam struct {
	name      string
	val, grad *tensor.Dense
}

func (p *testParam) Name() string   { return p.name }
func (p *testParam) Value() G.Value { return p.val }
func (p *testParam) Grad() (G.Value, error) {
	if p.grad == nil {
		return nil, errors.New("no gradient")
	}
	return p.grad, nil
}

func newTestParam(name string, dt tensor.Dtype, v []float64, shape ...int) *testParam {
	return &testParam{name: name, val: fromFloat64s(dt, v, shape...), grad: fromFloat64s(dt, make([]float64, len(v)), shape...)}
}

// setGrad copies v into the parameter's gradient.
func (p *testParam) setGrad(t testing.TB, v []float64) {
	t.Helper()
	g := fromFloat64s(p.grad.Dtype(), v, p.grad.Shape()...)
	if err := tensor.Copy(p.grad, g); err != nil {
		t.Fatal(err)
	}
}

func valueGrads(ps ...*testParam) []G.ValueGrad {
	out := make([]G.ValueGrad, len(ps))
	for i, p := range ps {
		out[i] = p
	}
	return out
}

// adamwCase is one case of testdata/adamw.json (gen_adamw.py).
type adamwCase struct {
	Name         string
	MaxNorm      float64 `json:"max_norm"`
	Beta1, Beta2 float64
	Eps          float64
	Shapes       [][]int
	Groups       []struct {
		LR, WD  float64
		Tensors []int
	}
	Init  [][]float64
	Steps []struct {
		Grads  [][]float64
		Norm   *float64
		Params [][]float64
	}
	ExpAvg   [][]float64 `json:"exp_avg"`
	ExpAvgSq [][]float64 `json:"exp_avg_sq"`
}

// Trajectories of torch.optim.AdamW after clip_grad_norm_ (PyTorch, float64),
// four steps of four tensors in two groups: float64 to TolForward64 and
// float32 (from the same values, exact in float32) to TolForward32, the
// norms to TolForward64 in both (the squares of floats are exact in
// float64), the moments after the last step too.
func TestAdamWTorchReference(t *testing.T) {
	var ref struct {
		Torch string
		Cases []adamwCase
	}
	loadJSON(t, "testdata/adamw.json", &ref)
	if len(ref.Cases) == 0 {
		t.Fatal("no cases in testdata/adamw.json")
	}
	for _, c := range ref.Cases {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			t.Run(fmt.Sprintf("%s/%v", c.Name, dt), func(t *testing.T) {
				tol := autograd.TolForward64
				if dt == tensor.Float32 {
					tol = autograd.TolForward32
				}
				ps := make([]*testParam, len(c.Shapes))
				for i, s := range c.Shapes {
					ps[i] = newTestParam(fmt.Sprintf("p%d", i), dt, c.Init[i], s...)
				}
				var groups []ParamGroup
				for _, g := range c.Groups {
					pg := ParamGroup{LR: g.LR, WeightDecay: g.WD}
					for _, i := range g.Tensors {
						pg.Params = append(pg.Params, ps[i])
					}
					groups = append(groups, pg)
				}
				cfg := AdamWConfig{Beta1: c.Beta1, Beta2: c.Beta2, Eps: c.Eps, MaxGradNorm: c.MaxNorm}
				opt, err := NewAdamW(groups, cfg)
				if err != nil {
					t.Fatal(err)
				}
				for si, s := range c.Steps {
					for i, p := range ps {
						p.setGrad(t, s.Grads[i])
					}
					if err := opt.Step(valueGrads(ps...)); err != nil {
						t.Fatal(err)
					}
					for i, p := range ps {
						if err := tol.Compare(toFloat64s(t, p.val), s.Params[i]); err != nil {
							t.Errorf("step %d: %s: %v", si+1, p.name, err)
						}
					}
					if s.Norm != nil {
						norm, err := opt.GradNorm()
						if err != nil {
							t.Fatal(err)
						}
						if err := autograd.TolForward64.Compare([]float64{norm}, []float64{*s.Norm}); err != nil {
							t.Errorf("step %d: the norm: %v", si+1, err)
						}
					}
				}
				for i, p := range ps {
					m, v, err := opt.Moments(p)
					if err != nil {
						t.Fatal(err)
					}
					if err := tol.Compare(toFloat64s(t, m), c.ExpAvg[i]); err != nil {
						t.Errorf("%s: exp_avg: %v", p.name, err)
					}
					if err := tol.Compare(toFloat64s(t, v), c.ExpAvgSq[i]); err != nil {
						t.Errorf("%s: exp_avg_sq: %v", p.name, err)
					}
				}
			})
		}
	}
}

// Values worked by hand. The first step of Adam moves each parameter by lr
// against the sign of its gradient, whatever the gradient's size: m_hat =
// g and v_hat = g^2, so lr*m_hat/(sqrt(v_hat) + eps) = lr*g/(|g| + eps).
// Weight decay first scales the parameter by 1 - lr*wd. Gradients (3, 4)
// have norm 5; clipped to 1 they become (3, 4)/(5 + 1e-6), which moves
// the parameters by the same lr (eps aside).
func TestAdamWHandValues(t *testing.T) {
	const lr, wd, eps = 0.1, 0.5, 1e-8
	for _, clip := range []float64{0, 1} {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			w := newTestParam("w", dt, []float64{1, -2}, 2)
			w.setGrad(t, []float64{3, 4})
			cfg := DefaultAdamWConfig()
			cfg.MaxGradNorm = clip
			opt, err := NewAdamW([]ParamGroup{{Params: valueGrads(w), LR: lr, WeightDecay: wd}}, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := opt.Step(valueGrads(w)); err != nil {
				t.Fatal(err)
			}
			g := []float64{3, 4}
			if clip > 0 {
				g = []float64{3 / (5 + 1e-6), 4 / (5 + 1e-6)}
			}
			want := []float64{1*(1-lr*wd) - lr*g[0]/(g[0]+eps), -2*(1-lr*wd) - lr*g[1]/(g[1]+eps)}
			tol := autograd.TolForward64
			if dt == tensor.Float32 {
				tol = autograd.TolForward32
			}
			if err := tol.Compare(toFloat64s(t, w.val), want); err != nil {
				t.Errorf("%v clip %v: %v", dt, clip, err)
			}
			if got := toFloat64s(t, w.grad); !slices.Equal(got, []float64{0, 0}) {
				t.Errorf("%v: the gradient after the step is %v, want zeros", dt, got)
			}
			norm, err := opt.GradNorm()
			if clip > 0 && (err != nil || norm != 5) {
				t.Errorf("%v: GradNorm = %v, %v; want 5", dt, norm, err)
			}
			if clip == 0 && err == nil {
				t.Errorf("%v: GradNorm without clipping = %v, want an error", dt, norm)
			}
		}
	}
}

// A parameter left out of a step is left alone, and its group's learning
// rate can change between steps; KeepGrads keeps the gradients; NaN
// gradients make every parameter NaN (torch's default clip).
func TestAdamWSubsetsRatesAndNaN(t *testing.T) {
	dt := tensor.Float64
	a := newTestParam("a", dt, []float64{1, 2}, 2)
	b := newTestParam("b", dt, []float64{3}, 1)
	cfg := DefaultAdamWConfig()
	cfg.KeepGrads = true
	opt, err := NewAdamW([]ParamGroup{{Params: valueGrads(a), LR: 0.1}, {Params: valueGrads(b), LR: 0.5}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.setGrad(t, []float64{1, -1})
	b.setGrad(t, []float64{2})
	if err := opt.Step(valueGrads(a)); err != nil {
		t.Fatal(err)
	}
	if got := toFloat64s(t, b.val); got[0] != 3 {
		t.Errorf("b, left out, = %v, want 3", got)
	}
	if got := toFloat64s(t, a.grad); !slices.Equal(got, []float64{1, -1}) {
		t.Errorf("KeepGrads: a's gradient = %v", got)
	}
	if err := opt.SetLR(1, 0.25); err != nil {
		t.Fatal(err)
	}
	if err := opt.Step(valueGrads(b)); err != nil {
		t.Fatal(err)
	}
	// Step 2 of b's first update: m_hat = g, v_hat = g^2 still (constant
	// bias corrections cancel for a first gradient at any t).
	m, v, _ := opt.Moments(b)
	bc1, bc2 := 1-math.Pow(0.9, 2), 1-math.Pow(0.999, 2)
	want := 3 - 0.25*toFloat64s(t, m)[0]/bc1/(math.Sqrt(toFloat64s(t, v)[0]/bc2)+1e-8)
	if err := autograd.TolForward64.Compare(toFloat64s(t, b.val), []float64{want}); err != nil {
		t.Errorf("b after SetLR: %v", err)
	}
	if opt.Steps() != 2 || opt.LR(1) != 0.25 {
		t.Errorf("Steps, LR(1) = %d, %v; want 2, 0.25", opt.Steps(), opt.LR(1))
	}

	c := newTestParam("c", tensor.Float32, []float64{1, 2, 3}, 3)
	d := newTestParam("d", tensor.Float32, []float64{4}, 1)
	cfg = DefaultAdamWConfig()
	cfg.MaxGradNorm = 1
	opt, err = NewAdamW([]ParamGroup{{Params: valueGrads(c, d), LR: 0.1}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.setGrad(t, []float64{1, math.NaN(), 1})
	d.setGrad(t, []float64{1})
	if err := opt.Step(valueGrads(c, d)); err != nil {
		t.Fatal(err)
	}
	if norm, err := opt.GradNorm(); err != nil || !math.IsNaN(norm) {
		t.Errorf("GradNorm = %v, %v; want NaN", norm, err)
	}
	for _, p := range []*testParam{c, d} {
		for i, v := range toFloat64s(t, p.val) {
			if !math.IsNaN(v) {
				t.Errorf("%s[%d] = %v, want NaN", p.name, i, v)
			}
		}
	}
}

// AdamW as gorgonia's solver: a graph's learnables bound with
// BindDualValues, trained for three steps. The loss sum(w * x) has the
// constant gradient x, so the trajectory is AdamW's with that gradient at
// every step (which also shows that each step sees the new gradient, not
// one added up over the runs).
func TestAdamWTrainsAGraph(t *testing.T) {
	g := G.NewGraph()
	xv := []float64{0.5, -1, 2, 0.25}
	w := G.NewVector(g, tensor.Float64, G.WithShape(4), G.WithName("w"), G.WithValue(tensor.New(tensor.WithBacking([]float64{1, 1, 1, 1}))))
	x := G.NewVector(g, tensor.Float64, G.WithShape(4), G.WithName("x"), G.WithValue(tensor.New(tensor.WithBacking(slices.Clone(xv)))))
	loss := G.Must(G.Sum(G.Must(G.HadamardProd(w, x))))
	if _, err := G.Grad(loss, w); err != nil {
		t.Fatal(err)
	}
	m := G.NewTapeMachine(g, G.BindDualValues(w))
	defer m.Close()
	cfg := DefaultAdamWConfig()
	cfg.MaxGradNorm = 1
	opt, err := NewAdamW([]ParamGroup{{Params: G.NodesToValueGrads(G.Nodes{w}), LR: 0.1, WeightDecay: 0.01}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{1, 1, 1, 1}
	wm, wv := make([]float64, 4), make([]float64, 4)
	norm := math.Sqrt(0.25 + 1 + 4 + 0.0625)
	for step := 1; step <= 3; step++ {
		if err := m.RunAll(); err != nil {
			t.Fatal(err)
		}
		if err := opt.Step(G.NodesToValueGrads(G.Nodes{w})); err != nil {
			t.Fatal(err)
		}
		m.Reset()
		gr := slices.Clone(xv)
		kernels.AdamWUpdate(kernels.NewAdamWScalars(0.9, 0.999, 1e-8, 0.1, 0.01, step), kernels.AdamWClipCoef(norm, 1), true, true, want, gr, wm, wv)
		if err := autograd.TolForward64.Compare(toFloat64s(t, w.Value()), want); err != nil {
			t.Errorf("step %d: w: %v", step, err)
		}
		if got, err := opt.GradNorm(); err != nil || math.Abs(got-norm) > 1e-12 {
			t.Errorf("step %d: GradNorm = %v, %v; want %v", step, got, err, norm)
		}
	}
}

// Bad configurations, groups and steps are errors that say what is wrong.
func TestAdamWBadInputs(t *testing.T) {
	f32 := func(name string) *testParam { return newTestParam(name, tensor.Float32, []float64{1, 2}, 2) }
	p, q := f32("p"), f32("q")
	good := DefaultAdamWConfig()
	with := func(f func(*AdamWConfig)) AdamWConfig { c := good; f(&c); return c }
	one := []ParamGroup{{Params: valueGrads(p), LR: 1e-3}}
	view := newTestParam("view", tensor.Float64, []float64{1, 2, 3, 4}, 2, 2)
	sliced, err := view.val.Slice(G.S(1))
	if err != nil {
		t.Fatal(err)
	}
	view.val = sliced.(*tensor.Dense)
	ints := &testParam{name: "ints", val: tensor.New(tensor.WithBacking([]int{1, 2}))}
	seventeen := make([]ParamGroup, 17)
	for i := range seventeen {
		seventeen[i] = ParamGroup{Params: valueGrads(f32(fmt.Sprint(i))), LR: 1}
	}
	for _, c := range []struct {
		name   string
		groups []ParamGroup
		cfg    AdamWConfig
		want   string
	}{
		{"beta1 1", one, with(func(c *AdamWConfig) { c.Beta1 = 1 }), "Beta1 = 1: want a value in [0, 1)"},
		{"beta2 negative", one, with(func(c *AdamWConfig) { c.Beta2 = -0.1 }), "Beta2 = -0.1: want a value in [0, 1)"},
		{"beta1 NaN", one, with(func(c *AdamWConfig) { c.Beta1 = math.NaN() }), "Beta1 = NaN"},
		{"eps 0", one, with(func(c *AdamWConfig) { c.Eps = 0 }), "Eps = 0: want a finite value > 0"},
		{"eps NaN", one, with(func(c *AdamWConfig) { c.Eps = math.NaN() }), "Eps = NaN"},
		{"max norm negative", one, with(func(c *AdamWConfig) { c.MaxGradNorm = -1 }), "MaxGradNorm = -1: want a finite value > 0, or 0 for no clipping"},
		{"max norm inf", one, with(func(c *AdamWConfig) { c.MaxGradNorm = math.Inf(1) }), "MaxGradNorm = +Inf"},
		{"lr negative", []ParamGroup{{Params: valueGrads(p), LR: -1}}, good, "group 0: LR = -1: want a finite value >= 0"},
		{"lr NaN", []ParamGroup{{Params: valueGrads(p), LR: math.NaN()}}, good, "group 0: LR = NaN"},
		{"weight decay negative", []ParamGroup{{Params: valueGrads(p)}, {Params: valueGrads(q), WeightDecay: -0.1}}, good, "group 1: WeightDecay = -0.1"},
		{"no groups", nil, good, "0 parameter groups: want 1 to 16"},
		{"17 groups", seventeen, good, "17 parameter groups: want 1 to 16"},
		{"no parameters", []ParamGroup{{LR: 1}}, good, "the parameter groups hold no parameters"},
		{"in two groups", []ParamGroup{{Params: valueGrads(p)}, {Params: valueGrads(q, p)}}, good, "parameter p (group 1) is also parameter p (group 0): a parameter belongs to one group"},
		{"nil", []ParamGroup{{Params: []G.ValueGrad{nil}}}, good, "parameter 0 of group 0 is nil"},
		{"no value", []ParamGroup{{Params: valueGrads(&testParam{name: "empty"})}}, good, "parameter empty (group 0): its value must be a *tensor.Dense"},
		{"ints", []ParamGroup{{Params: valueGrads(ints)}}, good, "parameter ints (group 0) has dtype int: want float32 or float64"},
		{"mixed dtypes", []ParamGroup{{Params: valueGrads(p, newTestParam("d", tensor.Float64, []float64{1}, 1))}}, good,
			"parameter d (group 0) has dtype float64 but parameter p (group 0) has float32: one optimiser takes one dtype"},
		{"view", []ParamGroup{{Params: valueGrads(view)}}, good, "parameter view (group 0) is a view"},
	} {
		_, err := NewAdamW(c.groups, c.cfg)
		if err == nil || !strings.HasPrefix(err.Error(), "ops: AdamW: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error with %q", c.name, err, c.want)
		}
	}

	// Steps.
	opt, err := NewAdamW([]ParamGroup{{Params: valueGrads(p, q), LR: 1e-3}}, good)
	if err != nil {
		t.Fatal(err)
	}
	stranger := f32("stranger")
	noGrad := f32("nograd")
	wrongShape := f32("shape")
	wrongDtype := f32("dtype")
	opt2, err := NewAdamW([]ParamGroup{{Params: valueGrads(noGrad, wrongShape, wrongDtype), LR: 1e-3}}, good)
	if err != nil {
		t.Fatal(err)
	}
	noGrad.grad = nil
	wrongShape.grad = fromFloat64s(tensor.Float32, []float64{1, 2, 3}, 3)
	wrongDtype.grad = fromFloat64s(tensor.Float64, []float64{1, 2}, 2)
	for _, c := range []struct {
		name  string
		opt   *AdamW
		model []G.ValueGrad
		want  string
	}{
		{"stranger", opt, valueGrads(p, stranger), "model[1] (stranger) is in no parameter group"},
		{"twice", opt, valueGrads(p, q, p), "model[0] and model[2] are both parameter p (group 0)"},
		{"no gradient", opt2, valueGrads(noGrad), "parameter nograd (group 0) has no gradient: no gradient"},
		{"gradient shape", opt2, valueGrads(wrongShape), "parameter shape (group 0): its gradient has shape (3), want (2)"},
		{"gradient dtype", opt2, valueGrads(wrongDtype), "parameter dtype (group 0): its gradient has dtype float64, want float32"},
	} {
		before := toFloat64s(t, p.val)
		err := c.opt.Step(c.model)
		if err == nil || !strings.HasPrefix(err.Error(), "ops: AdamW: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error with %q", c.name, err, c.want)
		}
		if got := toFloat64s(t, p.val); !slices.Equal(got, before) || c.opt.Steps() != 0 {
			t.Errorf("%s: a refused step changed p to %v (steps %d)", c.name, got, c.opt.Steps())
		}
	}
	if err := opt.SetLR(1, 0.1); err == nil || !strings.Contains(err.Error(), "SetLR: group 1 of 1") {
		t.Errorf("SetLR of a missing group: %v", err)
	}
	if err := opt.SetLR(0, math.Inf(1)); err == nil || !strings.Contains(err.Error(), "LR = +Inf") {
		t.Errorf("SetLR(+Inf): %v", err)
	}
	if _, _, err := opt.Moments(stranger); err == nil {
		t.Error("Moments of a stranger: no error")
	}
	if err := opt.Free(); err != nil {
		t.Fatal(err)
	}
	if err := opt.Step(valueGrads(p)); err == nil || !strings.Contains(err.Error(), "Step after Free") {
		t.Errorf("Step after Free: %v", err)
	}
}

// ParamsWithGrads hands AdamW the gradient nodes' values, without
// BindDualValues: a small regression trains, and the pairing refuses what
// cannot be a parameter and its gradient.
func TestParamsWithGrads(t *testing.T) {
	g := G.NewGraph()
	rng := rand.New(rand.NewPCG(5, 6))
	w := G.NodeFromAny(g, randTensor(rng, tensor.Float64, -1, 1, 2, 3), G.WithName("w"))
	b := G.NodeFromAny(g, randTensor(rng, tensor.Float64, -1, 1, 2), G.WithName("b"))
	x := G.NodeFromAny(g, randTensor(rng, tensor.Float64, -1, 1, 5, 3), G.WithName("x"))
	target := G.NodeFromAny(g, randTensor(rng, tensor.Float64, -1, 1, 5, 2), G.WithName("target"))
	y, err := Linear(x, w, b)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Sub(y, target)
	if err != nil {
		t.Fatal(err)
	}
	sq, err := Square(d)
	if err != nil {
		t.Fatal(err)
	}
	loss, err := Mean(sq, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	grads, err := G.Grad(loss, w, b)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name          string
		params, grads G.Nodes
		want          string
	}{
		{"counts differ", G.Nodes{w, b}, grads[:1], "2 parameters and 1 gradients"},
		{"not an input", G.Nodes{y, b}, grads, `is not an input node`},
		{"swapped", G.Nodes{w, b}, G.Nodes{grads[1], grads[0]}, `is float64 (2, 3) but its gradient`},
		{"nil", G.Nodes{w, nil}, grads, "parameter 1 or its gradient is nil"},
	} {
		if _, err := ParamsWithGrads(c.params, c.grads); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.name, err, c.want)
		}
	}
	pg, err := ParamsWithGrads(G.Nodes{w, b}, grads)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pg[0].Grad(); err == nil || !strings.Contains(err.Error(), "run the machine before the step") {
		t.Errorf("Grad before a run: %v", err)
	}
	opt, err := NewAdamW([]ParamGroup{{Params: pg, LR: 0.05}}, DefaultAdamWConfig())
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewTapeMachine(g)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var first, last float64
	for step := range 60 {
		if err := m.RunAll(); err != nil {
			t.Fatal(err)
		}
		last = toFloat64s(t, loss.Value())[0]
		if step == 0 {
			first = last
		}
		if err := opt.Step(pg); err != nil {
			t.Fatal(err)
		}
		m.Reset()
	}
	if !(last < first/2) {
		t.Errorf("loss %v -> %v after 60 steps: it should at least halve", first, last)
	}
}

// TestAdamWSetState: an optimiser restored from another's state (steps and
// moments, as a checkpoint keeps them) steps exactly as the original goes
// on stepping; bad state is refused and changes nothing.
func TestAdamWSetState(t *testing.T) {
	dt := tensor.Float32
	newParams := func() (*testParam, *testParam) {
		return newTestParam("a", dt, []float64{1, -2, 3}, 3), newTestParam("b", dt, []float64{0.5}, 1)
	}
	cfg := DefaultAdamWConfig()
	cfg.MaxGradNorm, cfg.KeepGrads = 1, true
	grads := [][2][]float64{{{0.3, -1, 2}, {4}}, {{-0.1, 0.2, 0.7}, {-1}}, {{1, 1, -1}, {0.25}}}
	step := func(opt *AdamW, a, b *testParam, g [2][]float64) {
		t.Helper()
		a.setGrad(t, g[0])
		b.setGrad(t, g[1])
		if err := opt.Step(valueGrads(a, b)); err != nil {
			t.Fatal(err)
		}
	}
	a, b := newParams()
	opt, err := NewAdamW([]ParamGroup{{Params: valueGrads(a), LR: 0.1, WeightDecay: 0.01}, {Params: valueGrads(b), LR: 0.2}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	step(opt, a, b, grads[0])
	step(opt, a, b, grads[1])

	// The copy starts from the original's values and state.
	a2, b2 := newParams()
	copy(a2.val.Float32s(), a.val.Float32s())
	copy(b2.val.Float32s(), b.val.Float32s())
	restored, err := NewAdamW([]ParamGroup{{Params: valueGrads(a2), LR: 0.1, WeightDecay: 0.01}, {Params: valueGrads(b2), LR: 0.2}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	state := map[G.ValueGrad][2]*tensor.Dense{}
	for _, p := range [][2]*testParam{{a, a2}, {b, b2}} {
		m, v, err := opt.Moments(p[0])
		if err != nil {
			t.Fatal(err)
		}
		state[p[1]] = [2]*tensor.Dense{m.Clone().(*tensor.Dense), v.Clone().(*tensor.Dense)}
	}
	wrong := map[G.ValueGrad][2]*tensor.Dense{a2: {state[a2][0], tensor.New(tensor.Of(dt), tensor.WithShape(2))}}
	if err := restored.SetState(5, wrong); err == nil || !strings.Contains(err.Error(), "second moment") {
		t.Errorf("SetState with a moment of the wrong shape: %v", err)
	}
	if restored.Steps() != 0 {
		t.Errorf("a refused SetState changed Steps to %d", restored.Steps())
	}
	if err := restored.SetState(opt.Steps(), state); err != nil {
		t.Fatal(err)
	}
	step(opt, a, b, grads[2])
	step(restored, a2, b2, grads[2])
	for _, p := range [][2]*testParam{{a, a2}, {b, b2}} {
		if !slices.Equal(p[0].val.Float32s(), p[1].val.Float32s()) {
			t.Errorf("%s: restored %v, original %v", p[0].name, p[1].val.Float32s(), p[0].val.Float32s())
		}
	}
}
