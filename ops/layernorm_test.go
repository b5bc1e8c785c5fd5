package ops

import (
	"encoding/json"
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

// layerNormBuild applies LayerNorm to in[0] with gamma and beta, when
// present, taken from in[1:] in that order.
func layerNormBuild(gamma, beta bool, eps float64) func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
	return func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
		var gn, bn *G.Node
		i := 1
		if gamma {
			gn, i = in[i], i+1
		}
		if beta {
			bn = in[i]
		}
		return LayerNorm(in[0], gn, bn, eps)
	}
}

// Two rows worked by hand. Row [1 2 3 4] has mean 5/2 and variance 5/4;
// row [0 0 4 4] has mean 2 and variance 4, so xhat = [-2 -2 2 2]*r with
// r = 1/sqrt(4 + eps). With the loss y[1][0] (a projection of 1 there, 0
// elsewhere) and gamma = 1, g = [1 0 0 0] on row 1: mean(g) = 1/4 and
// mean(g*xhat) = -r/2, so dx = r*(g - 1/4 + xhat*r/2) = r*[3/4 - r², -1/4
// - r², -1/4 + r², -1/4 + r²], dgamma = xhat of that element, [-2r 0 0 0],
// and dbeta = [1 0 0 0].
func TestLayerNormHandValues(t *testing.T) {
	const eps = 1e-5
	x := dense64([]int{2, 4}, 1, 2, 3, 4, 0, 0, 4, 4)
	gamma := dense64([]int{4}, 1, 1, 1, 1)
	beta := dense64([]int{4}, 0.5, 0, 0, -1)
	r0 := 1 / math.Sqrt(1.25+eps)
	r := 1 / math.Sqrt(4+eps)
	wantY := []float64{
		-1.5*r0 + 0.5, -0.5 * r0, 0.5 * r0, 1.5*r0 - 1,
		-2*r + 0.5, -2 * r, 2 * r, 2*r - 1,
	}
	p := dense64([]int{2, 4}, 0, 0, 0, 0, 1, 0, 0, 0)
	wantDx := []float64{0, 0, 0, 0, r * (0.75 - r*r), r * (-0.25 - r*r), r * (-0.25 + r*r), r * (-0.25 + r*r)}
	wantDgamma := []float64{-2 * r, 0, 0, 0}
	wantDbeta := []float64{1, 0, 0, 0}
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		tol := autograd.TolForward64
		if dt == tensor.Float32 {
			tol = autograd.TolForward32
		}
		in := []*tensor.Dense{cast(t, x, dt), cast(t, gamma, dt), cast(t, beta, dt)}
		got, shape, err := runGraph(t, in, layerNormBuild(true, true, eps))
		if err != nil {
			t.Fatal(err)
		}
		if !shape.Eq(tensor.Shape{2, 4}) {
			t.Errorf("%v: y has shape %v, want (2, 4)", dt, shape)
		}
		if err := tol.Compare(got, wantY); err != nil {
			t.Errorf("%v: y: %v", dt, err)
		}
		grads := gradOf(t, in, cast(t, p, dt), []int{0, 1, 2}, layerNormBuild(true, true, eps))
		for i, want := range [][]float64{wantDx, wantDgamma, wantDbeta} {
			if err := tol.Compare(grads[i], want); err != nil {
				t.Errorf("%v: gradient of %s: %v", dt, [...]string{"x", "gamma", "beta"}[i], err)
			}
		}
	}
}

// eps 0 is DefaultEps, PyTorch's 1e-5.
func TestLayerNormDefaultEps(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 10))
	x := randTensor(rng, tensor.Float64, -1, 1, 3, 5)
	a, _, err := runGraph(t, []*tensor.Dense{x}, layerNormBuild(false, false, 0))
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := runGraph(t, []*tensor.Dense{x}, layerNormBuild(false, false, DefaultEps))
	if err != nil {
		t.Fatal(err)
	}
	if !equalFloats(a, b) {
		t.Errorf("eps 0 gives %v, eps %v gives %v", a, DefaultEps, b)
	}
}

func TestLayerNormGradCheck(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 11))
	for i, c := range []struct {
		x           []int
		gamma, beta bool
		eps         float64
	}{
		{[]int{5}, true, true, 0},
		{[]int{3, 4}, true, true, 0},
		{[]int{2, 3, 7}, false, false, 0},
		{[]int{2, 1, 4, 33}, true, false, 1e-3},
		{[]int{6, 3}, false, true, 0},
		{[]int{4, 1}, true, true, 0},
		{[]int{3, 256}, true, true, 0},
		{[]int{2, 1030}, true, true, 0},
	} {
		for seed := range uint64(3) {
			name := fmt.Sprintf("x%v gamma=%t beta=%t eps=%v seed=%d", c.x, c.gamma, c.beta, c.eps, seed)
			inputs := []autograd.Input{{Name: "x", Value: randTensor(rng, tensor.Float64, -1, 1, c.x...)}}
			cs := c.x[len(c.x)-1]
			if c.gamma {
				inputs = append(inputs, autograd.Input{Name: "gamma", Value: randTensor(rng, tensor.Float64, 0.5, 1.5, cs)})
			}
			if c.beta {
				inputs = append(inputs, autograd.Input{Name: "beta", Value: randTensor(rng, tensor.Float64, -1, 1, cs)})
			}
			results, err := autograd.CheckGrad(layerNormBuild(c.gamma, c.beta, c.eps), inputs, uint64(i)*10+seed)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			for _, r := range results {
				// A row of one value is its own mean: xhat = 0 and y =
				// beta, whatever x and gamma.
				if r.Scale == 0 && !(r.Name != "beta" && cs == 1) {
					t.Errorf("%s: %s: zero gradient, the check proves nothing", name, r.Name)
				}
			}
		}
	}
}

// jsonFloats decodes a list of numbers in which null is NaN; a null list
// is nil.
type jsonFloats []float64

func (f *jsonFloats) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*f = nil
		return nil
	}
	var v []*float64
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*f = make([]float64, len(v))
	for i, p := range v {
		if p == nil {
			(*f)[i] = math.NaN()
		} else {
			(*f)[i] = *p
		}
	}
	return nil
}

// layerNormCase is one case of testdata/layernorm.json (gen_layernorm.py).
type layerNormCase struct {
	Name   string
	Dtypes []string
	Shape  []int
	Eps    float64
	// Gamma and Beta are nil when the case has none.
	X, Gamma, Beta, Proj jsonFloats
	Y, Dx, Dgamma, Dbeta jsonFloats
}

func TestLayerNormMatchesPyTorch(t *testing.T) {
	var ref struct {
		Torch string
		Cases []layerNormCase
	}
	loadJSON(t, "testdata/layernorm.json", &ref)
	if len(ref.Cases) == 0 {
		t.Fatal("no cases in testdata/layernorm.json")
	}
	for _, c := range ref.Cases {
		hasGamma, hasBeta := c.Gamma != nil, c.Beta != nil
		cs := c.Shape[len(c.Shape)-1]
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
			build := layerNormBuild(hasGamma, hasBeta, c.Eps)
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

func TestLayerNormBadInput(t *testing.T) {
	g := G.NewGraph()
	node := func(dt tensor.Dtype, name string, shape ...int) *G.Node {
		return G.NewTensor(g, dt, len(shape), G.WithShape(shape...), G.WithName(name))
	}
	f32, f64 := tensor.Float32, tensor.Float64
	x := node(f32, "x", 2, 3, 4)
	gamma := node(f32, "gamma", 4)
	beta := node(f32, "beta", 4)
	for _, c := range []struct {
		name           string
		x, gamma, beta *G.Node
		eps            float64
		want           string
	}{
		{"nil x", nil, gamma, beta, 0, "x is nil, want shape [... C]"},
		{"scalar x", G.NewScalar(g, f32, G.WithName("s")), nil, nil, 0, "x must have shape [... C] (one dimension or more), got a scalar"},
		{"int x", node(tensor.Int, "xi", 2, 4), nil, nil, 0, "x must be float32 or float64, got int"},
		{"empty x", node(f32, "x0", 0, 4), nil, nil, 0, "x must have positive sizes, got (0, 4) (dimension 0)"},
		{"empty C", node(f32, "xc0", 3, 0), nil, nil, 0, "x must have positive sizes, got (3, 0) (dimension 1)"},
		{"gamma size", x, node(f32, "g3", 3), beta, 0, "gamma must have shape [C] = [4] like x's last dimension (or be nil), got (3)"},
		{"gamma rank", x, node(f32, "g14", 1, 4), beta, 0, "gamma must have shape [C] = [4] like x's last dimension (or be nil), got (1, 4)"},
		{"beta size", x, gamma, node(f32, "b5", 5), 0, "beta must have shape [C] = [4] like x's last dimension (or be nil), got (5)"},
		{"gamma float64", x, node(f64, "g64", 4), beta, 0, "gamma has dtype float64, want float32 like the first input"},
		{"beta float64", x, nil, node(f64, "b64", 4), 0, "beta has dtype float64, want float32 like the first input"},
		{"eps negative", x, gamma, beta, -1e-5, "eps must be finite and positive (0 for DefaultEps), got -1e-05"},
		{"eps NaN", x, gamma, beta, math.NaN(), "eps must be finite and positive (0 for DefaultEps), got NaN"},
		{"eps +Inf", x, gamma, beta, math.Inf(1), "eps must be finite and positive (0 for DefaultEps), got +Inf"},
	} {
		_, err := LayerNorm(c.x, c.gamma, c.beta, c.eps)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "ops: LayerNorm: ") {
			t.Errorf("%s: got error %v, want one containing %q", c.name, err, c.want)
		}
	}
	// What the checks let through.
	for _, c := range []struct {
		name        string
		gamma, beta *G.Node
	}{{"gamma and beta", gamma, beta}, {"gamma", gamma, nil}, {"beta", nil, beta}, {"neither", nil, nil}} {
		if _, err := LayerNorm(x, c.gamma, c.beta, 1e-6); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// The backward ops say that second derivatives are not implemented, and
// LayerNorm's gradient is made of them (and of the Unpack of its column
// sums).
func TestLayerNormNoSecondDerivative(t *testing.T) {
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float64, G.WithShape(3, 4), G.WithName("x"))
	gamma := G.NewVector(g, tensor.Float64, G.WithShape(4), G.WithName("gamma"))
	beta := G.NewVector(g, tensor.Float64, G.WithShape(4), G.WithName("beta"))
	dy := G.NewMatrix(g, tensor.Float64, G.WithShape(3, 4), G.WithName("dy"))
	y, err := LayerNorm(x, gamma, beta, 0)
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
	for i, want := range []string{"LayerNormGradX", "unpack[0:4 of 8]", "unpack[4:8 of 8]"} {
		if got := grads[i].Op().String(); !strings.HasPrefix(got, want) {
			t.Errorf("gradient %d is %s, want %s", i, got, want)
		}
	}
	s, err := layerNormShapeOf(x, gamma, beta, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		op *specOp
		in G.Nodes
	}{{layerNormGradXOp(s), G.Nodes{x, gamma, dy}}, {layerNormGradParamsOp(s), G.Nodes{x, dy}}} {
		_, err := c.op.SymDiff(c.in, nil, dy)
		if err == nil || !strings.Contains(err.Error(), "ops: LayerNorm: second derivatives are not implemented") {
			t.Errorf("%v: second derivative: got %v", c.op, err)
		}
	}
}

// Ops that compute different things hash apart: gorgonia merges nodes
// whose ops hash alike.
func TestLayerNormOpsHashApart(t *testing.T) {
	base := layerNormShape{x: tensor.Shape{3, 4}, rows: 3, c: 4, gamma: true, beta: true, eps: 1e-5, dt: tensor.Float32}
	noGamma, noBeta, eps, f64, shape := base, base, base, base, base
	noGamma.gamma, noBeta.beta, eps.eps, f64.dt = false, false, 1e-6, tensor.Float64
	shape.x, shape.rows, shape.c = tensor.Shape{2, 6}, 2, 6
	hashes := map[uint32]string{}
	for _, s := range []layerNormShape{base, noGamma, noBeta, eps, f64, shape} {
		for _, op := range []*specOp{layerNormOp(s), layerNormGradXOp(s), layerNormGradParamsOp(s)} {
			h := op.Hashcode()
			if prev, ok := hashes[h]; ok {
				t.Errorf("%v hashes like %v", op, prev)
			}
			hashes[h] = op.String()
		}
	}
}

// A small network with LayerNorm between two Linear layers learns a fixed
// target under gorgonia's training machinery: dual values, a tape machine
// and Adam, gamma and beta among the parameters.
func TestLayerNormTrainsWithAdam(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 12))
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
	n, err := LayerNorm(h, gamma, beta, 0)
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
// kernel of layernorm.cu chosen for some shape (none shipped for nothing).
func TestLayerNormLaunch(t *testing.T) {
	chosen := map[string]bool{}
	for _, c := range []struct {
		rows, c int
		dt      tensor.Dtype
		want    string // the forward's kernel, less "layernorm_fwd_" and the dtype
		threads int    // the row kernels' block
		grid    int    // the forward's and dx's grid
		blocks  int    // the column sums'
	}{
		{44446, 256, tensor.Float32, "warp_row1k", 256, 5556, 1024},
		{600, 256, tensor.Float32, "warp_row1k", 256, 75, 75},
		{600, 256, tensor.Float64, "warp_row4k", 256, 75, 75},
		{13, 128, tensor.Float64, "warp_row1k", 256, 2, 2},
		{13, 1024, tensor.Float32, "warp_row4k", 256, 2, 2},
		{13, 512, tensor.Float64, "warp_row4k", 256, 2, 2},
		{13, 1032, tensor.Float32, "block_v16b", 96, 13, 13},
		{3000, 1024, tensor.Float64, "block_v16b", 128, 3000, 1024},
		{13, 1030, tensor.Float32, "block", 288, 13, 13},
		{13, 3, tensor.Float64, "block", 32, 13, 13},
	} {
		s := layerNormShape{x: tensor.Shape{c.rows, c.c}, rows: c.rows, c: c.c, gamma: true, beta: true, eps: 1e-5, dt: c.dt}
		p := s.params()
		for pass, prefix := range []string{"layernorm_fwd_", "layernorm_bwd_dx_", "layernorm_bwd_params_"} {
			k, cfg, err := s.layerNormLaunch(layerNormPass(pass), p)
			if err != nil {
				t.Fatal(err)
			}
			chosen[k.Name()] = true
			want := prefix + c.want + map[tensor.Dtype]string{tensor.Float32: "_f32", tensor.Float64: "_f64"}[c.dt]
			grid := c.grid
			if layerNormPass(pass) == lnBackwardParams {
				grid = c.blocks
			}
			if k.Name() != want || k.Module() != "layernorm" || cfg.Block.X != uint32(c.threads) || cfg.Grid.X != uint32(grid) {
				t.Errorf("[%d %d] %v: %s grid %d block %d, want %s grid %d block %d", c.rows, c.c, c.dt, k, cfg.Grid.X, cfg.Block.X, want, grid, c.threads)
			}
		}
	}
	chosen["layernorm_colsum_f32"], chosen["layernorm_colsum_f64"] = true, true
	for _, k := range cuda.Kernels() {
		if k.Module == "layernorm" && !chosen[k.Name] {
			t.Errorf("%s is never chosen", k.Name)
		}
	}
}
