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
	"github.com/stheno-ml/stheno/kernels/cuda"
)

func softmaxBuild(axis int, log bool) func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
	return func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
		if log {
			return LogSoftmax(in[0], axis)
		}
		return Softmax(in[0], axis)
	}
}

func softmaxName(log bool) string {
	if log {
		return "LogSoftmax"
	}
	return "Softmax"
}

// Values worked by hand: x = ln(1, 2, 5) gives probabilities (1, 2, 5)/8;
// with loss sum(y*p), the gradient is y*(p - sum p*y) for Softmax and p -
// y*sum p for LogSoftmax (y the probabilities). Axis 0 of a matrix works on
// its columns; -inf gives 0 (log: -inf) as in PyTorch, whose gradients
// there are 0 and p (torch.log_softmax: 1 for dy 1, checked by hand).
func TestSoftmaxHandValues(t *testing.T) {
	ln := math.Log
	tol := autograd.TolForward64
	for _, c := range []struct {
		name      string
		shape     []int
		axis      int
		x, p      []float64
		y, logY   []float64
		dx, logDx []float64
	}{
		{
			name: "vector", shape: []int{3}, axis: 0,
			x: []float64{0, ln(2), ln(5)}, p: []float64{1, 0, 0},
			y:    []float64{1.0 / 8, 2.0 / 8, 5.0 / 8},
			logY: []float64{ln(1.0 / 8), ln(2.0 / 8), ln(5.0 / 8)},
			// sum p*y = 1/8: dx = y*(p - 1/8); sum p = 1: dx = p - y.
			dx:    []float64{7.0 / 64, -2.0 / 64, -5.0 / 64},
			logDx: []float64{7.0 / 8, -2.0 / 8, -5.0 / 8},
		},
		{
			// The columns (0, ln 3) and (ln 3, 0): (1/4, 3/4) and (3/4, 1/4).
			name: "matrix axis 0", shape: []int{2, 2}, axis: 0,
			x: []float64{0, ln(3), ln(3), 0}, p: []float64{1, 1, 0, 2},
			y:    []float64{0.25, 0.75, 0.75, 0.25},
			logY: []float64{ln(0.25), ln(0.75), ln(0.75), ln(0.25)},
			// Column 0: p (1, 0), sum p*y = 1/4; column 1: p (1, 2), sum p*y = 5/4.
			dx:    []float64{0.25 * 0.75, 0.75 * -0.25, 0.75 * -0.25, 0.25 * 0.75},
			logDx: []float64{1 - 0.25, 1 - 0.75*3, 0 - 0.75, 2 - 0.25*3},
		},
		{
			// The same columns as rows of the transpose, axis -1.
			name: "matrix axis -1", shape: []int{2, 2}, axis: -1,
			x: []float64{0, ln(3), ln(3), 0}, p: []float64{1, 0, 1, 2},
			y:     []float64{0.25, 0.75, 0.75, 0.25},
			logY:  []float64{ln(0.25), ln(0.75), ln(0.75), ln(0.25)},
			dx:    []float64{0.25 * 0.75, 0.75 * -0.25, 0.75 * -0.25, 0.25 * 0.75},
			logDx: []float64{1 - 0.25, 0 - 0.75, 1 - 0.75*3, 2 - 0.25*3},
		},
		{
			name: "-inf", shape: []int{1, 3}, axis: 1,
			x: []float64{math.Inf(-1), 0, ln(3)}, p: []float64{1, 2, 3},
			y:    []float64{0, 0.25, 0.75},
			logY: []float64{math.Inf(-1), ln(0.25), ln(0.75)},
			// sum p*y = 2.75; sum p = 6.
			dx:    []float64{0, 0.25 * (2 - 2.75), 0.75 * (3 - 2.75)},
			logDx: []float64{1, 2 - 0.25*6, 3 - 0.75*6},
		},
	} {
		for _, log := range []bool{false, true} {
			x := dense64(c.shape, c.x...)
			wantY, wantDx := c.y, c.dx
			if log {
				wantY, wantDx = c.logY, c.logDx
			}
			got, shape, err := runGraph(t, []*tensor.Dense{x}, softmaxBuild(c.axis, log))
			if err != nil {
				t.Fatalf("%s %s: %v", softmaxName(log), c.name, err)
			}
			if !shape.Eq(tensor.Shape(c.shape)) {
				t.Errorf("%s %s: y has shape %v, want %v", softmaxName(log), c.name, shape, c.shape)
			}
			if err := tol.Compare(got, wantY); err != nil {
				t.Errorf("%s %s: y = %v: %v", softmaxName(log), c.name, got, err)
			}
			grads := gradOf(t, []*tensor.Dense{x}, dense64(c.shape, c.p...), []int{0}, softmaxBuild(c.axis, log))
			if err := tol.Compare(grads[0], wantDx); err != nil {
				t.Errorf("%s %s: dx = %v: %v", softmaxName(log), c.name, grads[0], err)
			}
		}
	}
}

// NaN, +inf and lines of -inf only make their line NaN and leave the other
// lines alone, as in PyTorch (torch.softmax([nan, 1]) = [nan, nan],
// softmax([inf, 1]) and softmax([-inf, -inf]) too).
func TestSoftmaxNaNLines(t *testing.T) {
	inf, nan := math.Inf(1), math.NaN()
	x := dense64([]int{4, 2}, nan, 1, inf, 1, -inf, -inf, 0, 0)
	for _, log := range []bool{false, true} {
		got, _, err := runGraph(t, []*tensor.Dense{x}, softmaxBuild(-1, log))
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range got[:6] {
			if !math.IsNaN(v) {
				t.Errorf("%s: element %d = %v, want NaN", softmaxName(log), i, v)
			}
		}
		want := 0.5
		if log {
			want = -math.Ln2
		}
		if got[6] != want || got[7] != want {
			t.Errorf("%s: the finite line is %v, want [%v %v]", softmaxName(log), got[6:], want, want)
		}
	}
}

func TestSoftmaxGradCheck(t *testing.T) {
	for i, c := range []struct {
		shape []int
		axis  int
	}{
		{[]int{6}, 0},
		{[]int{3, 5}, -1},
		{[]int{3, 5}, 0},
		{[]int{2, 3, 4}, 1},
		{[]int{2, 3, 4}, -3},
		{[]int{2, 3, 2, 5}, 2},
		{[]int{2, 1, 4}, 1}, // an axis of one: y = 1 (log 0), a zero gradient
	} {
		for _, log := range []bool{false, true} {
			for seed := range uint64(3) {
				rng := rand.New(rand.NewPCG(uint64(i), seed))
				inputs := []autograd.Input{{Name: "x", Value: randTensor(rng, tensor.Float64, -3, 3, c.shape...)}}
				results, err := autograd.CheckGrad(softmaxBuild(c.axis, log), inputs, seed)
				if err != nil {
					t.Errorf("%s %v axis %d, seed %d: %v", softmaxName(log), c.shape, c.axis, seed, err)
					continue
				}
				if n := c.shape[(c.axis+len(c.shape))%len(c.shape)]; n > 1 && results[0].Scale == 0 {
					t.Errorf("%s %v axis %d, seed %d: zero gradient, the check proves nothing", softmaxName(log), c.shape, c.axis, seed)
				}
			}
		}
	}
}

// softmaxCase is one case of testdata/softmax.json (gen_softmax.py).
type softmaxCase struct {
	Name  string
	Shape []int
	Axis  int
	Log   bool
	X     []float64
	Proj  []float64
	Y     []float64
	Grad  []float64
}

func TestSoftmaxMatchesPyTorch(t *testing.T) {
	var ref struct {
		Torch string
		Cases []softmaxCase
	}
	loadJSON(t, "testdata/softmax.json", &ref)
	if len(ref.Cases) == 0 {
		t.Fatal("no cases in testdata/softmax.json")
	}
	for _, c := range ref.Cases {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			tol := autograd.TolForward64
			if dt == tensor.Float32 {
				tol = autograd.TolForward32
			}
			x := fromFloat64s(dt, c.X, c.Shape...)
			build := softmaxBuild(c.Axis, c.Log)
			got, shape, err := runGraph(t, []*tensor.Dense{x}, build)
			if err != nil {
				t.Fatalf("%s %v: %v", c.Name, dt, err)
			}
			if !shape.Eq(tensor.Shape(c.Shape)) {
				t.Errorf("%s %v: y has shape %v, PyTorch's %v", c.Name, dt, shape, c.Shape)
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

// softmaxRef is softmax (log-softmax) in float64, line by line, every sum
// a plain running sum: the reference for long lines.
func softmaxRef(p kernels.SoftmaxParams, x []float64) []float64 {
	y := make([]float64, len(x))
	for o := range p.Outer {
		for i := range p.Inner {
			at := func(k int) int { return (o*p.N+k)*p.Inner + i }
			m := math.Inf(-1)
			for k := range p.N {
				m = math.Max(m, x[at(k)])
			}
			s := 0.0
			for k := range p.N {
				s += math.Exp(x[at(k)] - m)
			}
			for k := range p.N {
				j := at(k)
				if p.Log {
					y[j] = x[j] - m - math.Log(s)
				} else {
					y[j] = math.Exp(x[j]-m) / s
				}
			}
		}
	}
	return y
}

// softmaxRefBackward is its backward, dx from y and dy.
func softmaxRefBackward(p kernels.SoftmaxParams, y, dy []float64) []float64 {
	dx := make([]float64, len(y))
	for o := range p.Outer {
		for i := range p.Inner {
			at := func(k int) int { return (o*p.N+k)*p.Inner + i }
			g := 0.0
			for k := range p.N {
				if p.Log {
					g += dy[at(k)]
				} else {
					g += dy[at(k)] * y[at(k)]
				}
			}
			for k := range p.N {
				j := at(k)
				if p.Log {
					dx[j] = dy[j] - math.Exp(y[j])*g
				} else {
					dx[j] = y[j] * (dy[j] - g)
				}
			}
		}
	}
	return dx
}

// Long lines in float32 against float64, forward and backward: a row of
// 100,000 and an axis of 5,000 with inner > 1, each sum of thousands of
// terms rounded in float32. (Softmax's y are about 1/n, under TolForward32's
// Abs: log-softmax is the sharper check of the sums here.)
func TestSoftmaxLongLines(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 3))
	for _, c := range []struct {
		shape []int
		axis  int
	}{
		{[]int{2, 100000}, -1},
		{[]int{2, 5000, 3}, 1},
	} {
		for _, log := range []bool{false, true} {
			x32 := randTensor(rng, tensor.Float32, -4, 4, c.shape...)
			dy32 := randTensor(rng, tensor.Float32, -1, 1, c.shape...)
			g := G.NewGraph()
			s, err := softmaxShapeOf(softmaxName(log), G.NewTensor(g, tensor.Float32, len(c.shape), G.WithShape(c.shape...)), c.axis, log)
			if err != nil {
				t.Fatal(err)
			}
			y, err := softmaxOp(s).Do(x32)
			if err != nil {
				t.Fatal(err)
			}
			dx, err := softmaxGradOp(s).Do(y, dy32)
			if err != nil {
				t.Fatal(err)
			}
			// The reference from the float32 inputs: y for the forward, and
			// the float32 y for the backward.
			wantY := softmaxRef(s.params(), toFloat64s(t, x32))
			wantDx := softmaxRefBackward(s.params(), toFloat64s(t, y), toFloat64s(t, dy32))
			for _, cmp := range []struct {
				what      string
				got, want []float64
			}{{"y", toFloat64s(t, y), wantY}, {"dx", toFloat64s(t, dx), wantDx}} {
				if err := autograd.TolForward32.Compare(cmp.got, cmp.want); err != nil {
					t.Errorf("%s %v axis %d: %s: %v", s.op, c.shape, c.axis, cmp.what, err)
				}
				t.Logf("%s %v axis %d: %s: the worst element at %.3g of TolForward32", s.op, c.shape, c.axis, cmp.what,
					autograd.TolForward32.Worst(cmp.got, cmp.want))
			}
		}
	}
}

func TestSoftmaxBadInput(t *testing.T) {
	g := G.NewGraph()
	node := func(dt tensor.Dtype, name string, shape ...int) *G.Node {
		return G.NewTensor(g, dt, len(shape), G.WithShape(shape...), G.WithName(name))
	}
	x := node(tensor.Float32, "x", 2, 3)
	for _, c := range []struct {
		name string
		x    *G.Node
		axis int
		want string
	}{
		{"nil x", nil, 0, "x is nil"},
		{"scalar", G.NewScalar(g, tensor.Float32, G.WithName("s")), 0, "x must have one dimension or more, got a scalar"},
		{"axis too large", x, 2, "axis 2 is out of range for x of shape (2, 3): want -2 to 1"},
		{"axis too negative", x, -3, "axis -3 is out of range for x of shape (2, 3): want -2 to 1"},
		{"int x", node(tensor.Int, "xi", 2, 3), 1, "x must be float32 or float64, got int"},
		{"empty x", node(tensor.Float64, "x0", 2, 0), 0, "x must have positive sizes, got (2, 0) (dimension 1)"},
	} {
		for _, log := range []bool{false, true} {
			var err error
			if log {
				_, err = LogSoftmax(c.x, c.axis)
			} else {
				_, err = Softmax(c.x, c.axis)
			}
			prefix := "ops: " + softmaxName(log) + ": "
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), prefix) {
				t.Errorf("%s, %s: got error %v, want one starting %q and containing %q", softmaxName(log), c.name, err, prefix, c.want)
			}
		}
	}
	// Values of the wrong shape or dtype at run time.
	s, err := softmaxShapeOf("Softmax", x, -1, false)
	if err != nil {
		t.Fatal(err)
	}
	wrong := tensor.New(tensor.WithShape(3, 2), tensor.WithBacking(make([]float32, 6)))
	if _, err := softmaxOp(s).Do(wrong); err == nil || !strings.Contains(err.Error(), "ops: Softmax: x has shape (3, 2), want (2, 3)") {
		t.Errorf("wrong x shape at run time: %v", err)
	}
	f64 := tensor.New(tensor.WithShape(2, 3), tensor.WithBacking(make([]float64, 6)))
	if _, err := softmaxGradOp(s).Do(f64, f64); err == nil || !strings.Contains(err.Error(), "ops: Softmax backward: y has dtype float64, want float32") {
		t.Errorf("wrong y dtype at run time: %v", err)
	}
}

// The backward ops are not differentiable again; asking for a second
// derivative is an error, not a panic.
func TestSoftmaxSecondDerivativeIsAnError(t *testing.T) {
	for _, log := range []bool{false, true} {
		g := G.NewGraph()
		x := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 3), G.WithName("x"), G.WithInit(G.Ones()))
		y, err := softmaxBuild(-1, log)(g, G.Nodes{x})
		if err != nil {
			t.Fatal(err)
		}
		loss := G.Must(G.Sum(G.Must(G.Square(y))))
		grads, err := G.Grad(loss, x)
		if err != nil {
			t.Fatal(err)
		}
		loss2 := G.Must(G.Sum(grads[0]))
		want := "ops: " + softmaxName(log) + ": second derivatives are not implemented"
		if _, err := G.Grad(loss2, x); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: second derivative: got %v, want %q", softmaxName(log), err, want)
		}
	}
}

// Ops that compute different things hash apart (gorgonia merges nodes whose
// ops hash alike; its own SoftMax and LogSoftMax do): Softmax and
// LogSoftmax of one x in one graph give their own values.
func TestSoftmaxOpsHashApart(t *testing.T) {
	base := softmaxShape{op: "Softmax", x: tensor.Shape{2, 3}, axis: 1, dt: tensor.Float32}
	lg, ax, f64 := base, base, base
	lg.op, lg.log = "LogSoftmax", true
	ax.axis = 0
	f64.dt = tensor.Float64
	hashes := map[uint32]string{}
	for _, s := range []softmaxShape{base, lg, ax, f64} {
		for _, op := range []*specOp{softmaxOp(s), softmaxGradOp(s)} {
			h := op.Hashcode()
			if prev, ok := hashes[h]; ok {
				t.Errorf("%v hashes like %v", op, prev)
			}
			hashes[h] = op.String()
		}
	}

	x := dense64([]int{2, 2}, 0, math.Log(3), 1, 1)
	got, _, err := runGraph(t, []*tensor.Dense{x}, func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
		p, err := Softmax(in[0], -1)
		if err != nil {
			return nil, err
		}
		lp, err := LogSoftmax(in[0], -1)
		if err != nil {
			return nil, err
		}
		return G.Sub(lp, p) // log p - p
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{math.Log(0.25) - 0.25, math.Log(0.75) - 0.75, -math.Ln2 - 0.5, -math.Ln2 - 0.5}
	if err := autograd.TolForward64.Compare(got, want); err != nil {
		t.Errorf("log p - p in one graph = %v: %v", got, err)
	}
}

// The device's choice of kernel and launch by shape (softmax_device.go),
// which needs no GPU to check: the warp kernels for rows up to 1024
// float32 (512 float64), with 16-byte vectors where every row is aligned
// and as many lanes as cover a row (the lane kernels where that is a
// vector or element a lane); the block kernels for longer rows; the
// inner kernels for inner > 1.
func TestSoftmaxPlan(t *testing.T) {
	for _, c := range []struct {
		name    string
		shape   []int
		axis    int
		dt      tensor.Dtype
		aligned bool
		kernel  string // forward
		lanes   int
		grid    int
		block   [2]int
		smem    int
	}{
		{"attention", []int{2, 8, 300, 300}, -1, tensor.Float32, true, "softmax_fwd_warp_v16b_f32", 32, 1200, [2]int{128, 1}, 0},
		{"msdeform weights", []int{2, 8, 22223, 16}, -1, tensor.Float32, true, "softmax_fwd_lane_v16b_f32", 4, 11112, [2]int{128, 1}, 0},
		{"unaligned tensors", []int{2, 8, 22223, 16}, -1, tensor.Float32, false, "softmax_fwd_lane_f32", 16, 44446, [2]int{128, 1}, 0},
		{"odd rows", []int{37, 301}, -1, tensor.Float32, true, "softmax_fwd_warp_f32", 32, 10, [2]int{128, 1}, 0},
		{"n = 1", []int{5, 1}, 1, tensor.Float64, true, "softmax_fwd_lane_f64", 1, 1, [2]int{128, 1}, 0},
		{"32 vectors", []int{3, 128}, -1, tensor.Float32, true, "softmax_fwd_lane_v16b_f32", 32, 1, [2]int{128, 1}, 0},
		{"33 vectors", []int{3, 132}, -1, tensor.Float32, true, "softmax_fwd_warp_v16b_f32", 32, 1, [2]int{128, 1}, 0},
		{"float32 warp limit", []int{3, 1024}, -1, tensor.Float32, true, "softmax_fwd_warp_v16b_f32", 32, 1, [2]int{128, 1}, 0},
		{"float64 rows", []int{4, 300}, -1, tensor.Float64, true, "softmax_fwd_warp_v16b_f64", 32, 1, [2]int{128, 1}, 0},
		{"float64 long rows", []int{4, 513}, -1, tensor.Float64, true, "softmax_fwd_block_f64", 0, 4, [2]int{256, 1}, 256},
		{"long rows", []int{6, 20000}, 1, tensor.Float32, true, "softmax_fwd_block_v16b_f32", 0, 6, [2]int{512, 1}, 128},
		{"long odd rows", []int{6, 1025}, 1, tensor.Float32, true, "softmax_fwd_block_f32", 0, 6, [2]int{512, 1}, 128},
		{"channels", []int{2, 64, 50, 60}, 1, tensor.Float32, true, "softmax_fwd_inner_f32", 0, 188, [2]int{32, 16}, 2048},
		{"large inner", []int{2, 4, 300, 300}, 1, tensor.Float32, true, "softmax_fwd_inner_f32", 0, 1407, [2]int{128, 2}, 1024},
		{"small inner", []int{3, 5, 2}, 1, tensor.Float64, true, "softmax_fwd_inner_f64", 0, 1, [2]int{32, 4}, 1024},
	} {
		g := G.NewGraph()
		s, err := softmaxShapeOf("Softmax", G.NewTensor(g, c.dt, len(c.shape), G.WithShape(c.shape...)), c.axis, false)
		if err != nil {
			t.Fatal(err)
		}
		pl := softmaxPlanFor(s.params(), int(c.dt.Size()), c.aligned)
		k, err := pl.kernel(c.dt, false)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := fmt.Sprintf("%s lanes=%d grid=%d block=%dx%d smem=%d", k.Name(), pl.lanes, pl.cfg.Grid.X, pl.cfg.Block.X, pl.cfg.Block.Y, pl.cfg.SharedMem)
		want := fmt.Sprintf("%s lanes=%d grid=%d block=%dx%d smem=%d", c.kernel, c.lanes, c.grid, c.block[0], c.block[1], c.smem)
		if got != want {
			t.Errorf("%s %v axis %d: %s, want %s", c.name, c.shape, c.axis, got, want)
		}
		// The backward kernel of the same design.
		kb, err := pl.kernel(c.dt, true)
		if wantB := strings.Replace(c.kernel, "_fwd_", "_bwd_", 1); err != nil || kb.Name() != wantB {
			t.Errorf("%s: backward kernel %s (%v), want %s", c.name, kb.Name(), err, wantB)
		}
		if err := s.checkDeviceSizes("Softmax", pl); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// Every softmax launch, whatever its shape, asks for at most one value of
// shared memory per thread of its block, whose threads are within its
// kernel's __launch_bounds__ (at most SoftmaxMaxThreads): within the 48 KiB
// every GPU gives a block without opting in (sharedPerBlock), so no
// launch needs to ask the device.
func TestSoftmaxPlanSharedMemory(t *testing.T) {
	sizes := []int{1, 2, 3, 16, 31, 33, 300, 1024, 1025, 4096, 1 << 20}
	most := 0
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		elem := int(dt.Size())
		for _, outer := range []int{1, 3, 1000, 1 << 20} {
			for _, n := range sizes {
				for _, inner := range []int{1, 2, 7, 64, 1000, 1 << 16} {
					for _, aligned := range []bool{false, true} {
						p := kernels.SoftmaxParams{Outer: outer, N: n, Inner: inner}
						pl := softmaxPlanFor(p, elem, aligned)
						k, err := pl.kernel(dt, false)
						if err != nil {
							t.Fatal(err)
						}
						info, _ := cuda.Lookup(string(k))
						b := pl.cfg.Block
						threads := int(b.X * b.Y * b.Z)
						smem := int(pl.cfg.SharedMem)
						what := fmt.Sprintf("%v %+v aligned %v: %s, block %dx%d, %d bytes of shared memory", dt, p, aligned, k.Name(), b.X, b.Y, smem)
						if threads > info.MaxThreads {
							t.Errorf("%s: beyond its __launch_bounds__(%d)", what, info.MaxThreads)
						}
						if smem > threads*elem || smem > sharedPerBlock {
							t.Errorf("%s: more than a value per thread or %d bytes", what, sharedPerBlock)
						}
						most = max(most, smem)
					}
				}
			}
		}
	}
	t.Logf("at most %d bytes of shared memory per block", most)
}

// BenchmarkSoftmax times the CPU twin at the GPU benchmark's shapes
// (BenchmarkGPUSoftmax), forward and backward, float32.
func BenchmarkSoftmax(b *testing.B) {
	for _, c := range softmaxBenchCases {
		rng := rand.New(rand.NewPCG(1, 1))
		g := G.NewGraph()
		s, err := softmaxShapeOf("Softmax", G.NewTensor(g, tensor.Float32, len(c.shape), G.WithShape(c.shape...)), -1, false)
		if err != nil {
			b.Fatal(err)
		}
		x := randTensor(rng, tensor.Float32, -4, 4, c.shape...)
		dy := randTensor(rng, tensor.Float32, -1, 1, c.shape...)
		bytes := float64(4 * s.x.TotalSize())
		b.Run(fmt.Sprintf("impl=cpu/case=%s/op=softmax/pass=fwd", c.name), func(b *testing.B) {
			runCase(b, "cpu", softmaxOp(s), []*tensor.Dense{x}, 2*bytes)
		})
		b.Run(fmt.Sprintf("impl=cpu/case=%s/op=softmax/pass=bwd", c.name), func(b *testing.B) {
			runCase(b, "cpu", softmaxGradOp(s), []*tensor.Dense{x, dy}, 3*bytes)
		})
	}
}
