package ops

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
)

type lossFunc func(x, t, w *G.Node) (*G.Node, error)

func smoothL1With(beta float64) lossFunc {
	return func(x, t, w *G.Node) (*G.Node, error) { return SmoothL1(x, t, w, beta) }
}

// lossAndGrad runs loss(x, t, w) and its gradient with respect to x.
func lossAndGrad(t *testing.T, f lossFunc, x, tg, w *tensor.Dense) (float64, []float64) {
	t.Helper()
	g := G.NewGraph()
	xn := G.NodeFromAny(g, x, G.WithName("x"))
	tn := G.NodeFromAny(g, tg, G.WithName("t"))
	wn := G.NodeFromAny(g, w, G.WithName("w"))
	loss, err := f(xn, tn, wn)
	if err != nil {
		t.Fatal(err)
	}
	grads, err := G.Grad(loss, xn)
	if err != nil {
		t.Fatal(err)
	}
	var lv, gv G.Value
	G.Read(loss, &lv)
	G.Read(grads[0], &gv)
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		t.Fatal(err)
	}
	return toFloat64s(t, lv)[0], toFloat64s(t, gv)
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// Forward values and gradients against the textbook formulas, which are
// fine at these moderate logits.
func TestLossHandValues(t *testing.T) {
	bceX, bceT, bceW := []float64{0, 2, -1}, []float64{1, 0, 1}, []float64{1, 0.5, 2}
	var bceLoss float64
	bceGrad := make([]float64, 3)
	for i, x := range bceX {
		p := sigmoid(x)
		bceLoss += -bceW[i] * (bceT[i]*math.Log(p) + (1-bceT[i])*math.Log(1-p))
		bceGrad[i] = bceW[i] * (p - bceT[i])
	}
	// Row 0: logsumexp(1,2,3) - 3; row 1: log 3, weighted 0.5.
	lse := 3 + math.Log(1+math.Exp(-1)+math.Exp(-2))
	ceLoss := (lse - 3) + 0.5*math.Log(3)
	ceGrad := []float64{
		math.Exp(1 - lse), math.Exp(2 - lse), math.Exp(3-lse) - 1,
		0.5 * (1.0/3 - 1), 0.5 / 3, 0.5 / 3,
	}
	cases := []struct {
		name     string
		f        lossFunc
		x, tg, w *tensor.Dense
		loss     float64
		grad     []float64
	}{
		{"bce", SigmoidBCE, vec(bceX...), vec(bceT...), vec(bceW...), bceLoss, bceGrad},
		// d = -0.2 (quadratic), 2 (linear), 1 = beta (linear: the kink
		// belongs to the linear part, as in PyTorch).
		{"smoothl1", smoothL1With(1), vec(0, 3, 0.5), vec(0.2, 1, -0.5), vec(1, 2, 3),
			0.5*0.04 + 2*1.5 + 3*0.5, []float64{-0.2, 2, 3}},
		{"l1", smoothL1With(0), vec(0, 3, -1), vec(0, 1, 1), vec(1, 2, 3),
			0 + 4 + 6, []float64{0, 2, -3}},
		{"softmaxce", SoftmaxCrossEntropy,
			tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float64{1, 2, 3, 0, 0, 0})),
			vec(2, 0), vec(1, 0.5), ceLoss, ceGrad},
	}
	for _, c := range cases {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			t.Run(c.name+"/"+dt.String(), func(t *testing.T) {
				tol := autograd.TolForward64
				if dt == tensor.Float32 {
					tol = autograd.TolForward32
				}
				loss, grad := lossAndGrad(t, c.f, cast(t, c.x, dt), cast(t, c.tg, dt), cast(t, c.w, dt))
				if err := tol.Compare([]float64{loss}, []float64{c.loss}); err != nil {
					t.Errorf("loss: %v", err)
				}
				if err := tol.Compare(grad, c.grad); err != nil {
					t.Errorf("gradient: %v", err)
				}
			})
		}
	}
}

func vec(v ...float64) *tensor.Dense {
	return tensor.New(tensor.WithShape(len(v)), tensor.WithBacking(append([]float64(nil), v...)))
}

// Huge logits neither overflow nor lose the loss: the stable forms give the
// exact limits.
func TestLossExtremeLogits(t *testing.T) {
	loss, grad := lossAndGrad(t, SigmoidBCE, vec(1000, -1000, 1000), vec(0, 0, 1), vec(1, 1, 1))
	if loss != 1000 {
		t.Errorf("BCE loss %v, want 1000", loss)
	}
	if want := []float64{1, 0, 0}; !equalFloats(grad, want) {
		t.Errorf("BCE gradient %v, want %v", grad, want)
	}
	x := tensor.New(tensor.WithShape(1, 2), tensor.WithBacking([]float64{1000, 0}))
	loss, grad = lossAndGrad(t, SoftmaxCrossEntropy, x, vec(1), vec(1))
	if loss != 1000 {
		t.Errorf("cross-entropy loss %v, want 1000", loss)
	}
	if want := []float64{1, -1}; !equalFloats(grad, want) {
		t.Errorf("cross-entropy gradient %v, want %v", grad, want)
	}
}

func equalFloats(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A zero weight removes an element from the loss and its gradient, even
// when the element holds garbage (padding).
func TestLossZeroWeightIsPadding(t *testing.T) {
	inf := math.Inf(1)
	for _, c := range []struct {
		name string
		f    lossFunc
	}{{"bce", SigmoidBCE}, {"smoothl1", smoothL1With(1.0 / 9)}} {
		loss, grad := lossAndGrad(t, c.f, vec(0.5, 1e30, -inf), vec(1, 0, 1), vec(1, 0, 0))
		ref, refGrad := lossAndGrad(t, c.f, vec(0.5), vec(1), vec(1))
		if loss != ref || grad[0] != refGrad[0] || grad[1] != 0 || grad[2] != 0 {
			t.Errorf("%s: loss %v grad %v, want %v and %v, 0, 0", c.name, loss, grad, ref, refGrad[0])
		}
	}
	x := tensor.New(tensor.WithShape(2, 2), tensor.WithBacking([]float64{1, 2, inf, 3}))
	loss, grad := lossAndGrad(t, SoftmaxCrossEntropy, x, vec(0, 1), vec(1, 0))
	want := math.Log(math.Exp(1)+math.Exp(2)) - 1 // label 0 of row (1, 2)
	if math.Abs(loss-want) > 1e-15 || grad[2] != 0 || grad[3] != 0 {
		t.Errorf("cross-entropy: loss %v grad %v, want %v and zeros in row 1", loss, grad, want)
	}
}

func TestLossGradCheck(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		rng := rand.New(rand.NewPCG(seed, 11))
		x := randTensor(rng, tensor.Float64, -3, 3, 4, 5)
		tg := randTensor(rng, tensor.Float64, 0, 1, 4, 5)
		w := randTensor(rng, tensor.Float64, 0, 2, 4, 5)
		labels := vec(0, 4, 2, 1)
		rowW := randTensor(rng, tensor.Float64, 0, 2, 4)
		cases := []struct {
			name      string
			f         lossFunc
			tg, w     *tensor.Dense
			tolerance autograd.Tolerance
		}{
			{"bce", SigmoidBCE, tg, w, autograd.TolGrad},
			{"smoothl1", smoothL1With(0.5), tg, w, autograd.TolGrad},
			{"l1", smoothL1With(0), tg, w, autograd.TolGrad},
			{"softmaxce", SoftmaxCrossEntropy, labels, rowW, autograd.TolGrad},
		}
		for _, c := range cases {
			build := func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) { return c.f(in[0], in[1], in[2]) }
			inputs := []autograd.Input{
				{Name: "x", Value: x},
				{Name: "t", Value: c.tg, NoGrad: true},
				{Name: "w", Value: c.w, NoGrad: true},
			}
			results, err := autograd.CheckGrad(build, inputs, seed)
			if err != nil {
				t.Fatalf("%s seed %d: %v", c.name, seed, err)
			}
			if results[0].Scale == 0 {
				t.Errorf("%s seed %d: zero gradient, the check proves nothing", c.name, seed)
			}
		}
	}
}

func TestLossBadInput(t *testing.T) {
	g := G.NewGraph()
	m23 := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 3), G.WithName("m23"))
	m23b := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 3), G.WithName("m23b"))
	m32 := G.NewMatrix(g, tensor.Float64, G.WithShape(3, 2), G.WithName("m32"))
	f32 := G.NewMatrix(g, tensor.Float32, G.WithShape(2, 3), G.WithName("f32"))
	i23 := G.NewMatrix(g, tensor.Int, G.WithShape(2, 3), G.WithName("i23"))
	v2 := G.NewVector(g, tensor.Float64, G.WithShape(2), G.WithName("v2"))
	v3 := G.NewVector(g, tensor.Float64, G.WithShape(3), G.WithName("v3"))
	cases := []struct {
		name string
		f    func() (*G.Node, error)
		want string
	}{
		{"bce targets shape", func() (*G.Node, error) { return SigmoidBCE(m23, m32, m23b) }, "targets must have shape (2, 3) like x"},
		{"bce weights dtype", func() (*G.Node, error) { return SigmoidBCE(m23, m23b, f32) }, "weights has dtype float32"},
		{"bce int", func() (*G.Node, error) { return SigmoidBCE(i23, i23, i23) }, "x must be float32 or float64"},
		{"bce nil", func() (*G.Node, error) { return SigmoidBCE(m23, nil, m23b) }, "must not be nil"},
		{"smoothl1 beta", func() (*G.Node, error) { return SmoothL1(m23, m23b, m23b, -1) }, "beta must be non-negative"},
		{"smoothl1 beta NaN", func() (*G.Node, error) { return SmoothL1(m23, m23b, m23b, math.NaN()) }, "beta must be non-negative"},
		{"ce logits rank", func() (*G.Node, error) { return SoftmaxCrossEntropy(v2, v2, v2) }, "logits must have shape [K C]"},
		{"ce labels rows", func() (*G.Node, error) { return SoftmaxCrossEntropy(m23, v3, v2) }, "labels must have shape [2]"},
		{"ce weights rank", func() (*G.Node, error) { return SoftmaxCrossEntropy(m23, v2, m23b) }, "weights must have shape [2]"},
	}
	for _, c := range cases {
		_, err := c.f()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got error %v, want one containing %q", c.name, err, c.want)
		}
	}
}

// Labels are checked when the graph runs, whatever their weight.
func TestSoftmaxCrossEntropyBadLabels(t *testing.T) {
	for _, label := range []float64{-1, 3, 1.5, math.NaN()} {
		x := tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float64{1, 2, 3, 4, 5, 6}))
		_, _, err := runGraph(t, []*tensor.Dense{x, vec(0, label), vec(1, 0)}, func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
			return SoftmaxCrossEntropy(in[0], in[1], in[2])
		})
		if err == nil || !strings.Contains(err.Error(), "row 1: label") {
			t.Errorf("label %v: got error %v", label, err)
		}
	}
}

// Losses with different parameters, or of different kinds, on the same
// inputs stay distinct nodes.
func TestLossHashes(t *testing.T) {
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 3), G.WithName("x"))
	a, _ := SmoothL1(x, x, x, 1)
	b, _ := SmoothL1(x, x, x, 0.5)
	c, _ := SigmoidBCE(x, x, x)
	if a == b || a == c || a.Hashcode() == b.Hashcode() || a.Hashcode() == c.Hashcode() {
		t.Error("distinct losses were merged")
	}
}

// The backward op takes the loss's gradient in every form gorgonia hands it
// over: a *G.F64 or *G.F32 whatever the loss's dtype, or a tensor of one
// element; anything else is an error naming the argument.
func TestLossGradScalarForms(t *testing.T) {
	x, tg, w := vec(0.5, -1), vec(1, 0), vec(1, 2)
	s := lossShape{kind: lossSigmoidBCE, x: tensor.Shape{2}, t: tensor.Shape{2}, w: tensor.Shape{2}, dt: tensor.Float64}
	want := []float64{3 * (sigmoid(0.5) - 1), 3 * 2 * sigmoid(-1)}
	for _, c := range []struct {
		name string
		g    G.Value
	}{
		{"F64", G.NewF64(3)},
		{"F32", G.NewF32(3)},
		{"scalar tensor", tensor.New(tensor.FromScalar(3.0))},
		{"one-element tensor", tensor.New(tensor.WithShape(1, 1), tensor.WithBacking([]float32{3}))},
	} {
		dx, err := lossGradOp(s).Do(x, tg, w, c.g)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if err := autograd.TolForward64.Compare(toFloat64s(t, dx), want); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	_, err := lossGradOp(s).Do(x, tg, w, vec(1, 2))
	if err == nil || !strings.Contains(err.Error(), "SigmoidBCE backward: grad must be a float scalar") {
		t.Errorf("a two-element gradient: got error %v", err)
	}
}
