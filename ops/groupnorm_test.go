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
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// groupNormBuild applies GroupNorm in groups groups to in[0] with gamma and
// beta, when present, taken from in[1:] in that order.
func groupNormBuild(groups int, gamma, beta bool, eps float64) func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
	return func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
		var gn, bn *G.Node
		i := 1
		if gamma {
			gn, i = in[i], i+1
		}
		if beta {
			bn = in[i]
		}
		return GroupNorm(in[0], groups, gn, bn, eps)
	}
}

// One sample of four channels of two values, in two groups, worked by
// hand. Group 0 (channels 0, 1) holds [1 2 3 4], of mean 5/2 and variance
// 5/4; group 1 (channels 2, 3) holds [0 0 4 4], of mean 2 and variance 4,
// so xhat = [-2 -2 2 2]*r with r = 1/sqrt(4 + eps). With the loss y[0, 2,
// 0] (a projection of 1 there, 0 elsewhere) and gamma = 1, g = [1 0 0 0]
// on group 1: mean(g) = 1/4 and mean(g*xhat) = -r/2, so dx = r*(g - 1/4 +
// xhat*r/2) = r*[3/4 - r², -1/4 - r², -1/4 + r², -1/4 + r²] there,
// dgamma[2] = xhat of that element, -2r, and dbeta[2] = 1.
func TestGroupNormHandValues(t *testing.T) {
	const eps = 1e-5
	x := dense64([]int{1, 4, 2}, 1, 2, 3, 4, 0, 0, 4, 4)
	gamma := dense64([]int{4}, 1, 1, 1, 1)
	beta := dense64([]int{4}, 0.5, 0, 0, -1)
	r0 := 1 / math.Sqrt(1.25+eps)
	r := 1 / math.Sqrt(4+eps)
	wantY := []float64{
		-1.5*r0 + 0.5, -0.5*r0 + 0.5, 0.5 * r0, 1.5 * r0,
		-2 * r, -2 * r, 2*r - 1, 2*r - 1,
	}
	p := dense64([]int{1, 4, 2}, 0, 0, 0, 0, 1, 0, 0, 0)
	wantDx := []float64{0, 0, 0, 0, r * (0.75 - r*r), r * (-0.25 - r*r), r * (-0.25 + r*r), r * (-0.25 + r*r)}
	wantDgamma := []float64{0, 0, -2 * r, 0}
	wantDbeta := []float64{0, 0, 1, 0}
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		tol := autograd.TolForward64
		if dt == tensor.Float32 {
			tol = autograd.TolForward32
		}
		in := []*tensor.Dense{cast(t, x, dt), cast(t, gamma, dt), cast(t, beta, dt)}
		got, shape, err := runGraph(t, in, groupNormBuild(2, true, true, eps))
		if err != nil {
			t.Fatal(err)
		}
		if !shape.Eq(tensor.Shape{1, 4, 2}) {
			t.Errorf("%v: y has shape %v, want (1, 4, 2)", dt, shape)
		}
		if err := tol.Compare(got, wantY); err != nil {
			t.Errorf("%v: y: %v", dt, err)
		}
		grads := gradOf(t, in, cast(t, p, dt), []int{0, 1, 2}, groupNormBuild(2, true, true, eps))
		for i, want := range [][]float64{wantDx, wantDgamma, wantDbeta} {
			if err := tol.Compare(grads[i], want); err != nil {
				t.Errorf("%v: gradient of %s: %v", dt, [...]string{"x", "gamma", "beta"}[i], err)
			}
		}
	}
}

// eps 0 is DefaultEps, PyTorch's 1e-5.
func TestGroupNormDefaultEps(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 20))
	x := randTensor(rng, tensor.Float64, -1, 1, 2, 4, 3)
	a, _, err := runGraph(t, []*tensor.Dense{x}, groupNormBuild(2, false, false, 0))
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := runGraph(t, []*tensor.Dense{x}, groupNormBuild(2, false, false, DefaultEps))
	if err != nil {
		t.Fatal(err)
	}
	if !equalFloats(a, b) {
		t.Errorf("eps 0 gives %v, eps %v gives %v", a, DefaultEps, b)
	}
}

func TestGroupNormGradCheck(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 21))
	for i, c := range []struct {
		x           []int
		groups      int
		gamma, beta bool
		eps         float64
	}{
		{[]int{2, 4}, 2, true, true, 0},
		{[]int{2, 6, 3, 3}, 3, true, true, 0},
		{[]int{3, 4, 5}, 1, false, false, 0},
		{[]int{2, 4, 2, 3}, 4, true, false, 1e-3},
		{[]int{1, 6, 2, 2}, 2, false, true, 0},
		{[]int{2, 70, 2}, 2, true, true, 0},
	} {
		for seed := range uint64(2) {
			name := fmt.Sprintf("x%v groups=%d gamma=%t beta=%t eps=%v seed=%d", c.x, c.groups, c.gamma, c.beta, c.eps, seed)
			inputs := []autograd.Input{{Name: "x", Value: randTensor(rng, tensor.Float64, -1, 1, c.x...)}}
			cs := c.x[1]
			if c.gamma {
				inputs = append(inputs, autograd.Input{Name: "gamma", Value: randTensor(rng, tensor.Float64, 0.5, 1.5, cs)})
			}
			if c.beta {
				inputs = append(inputs, autograd.Input{Name: "beta", Value: randTensor(rng, tensor.Float64, -1, 1, cs)})
			}
			results, err := autograd.CheckGrad(groupNormBuild(c.groups, c.gamma, c.beta, c.eps), inputs, uint64(i)*10+seed)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			for _, r := range results {
				if r.Scale == 0 {
					t.Errorf("%s: %s: zero gradient, the check proves nothing", name, r.Name)
				}
			}
		}
	}
}

// groupNormCase is one case of testdata/groupnorm.json (gen_groupnorm.py).
type groupNormCase struct {
	Name   string
	Dtypes []string
	Shape  []int
	Groups int
	Eps    float64
	// Gamma and Beta are nil when the case has none.
	X, Gamma, Beta, Proj jsonFloats
	Y, Dx, Dgamma, Dbeta jsonFloats
}

func TestGroupNormMatchesPyTorch(t *testing.T) {
	var ref struct {
		Torch string
		Cases []groupNormCase
	}
	loadJSON(t, "testdata/groupnorm.json", &ref)
	if len(ref.Cases) == 0 {
		t.Fatal("no cases in testdata/groupnorm.json")
	}
	for _, c := range ref.Cases {
		hasGamma, hasBeta := c.Gamma != nil, c.Beta != nil
		cs := c.Shape[1]
		for _, dts := range c.Dtypes {
			dt, tol := tensor.Float64, autograd.TolForward64
			if dts == "float32" {
				dt, tol = tensor.Float32, autograd.TolForward32
			}
			inputs := []*tensor.Dense{fromFloat64s(dt, c.X, c.Shape...)}
			names := []string{"x"}
			wants := [][]float64{c.Dx}
			if hasGamma {
				inputs, names, wants = append(inputs, fromFloat64s(dt, c.Gamma, cs)), append(names, "gamma"), append(wants, c.Dgamma)
			}
			if hasBeta {
				inputs, names, wants = append(inputs, fromFloat64s(dt, c.Beta, cs)), append(names, "beta"), append(wants, c.Dbeta)
			}
			build := groupNormBuild(c.Groups, hasGamma, hasBeta, c.Eps)
			got, shape, err := runGraph(t, inputs, build)
			if err != nil {
				t.Fatalf("%s %v: %v", c.Name, dt, err)
			}
			if !shape.Eq(tensor.Shape(c.Shape)) {
				t.Errorf("%s %v: y has shape %v, PyTorch's %v", c.Name, dt, shape, c.Shape)
			}
			if err := tol.Compare(got, c.Y); err != nil {
				t.Errorf("%s %v: y: %v", c.Name, dt, err)
			}
			wrt := make([]int, len(inputs))
			for i := range wrt {
				wrt[i] = i
			}
			grads := gradOf(t, inputs, fromFloat64s(dt, c.Proj, c.Shape...), wrt, build)
			for i, name := range names {
				if err := tol.Compare(grads[i], wants[i]); err != nil {
					t.Errorf("%s %v: gradient of %s: %v", c.Name, dt, name, err)
				}
			}
		}
	}
}

func TestGroupNormBadInput(t *testing.T) {
	g := G.NewGraph()
	node := func(dt tensor.Dtype, name string, shape ...int) *G.Node {
		return G.NewTensor(g, dt, len(shape), G.WithShape(shape...), G.WithName(name))
	}
	f32, f64 := tensor.Float32, tensor.Float64
	x := node(f32, "x", 2, 4, 3, 3)
	gamma := node(f32, "gamma", 4)
	beta := node(f32, "beta", 4)
	for _, c := range []struct {
		name        string
		x           *G.Node
		groups      int
		gamma, beta *G.Node
		eps         float64
		want        string
	}{
		{"nil x", nil, 2, gamma, beta, 0, "x is nil, want shape [N C ...]"},
		{"scalar x", G.NewScalar(g, f32, G.WithName("s")), 1, nil, nil, 0, "x must have shape [N C ...] (two dimensions or more), got ()"},
		{"vector x", node(f32, "v", 4), 1, nil, nil, 0, "x must have shape [N C ...] (two dimensions or more), got (4)"},
		{"int x", node(tensor.Int, "xi", 2, 4), 2, nil, nil, 0, "x must be float32 or float64, got int"},
		{"empty x", node(f32, "x0", 0, 4, 3), 2, nil, nil, 0, "x must have positive sizes, got (0, 4, 3) (dimension 0)"},
		{"empty plane", node(f32, "xp0", 2, 4, 0), 2, nil, nil, 0, "x must have positive sizes, got (2, 4, 0) (dimension 2)"},
		{"groups 0", x, 0, gamma, beta, 0, "groups must be positive and divide C = 4 (x's dimension 1), got 0"},
		{"groups negative", x, -2, gamma, beta, 0, "groups must be positive and divide C = 4 (x's dimension 1), got -2"},
		{"groups not dividing", x, 3, gamma, beta, 0, "groups must be positive and divide C = 4 (x's dimension 1), got 3"},
		{"groups past C", x, 8, gamma, beta, 0, "groups must be positive and divide C = 4 (x's dimension 1), got 8"},
		{"gamma size", x, 2, node(f32, "g3", 3), beta, 0, "gamma must have shape [C] = [4] like x's dimension 1 (or be nil), got (3)"},
		{"gamma rank", x, 2, node(f32, "g14", 1, 4), beta, 0, "gamma must have shape [C] = [4] like x's dimension 1 (or be nil), got (1, 4)"},
		{"beta size", x, 2, gamma, node(f32, "b5", 5), 0, "beta must have shape [C] = [4] like x's dimension 1 (or be nil), got (5)"},
		{"gamma float64", x, 2, node(f64, "g64", 4), beta, 0, "gamma has dtype float64, want float32 like the first input"},
		{"beta float64", x, 2, nil, node(f64, "b64", 4), 0, "beta has dtype float64, want float32 like the first input"},
		{"eps negative", x, 2, gamma, beta, -1e-5, "eps must be finite and positive (0 for DefaultEps), got -1e-05"},
		{"eps NaN", x, 2, gamma, beta, math.NaN(), "eps must be finite and positive (0 for DefaultEps), got NaN"},
		{"eps +Inf", x, 2, gamma, beta, math.Inf(1), "eps must be finite and positive (0 for DefaultEps), got +Inf"},
	} {
		_, err := GroupNorm(c.x, c.groups, c.gamma, c.beta, c.eps)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "ops: GroupNorm: ") {
			t.Errorf("%s: got error %v, want one containing %q", c.name, err, c.want)
		}
	}
	// What the checks let through.
	for _, c := range []struct {
		name        string
		groups      int
		gamma, beta *G.Node
	}{{"gamma and beta", 2, gamma, beta}, {"gamma", 4, gamma, nil}, {"beta", 1, nil, beta}, {"neither", 2, nil, nil}} {
		if _, err := GroupNorm(x, c.groups, c.gamma, c.beta, 1e-6); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// The backward ops say that second derivatives are not implemented, and
// GroupNorm's gradient is made of them (and of the Unpack of its channel
// sums).
func TestGroupNormNoSecondDerivative(t *testing.T) {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float64, 3, G.WithShape(2, 4, 3), G.WithName("x"))
	gamma := G.NewVector(g, tensor.Float64, G.WithShape(4), G.WithName("gamma"))
	beta := G.NewVector(g, tensor.Float64, G.WithShape(4), G.WithName("beta"))
	dy := G.NewTensor(g, tensor.Float64, 3, G.WithShape(2, 4, 3), G.WithName("dy"))
	y, err := GroupNorm(x, 2, gamma, beta, 0)
	if err != nil {
		t.Fatal(err)
	}
	grads, err := y.Op().(G.SDOp).SymDiff(G.Nodes{x, gamma, beta}, y, dy)
	if err != nil {
		t.Fatal(err)
	}
	if len(grads) != 3 {
		t.Fatalf("%d gradients, want 3", len(grads))
	}
	for i, want := range []string{"GroupNormGradX", "unpack[0:4 of 8]", "unpack[4:8 of 8]"} {
		if got := grads[i].Op().String(); !strings.HasPrefix(got, want) {
			t.Errorf("gradient %d is %s, want %s", i, got, want)
		}
	}
	s, err := groupNormShapeOf(x, 2, gamma, beta, 0)
	if err != nil {
		t.Fatal(err)
	}
	sums := G.NewVector(g, tensor.Float64, G.WithShape(s.params().SumsLen()), G.WithName("sums"))
	for _, c := range []struct {
		op *specOp
		in G.Nodes
	}{
		{groupNormGradSumsOp(s), G.Nodes{x, gamma, dy}},
		{groupNormGradXOp(s), G.Nodes{x, gamma, dy, sums}},
		{groupNormGradParamsOp(s), G.Nodes{sums}},
	} {
		_, err := c.op.SymDiff(c.in, nil, dy)
		if err == nil || !strings.Contains(err.Error(), "ops: GroupNorm: second derivatives are not implemented") {
			t.Errorf("%v: second derivative: got %v", c.op, err)
		}
	}
}

// Ops that compute different things hash apart: gorgonia merges nodes
// whose ops hash alike.
func TestGroupNormOpsHashApart(t *testing.T) {
	base := groupNormShape{x: tensor.Shape{2, 4, 3}, n: 2, c: 4, hw: 3, groups: 2, gamma: true, beta: true, eps: 1e-5, dt: tensor.Float32}
	noGamma, noBeta, eps, f64, shape, groups := base, base, base, base, base, base
	noGamma.gamma, noBeta.beta, eps.eps, f64.dt, groups.groups = false, false, 1e-6, tensor.Float64, 4
	shape.x, shape.hw = tensor.Shape{2, 4, 5}, 5
	hashes := map[uint32]string{}
	for _, s := range []groupNormShape{base, noGamma, noBeta, eps, f64, shape, groups} {
		for _, op := range []*specOp{groupNormOp(s), groupNormGradSumsOp(s), groupNormGradXOp(s), groupNormGradParamsOp(s)} {
			h := op.Hashcode()
			if prev, ok := hashes[h]; ok {
				t.Errorf("%v hashes like %v", op, prev)
			}
			hashes[h] = op.String()
		}
	}
}

// A small network with GroupNorm between two Linear layers learns a fixed
// target under gorgonia's training machinery: dual values, a tape machine
// and Adam, gamma and beta among the parameters.
func TestGroupNormTrainsWithAdam(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 22))
	dt := tensor.Float32
	g := G.NewGraph()
	x := G.NodeFromAny(g, randTensor(rng, dt, -1, 1, 6, 5), G.WithName("x"))
	target := G.NodeFromAny(g, randTensor(rng, dt, -1, 1, 6, 3), G.WithName("target"))
	w1 := G.NodeFromAny(g, randTensor(rng, dt, -0.5, 0.5, 8, 5), G.WithName("w1"))
	gamma := G.NodeFromAny(g, randTensor(rng, dt, 0.9, 1.1, 8), G.WithName("gamma"))
	beta := G.NodeFromAny(g, randTensor(rng, dt, -0.1, 0.1, 8), G.WithName("beta"))
	w2 := G.NodeFromAny(g, randTensor(rng, dt, -0.3, 0.3, 3, 8), G.WithName("w2"))
	h, err := Linear(x, w1, nil)
	if err != nil {
		t.Fatal(err)
	}
	n, err := GroupNorm(h, 2, gamma, beta, 0)
	if err != nil {
		t.Fatal(err)
	}
	y, err := Linear(n, w2, nil)
	if err != nil {
		t.Fatal(err)
	}
	loss := G.Must(G.Mean(G.Must(G.Square(G.Must(G.Sub(y, target))))))
	losses := adamLosses(t, g, loss, G.Nodes{w1, gamma, beta, w2}, 0.05, 60)
	first, last := losses[0], losses[len(losses)-1]
	t.Logf("loss %.4f -> %.4f", first, last)
	if !(last < 0.25*first) {
		t.Errorf("loss went from %v to %v in %d Adam steps, want it below a quarter: %v", first, last, len(losses), losses)
	}
}

// The kernels the device launchers choose and their launches, and every
// kernel of groupnorm.cu chosen for some shape (none shipped for nothing).
func TestGroupNormLaunch(t *testing.T) {
	chosen := map[string]bool{}
	for _, c := range []struct {
		x         []int
		groups    int
		dt        tensor.Dtype
		design    string // the tile kernels', less the pass and the dtype
		grid      int
		rowsFirst bool // stats_rows before fwd
	}{
		{[]int{2, 256, 200, 200}, 32, tensor.Float32, "v16b", 2 * 256 * 10, false},
		{[]int{2, 256, 25, 25}, 32, tensor.Float32, "scalar", 2 * 256, false},
		{[]int{2, 512, 64, 64}, 32, tensor.Float64, "v16b", 2 * 512, false},
		{[]int{3, 6, 4097}, 2, tensor.Float64, "scalar", 3 * 6 * 2, false},
		// 256 channels of 10 tiles a row: 2560 tile sums.
		{[]int{2, 256, 200, 200}, 1, tensor.Float32, "v16b", 2 * 256 * 10, true},
		{[]int{1, 64, 4100}, 8, tensor.Float32, "v16b", 64 * 2, false},
		{[]int{1, 129, 4100}, 1, tensor.Float64, "v16b", 129 * 2, true},
	} {
		s := groupNormShape{x: tensor.Shape(c.x), n: c.x[0], c: c.x[1], hw: tensor.Shape(c.x[2:]).TotalSize(), groups: c.groups, gamma: true, beta: true, eps: 1e-5, dt: c.dt}
		p := s.params()
		suffix := map[tensor.Dtype]string{tensor.Float32: "_f32", tensor.Float64: "_f64"}[c.dt]
		if rowsFirst := p.RowPartials() > cuda.GroupNormInlineRowPartials; rowsFirst != c.rowsFirst {
			t.Errorf("%v groups=%d: stats_rows %t, want %t", c.x, c.groups, rowsFirst, c.rowsFirst)
		} else if rowsFirst {
			chosen["groupnorm_stats_rows"+suffix] = true
		}
		for pass, prefix := range []string{"groupnorm_stats_", "groupnorm_fwd_", "groupnorm_bwd_reduce_", "groupnorm_bwd_dx_"} {
			k, cfg, err := s.groupNormLaunch(groupNormTilePass(pass), p)
			if err != nil {
				t.Fatal(err)
			}
			chosen[k.Name()] = true
			want := prefix + c.design + suffix
			if k.Name() != want || k.Module() != "groupnorm" || cfg.Block.X != 256 || cfg.Grid.X != uint32(c.grid) {
				t.Errorf("%v %v: %s grid %d block %d, want %s grid %d block 256", c.x, c.dt, k, cfg.Grid.X, cfg.Block.X, want, c.grid)
			}
		}
	}
	for _, k := range []string{"groupnorm_bwd_finalize_", "groupnorm_bwd_params_"} {
		chosen[k+"f32"], chosen[k+"f64"] = true, true
	}
	for _, k := range cuda.Kernels() {
		if k.Module == "groupnorm" && !chosen[k.Name] {
			t.Errorf("%s is never chosen", k.Name)
		}
	}
}
