package ops

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/kernels"
)

func linearBuild(bias bool) func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
	return func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
		if bias {
			return Linear(in[0], in[1], in[2])
		}
		return Linear(in[0], in[1], nil)
	}
}

func matmulBuild(g *G.ExprGraph, in G.Nodes) (*G.Node, error) { return MatMul(in[0], in[1]) }

func bmmBuild(transA, transB bool) func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
	return func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) { return BatchedMatMul(in[0], in[1], transA, transB) }
}

func dense64(shape []int, v ...float64) *tensor.Dense {
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(v))
}

func TestLinearHandValues(t *testing.T) {
	x := dense64([]int{2, 3}, 1, 2, 3, 4, 5, 6)
	w := dense64([]int{2, 3}, 1, 0, -1, 2, 1, 0)
	b := dense64([]int{2}, 10, 20)
	// y[i,o] = sum_j x[i,j] w[o,j] + b[o].
	got, shape, err := runGraph(t, []*tensor.Dense{x, w, b}, linearBuild(true))
	if err != nil {
		t.Fatal(err)
	}
	if want := []float64{8, 24, 8, 33}; !shape.Eq(tensor.Shape{2, 2}) || !equalFloats(got, want) {
		t.Errorf("y = %v %v, want (2, 2) %v", shape, got, want)
	}
	// With loss sum(y ⊙ p): dx = p·w, dw = pᵀ·x, db = the columns' sums of p.
	p := dense64([]int{2, 2}, 1, 2, 3, 4)
	grads := gradOf(t, []*tensor.Dense{x, w, b}, p, []int{0, 1, 2}, linearBuild(true))
	for i, want := range [][]float64{{5, 2, -1, 11, 4, -3}, {13, 17, 21, 18, 24, 30}, {4, 6}} {
		if !equalFloats(grads[i], want) {
			t.Errorf("gradient %d = %v, want %v", i, grads[i], want)
		}
	}
	// A 3-D x is a stack of rows: [1,2,3] -> y [1,2,2].
	x3 := dense64([]int{1, 2, 3}, 1, 2, 3, 4, 5, 6)
	got, shape, err = runGraph(t, []*tensor.Dense{x3, w}, linearBuild(false))
	if err != nil {
		t.Fatal(err)
	}
	if want := []float64{-2, 4, -2, 13}; !shape.Eq(tensor.Shape{1, 2, 2}) || !equalFloats(got, want) {
		t.Errorf("3-D x, no bias: y = %v %v, want (1, 2, 2) %v", shape, got, want)
	}
}

func TestMatMulHandValues(t *testing.T) {
	a := dense64([]int{2, 2}, 1, 2, 3, 4)
	b := dense64([]int{2, 3}, 5, 6, 0, 7, 8, -1)
	got, shape, err := runGraph(t, []*tensor.Dense{a, b}, matmulBuild)
	if err != nil {
		t.Fatal(err)
	}
	if want := []float64{19, 22, -2, 43, 50, -4}; !shape.Eq(tensor.Shape{2, 3}) || !equalFloats(got, want) {
		t.Errorf("a·b = %v %v, want (2, 3) %v", shape, got, want)
	}
	// da = p·bᵀ, db = aᵀ·p for p = ones.
	p := dense64([]int{2, 3}, 1, 1, 1, 1, 1, 1)
	grads := gradOf(t, []*tensor.Dense{a, b}, p, []int{0, 1}, matmulBuild)
	for i, want := range [][]float64{{11, 14, 11, 14}, {4, 4, 4, 6, 6, 6}} {
		if !equalFloats(grads[i], want) {
			t.Errorf("gradient %d = %v, want %v", i, grads[i], want)
		}
	}
}

// Two matrices per batch, each product worked by hand; the transposed
// variants take the same matrices stored transposed and must agree.
func TestBatchedMatMulHandValues(t *testing.T) {
	// a[0] = [[1 2] [3 4]], a[1] = [[0 1] [1 0]]; b[0] = [[1 0 2] [0 1 3]],
	// b[1] = [[1 2 3] [4 5 6]].
	a := []float64{1, 2, 3, 4, 0, 1, 1, 0}
	b := []float64{1, 0, 2, 0, 1, 3, 1, 2, 3, 4, 5, 6}
	want := []float64{1, 2, 8, 3, 4, 18, 4, 5, 6, 1, 2, 3}
	aT := []float64{1, 3, 2, 4, 0, 1, 1, 0}
	bT := []float64{1, 0, 0, 1, 2, 3, 1, 4, 2, 5, 3, 6}
	for _, c := range []struct {
		transA, transB bool
		a, b           []float64
		as, bs         []int
	}{
		{false, false, a, b, []int{2, 2, 2}, []int{2, 2, 3}},
		{true, false, aT, b, []int{2, 2, 2}, []int{2, 2, 3}},
		{false, true, a, bT, []int{2, 2, 2}, []int{2, 3, 2}},
		{true, true, aT, bT, []int{2, 2, 2}, []int{2, 3, 2}},
	} {
		got, shape, err := runGraph(t, []*tensor.Dense{dense64(c.as, c.a...), dense64(c.bs, c.b...)}, bmmBuild(c.transA, c.transB))
		if err != nil {
			t.Fatal(err)
		}
		if !shape.Eq(tensor.Shape{2, 2, 3}) || !equalFloats(got, want) {
			t.Errorf("transA=%t transB=%t: got %v %v, want (2, 2, 3) %v", c.transA, c.transB, shape, got, want)
		}
	}
}

// Against gorgonia's own Mul and BatchedMatMul, on inputs whose sums round.
func TestMatMulMatchesGorgonia(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		a, b := randTensor(rng, dt, -1, 1, 13, 70), randTensor(rng, dt, -1, 1, 70, 9)
		got, _, err := runGraph(t, []*tensor.Dense{a, b}, matmulBuild)
		if err != nil {
			t.Fatal(err)
		}
		want, _, err := runGraph(t, []*tensor.Dense{a, b}, func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) { return G.Mul(in[0], in[1]) })
		if err != nil {
			t.Fatal(err)
		}
		tol := autograd.TolForward64
		if dt == tensor.Float32 {
			tol = autograd.TolForward32
		}
		if err := tol.Compare(got, want); err != nil {
			t.Errorf("%v MatMul vs G.Mul: %v", dt, err)
		}
		a3, b3 := randTensor(rng, dt, -1, 1, 3, 7, 20), randTensor(rng, dt, -1, 1, 3, 20, 5)
		got, _, err = runGraph(t, []*tensor.Dense{a3, b3}, bmmBuild(false, false))
		if err != nil {
			t.Fatal(err)
		}
		want, _, err = runGraph(t, []*tensor.Dense{a3, b3}, func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
			return G.BatchedMatMul(in[0], in[1])
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := tol.Compare(got, want); err != nil {
			t.Errorf("%v BatchedMatMul vs G.BatchedMatMul: %v", dt, err)
		}
	}
}

func TestLinearGradCheck(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	type input struct {
		name  string
		shape []int
	}
	for i, c := range []struct {
		name   string
		inputs []input
		build  func(g *G.ExprGraph, in G.Nodes) (*G.Node, error)
	}{
		{"Linear 1-D x", []input{{"x", []int{5}}, {"w", []int{3, 5}}, {"b", []int{3}}}, linearBuild(true)},
		{"Linear 2-D x", []input{{"x", []int{4, 5}}, {"w", []int{3, 5}}, {"b", []int{3}}}, linearBuild(true)},
		{"Linear 3-D x, nil bias", []input{{"x", []int{2, 3, 4}}, {"w", []int{5, 4}}}, linearBuild(false)},
		{"Linear 4-D x", []input{{"x", []int{2, 1, 3, 4}}, {"w", []int{2, 4}}, {"b", []int{2}}}, linearBuild(true)},
		{"MatMul", []input{{"a", []int{3, 4}}, {"b", []int{4, 5}}}, matmulBuild},
		{"BatchedMatMul", []input{{"a", []int{2, 3, 4}}, {"b", []int{2, 4, 5}}}, bmmBuild(false, false)},
		{"BatchedMatMul transA", []input{{"a", []int{2, 4, 3}}, {"b", []int{2, 4, 5}}}, bmmBuild(true, false)},
		{"BatchedMatMul transB", []input{{"a", []int{2, 3, 4}}, {"b", []int{2, 5, 4}}}, bmmBuild(false, true)},
		{"BatchedMatMul transA transB", []input{{"a", []int{2, 4, 3}}, {"b", []int{2, 5, 4}}}, bmmBuild(true, true)},
	} {
		for seed := range uint64(2) {
			var inputs []autograd.Input
			for _, in := range c.inputs {
				inputs = append(inputs, autograd.Input{Name: in.name, Value: randTensor(rng, tensor.Float64, -1, 1, in.shape...)})
			}
			results, err := autograd.CheckGrad(c.build, inputs, uint64(i)*10+seed)
			if err != nil {
				t.Errorf("%s, seed %d: %v", c.name, seed, err)
				continue
			}
			for _, r := range results {
				if r.Scale == 0 {
					t.Errorf("%s, seed %d: %s: zero gradient, the check proves nothing", c.name, seed, r.Name)
				}
			}
		}
	}
}

// The backward ops are differentiable too (GEMMs again, and the bias's
// row sum and its adjoint): each gradient of Linear and of BatchedMatMul,
// as a function of its inputs and of the output gradient dy, passes the
// check. (gorgonia's Grad of a graph that already holds a Grad fails on
// its own ops, so the backward ops are built here from SymDiff directly.)
func TestGemmBackwardGradCheck(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	type input struct {
		name  string
		shape []int
	}
	for _, c := range []struct {
		name   string
		inputs []input // the op's inputs, then dy
		build  func(g *G.ExprGraph, in G.Nodes) (*G.Node, error)
	}{
		{"Linear", []input{{"x", []int{2, 3, 4}}, {"w", []int{5, 4}}, {"b", []int{5}}, {"dy", []int{2, 3, 5}}}, linearBuild(true)},
		{"BatchedMatMul transA", []input{{"a", []int{2, 4, 3}}, {"b", []int{2, 4, 5}}, {"dy", []int{2, 3, 5}}}, bmmBuild(true, false)},
		{"BatchedMatMul transB", []input{{"a", []int{2, 3, 4}}, {"b", []int{2, 5, 4}}, {"dy", []int{2, 3, 5}}}, bmmBuild(false, true)},
	} {
		nIn := len(c.inputs) - 1
		values := make([]*tensor.Dense, len(c.inputs))
		for i, in := range c.inputs {
			values[i] = randTensor(rng, tensor.Float64, -1, 1, in.shape...)
		}
		for which := range nIn {
			build := func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
				y, err := c.build(g, in[:nIn])
				if err != nil {
					return nil, err
				}
				grads, err := y.Op().(G.SDOp).SymDiff(in[:nIn], y, in[nIn])
				if err != nil {
					return nil, err
				}
				return grads[which], nil
			}
			// The gradient with respect to input which is linear in dy and
			// depends on the other matrix operand (not on a bias, nor on
			// input which itself).
			var inputs []autograd.Input
			for i, in := range c.inputs {
				noGrad := i == which || i == 2 && i < nIn || which == 2 && i < nIn
				inputs = append(inputs, autograd.Input{Name: in.name, Value: values[i], NoGrad: noGrad})
			}
			if _, err := autograd.CheckGrad(build, inputs, uint64(which)); err != nil {
				t.Errorf("%s, gradient of %s: %v", c.name, c.inputs[which].name, err)
			}
		}
	}
}

// linearCase is one case of testdata/linear.json (gen_linear.py).
type linearCase struct {
	Name   string `json:"name"`
	Kind   string `json:"kind"`
	TransA bool   `json:"trans_a"`
	TransB bool   `json:"trans_b"`
	Order  []string
	Inputs map[string]struct {
		Shape []int
		Data  []float64
	}
	Proj []float64
	Y    struct {
		Shape []int
		Data  []float64
	}
	Grads map[string][]float64
}

func TestLinearMatchesPyTorch(t *testing.T) {
	var ref struct {
		Torch string
		Cases []linearCase
	}
	loadJSON(t, "testdata/linear.json", &ref)
	if len(ref.Cases) == 0 {
		t.Fatal("no cases in testdata/linear.json")
	}
	for _, c := range ref.Cases {
		var build func(g *G.ExprGraph, in G.Nodes) (*G.Node, error)
		switch c.Kind {
		case "linear":
			build = linearBuild(len(c.Order) == 3)
		case "matmul":
			build = matmulBuild
		case "bmm":
			build = bmmBuild(c.TransA, c.TransB)
		default:
			t.Fatalf("%s: unknown kind %q", c.Name, c.Kind)
		}
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			tol := autograd.TolForward64
			if dt == tensor.Float32 {
				tol = autograd.TolForward32
			}
			var inputs []*tensor.Dense
			var wrt []int
			for i, name := range c.Order {
				in := c.Inputs[name]
				inputs = append(inputs, fromFloat64s(dt, in.Data, in.Shape...))
				wrt = append(wrt, i)
			}
			got, shape, err := runGraph(t, inputs, build)
			if err != nil {
				t.Fatalf("%s %v: %v", c.Name, dt, err)
			}
			if !shape.Eq(tensor.Shape(c.Y.Shape)) {
				t.Errorf("%s %v: y has shape %v, PyTorch's %v", c.Name, dt, shape, c.Y.Shape)
			}
			if err := tol.Compare(got, c.Y.Data); err != nil {
				t.Errorf("%s %v: y: %v", c.Name, dt, err)
			}
			grads := gradOf(t, inputs, fromFloat64s(dt, c.Proj, c.Y.Shape...), wrt, build)
			for i, name := range c.Order {
				if err := tol.Compare(grads[i], c.Grads[name]); err != nil {
					t.Errorf("%s %v: gradient of %s: %v", c.Name, dt, name, err)
				}
			}
		}
	}
}

func TestLinearBadInput(t *testing.T) {
	g := G.NewGraph()
	node := func(dt tensor.Dtype, name string, shape ...int) *G.Node {
		return G.NewTensor(g, dt, len(shape), G.WithShape(shape...), G.WithName(name))
	}
	f32, f64 := tensor.Float32, tensor.Float64
	x := node(f32, "x", 2, 3, 4)
	w := node(f32, "w", 5, 4)
	b := node(f32, "b", 5)
	scalar := G.NewScalar(g, f32, G.WithName("s"))
	for _, c := range []struct {
		name    string
		x, w, b *G.Node
		want    string
	}{
		{"nil x", nil, w, b, "Linear: x is nil, want shape [... in]"},
		{"nil w", x, nil, b, "Linear: w is nil, want shape [out in]"},
		{"scalar x", scalar, w, b, "x must have shape [... in] (one dimension or more), got a scalar"},
		{"3-D w", x, node(f32, "w3", 5, 4, 1), b, "w must have shape [out in], got (5, 4, 1)"},
		{"in differs", x, node(f32, "w5", 5, 3), b, "x's last dimension (4) must equal w's in (3): x [... in], w [out in]"},
		{"bias size", x, w, node(f32, "b4", 4), "b must have shape [out] = [5] (or be nil), got (4)"},
		{"bias rank", x, w, node(f32, "b15", 1, 5), "b must have shape [out] = [5] (or be nil), got (1, 5)"},
		{"int x", node(tensor.Int, "xi", 2, 4), w, nil, "x must be float32 or float64, got int"},
		{"w float64", x, node(f64, "w64", 5, 4), b, "w has dtype float64, want float32 like the first input"},
		{"b float64", x, w, node(f64, "b64", 5), "b has dtype float64, want float32 like the first input"},
		{"empty x", node(f32, "x0", 0, 4), w, b, "x must have positive sizes, got (0, 4) (dimension 0)"},
	} {
		_, err := Linear(c.x, c.w, c.b)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "ops: Linear: ") {
			t.Errorf("Linear, %s: got error %v, want one containing %q", c.name, err, c.want)
		}
	}

	m := node(f32, "m", 3, 4)
	for _, c := range []struct {
		name string
		a, b *G.Node
		want string
	}{
		{"nil a", nil, m, "MatMul: a is nil, want shape [m k]"},
		{"nil b", m, nil, "MatMul: b is nil, want shape [k n]"},
		{"3-D a", x, m, "a must have shape [m k], got (2, 3, 4)"},
		{"1-D b", m, b, "b must have shape [k n], got (5)"},
		{"inner", m, m, "a's columns (4) must equal b's rows (3): a [m k], b [k n], got a (3, 4) and b (3, 4)"},
		{"dtype", m, node(f64, "m64", 4, 2), "b has dtype float64, want float32"},
		{"int", node(tensor.Int, "mi", 3, 4), m, "a must be float32 or float64, got int"},
	} {
		_, err := MatMul(c.a, c.b)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "ops: MatMul: ") {
			t.Errorf("MatMul, %s: got error %v, want one containing %q", c.name, err, c.want)
		}
	}

	q := node(f32, "q", 2, 10, 8)
	for _, c := range []struct {
		name           string
		a, b           *G.Node
		transA, transB bool
		want           string
	}{
		{"nil a", nil, q, false, false, "a is nil, want shape [B m k]"},
		{"nil b transB", q, nil, false, true, "b is nil, want shape [B n k] (transB)"},
		{"2-D a transA", m, q, true, false, "a must have shape [B k m] (transA), got (3, 4)"},
		{"batch", q, node(f32, "k3", 3, 10, 8), false, true, "a and b must hold as many matrices, got a (2, 10, 8) and b (3, 10, 8)"},
		{"inner", q, q, false, false, "inner dimensions differ: a [B m k] is (2, 10, 8) (k=8) and b [B k n] is (2, 10, 8) (k=10)"},
		{"inner transA", q, node(f32, "v", 2, 8, 3), true, false, "inner dimensions differ: a [B k m] (transA) is (2, 10, 8) (k=10) and b [B k n] is (2, 8, 3) (k=8)"},
		{"dtype", q, node(f64, "q64", 2, 10, 8), false, true, "b has dtype float64, want float32"},
		{"empty", node(f32, "e", 2, 0, 8), q, false, true, "a must have positive sizes, got (2, 0, 8) (dimension 1)"},
	} {
		_, err := BatchedMatMul(c.a, c.b, c.transA, c.transB)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "ops: BatchedMatMul: ") {
			t.Errorf("BatchedMatMul, %s: got error %v, want one containing %q", c.name, err, c.want)
		}
	}
	// The transposed variants accept what they promise.
	for _, tr := range [][2]bool{{false, true}, {true, false}} {
		if _, err := BatchedMatMul(q, q, tr[0], tr[1]); err != nil {
			t.Errorf("BatchedMatMul of [2 10 8] with itself, transA=%t transB=%t: %v", tr[0], tr[1], err)
		}
	}
}

// Ops that compute different things hash apart: gorgonia merges nodes
// whose ops hash alike.
func TestGemmOpsHashApart(t *testing.T) {
	base := gemmShape{op: "BatchedMatMul", args: [3]string{"a", "b"}, batch: 2, m: 3, n: 3, k: 3,
		a: tensor.Shape{2, 3, 3}, b: tensor.Shape{2, 3, 3}, c: tensor.Shape{2, 3, 3}, dt: tensor.Float32}
	ta, tb, f64 := base, base, base
	ta.transA, tb.transB, f64.dt = true, true, tensor.Float64
	lin := gemmShape{op: "Linear", args: [3]string{"x", "w", "b"}, transB: true, batch: 1, m: 6, n: 3, k: 3,
		a: tensor.Shape{2, 3, 3}, b: tensor.Shape{3, 3}, c: tensor.Shape{2, 3, 3}, dt: tensor.Float32}
	linBias := lin
	linBias.bias = true
	rows := lin.biasRows()
	ops := []G.Op{gemmOp(base), gemmOp(ta), gemmOp(tb), gemmOp(f64), gemmOp(lin), gemmOp(linBias),
		gemmOp(lin.gradA().s), gemmOp(lin.gradB().s), gemmOp(ta.gradA().s), gemmOp(ta.gradB().s),
		sumRowsOp(rows), broadcastRowsOp(rows)}
	hashes := map[uint32]string{}
	for _, op := range ops {
		h := op.Hashcode()
		if prev, ok := hashes[h]; ok {
			t.Errorf("%v hashes like %v", op, prev)
		}
		hashes[h] = fmt.Sprint(op)
	}
}

// A small network of Linear and BatchedMatMul learns a fixed target under
// gorgonia's own training machinery: dual values, a tape machine and Adam.
func TestLinearTrainsWithAdam(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	dt := tensor.Float32
	g := G.NewGraph()
	x := G.NodeFromAny(g, randTensor(rng, dt, -1, 1, 2, 5, 4), G.WithName("x"))
	target := G.NodeFromAny(g, randTensor(rng, dt, -1, 1, 2, 5, 3), G.WithName("target"))
	w1 := G.NodeFromAny(g, randTensor(rng, dt, -0.5, 0.5, 8, 4), G.WithName("w1"))
	b1 := G.NodeFromAny(g, randTensor(rng, dt, -0.1, 0.1, 8), G.WithName("b1"))
	v := G.NodeFromAny(g, randTensor(rng, dt, -0.3, 0.3, 2, 8, 3), G.WithName("v"))
	h, err := Linear(x, w1, b1)
	if err != nil {
		t.Fatal(err)
	}
	y, err := BatchedMatMul(G.Must(G.Tanh(h)), v, false, false)
	if err != nil {
		t.Fatal(err)
	}
	loss := G.Must(G.Mean(G.Must(G.Square(G.Must(G.Sub(y, target))))))
	learnables := G.Nodes{w1, b1, v}
	losses := adamLosses(t, g, loss, learnables, 0.05, 60)
	first, last := losses[0], losses[len(losses)-1]
	t.Logf("loss %.4f -> %.4f", first, last)
	if !(last < 0.25*first) {
		t.Errorf("loss went from %v to %v in %d Adam steps, want it below a quarter: %v", first, last, len(losses), losses)
	}
}

// The device runs a bias as Sum's and the pointwise ops' kernels
// (linear_device.go): their plans, run by those ops' CPU twins, compute
// what the CPU twins of the bias ops do.
func TestBiasDevicePlans(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 20))
	for _, rc := range [][2]int{{1, 1}, {1, 6}, {7, 3}, {300, 5}, {4, 70}, {5000, 16}} {
		rows, cols := rc[0], rc[1]
		s := rowsShape{op: "test", rows: rows, cols: cols, full: tensor.Shape{rows, cols}, dt: tensor.Float64}
		// Multiples of 1/8: every sum is exact, in any order.
		dy := make([]float64, rows*cols)
		for i := range dy {
			dy[i] = float64(rng.IntN(17)-8) / 8
		}
		want, got := make([]float64, cols), make([]float64, cols)
		kernels.SumRows(rows, cols, dy, want)
		if err := reduceRun(s.sumShape(), [][]float64{dy}, got); err != nil {
			t.Fatal(err)
		}
		if !equalFloats(got, want) {
			t.Errorf("%dx%d: Sum's plan gives %v, SumRows %v", rows, cols, got, want)
		}
		ps, err := s.broadcastShape()
		if err != nil {
			t.Fatal(err)
		}
		wantRows, gotRows := make([]float64, rows*cols), make([]float64, rows*cols)
		kernels.BroadcastRows(rows, cols, want, wantRows)
		if err := pointwiseRun(ps, [][]float64{want}, gotRows); err != nil {
			t.Fatal(err)
		}
		if !equalFloats(gotRows, wantRows) {
			t.Errorf("%dx%d: the pointwise copy differs from BroadcastRows", rows, cols)
		}
	}
}

// BenchmarkLinear times Linear over a detector's tokens and attention's
// batched products, float32, against gorgonia's own ops on the same graph
// (Mul of xᵀ-free matrices with a broadcast bias add, BatchedMatMul).
func BenchmarkLinear(b *testing.B) {
	const tokens, in, out = 4096, 256, 256
	flops := 2.0 * tokens * in * out
	for _, impl := range []string{"stheno", "gorgonia"} {
		for _, pass := range []string{"fwd", "fwdbwd"} {
			b.Run(fmt.Sprintf("op=linear/tokens=%d/in=%d/out=%d/impl=%s/pass=%s", tokens, in, out, impl, pass), func(b *testing.B) {
				benchGraph(b, pass == "fwdbwd", flops, func(g *G.ExprGraph) (*G.Node, G.Nodes, error) {
					rng := rand.New(rand.NewPCG(1, 1))
					x := benchNode(g, rng, "x", -1, 1, tokens, in)
					w := benchNode(g, rng, "w", -0.1, 0.1, out, in)
					bias := benchNode(g, rng, "b", -0.1, 0.1, out)
					if impl == "stheno" {
						y, err := Linear(x, w, bias)
						return y, G.Nodes{x, w, bias}, err
					}
					// gorgonia: x·wᵀ with w stored [in out], then the bias.
					wt := benchNode(g, rng, "wt", -0.1, 0.1, in, out)
					xw, err := G.Mul(x, wt)
					if err != nil {
						return nil, nil, err
					}
					y, err := G.BroadcastAdd(xw, bias, nil, []byte{0})
					return y, G.Nodes{x, wt, bias}, err
				})
			})
		}
	}
	const batch, seq, dim = 16, 300, 32
	for _, impl := range []string{"stheno", "gorgonia"} {
		for _, pass := range []string{"fwd", "fwdbwd"} {
			b.Run(fmt.Sprintf("op=bmm/batch=%d/m=%d/n=%d/k=%d/impl=%s/pass=%s", batch, seq, dim, seq, impl, pass), func(b *testing.B) {
				benchGraph(b, pass == "fwdbwd", 2.0*batch*seq*seq*dim, func(g *G.ExprGraph) (*G.Node, G.Nodes, error) {
					rng := rand.New(rand.NewPCG(2, 2))
					p := benchNode(g, rng, "p", 0, 1, batch, seq, seq)
					v := benchNode(g, rng, "v", -1, 1, batch, seq, dim)
					var y *G.Node
					var err error
					if impl == "stheno" {
						y, err = BatchedMatMul(p, v, false, false)
					} else {
						y, err = G.BatchedMatMul(p, v)
					}
					return y, G.Nodes{p, v}, err
				})
			})
		}
	}
}
