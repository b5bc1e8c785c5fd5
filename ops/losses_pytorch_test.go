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

// Tests of SigmoidFocalLoss, L1Loss, GIoULoss and the box conversions, and
// of every loss against PyTorch (testdata/losses.json, from
// gen_losses_device.py).

func focalWith(alpha, gamma float64) lossFunc {
	return func(x, t, w *G.Node) (*G.Node, error) { return SigmoidFocalLoss(x, t, w, alpha, gamma) }
}

// lossCaseFunc returns the loss of a losses.json case.
func lossCaseFunc(t *testing.T, c lossRef) lossFunc {
	switch c.Kind {
	case "bce":
		return SigmoidBCE
	case "smoothl1":
		return smoothL1With(c.Beta)
	case "l1":
		return L1Loss
	case "focal":
		return focalWith(c.Alpha, c.Gamma)
	case "ce":
		return SoftmaxCrossEntropy
	case "giou":
		return GIoULoss
	}
	t.Fatalf("unknown loss kind %q", c.Kind)
	return nil
}

// lossRef is one loss case of testdata/losses.json.
type lossRef struct {
	Name, Kind         string
	Shape              []int
	X, T, W            []float64
	Loss               float64
	Grad               []float64
	Beta, Alpha, Gamma float64
}

// boxRef is one box conversion case of testdata/losses.json.
type boxRef struct {
	Name, In, Out string
	Shape         []int
	X, Proj, Y    []float64
	Grad          []float64
}

func loadLossRefs(t *testing.T) ([]lossRef, []boxRef) {
	var ref struct {
		Torch  string
		Losses []lossRef
		Boxes  []boxRef
	}
	loadJSON(t, "testdata/losses.json", &ref)
	if len(ref.Losses) == 0 || len(ref.Boxes) == 0 {
		t.Fatal("no cases in testdata/losses.json")
	}
	return ref.Losses, ref.Boxes
}

// lossInputs are a case's x, t and w tensors in dtype dt.
func lossInputs(c lossRef, dt tensor.Dtype) (x, tg, w *tensor.Dense) {
	x = fromFloat64s(dt, c.X, c.Shape...)
	tShape, wShape := c.Shape, c.Shape
	switch c.Kind {
	case "ce":
		tShape, wShape = c.Shape[:1], c.Shape[:1]
	case "giou":
		wShape = c.Shape[:1]
	}
	return x, fromFloat64s(dt, c.T, tShape...), fromFloat64s(dt, c.W, wShape...)
}

func TestLossesMatchPyTorch(t *testing.T) {
	losses, _ := loadLossRefs(t)
	for _, c := range losses {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			tol := autograd.TolForward64
			if dt == tensor.Float32 {
				tol = autograd.TolForward32
			}
			x, tg, w := lossInputs(c, dt)
			loss, grad := lossAndGrad(t, lossCaseFunc(t, c), x, tg, w)
			if err := tol.Compare([]float64{loss}, []float64{c.Loss}); err != nil {
				t.Errorf("%s %v: loss: %v", c.Name, dt, err)
			}
			if err := tol.Compare(grad, c.Grad); err != nil {
				t.Errorf("%s %v: gradient: %v", c.Name, dt, err)
			}
		}
	}
}

func boxConvertFunc(in string) func(*G.Node) (*G.Node, error) {
	if in == "cxcywh" {
		return BoxCxCyWHToXYXY
	}
	return BoxXYXYToCxCyWH
}

func TestBoxConvertMatchesPyTorch(t *testing.T) {
	_, boxes := loadLossRefs(t)
	for _, c := range boxes {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			x := fromFloat64s(dt, c.X, c.Shape...)
			build := func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) { return boxConvertFunc(c.In)(in[0]) }
			got, shape, err := runGraph(t, []*tensor.Dense{x}, build)
			if err != nil {
				t.Fatalf("%s %v: %v", c.Name, dt, err)
			}
			if !shape.Eq(tensor.Shape(c.Shape)) {
				t.Errorf("%s %v: shape %v, PyTorch's %v", c.Name, dt, shape, c.Shape)
			}
			// Multiples of 1/16 halved and added: exact in either dtype.
			if !equalFloats(got, c.Y) {
				t.Errorf("%s %v: got %v, PyTorch's %v", c.Name, dt, got, c.Y)
			}
			grads := gradOf(t, []*tensor.Dense{x}, fromFloat64s(dt, c.Proj, c.Shape...), []int{0}, build)
			if !equalFloats(grads[0], c.Grad) {
				t.Errorf("%s %v: gradient %v, PyTorch's %v", c.Name, dt, grads[0], c.Grad)
			}
		}
	}
}

// Values worked out by hand.
func TestNewLossesHandValues(t *testing.T) {
	// Focal at x = 0, t = 1: p = p_t = 1/2, bce = log 2, alpha_t = 1/4:
	// (1/4) log 2 (1/2)^2. Its gradient: alpha_t * ((p - t) m^2 + bce * 2m
	// * dm), m = 1/2, dm = -p(1-p)(2t-1) = -1/4.
	focal := 0.25 * math.Ln2 * 0.25
	focalGrad := 0.25 * (-0.5*0.25 + math.Ln2*2*0.5*-0.25)
	// GIoU of [0 0 2 2] against [1 1 3 3]: inter 1, union 7, enclosing 9.
	giou := 1 - (1/(7+1e-7) - 2/(9+1e-7))
	cases := []struct {
		name     string
		f        lossFunc
		x, tg, w *tensor.Dense
		loss     float64
	}{
		{"focal", focalWith(0.25, 2), vec(0), vec(1), vec(1), focal},
		{"focal gamma=0 alpha=-1 is bce", focalWith(-1, 0), vec(0, 2), vec(1, 0), vec(1, 3), math.Ln2 + 3*(2+math.Log1p(math.Exp(-2)))},
		{"l1", L1Loss, vec(0, 3, -1), vec(0, 1, 1), vec(1, 2, 3), 0 + 4 + 6},
		{"giou", GIoULoss,
			tensor.New(tensor.WithShape(2, 4), tensor.WithBacking([]float64{0, 0, 2, 2, 5, 5, 6, 6})),
			tensor.New(tensor.WithShape(2, 4), tensor.WithBacking([]float64{1, 1, 3, 3, 5, 5, 6, 6})),
			vec(1, 0.5), giou + 0.5*(1-1/(1+1e-7)+0)},
	}
	for _, c := range cases {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			tol := autograd.TolForward64
			if dt == tensor.Float32 {
				tol = autograd.TolForward32
			}
			loss, grad := lossAndGrad(t, c.f, cast(t, c.x, dt), cast(t, c.tg, dt), cast(t, c.w, dt))
			if err := tol.Compare([]float64{loss}, []float64{c.loss}); err != nil {
				t.Errorf("%s %v: loss: %v", c.name, dt, err)
			}
			if c.name == "focal" {
				if err := tol.Compare(grad, []float64{focalGrad}); err != nil {
					t.Errorf("%s %v: gradient: %v", c.name, dt, err)
				}
			}
		}
	}
}

// For 0 < gamma < 1, a saturated logit's focal gradient is NaN in float32
// (p_t rounds to 1, and (1-p_t)^(gamma-1) is infinite) and finite in
// float64, as PyTorch's autograd gives them (checked against torch 1.13:
// [nan nan -0.0038] and [-3.5091e-14 1.0527e-13]).
func TestFocalSaturatedGradient(t *testing.T) {
	f := focalWith(0.25, 0.5)
	_, g32 := lossAndGrad(t, f, cast(t, vec(20, -20, 3), tensor.Float32), cast(t, vec(1, 0, 1), tensor.Float32), cast(t, vec(1, 1, 1), tensor.Float32))
	if !math.IsNaN(g32[0]) || !math.IsNaN(g32[1]) || math.Abs(g32[2]+0.0038) > 1e-4 {
		t.Errorf("float32: %v, want [NaN NaN -0.0038]", g32)
	}
	_, g64 := lossAndGrad(t, f, vec(20, -20), vec(1, 0), vec(1, 1))
	// PyTorch printed 5 digits.
	if math.Abs(g64[0]/-3.5091e-14-1) > 1e-4 || math.Abs(g64[1]/1.0527e-13-1) > 1e-4 {
		t.Errorf("float64: %v, want [-3.5091e-14 1.0527e-13]", g64)
	}
}

// A zero weight removes an element or a box from the loss and its
// gradient, whatever it holds.
func TestNewLossesZeroWeightIsPadding(t *testing.T) {
	inf := math.Inf(1)
	for _, c := range []struct {
		name string
		f    lossFunc
	}{{"focal", focalWith(0.25, 2)}, {"l1", L1Loss}} {
		loss, grad := lossAndGrad(t, c.f, vec(0.5, 1e30, -inf, math.NaN()), vec(1, 0, 1, 0), vec(1, 0, 0, 0))
		ref, refGrad := lossAndGrad(t, c.f, vec(0.5), vec(1), vec(1))
		if loss != ref || grad[0] != refGrad[0] || grad[1] != 0 || grad[2] != 0 || grad[3] != 0 {
			t.Errorf("%s: loss %v grad %v, want %v and %v, 0, 0, 0", c.name, loss, grad, ref, refGrad[0])
		}
	}
	b := tensor.New(tensor.WithShape(2, 4), tensor.WithBacking([]float64{0, 0, 2, 2, math.NaN(), 0, inf, 1}))
	tb := tensor.New(tensor.WithShape(2, 4), tensor.WithBacking([]float64{1, 1, 3, 3, 0, 0, 1, 1}))
	loss, grad := lossAndGrad(t, GIoULoss, b, tb, vec(1, 0))
	if math.IsNaN(loss) || grad[4] != 0 || grad[5] != 0 || grad[6] != 0 || grad[7] != 0 {
		t.Errorf("giou: loss %v grad %v, want a number and zeros for box 1", loss, grad)
	}
}

func TestNewLossesGradCheck(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		rng := rand.New(rand.NewPCG(seed, 12))
		x := randTensor(rng, tensor.Float64, -3, 3, 4, 5)
		tg := randTensor(rng, tensor.Float64, 0, 1, 4, 5)
		w := randTensor(rng, tensor.Float64, 0, 2, 4, 5)
		// Boxes in general position (no ties, so the gradient is smooth
		// around them), some overlapping their targets and some not.
		boxes := randBoxes(rng, 12)
		tboxes := randBoxes(rng, 12)
		bw := randTensor(rng, tensor.Float64, 0, 2, 12)
		cases := []struct {
			name      string
			f         lossFunc
			x, tg, w  *tensor.Dense
			tolerance autograd.Tolerance
		}{
			{"focal", focalWith(0.25, 2), x, tg, w, autograd.TolGrad},
			{"focal alpha=-1 gamma=1.5", focalWith(-1, 1.5), x, tg, w, autograd.TolGrad},
			{"focal gamma=0", focalWith(0.75, 0), x, tg, w, autograd.TolGrad},
			{"l1", L1Loss, x, tg, w, autograd.TolGrad},
			{"giou", GIoULoss, boxes, tboxes, bw, autograd.TolGrad},
		}
		for _, c := range cases {
			build := func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) { return c.f(in[0], in[1], in[2]) }
			inputs := []autograd.Input{
				{Name: "x", Value: c.x},
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
		for _, f := range []func(*G.Node) (*G.Node, error){BoxCxCyWHToXYXY, BoxXYXYToCxCyWH} {
			build := func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) { return f(in[0]) }
			in := []autograd.Input{{Name: "boxes", Value: randTensor(rng, tensor.Float64, -2, 2, 3, 4)}}
			if _, err := autograd.CheckGrad(build, in, seed); err != nil {
				t.Fatalf("box conversion seed %d: %v", seed, err)
			}
		}
	}
}

// randBoxes returns n boxes (x1, y1, x2, y2) with sides in [0.5, 3] and
// corners in [0, 4): float64.
func randBoxes(rng *rand.Rand, n int) *tensor.Dense {
	b := make([]float64, 4*n)
	for i := range n {
		x, y := 4*rng.Float64(), 4*rng.Float64()
		b[4*i], b[4*i+1] = x, y
		b[4*i+2], b[4*i+3] = x+0.5+2.5*rng.Float64(), y+0.5+2.5*rng.Float64()
	}
	return tensor.New(tensor.WithShape(n, 4), tensor.WithBacking(b))
}

// The box conversions undo each other, and their backward ops are their
// transposes: the second derivative exists (the backward's backward is
// the conversion).
func TestBoxConvertRoundTripAndSecondDerivative(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	x := randTensor(rng, tensor.Float64, -4, 4, 5, 4)
	got, _, err := runGraph(t, []*tensor.Dense{x}, func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
		y, err := BoxCxCyWHToXYXY(in[0])
		if err != nil {
			return nil, err
		}
		return BoxXYXYToCxCyWH(y)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := autograd.TolForward64.Compare(got, x.Float64s()); err != nil {
		t.Errorf("round trip: %v", err)
	}
	g := G.NewGraph()
	xn := G.NodeFromAny(g, x, G.WithName("x"))
	y := G.Must(BoxCxCyWHToXYXY(xn))
	gy, err := boxOp(boxShape{mode: 1, shape: tensor.Shape{5, 4}, dt: tensor.Float64}).SymDiff(G.Nodes{y}, nil, y)
	if err != nil || len(gy) != 1 || gy[0] == nil {
		t.Fatalf("the backward op's derivative: %v, %v", gy, err)
	}
}

func TestNewLossesBadInput(t *testing.T) {
	g := G.NewGraph()
	m23 := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 3), G.WithName("m23"))
	m32 := G.NewMatrix(g, tensor.Float64, G.WithShape(3, 2), G.WithName("m32"))
	f23 := G.NewMatrix(g, tensor.Float32, G.WithShape(2, 3), G.WithName("f23"))
	b24 := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 4), G.WithName("b24"))
	b34 := G.NewMatrix(g, tensor.Float64, G.WithShape(3, 4), G.WithName("b34"))
	v2 := G.NewVector(g, tensor.Float64, G.WithShape(2), G.WithName("v2"))
	v3 := G.NewVector(g, tensor.Float64, G.WithShape(3), G.WithName("v3"))
	i24 := G.NewMatrix(g, tensor.Int, G.WithShape(2, 4), G.WithName("i24"))
	nanW := G.NodeFromAny(g, tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float64{1, 0, math.NaN(), 1, 1, 1})), G.WithName("nanw"))
	nanW2 := G.NodeFromAny(g, vec(1, math.NaN()), G.WithName("nanw2"))
	cases := []struct {
		name string
		f    func() (*G.Node, error)
		want string
	}{
		{"focal targets shape", func() (*G.Node, error) { return SigmoidFocalLoss(m23, m32, m23, 0.25, 2) }, "SigmoidFocalLoss: targets must have shape (2, 3) like x"},
		{"focal weights dtype", func() (*G.Node, error) { return SigmoidFocalLoss(m23, m23, f23, 0.25, 2) }, "weights has dtype float32"},
		{"focal alpha > 1", func() (*G.Node, error) { return SigmoidFocalLoss(m23, m23, m23, 1.5, 2) }, "alpha must be in [0, 1], or negative"},
		{"focal alpha NaN", func() (*G.Node, error) { return SigmoidFocalLoss(m23, m23, m23, math.NaN(), 2) }, "alpha must be in [0, 1]"},
		{"focal gamma < 0", func() (*G.Node, error) { return SigmoidFocalLoss(m23, m23, m23, 0.25, -1) }, "gamma must be non-negative and finite"},
		{"focal gamma NaN", func() (*G.Node, error) { return SigmoidFocalLoss(m23, m23, m23, 0.25, math.NaN()) }, "gamma must be non-negative"},
		{"focal gamma inf", func() (*G.Node, error) { return SigmoidFocalLoss(m23, m23, m23, 0.25, math.Inf(1)) }, "gamma must be non-negative"},
		{"focal NaN weights", func() (*G.Node, error) { return SigmoidFocalLoss(m23, m23, nanW, 0.25, 2) }, "weights must be numbers, got NaN at element 2"},
		{"l1 shape", func() (*G.Node, error) { return L1Loss(m23, m23, m32) }, "L1Loss: weights must have shape (2, 3) like x"},
		{"l1 NaN weights", func() (*G.Node, error) { return L1Loss(m23, m23, nanW) }, "L1Loss: weights must be numbers"},
		{"giou rank", func() (*G.Node, error) { return GIoULoss(v2, v2, v2) }, "GIoULoss: boxes must have shape [N 4]"},
		{"giou not 4", func() (*G.Node, error) { return GIoULoss(m23, m23, v2) }, "boxes must have shape [N 4], got (2, 3)"},
		{"giou targets", func() (*G.Node, error) { return GIoULoss(b24, b34, v2) }, "targets must have shape (2, 4) like boxes"},
		{"giou weights", func() (*G.Node, error) { return GIoULoss(b24, b24, v3) }, "weights must have shape [2], one per box"},
		{"giou dtype", func() (*G.Node, error) { return GIoULoss(i24, i24, v2) }, "boxes must be float32 or float64"},
		{"giou NaN weights", func() (*G.Node, error) { return GIoULoss(b24, b24, nanW2) }, "GIoULoss: weights must be numbers"},
		{"ce NaN weights", func() (*G.Node, error) { return SoftmaxCrossEntropy(m23, v2, nanW2) }, "weights must be numbers"},
		{"box convert last dim", func() (*G.Node, error) { return BoxCxCyWHToXYXY(m23) }, "BoxCxCyWHToXYXY: boxes must have shape [... 4], got (2, 3)"},
		{"box convert int", func() (*G.Node, error) { return BoxXYXYToCxCyWH(i24) }, "BoxXYXYToCxCyWH: boxes must be float32 or float64"},
		{"box convert nil", func() (*G.Node, error) { return BoxXYXYToCxCyWH(nil) }, "boxes is nil"},
	}
	for _, c := range cases {
		_, err := c.f()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got error %v, want one containing %q", c.name, err, c.want)
		}
	}
}

// NaN weights fed when the graph runs (not known when it is built) are an
// error on the host, forward and backward.
func TestLossNaNWeightsAtRunTime(t *testing.T) {
	s := lossShape{kind: lossL1, x: tensor.Shape{2}, t: tensor.Shape{2}, w: tensor.Shape{2}, dt: tensor.Float64}
	x, tg, w := vec(1, 2), vec(0, 1), vec(1, math.NaN())
	if _, err := lossOp(s).Do(x, tg, w); err == nil || !strings.Contains(err.Error(), "L1Loss: weight 1 is NaN") {
		t.Errorf("forward: got error %v, want one about weight 1", err)
	}
	if _, err := lossGradOp(s).Do(x, tg, w, G.NewF64(1)); err == nil || !strings.Contains(err.Error(), "L1Loss backward: weight 1 is NaN") {
		t.Errorf("backward: got error %v, want one about weight 1", err)
	}
}

// Focal losses with other alpha or gamma, and L1Loss against SmoothL1 of
// beta 0, stay distinct nodes.
func TestNewLossHashes(t *testing.T) {
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 4), G.WithName("x"))
	v := G.NewVector(g, tensor.Float64, G.WithShape(2), G.WithName("v"))
	a, _ := SigmoidFocalLoss(x, x, x, 0.25, 2)
	b, _ := SigmoidFocalLoss(x, x, x, 0.5, 2)
	c, _ := SigmoidFocalLoss(x, x, x, 0.25, 1)
	d, _ := L1Loss(x, x, x)
	e, _ := SmoothL1(x, x, x, 0)
	f, _ := GIoULoss(x, x, v)
	h, _ := BoxCxCyWHToXYXY(x)
	k, _ := BoxXYXYToCxCyWH(x)
	nodes := []*G.Node{a, b, c, d, e, f, h, k}
	for i := range nodes {
		for j := range i {
			if nodes[i] == nodes[j] || nodes[i].Hashcode() == nodes[j].Hashcode() {
				t.Errorf("nodes %d and %d were merged", j, i)
			}
		}
	}
}

// SumLosses on the host: the sum of the losses, each getting the sum's
// gradient whole; bad arguments are errors.
func TestSumLosses(t *testing.T) {
	x, tg, w := vec(0.5, -1, 2), vec(1, 0, 1), vec(1, 2, 0.5)
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		sum, grad := lossAndGrad(t, func(x, t, w *G.Node) (*G.Node, error) {
			a, err := SigmoidBCE(x, t, w)
			if err != nil {
				return nil, err
			}
			b, err := L1Loss(x, t, w)
			if err != nil {
				return nil, err
			}
			c, err := focalWith(0.25, 2)(x, t, w)
			if err != nil {
				return nil, err
			}
			return SumLosses(a, b, c)
		}, cast(t, x, dt), cast(t, tg, dt), cast(t, w, dt))
		var want float64
		wantGrad := make([]float64, 3)
		for _, f := range []lossFunc{SigmoidBCE, L1Loss, focalWith(0.25, 2)} {
			l, g := lossAndGrad(t, f, cast(t, x, dt), cast(t, tg, dt), cast(t, w, dt))
			want += l
			for i := range g {
				wantGrad[i] += g[i]
			}
		}
		tol := autograd.TolForward64
		if dt == tensor.Float32 {
			tol = autograd.TolForward32
		}
		if err := tol.Compare([]float64{sum}, []float64{want}); err != nil {
			t.Errorf("%v: sum: %v", dt, err)
		}
		if err := tol.Compare(grad, wantGrad); err != nil {
			t.Errorf("%v: gradient: %v", dt, err)
		}
	}
	g := G.NewGraph()
	s64 := G.NewScalar(g, tensor.Float64, G.WithName("s64"))
	s32 := G.NewScalar(g, tensor.Float32, G.WithName("s32"))
	v := G.NewVector(g, tensor.Float64, G.WithShape(2), G.WithName("v"))
	for _, c := range []struct {
		in   []*G.Node
		want string
	}{
		{nil, "SumLosses: no losses"},
		{[]*G.Node{s64, v}, "losses[1] must be a scalar, got shape (2)"},
		{[]*G.Node{s64, s32}, "losses[1] has dtype float32, losses[0] float64"},
		{[]*G.Node{s64, nil}, "losses[1] is nil"},
	} {
		if _, err := SumLosses(c.in...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got error %v, want one containing %q", err, c.want)
		}
	}
}
