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

func reduceBuild(op string, axes []int, keep bool) func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
	return func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
		if op == "mean" {
			return Mean(in[0], axes, keep)
		}
		return Sum(in[0], axes, keep)
	}
}

func TestReduceMatchesPyTorch(t *testing.T) {
	ref := loadPointwiseRef(t)
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		tol := forwardTol(dt)
		for _, c := range ref.Reduce {
			x := fromFloat64s(dt, c.X, c.Shape...)
			build := reduceBuild(c.Op, c.Axes, c.Keepdim)
			got, shape, err := runGraph(t, []*tensor.Dense{x}, build)
			if err != nil {
				t.Fatalf("%s %v: %v", c.Name, dt, err)
			}
			if !shape.Eq(tensor.Shape(c.YShape)) {
				t.Errorf("%s %v: y has shape %v, PyTorch's %v", c.Name, dt, shape, c.YShape)
			}
			if err := tol.Compare(got, c.Y); err != nil {
				t.Errorf("%s %v: y: %v", c.Name, dt, err)
			}
			var grad []float64
			if len(c.YShape) == 0 {
				grad = scalarGradOf(t, x, c.Proj[0], build)
			} else {
				grad = gradOf(t, []*tensor.Dense{x}, fromFloat64s(dt, c.Proj, c.YShape...), []int{0}, build)[0]
			}
			if err := tol.Compare(grad, c.Grad); err != nil {
				t.Errorf("%s %v: gradient: %v", c.Name, dt, err)
			}
		}
	}
}

// scalarGradOf is gradOf for a graph whose output is a scalar: the
// gradient of loss = y * proj with respect to x.
func scalarGradOf(t *testing.T, x *tensor.Dense, proj float64, build func(g *G.ExprGraph, in G.Nodes) (*G.Node, error)) []float64 {
	t.Helper()
	g := G.NewGraph()
	xn := G.NodeFromAny(g, x, G.WithName("x"))
	y, err := build(g, G.Nodes{xn})
	if err != nil {
		t.Fatal(err)
	}
	var p *G.Node
	if x.Dtype() == tensor.Float32 {
		p = G.NewScalar(g, tensor.Float32, G.WithValue(float32(proj)), G.WithName("proj"))
	} else {
		p = G.NewScalar(g, tensor.Float64, G.WithValue(proj), G.WithName("proj"))
	}
	grads, err := G.Grad(G.Must(G.Mul(y, p)), xn)
	if err != nil {
		t.Fatal(err)
	}
	var v G.Value
	G.Read(grads[0], &v)
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		t.Fatal(err)
	}
	return toFloat64s(t, v)
}

// Hand values: sums and means of a [2, 3] matrix over each axis and both,
// with and without kept dims, and a sum over every axis to a scalar whose
// gradient (a host scalar from gorgonia) fills x.
func TestReduceHandValues(t *testing.T) {
	x := dense64([]int{2, 3}, 1, 2, 3, 4, 5, 6)
	for _, c := range []struct {
		op    string
		axes  []int
		keep  bool
		shape tensor.Shape
		want  []float64
	}{
		{"sum", []int{0}, false, tensor.Shape{3}, []float64{5, 7, 9}},
		{"sum", []int{-1}, true, tensor.Shape{2, 1}, []float64{6, 15}},
		{"sum", nil, true, tensor.Shape{1, 1}, []float64{21}},
		{"sum", []int{1, 0}, false, tensor.Shape{}, []float64{21}},
		{"mean", []int{1}, false, tensor.Shape{2}, []float64{2, 5}},
		{"mean", []int{0}, true, tensor.Shape{1, 3}, []float64{2.5, 3.5, 4.5}},
		{"mean", nil, false, tensor.Shape{}, []float64{3.5}},
	} {
		got, shape, err := runGraph(t, []*tensor.Dense{x}, reduceBuild(c.op, c.axes, c.keep))
		if err != nil {
			t.Fatalf("%s %v: %v", c.op, c.axes, err)
		}
		if !shape.Eq(c.shape) || autograd.TolForward64.Compare(got, c.want) != nil {
			t.Errorf("%s %v keep=%t: %v %v, want %v %v", c.op, c.axes, c.keep, shape, got, c.shape, c.want)
		}
	}
	// d mean(x) / dx = 1/6 everywhere, through gorgonia's scalar gradient.
	g := G.NewGraph()
	xn := G.NodeFromAny(g, x, G.WithName("x"))
	grads, err := G.Grad(G.Must(Mean(xn, nil, false)), xn)
	if err != nil {
		t.Fatal(err)
	}
	var v G.Value
	G.Read(grads[0], &v)
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		t.Fatal(err)
	}
	if want := filled(6, 1.0/6); autograd.TolForward64.Compare(toFloat64s(t, v), want) != nil {
		t.Errorf("d mean / dx = %v, want %v", v, want)
	}
}

// A NaN makes its sum NaN, +inf with -inf too; the other sums stay.
func TestReduceSpecialValues(t *testing.T) {
	inf, nan := math.Inf(1), math.NaN()
	x := dense64([]int{4, 3}, 1, nan, 2, inf, -inf, 0, inf, 1, 1, 1, 2, 3)
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		got, _, err := runGraph(t, []*tensor.Dense{cast(t, x, dt)}, reduceBuild("sum", []int{1}, false))
		if err != nil {
			t.Fatal(err)
		}
		if want := []float64{nan, nan, inf, 6}; autograd.TolForward64.Compare(got, want) != nil {
			t.Errorf("%v: %v, want %v", dt, got, want)
		}
	}
}

func TestReduceGradCheck(t *testing.T) {
	for i, c := range []struct {
		shape []int
		axes  []int
		keep  bool
	}{
		{[]int{6}, nil, false},
		{[]int{3, 5}, []int{1}, false},
		{[]int{3, 5}, []int{0}, true},
		{[]int{2, 3, 4}, []int{0, 2}, false},
		{[]int{2, 3, 4, 5}, []int{-3, -1}, true},
		{[]int{2, 1, 4}, []int{1}, false},
	} {
		for _, op := range []string{"sum", "mean"} {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			inputs := []autograd.Input{{Name: "x", Value: randTensor(rng, tensor.Float64, -2, 2, c.shape...)}}
			if _, err := autograd.CheckGrad(reduceBuild(op, c.axes, c.keep), inputs, uint64(i)); err != nil {
				t.Errorf("%s %v axes %v: %v", op, c.shape, c.axes, err)
			}
		}
	}
}

func TestReduceBadInput(t *testing.T) {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float32, 2, G.WithShape(2, 3), G.WithName("x"))
	for _, c := range []struct {
		name string
		x    *G.Node
		axes []int
		want string
	}{
		{"nil", nil, nil, "ops: Sum: x is nil"},
		{"scalar", G.NewScalar(g, tensor.Float32, G.WithName("s")), nil, "ops: Sum: x must have a dim or more, got a scalar"},
		{"int", G.NewTensor(g, tensor.Int, 1, G.WithShape(3), G.WithName("i")), nil, "ops: Sum: x must be float32 or float64, got int"},
		{"axis", x, []int{2}, "ops: Sum: axis 2 is out of range for x of shape (2, 3): want -2 to 1"},
		{"negative axis", x, []int{-3}, "ops: Sum: axis -3 is out of range for x of shape (2, 3): want -2 to 1"},
		{"repeated", x, []int{1, -1}, "ops: Sum: axis 1 appears twice in [1 -1]"},
	} {
		if _, err := Sum(c.x, c.axes, false); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got error %v, want one containing %q", c.name, err, c.want)
		}
	}
	if _, err := Mean(x, []int{5}, true); err == nil || !strings.HasPrefix(err.Error(), "ops: Mean: axis 5") {
		t.Errorf("Mean's bad axis: %v", err)
	}
}

// Long sums in float32 against float64, at detector shapes cut down: rows
// of 100,000 (parts and a second pass), DETR's bias gradient (the column
// sums of 8,000 rows of 256), attention's rows of 300, the channel sums of
// a feature map over N, H and W; every result within TolForward32 of the
// float64 sum of the same float32 inputs. The terms are positive: a sum
// that cancels to near zero has an error relative to the sum of its
// terms' sizes, which TolForward32's bound, relative to the result, does
// not describe.
func TestReduceLongSums(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 9))
	for _, c := range []struct {
		shape []int
		axes  []int
	}{
		{[]int{2, 100000}, []int{-1}},
		{[]int{2, 4000, 256}, []int{0, 1}},
		{[]int{2, 8, 30, 300}, []int{-1}},
		{[]int{2, 64, 30, 40}, []int{0, 2, 3}},
		{[]int{3, 5000, 7}, []int{1}},
	} {
		x := randTensor(rng, tensor.Float32, 0, 1, c.shape...)
		got, _, err := runGraph(t, []*tensor.Dense{x}, reduceBuild("sum", c.axes, false))
		if err != nil {
			t.Fatal(err)
		}
		want := naiveSum(toFloat64s(t, x), c.shape, c.axes)
		if err := autograd.TolForward32.Compare(got, want); err != nil {
			t.Errorf("%v axes %v: %v", c.shape, c.axes, err)
		}
		t.Logf("%v axes %v: the worst element at %.3g of TolForward32", c.shape, c.axes, autograd.TolForward32.Worst(got, want))
	}
}

// naiveSum sums x of shape over axes in float64, in index order.
func naiveSum(x []float64, shape, axes []int) []float64 {
	summed := make([]bool, len(shape))
	for _, a := range axes {
		summed[(a+len(shape))%len(shape)] = true
	}
	outShape := []int{}
	for i, d := range shape {
		if !summed[i] {
			outShape = append(outShape, d)
		}
	}
	out := make([]float64, tensor.Shape(outShape).TotalSize())
	idx := make([]int, len(shape))
	for _, v := range x {
		o := 0
		for i, d := range shape {
			if !summed[i] {
				o = o*d + idx[i]
			}
		}
		out[o] += v
		for i := len(shape) - 1; i >= 0; i-- {
			if idx[i]++; idx[i] < shape[i] {
				break
			}
			idx[i] = 0
		}
	}
	return out
}

// The plans of detector shapes (kernels.NewReducePlan): which passes, and
// their geometry. No GPU needed.
func TestReducePlans(t *testing.T) {
	for _, c := range []struct {
		shape []int
		axes  []int
		dt    tensor.Dtype
		want  []kernels.ReducePass
	}{
		// DETR's bias gradient: the column sums of 40,000 rows of 256.
		{[]int{2, 20000, 256}, []int{0, 1}, tensor.Float32, []kernels.ReducePass{
			{Cols: true, Outer: 1, R: 40000, Inner: 256, Chunk: 313, Parts: 128, BX: 32, Alpha: 1},
			{Cols: true, Outer: 1, R: 128, Inner: 256, Chunk: 128, Parts: 1, BX: 32, Alpha: 1},
		}},
		// Attention's rows.
		{[]int{2, 8, 300, 300}, []int{-1}, tensor.Float32, []kernels.ReducePass{
			{Warp: true, Outer: 4800, R: 300, Inner: 1, Chunk: 300, Parts: 1, Lanes: 32, Alpha: 1},
		}},
		// One long row: parts, then a warp pass over them.
		{[]int{2, 20000, 256}, nil, tensor.Float32, []kernels.ReducePass{
			{Outer: 1, R: 10240000, Inner: 1, Chunk: 10000, Parts: 1024, Alpha: 1},
			{Warp: true, Outer: 1, R: 1024, Inner: 1, Chunk: 1024, Parts: 1, Lanes: 32, Alpha: 1},
		}},
		// Channel sums of a feature map: the rows of H*W (a block each,
		// rows of 3000 being enough for one part), then the columns over N.
		{[]int{2, 256, 50, 60}, []int{0, 2, 3}, tensor.Float64, []kernels.ReducePass{
			{Outer: 512, R: 3000, Inner: 1, Chunk: 3000, Parts: 1, Alpha: 1},
			{Cols: true, Outer: 1, R: 2, Inner: 256, Chunk: 2, Parts: 1, BX: 32, Alpha: 1},
		}},
	} {
		summed := make([]bool, len(c.shape))
		for i := range summed {
			summed[i] = len(c.axes) == 0
		}
		for _, a := range c.axes {
			summed[(a+len(c.shape))%len(c.shape)] = true
		}
		plan := kernels.NewReducePlan(c.shape, summed, int(c.dt.Size()), 1)
		if len(plan.Passes) != len(c.want) {
			t.Errorf("%v axes %v: %+v, want %+v", c.shape, c.axes, plan.Passes, c.want)
			continue
		}
		for i, p := range plan.Passes {
			if p != c.want[i] {
				t.Errorf("%v axes %v: pass %d is %+v, want %+v", c.shape, c.axes, i, p, c.want[i])
			}
		}
	}
}

// The backward op of a sum (dy broadcast back over x, times 1/count for
// a mean) is differentiable in its turn: its gradient sums back over the
// broadcast dims, checked by finite differences.
func TestReduceBackwardGradCheck(t *testing.T) {
	for i, c := range []struct {
		shape []int
		axes  []int
		keep  bool
		mean  bool
	}{
		{[]int{2, 3, 4}, []int{1}, false, false},
		{[]int{2, 3, 4}, []int{0, 2}, true, true},
	} {
		summed := make([]bool, len(c.shape))
		out := tensor.Shape{}
		count := 1
		for j, d := range c.shape {
			for _, a := range c.axes {
				summed[j] = summed[j] || a == j
			}
			if summed[j] {
				count *= d
				if c.keep {
					out = append(out, 1)
				}
			} else {
				out = append(out, d)
			}
		}
		alpha := 1.0
		if c.mean {
			alpha = 1 / float64(count)
		}
		s := newReduceShape("Sum", tensor.Shape(c.shape), summed, out, alpha, tensor.Float64)
		rng := rand.New(rand.NewPCG(uint64(i), 11))
		inputs := []autograd.Input{{Name: "dy", Value: randTensor(rng, tensor.Float64, -1, 1, out...)}}
		if _, err := autograd.CheckGrad(func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
			return s.broadcastBack(nil, in[0])
		}, inputs, uint64(i)); err != nil {
			t.Errorf("%v axes %v keep=%t mean=%t: %v", c.shape, c.axes, c.keep, c.mean, err)
		}
	}
}
