package ops

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/kernels"
)

// binaryOps and unaryOps are the elementwise ops by the names
// gen_pointwise.py gives them.
var binaryOps = map[string]func(a, b *G.Node) (*G.Node, error){
	"add": Add, "sub": Sub, "mul": Mul, "div": Div,
}

func unaryBuild(op string, scale float64) func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
	return func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
		x := in[0]
		switch op {
		case "relu":
			return ReLU(x)
		case "sigmoid":
			return Sigmoid(x)
		case "inverse_sigmoid":
			return InverseSigmoid(x, 0)
		case "exp":
			return Exp(x)
		case "log":
			return Log(x)
		case "sqrt":
			return Sqrt(x)
		case "square":
			return Square(x)
		case "scale":
			return Scale(x, scale)
		}
		panic("unknown op " + op)
	}
}

func binaryBuild(op string) func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
	return func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) { return binaryOps[op](in[0], in[1]) }
}

// pointwiseRef is testdata/pointwise.json (gen_pointwise.py).
type pointwiseRef struct {
	Torch  string `json:"torch"`
	Binary []struct {
		Name   string    `json:"name"`
		Op     string    `json:"op"`
		AShape []int     `json:"a_shape"`
		BShape []int     `json:"b_shape"`
		YShape []int     `json:"y_shape"`
		A      []float64 `json:"a"`
		B      []float64 `json:"b"`
		Proj   []float64 `json:"proj"`
		Y      []float64 `json:"y"`
		GradA  []float64 `json:"grad_a"`
		GradB  []float64 `json:"grad_b"`
	} `json:"binary"`
	Unary []struct {
		Name  string    `json:"name"`
		Op    string    `json:"op"`
		Shape []int     `json:"shape"`
		Scale float64   `json:"scale"`
		X     []float64 `json:"x"`
		Proj  []float64 `json:"proj"`
		Y     []float64 `json:"y"`
		Grad  []float64 `json:"grad"`
	} `json:"unary"`
	Reduce []struct {
		Name    string    `json:"name"`
		Op      string    `json:"op"`
		Shape   []int     `json:"shape"`
		Axes    []int     `json:"axes"`
		Keepdim bool      `json:"keepdim"`
		YShape  []int     `json:"y_shape"`
		X       []float64 `json:"x"`
		Proj    []float64 `json:"proj"`
		Y       []float64 `json:"y"`
		Grad    []float64 `json:"grad"`
	} `json:"reduce"`
}

func loadPointwiseRef(t *testing.T) pointwiseRef {
	var ref pointwiseRef
	loadJSON(t, "testdata/pointwise.json", &ref)
	if len(ref.Binary) == 0 || len(ref.Unary) == 0 || len(ref.Reduce) == 0 {
		t.Fatal("testdata/pointwise.json lacks cases")
	}
	return ref
}

// The ops' values and gradients against PyTorch's, float64 and float32
// (a float32 x of the same values), every case of gen_pointwise.py.
func TestPointwiseMatchesPyTorch(t *testing.T) {
	ref := loadPointwiseRef(t)
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		tol := forwardTol(dt)
		for _, c := range ref.Binary {
			a, b := fromFloat64s(dt, c.A, c.AShape...), fromFloat64s(dt, c.B, c.BShape...)
			got, shape, err := runGraph(t, []*tensor.Dense{a, b}, binaryBuild(c.Op))
			if err != nil {
				t.Fatalf("%s %v: %v", c.Name, dt, err)
			}
			if !shape.Eq(tensor.Shape(c.YShape)) {
				t.Errorf("%s %v: y has shape %v, PyTorch's %v", c.Name, dt, shape, c.YShape)
			}
			if err := tol.Compare(got, c.Y); err != nil {
				t.Errorf("%s %v: y: %v", c.Name, dt, err)
			}
			grads := gradOf(t, []*tensor.Dense{a, b}, fromFloat64s(dt, c.Proj, c.YShape...), []int{0, 1}, binaryBuild(c.Op))
			if err := tol.Compare(grads[0], c.GradA); err != nil {
				t.Errorf("%s %v: gradient of a: %v", c.Name, dt, err)
			}
			if err := tol.Compare(grads[1], c.GradB); err != nil {
				t.Errorf("%s %v: gradient of b: %v", c.Name, dt, err)
			}
		}
		for _, c := range ref.Unary {
			x := fromFloat64s(dt, c.X, c.Shape...)
			build := unaryBuild(c.Op, c.Scale)
			got, _, err := runGraph(t, []*tensor.Dense{x}, build)
			if err != nil {
				t.Fatalf("%s %v: %v", c.Name, dt, err)
			}
			if err := tol.Compare(got, c.Y); err != nil {
				t.Errorf("%s %v: y: %v", c.Name, dt, err)
			}
			grads := gradOf(t, []*tensor.Dense{x}, fromFloat64s(dt, c.Proj, c.Shape...), []int{0}, build)
			if err := tol.Compare(grads[0], c.Grad); err != nil {
				t.Errorf("%s %v: gradient: %v", c.Name, dt, err)
			}
		}
	}
}

// Special values, as PyTorch gives them (torch 1.13, checked by hand):
// NaN goes through every op, inf - inf and 0/0 are NaN, x/0 is ±inf,
// log(0) = -inf, log and sqrt of a negative are NaN, sigmoid(±inf) = 1, 0,
// relu(-0) = 0, inverse_sigmoid(±inf) = ±log(1/eps - ...) clamped.
func TestPointwiseSpecialValues(t *testing.T) {
	inf, nan := math.Inf(1), math.NaN()
	eps := DefaultInverseSigmoidEps
	for _, c := range []struct {
		name string
		op   string
		x    []float64
		want []float64
	}{
		{"relu", "relu", []float64{nan, -inf, inf, -1, 0, 2}, []float64{nan, 0, inf, 0, 0, 2}},
		{"sigmoid", "sigmoid", []float64{nan, -inf, inf, 0}, []float64{nan, 0, 1, 0.5}},
		{"exp", "exp", []float64{nan, -inf, inf, 0}, []float64{nan, 0, inf, 1}},
		{"log", "log", []float64{nan, -1, 0, inf, 1}, []float64{nan, nan, -inf, inf, 0}},
		{"sqrt", "sqrt", []float64{nan, -1, 0, inf, 4}, []float64{nan, nan, 0, inf, 2}},
		{"square", "square", []float64{nan, -inf, -3}, []float64{nan, inf, 9}},
		{"inverse_sigmoid", "inverse_sigmoid", []float64{nan, -inf, inf, 0.5},
			[]float64{nan, math.Log(eps / 1), math.Log(1 / eps), 0}},
	} {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			x := fromFloat64s(dt, c.x, len(c.x))
			got, _, err := runGraph(t, []*tensor.Dense{x}, unaryBuild(c.op, 1))
			if err != nil {
				t.Fatal(err)
			}
			if err := forwardTol(dt).Compare(got, c.want); err != nil {
				t.Errorf("%s %v: %v: %v", c.name, dt, got, err)
			}
		}
	}
	a := dense64([]int{5}, inf, 1, 0, -1, nan)
	b := dense64([]int{5}, inf, 0, 0, 0, 1)
	for op, want := range map[string][]float64{
		"add": {inf, 1, 0, -1, nan},
		"sub": {nan, 1, 0, -1, nan},
		"mul": {inf, 0, 0, 0, nan},
		"div": {nan, inf, nan, -inf, nan},
	} {
		got, _, err := runGraph(t, []*tensor.Dense{a, b}, binaryBuild(op))
		if err != nil {
			t.Fatal(err)
		}
		if err := autograd.TolForward64.Compare(got, want); err != nil {
			t.Errorf("%s: %v: %v", op, got, err)
		}
	}
}

// InverseSigmoid's gradient where PyTorch's clamps act (torch 1.13 by
// hand): outside [0, 1] and at NaN it is 0; at 0 the clamp to eps stops
// the numerator's share but not the denominator's, which passes dy/(1 - 0)
// = dy; at 1 the denominator's clamp acts and the numerator passes
// (dy/q)/eps = dy, q = 1/eps; in the middle dy/(x(1-x)).
func TestInverseSigmoidGradientAtClamps(t *testing.T) {
	x := dense64([]int{6}, math.NaN(), -0.5, 1.5, 0, 1, 0.5)
	proj := dense64([]int{6}, 1, 1, 1, 1, 1, 1)
	grads := gradOf(t, []*tensor.Dense{x}, proj, []int{0}, unaryBuild("inverse_sigmoid", 0))
	want := []float64{0, 0, 0, 1, 1, 4}
	if err := autograd.TolForward64.Compare(grads[0], want); err != nil {
		t.Errorf("gradient %v: %v", grads[0], err)
	}
}

// Hand values of broadcasting, and of its gradient: the sum over the dims
// each operand was broadcast along.
func TestPointwiseBroadcastHandValues(t *testing.T) {
	a := dense64([]int{2, 3}, 1, 2, 3, 4, 5, 6)
	col := dense64([]int{2, 1}, 10, 20)
	row := dense64([]int{3}, 100, 200, 300)
	got, shape, err := runGraph(t, []*tensor.Dense{a, col}, binaryBuild("add"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []float64{11, 12, 13, 24, 25, 26}; !shape.Eq(tensor.Shape{2, 3}) || autograd.TolForward64.Compare(got, want) != nil {
		t.Errorf("a + col = %v %v, want (2, 3) %v", shape, got, want)
	}
	got, _, err = runGraph(t, []*tensor.Dense{row, col}, binaryBuild("mul"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []float64{1000, 2000, 3000, 2000, 4000, 6000}; autograd.TolForward64.Compare(got, want) != nil {
		t.Errorf("row * col = %v, want %v", got, want)
	}
	// loss = sum((row * col) * p): d row[j] = sum_i p[i,j] col[i], d col[i] = sum_j p[i,j] row[j].
	p := dense64([]int{2, 3}, 1, 0, 1, 0, 1, 1)
	grads := gradOf(t, []*tensor.Dense{row, col}, p, []int{0, 1}, binaryBuild("mul"))
	if want := []float64{10, 20, 30}; autograd.TolForward64.Compare(grads[0], want) != nil {
		t.Errorf("d row = %v, want %v", grads[0], want)
	}
	if want := []float64{400, 500}; autograd.TolForward64.Compare(grads[1], want) != nil {
		t.Errorf("d col = %v, want %v", grads[1], want)
	}
	grads = gradOf(t, []*tensor.Dense{row, col}, p, []int{0, 1}, binaryBuild("sub"))
	if want := []float64{-2, -2}; autograd.TolForward64.Compare(grads[1], want) != nil {
		t.Errorf("d col of row - col = %v, want %v", grads[1], want)
	}
}

func TestPointwiseGradCheck(t *testing.T) {
	for i, c := range []struct {
		op     string
		sa, sb []int
	}{
		{"add", []int{2, 3}, []int{2, 3}},
		{"add", []int{2, 3, 4}, []int{4}},
		{"sub", []int{3, 1}, []int{2, 1, 4}},
		{"mul", []int{2, 3, 4}, []int{3, 1}},
		{"mul", []int{2, 1, 4, 1}, []int{1, 3, 1, 5}},
		{"div", []int{2, 3}, []int{3}},
		{"div", []int{4}, []int{2, 3, 1}},
	} {
		for seed := range uint64(2) {
			rng := rand.New(rand.NewPCG(uint64(i), seed))
			b := randTensor(rng, tensor.Float64, 0.5, 2, c.sb...)
			if c.op != "div" {
				b = randTensor(rng, tensor.Float64, -2, 2, c.sb...)
			}
			inputs := []autograd.Input{{Name: "a", Value: randTensor(rng, tensor.Float64, -2, 2, c.sa...)}, {Name: "b", Value: b}}
			if _, err := autograd.CheckGrad(binaryBuild(c.op), inputs, seed); err != nil {
				t.Errorf("%s %v %v, seed %d: %v", c.op, c.sa, c.sb, seed, err)
			}
		}
	}
	for i, c := range []struct {
		op     string
		lo, hi float64
	}{
		{"relu", -2, 2}, {"sigmoid", -4, 4}, {"inverse_sigmoid", 0.05, 0.95}, {"exp", -2, 2},
		{"log", 0.2, 3}, {"sqrt", 0.2, 3}, {"square", -2, 2}, {"scale", -2, 2},
	} {
		for seed := range uint64(2) {
			rng := rand.New(rand.NewPCG(uint64(100+i), seed))
			inputs := []autograd.Input{{Name: "x", Value: randTensor(rng, tensor.Float64, c.lo, c.hi, 3, 4)}}
			results, err := autograd.CheckGrad(unaryBuild(c.op, -1.5), inputs, seed)
			if err != nil {
				t.Errorf("%s, seed %d: %v", c.op, seed, err)
				continue
			}
			if results[0].Scale == 0 {
				t.Errorf("%s, seed %d: zero gradient, the check proves nothing", c.op, seed)
			}
		}
	}
}

// Exp's gradient is Mul, itself differentiable: the second derivative of
// sum exp(x) is exp(x). (Gorgonia's Grad of a gradient whose node sums
// several contributions comes out wrong with its own ops too, so the
// check keeps to a chain.)
func TestPointwiseSecondDerivatives(t *testing.T) {
	g := G.NewGraph()
	x := G.NewVector(g, tensor.Float64, G.WithShape(3), G.WithName("x"), G.WithValue(dense64([]int{3}, 0, 1, 2)))
	grads, err := G.Grad(G.Must(Sum(G.Must(Exp(x)), nil, false)), x)
	if err != nil {
		t.Fatal(err)
	}
	grads2, err := G.Grad(G.Must(Sum(grads[0], nil, false)), x)
	if err != nil {
		t.Fatal(err)
	}
	var v G.Value
	G.Read(grads2[0], &v)
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		t.Fatal(err)
	}
	if want := []float64{1, math.E, math.Exp(2)}; autograd.TolForward64.Compare(toFloat64s(t, v), want) != nil {
		t.Errorf("d2 sum exp(x) = %v, want %v", v, want)
	}
	// The backward-only ops refuse politely.
	g = G.NewGraph()
	x = G.NewVector(g, tensor.Float64, G.WithShape(3), G.WithName("x"), G.WithInit(G.Ones()))
	grads, err = G.Grad(G.Must(Sum(G.Must(ReLU(x)), nil, false)), x)
	if err != nil {
		t.Fatal(err)
	}
	want := "ops: ReLU backward: second derivatives are not implemented"
	if _, err := G.Grad(G.Must(Sum(grads[0], nil, false)), x); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("second derivative of ReLU: got %v, want %q", err, want)
	}
}

func TestPointwiseBadInput(t *testing.T) {
	g := G.NewGraph()
	node := func(dt tensor.Dtype, name string, shape ...int) *G.Node {
		return G.NewTensor(g, dt, len(shape), G.WithShape(shape...), G.WithName(name))
	}
	a := node(tensor.Float32, "a", 2, 3)
	for _, c := range []struct {
		name string
		a, b *G.Node
		want string
	}{
		{"nil a", nil, a, "ops: Add: a is nil"},
		{"nil b", a, nil, "ops: Add: b is nil"},
		{"scalar", a, G.NewScalar(g, tensor.Float32, G.WithName("s")), "ops: Add: b must have a dim or more, got a scalar"},
		{"int", node(tensor.Int, "i", 2, 3), a, "ops: Add: a must be float32 or float64, got int"},
		{"dtypes", a, node(tensor.Float64, "d", 2, 3), "ops: Add: b has dtype float64, want float32 like a"},
		{"shapes", a, node(tensor.Float32, "b4", 4), "ops: Add: a (2, 3) and b (4) do not broadcast: dim -1 (from the end) is 3 and 4"},
		{"inner shapes", a, node(tensor.Float32, "b33", 3, 3), "dim -2 (from the end) is 2 and 3"},
		{"empty", a, node(tensor.Float32, "e", 0, 3), "ops: Add: b must have positive sizes"},
		{"7 dims", node(tensor.Float32, "a7", 2, 1, 2, 1, 2, 1, 2), node(tensor.Float32, "b7", 1, 2, 1, 2, 1, 2, 1),
			"ops: Add: broadcasting takes up to 6 dims"},
	} {
		if _, err := Add(c.a, c.b); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got error %v, want one containing %q", c.name, err, c.want)
		}
	}
	// Equal shapes need no broadcast and take any rank.
	a7 := node(tensor.Float32, "same7", 1, 2, 1, 2, 1, 2, 1)
	if _, err := Mul(a7, a7); err != nil {
		t.Errorf("equal shapes of 7 dims: %v", err)
	}
	for _, c := range []struct {
		name string
		f    func() (*G.Node, error)
		want string
	}{
		{"relu nil", func() (*G.Node, error) { return ReLU(nil) }, "ops: ReLU: x is nil"},
		{"exp int", func() (*G.Node, error) { return Exp(node(tensor.Int, "ei", 2)) }, "ops: Exp: x must be float32 or float64, got int"},
		{"scale nan", func() (*G.Node, error) { return Scale(a, math.NaN()) }, "ops: Scale: the constant must be finite, got NaN"},
		{"eps negative", func() (*G.Node, error) { return InverseSigmoid(a, -1) }, "ops: InverseSigmoid: eps must be in (0, 0.5)"},
		{"eps large", func() (*G.Node, error) { return InverseSigmoid(a, 0.5) }, "ops: InverseSigmoid: eps must be in (0, 0.5)"},
	} {
		if _, err := c.f(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got error %v, want one containing %q", c.name, err, c.want)
		}
	}
	// Values of the wrong shape at run time.
	s, err := newPointwiseShape(pointwiseShape{name: "Add", op: kernels.PointwiseAdd, argA: "a", argB: "b", a: tensor.Shape{2, 3}, b: tensor.Shape{3}, out: tensor.Shape{2, 3}, dt: tensor.Float32})
	if err != nil {
		t.Fatal(err)
	}
	wrong := tensor.New(tensor.WithShape(3, 2), tensor.WithBacking(make([]float32, 6)))
	if _, err := pointwiseOp(s).Do(wrong, wrong); err == nil || !strings.Contains(err.Error(), "ops: Add: a has shape (3, 2), want (2, 3)") {
		t.Errorf("wrong a shape at run time: %v", err)
	}
}

// Ops that compute different things hash apart: Add and Sub, Scale by two
// constants, of one x in one graph give their own values.
func TestPointwiseOpsHashApart(t *testing.T) {
	x := dense64([]int{2}, 1, 2)
	got, _, err := runGraph(t, []*tensor.Dense{x, x}, func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
		s := G.Must(Add(in[0], in[1]))
		d := G.Must(Sub(in[0], in[1]))
		h := G.Must(Scale(in[0], 0.5))
		q := G.Must(Scale(in[0], 0.25))
		return Add(G.Must(Add(s, d)), G.Must(Sub(h, q)))
	})
	if err != nil {
		t.Fatal(err)
	}
	// 2x + 0 + x/4.
	if want := []float64{2.25, 4.5}; autograd.TolForward64.Compare(got, want) != nil {
		t.Errorf("got %v, want %v", got, want)
	}
}
