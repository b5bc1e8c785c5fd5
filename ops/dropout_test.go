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
	"github.com/stheno-ml/stheno/kernels"
)

// dropoutBuild applies Dropout to in[0] with a DropoutRNG of seed made
// for each graph: the node is then stream 0 in every graph built, so two
// builds draw the same masks (GradCheck builds two graphs).
func dropoutBuild(p float64, seed uint64) func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
	return func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) { return Dropout(in[0], p, NewDropoutRNG(seed)) }
}

// dropoutMask is the definition of the mask of element i: word i%4 of
// Philox-4x32-10 of (i/4, stream, step lo, step hi) under (seed lo, seed
// hi), below (1-p)*2^32.
func dropoutMask(n int, p float64, seed uint64, stream uint32, step uint64) []bool {
	keep := make([]bool, n)
	for i := range keep {
		r := kernels.Philox4x32([4]uint32{uint32(i / 4), stream, uint32(step), uint32(step >> 32)}, [2]uint32{uint32(seed), uint32(seed >> 32)})
		keep[i] = float64(r[i%4]) < math.Round((1-p)*(1<<32))
	}
	return keep
}

// y and the gradient of sum(y * R) against the definition: y = x/(1-p)
// where kept, 0 elsewhere; dx = R/(1-p) where kept. 21 elements, not a
// multiple of the four a Philox call gives.
func TestDropoutHandValues(t *testing.T) {
	const p, seed = 0.25, 5
	rng := rand.New(rand.NewPCG(26, 70))
	x := randTensor(rng, tensor.Float64, -1, 1, 3, 7)
	proj := randTensor(rng, tensor.Float64, -1, 1, 3, 7)
	keep := dropoutMask(21, p, seed, 0, 0)
	kept := 0
	for _, k := range keep {
		if k {
			kept++
		}
	}
	if kept == 0 || kept == 21 {
		t.Fatalf("the mask keeps %d of 21: pick another seed for a test that sees both", kept)
	}
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		in := []*tensor.Dense{cast(t, x, dt)}
		xs, ps := toFloat64s(t, in[0]), toFloat64s(t, cast(t, proj, dt))
		scale := kernels.DropoutScale(p, int(dt.Size()))
		wantY, wantDx := make([]float64, 21), make([]float64, 21)
		for i, k := range keep {
			if k {
				wantY[i], wantDx[i] = xs[i]*scale, ps[i]*scale
			}
		}
		tol := autograd.TolForward64
		if dt == tensor.Float32 {
			tol = autograd.TolForward32
		}
		got, shape, err := runGraph(t, in, dropoutBuild(p, seed))
		if err != nil {
			t.Fatal(err)
		}
		if !shape.Eq(tensor.Shape{3, 7}) {
			t.Errorf("%v: y has shape %v, want (3, 7)", dt, shape)
		}
		if err := tol.Compare(got, wantY); err != nil {
			t.Errorf("%v: y: %v", dt, err)
		}
		dx := gradOf(t, in, cast(t, proj, dt), []int{0}, dropoutBuild(p, seed))[0]
		if err := tol.Compare(dx, wantDx); err != nil {
			t.Errorf("%v: dx: %v", dt, err)
		}
	}
}

// One graph run again and again, as a training loop does: Next draws a
// new mask, SetStep an old one again, a second node of the same DropoutRNG
// its own, and SetTraining(false) makes Dropout the identity, gradient
// included. A graph built again with a DropoutRNG of the same seed draws
// the same masks.
func TestDropoutSteps(t *testing.T) {
	const n, p = 4096, 0.5
	// vals are a, b and dx, read after each run.
	build := func(r *DropoutRNG) (m G.VM, vals *[3]G.Value) {
		g := G.NewGraph()
		ones := make([]float64, n)
		for i := range ones {
			ones[i] = 1
		}
		x := G.NewVector(g, tensor.Float64, G.WithShape(n), G.WithName("x"), G.WithValue(tensor.New(tensor.WithShape(n), tensor.WithBacking(ones))))
		a, err := Dropout(x, p, r)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Dropout(x, p, r)
		if err != nil {
			t.Fatal(err)
		}
		loss := G.Must(G.Sum(G.Must(G.Add(a, b))))
		grads, err := G.Grad(loss, x)
		if err != nil {
			t.Fatal(err)
		}
		vals = new([3]G.Value)
		for i, nd := range []*G.Node{a, b, grads[0]} {
			G.Read(nd, &vals[i])
		}
		return G.NewTapeMachine(g), vals
	}
	r := NewDropoutRNG(7)
	m, vals := build(r)
	defer m.Close()
	type result struct{ a, b, dx []float64 }
	run := func() result {
		t.Helper()
		if err := m.RunAll(); err != nil {
			t.Fatal(err)
		}
		defer m.Reset()
		return result{toFloat64s(t, vals[0]), toFloat64s(t, vals[1]), toFloat64s(t, vals[2])}
	}
	step0 := run()
	same := func(u, v []float64) bool { return sameFloats(u, v) }
	if same(step0.a, step0.b) {
		t.Errorf("two Dropout nodes of one DropoutRNG drew the same mask")
	}
	for i := range n {
		want := step0.a[i] + step0.b[i]
		if step0.dx[i] != want {
			t.Fatalf("dx[%d] = %v, want the masks' sum %v", i, step0.dx[i], want)
		}
	}
	if got := r.Next(); got != 1 {
		t.Errorf("Next returned step %d, want 1", got)
	}
	step1 := run()
	if same(step0.a, step1.a) || same(step0.b, step1.b) {
		t.Errorf("the masks did not change with the step")
	}
	r.SetStep(0)
	again := run()
	if !same(step0.a, again.a) || !same(step0.b, again.b) || !same(step0.dx, again.dx) {
		t.Errorf("step 0 again drew other masks")
	}
	want := dropoutMask(n, p, 7, 1, 0)
	for i, k := range want {
		if (step0.b[i] != 0) != k {
			t.Fatalf("the second node's mask at %d is %v, the definition's (stream 1) %v", i, step0.b[i] != 0, k)
		}
	}
	// Another graph from another DropoutRNG of the same seed.
	m2, vals2 := build(NewDropoutRNG(7))
	defer m2.Close()
	if err := m2.RunAll(); err != nil {
		t.Fatal(err)
	}
	if !same(toFloat64s(t, vals2[0]), step0.a) || !same(toFloat64s(t, vals2[1]), step0.b) {
		t.Errorf("a graph built again with the same seed drew other masks")
	}
	r.SetTraining(false)
	if r.Training() {
		t.Errorf("Training() is true after SetTraining(false)")
	}
	eval := run()
	for i := range n {
		if eval.a[i] != 1 || eval.b[i] != 1 || eval.dx[i] != 2 {
			t.Fatalf("outside training, element %d: a %v, b %v, dx %v; want 1, 1, 2", i, eval.a[i], eval.b[i], eval.dx[i])
		}
	}
}

// The keep rate and the mean through the op: 2^20 ones at p = 0.3 keep
// 0.7 of them to within 6 standard deviations (sd = sqrt(n p (1-p)) =
// 469, 0.27% of the kept count: a wrong threshold cannot pass), and every
// kept element is 1/0.7 as PyTorch rounds it for float32.
func TestDropoutKeepRateThroughTheOp(t *testing.T) {
	const n, p = 1 << 20, 0.3
	ones := make([]float32, n)
	for i := range ones {
		ones[i] = 1
	}
	x := tensor.New(tensor.WithShape(1024, 1024), tensor.WithBacking(ones))
	got, _, err := runGraph(t, []*tensor.Dense{x}, dropoutBuild(p, 2026))
	if err != nil {
		t.Fatal(err)
	}
	scale := float64(float32(1) / float32(1-p))
	kept := 0
	for i, v := range got {
		switch v {
		case 0:
		case scale:
			kept++
		default:
			t.Fatalf("y[%d] = %v, want 0 or %v", i, v, scale)
		}
	}
	sd := math.Sqrt(n * p * (1 - p))
	if d := float64(kept) - n*(1-p); math.Abs(d) > 6*sd {
		t.Errorf("%d of %d kept, %.1f sd from %v", kept, n, d/sd, n*(1-p))
	}
}

func TestDropoutGradCheck(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 71))
	for i, c := range []struct {
		x []int
		p float64
	}{{[]int{7}, 0.5}, {[]int{3, 5}, 0.1}, {[]int{2, 3, 11}, 0.9}, {[]int{4, 64}, 0.3}} {
		for seed := range uint64(3) {
			name := fmt.Sprintf("x%v p=%v seed=%d", c.x, c.p, seed)
			inputs := []autograd.Input{{Name: "x", Value: randTensor(rng, tensor.Float64, -1, 1, c.x...)}}
			results, err := autograd.CheckGrad(dropoutBuild(c.p, 100+seed), inputs, uint64(i)*10+seed)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			for _, r := range results {
				if r.Scale == 0 {
					t.Errorf("%s: %s: zero gradient (every element dropped), the check proves nothing", name, r.Name)
				}
			}
		}
	}
}

func TestDropoutBadInput(t *testing.T) {
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float32, G.WithShape(3, 4), G.WithName("x"))
	r := NewDropoutRNG(1)
	for _, c := range []struct {
		name string
		x    *G.Node
		p    float64
		rng  *DropoutRNG
		want string
	}{
		{"nil rng", x, 0.1, nil, "rng is nil, want a *DropoutRNG (NewDropoutRNG)"},
		{"p = 1", x, 1, r, "p must be in [0, 1), got 1"},
		{"negative p", x, -0.1, r, "p must be in [0, 1), got -0.1"},
		{"NaN p", x, math.NaN(), r, "p must be in [0, 1), got NaN"},
		{"nil x", nil, 0.1, r, "x is nil"},
		{"int x", G.NewMatrix(g, tensor.Int, G.WithShape(2, 2), G.WithName("xi")), 0.1, r, "x must be float32 or float64, got int"},
		{"empty x", G.NewMatrix(g, tensor.Float32, G.WithShape(0, 2), G.WithName("x0")), 0.1, r, "x must have positive sizes, got (0, 2) (dimension 0)"},
	} {
		_, err := Dropout(c.x, c.p, c.rng)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "ops: Dropout: ") {
			t.Errorf("%s: got error %v, want one containing %q", c.name, err, c.want)
		}
	}
	// p = 0 is x itself.
	y, err := Dropout(x, 0, r)
	if err != nil || y != x {
		t.Errorf("p = 0: got %v, %v; want x itself", y, err)
	}
}

// Nodes of other p, stream, DropoutRNG or pass hash apart; the same node's
// op hashes alike from step to step.
func TestDropoutOpsHashApart(t *testing.T) {
	r1, r2 := NewDropoutRNG(1), NewDropoutRNG(1)
	base := dropoutShape{x: tensor.Shape{3, 4}, p: 0.1, rng: r1, dt: tensor.Float32}
	p, stream, rng, dt := base, base, base, base
	p.p, stream.stream, rng.rng, dt.dt = 0.2, 1, r2, tensor.Float64
	hashes := map[uint32]string{}
	for _, s := range []dropoutShape{base, p, stream, rng, dt} {
		for _, op := range []*specOp{dropoutOp(s, false), dropoutOp(s, true)} {
			h := op.Hashcode()
			if prev, ok := hashes[h]; ok {
				t.Errorf("%v hashes like %v", op, prev)
			}
			hashes[h] = op.String()
		}
	}
	h := dropoutOp(base, false).Hashcode()
	r1.Next()
	if dropoutOp(base, false).Hashcode() != h {
		t.Errorf("the op's hash changed with the step")
	}
}
