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
)

func maxPoolBuild(cfg MaxPool2dConfig) func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
	return func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) { return MaxPool2d(in[0], cfg) }
}

// One plane of 4x4 worked by hand, with the ResNet stem's pooling (kernel
// 3, stride 2, padding 1: a 2x2 output) and with disjoint 2x2 windows.
//
//	x = 1 5 5 0     stem windows (rows x cols of x):
//	    2 0 3 3     (0,0): rows 0-1, cols 0-1: 5 at (0,1)
//	    7 1 3 6     (0,1): rows 0-1, cols 1-3: 5 at (0,1), the first of a tie with (0,2)
//	    7 4 NaN 2   (1,0): rows 1-3, cols 0-1: 7 at (2,0), the first of a tie with (3,0)
//	                (1,1): rows 1-3, cols 1-3: NaN at (3,2)
//
// With the loss sum(y * [1 2; 4 8]), x(0,1) gets 1 + 2, x(2,0) 4 and the
// NaN 8. The 2x2 windows: 5 at (0,1), 5 at (0,2), 7 at (2,0) (a tie with
// (3,0)) and NaN at (3,2), getting 1, 2, 4 and 8.
func TestMaxPool2dHandValues(t *testing.T) {
	nan := math.NaN()
	x := dense64([]int{1, 1, 4, 4}, 1, 5, 5, 0, 2, 0, 3, 3, 7, 1, 3, 6, 7, 4, nan, 2)
	p := dense64([]int{1, 1, 2, 2}, 1, 2, 4, 8)
	for _, c := range []struct {
		name   string
		cfg    MaxPool2dConfig
		y, dx  []float64
		yShape tensor.Shape
	}{
		{"stem", MaxPool2dConfig{Kernel: [2]int{3, 3}, Stride: [2]int{2, 2}, Pad: [2]int{1, 1}},
			[]float64{5, 5, 7, nan}, []float64{0, 3, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 8, 0}, tensor.Shape{1, 1, 2, 2}},
		{"2x2", MaxPool2dConfig{Kernel: [2]int{2, 2}},
			[]float64{5, 5, 7, nan}, []float64{0, 1, 2, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 8, 0}, tensor.Shape{1, 1, 2, 2}},
	} {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			in := []*tensor.Dense{cast(t, x, dt)}
			got, shape, err := runGraph(t, in, maxPoolBuild(c.cfg))
			if err != nil {
				t.Fatal(err)
			}
			if !shape.Eq(c.yShape) {
				t.Errorf("%s %v: y has shape %v, want %v", c.name, dt, shape, c.yShape)
			}
			if !sameFloats(got, c.y) {
				t.Errorf("%s %v: y = %v, want %v", c.name, dt, got, c.y)
			}
			dx := gradOf(t, in, cast(t, p, dt), []int{0}, maxPoolBuild(c.cfg))[0]
			if !sameFloats(dx, c.dx) {
				t.Errorf("%s %v: dx = %v, want %v", c.name, dt, dx, c.dx)
			}
		}
	}
}

// sameFloats says whether a and b are equal element by element, NaN
// equal to NaN.
func sameFloats(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] && !(math.IsNaN(a[i]) && math.IsNaN(b[i])) {
			return false
		}
	}
	return true
}

// Random inputs without ties (max pooling is differentiable there): the
// stem's pooling, P6's, overlapping and rectangular windows, padding.
func TestMaxPool2dGradCheck(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 50))
	for i, c := range []struct {
		x   []int
		cfg MaxPool2dConfig
	}{
		{[]int{2, 3, 9, 10}, MaxPool2dConfig{Kernel: [2]int{3, 3}, Stride: [2]int{2, 2}, Pad: [2]int{1, 1}}},
		{[]int{1, 4, 7, 9}, MaxPool2dConfig{Kernel: [2]int{1, 1}, Stride: [2]int{2, 2}}},
		{[]int{2, 2, 6, 6}, MaxPool2dConfig{Kernel: [2]int{3, 3}, Stride: [2]int{1, 1}, Pad: [2]int{1, 1}}},
		{[]int{1, 2, 7, 9}, MaxPool2dConfig{Kernel: [2]int{3, 2}, Stride: [2]int{1, 3}, Pad: [2]int{1, 1}}},
		{[]int{1, 3, 8, 8}, MaxPool2dConfig{Kernel: [2]int{2, 2}}},
	} {
		for seed := range uint64(3) {
			name := fmt.Sprintf("x%v %+v seed=%d", c.x, c.cfg, seed)
			// A permutation of spread values: no ties, and every
			// difference far above the finite-difference step.
			n := 1
			for _, d := range c.x {
				n *= d
			}
			v := make([]float64, n)
			for j, k := range rng.Perm(n) {
				v[j] = float64(k)/float64(n) - 0.5
			}
			x := fromFloat64s(tensor.Float64, v, c.x...)
			results, err := autograd.CheckGrad(maxPoolBuild(c.cfg), []autograd.Input{{Name: "x", Value: x}}, uint64(i)*10+seed)
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

// jsonSpecials decodes a list of numbers in which null is NaN and "-inf"
// is -Inf.
type jsonSpecials []float64

func (f *jsonSpecials) UnmarshalJSON(b []byte) error {
	var v []any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*f = make([]float64, len(v))
	for i, e := range v {
		switch e := e.(type) {
		case nil:
			(*f)[i] = math.NaN()
		case float64:
			(*f)[i] = e
		case string:
			if e != "-inf" {
				return fmt.Errorf("element %d: %q: want a number, null or \"-inf\"", i, e)
			}
			(*f)[i] = math.Inf(-1)
		default:
			return fmt.Errorf("element %d: %v: want a number, null or \"-inf\"", i, e)
		}
	}
	return nil
}

// maxPoolCase is one case of testdata/maxpool.json (gen_maxpool.py).
type maxPoolCase struct {
	Name                  string
	Shape, Kernel, Stride []int
	Padding, Yshape       []int
	X, Proj, Y, Dx        jsonSpecials
}

// PyTorch's values, exactly: every input and every sum of projections is
// exact in float32 too.
func TestMaxPool2dMatchesPyTorch(t *testing.T) {
	var ref struct {
		Torch string
		Cases []maxPoolCase
	}
	loadJSON(t, "testdata/maxpool.json", &ref)
	if len(ref.Cases) == 0 {
		t.Fatal("no cases in testdata/maxpool.json")
	}
	for _, c := range ref.Cases {
		cfg := MaxPool2dConfig{Kernel: [2]int(c.Kernel), Stride: [2]int(c.Stride), Pad: [2]int(c.Padding)}
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			in := []*tensor.Dense{fromFloat64s(dt, c.X, c.Shape...)}
			got, shape, err := runGraph(t, in, maxPoolBuild(cfg))
			if err != nil {
				t.Fatalf("%s %v: %v", c.Name, dt, err)
			}
			if !shape.Eq(tensor.Shape(c.Yshape)) {
				t.Errorf("%s %v: y has shape %v, PyTorch's %v", c.Name, dt, shape, c.Yshape)
			}
			if !sameFloats(got, c.Y) {
				t.Errorf("%s %v: y = %v, PyTorch's %v", c.Name, dt, got, c.Y)
			}
			dx := gradOf(t, in, fromFloat64s(dt, c.Proj, c.Yshape...), []int{0}, maxPoolBuild(cfg))[0]
			if !sameFloats(dx, c.Dx) {
				t.Errorf("%s %v: dx = %v, PyTorch's %v", c.Name, dt, dx, c.Dx)
			}
		}
	}
}

func TestMaxPool2dBadInput(t *testing.T) {
	g := G.NewGraph()
	node := func(dt tensor.Dtype, name string, shape ...int) *G.Node {
		return G.NewTensor(g, dt, len(shape), G.WithShape(shape...), G.WithName(name))
	}
	x := node(tensor.Float32, "x", 2, 3, 8, 8)
	stem := MaxPool2dConfig{Kernel: [2]int{3, 3}, Stride: [2]int{2, 2}, Pad: [2]int{1, 1}}
	with := func(f func(*MaxPool2dConfig)) MaxPool2dConfig { c := stem; f(&c); return c }
	for _, c := range []struct {
		name string
		x    *G.Node
		cfg  MaxPool2dConfig
		want string
	}{
		{"nil x", nil, stem, "x is nil, want shape [N C H W]"},
		{"3-D x", node(tensor.Float32, "x3", 3, 8, 8), stem, "x must have shape [N C H W], got (3, 8, 8)"},
		{"int x", node(tensor.Int, "xi", 1, 1, 4, 4), stem, "x must be float32 or float64, got int"},
		{"empty x", node(tensor.Float32, "x0", 1, 0, 4, 4), stem, "x must have positive sizes, got (1, 0, 4, 4) (dimension 1)"},
		{"zero kernel", x, MaxPool2dConfig{}, "Kernel must be positive, got [0 0]"},
		{"negative stride", x, with(func(c *MaxPool2dConfig) { c.Stride[1] = -1 }), "Stride must be positive (or 0 for Kernel), got [2 -1]"},
		{"pad over half", x, with(func(c *MaxPool2dConfig) { c.Pad = [2]int{2, 1} }), "Pad must be between 0 and half of Kernel [3 3], got [2 1]"},
		{"negative pad", x, with(func(c *MaxPool2dConfig) { c.Pad = [2]int{0, -1} }), "Pad must be between 0 and half of Kernel [3 3], got [0 -1]"},
		{"dilation", x, with(func(c *MaxPool2dConfig) { c.Dilation = [2]int{2, 2} }), "Dilation [2 2] is not implemented: want [1 1] (or zero)"},
		{"ceil mode", x, with(func(c *MaxPool2dConfig) { c.CeilMode = true }), "CeilMode is not implemented: want false"},
		{"kernel too large", node(tensor.Float32, "xs", 1, 1, 2, 9), MaxPool2dConfig{Kernel: [2]int{5, 5}}, "Kernel [5 5] is larger than x (1, 1, 2, 9) padded by [0 0] (2x9)"},
	} {
		_, err := MaxPool2d(c.x, c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "ops: MaxPool2d: ") {
			t.Errorf("%s: got error %v, want one containing %q", c.name, err, c.want)
		}
	}
	// What the checks let through: the stem, P6, dilation 1, stride 0.
	for _, cfg := range []MaxPool2dConfig{
		stem,
		{Kernel: [2]int{1, 1}, Stride: [2]int{2, 2}},
		with(func(c *MaxPool2dConfig) { c.Dilation = [2]int{1, 1} }),
		{Kernel: [2]int{2, 2}, Pad: [2]int{1, 1}},
	} {
		if _, err := MaxPool2d(x, cfg); err != nil {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
	// Stride 0 is Kernel: y is 4x4 for 2x2 windows on 8x8.
	y, err := MaxPool2d(x, MaxPool2dConfig{Kernel: [2]int{2, 2}})
	if err != nil {
		t.Fatal(err)
	}
	if !y.Shape().Eq(tensor.Shape{2, 3, 4, 4}) {
		t.Errorf("kernel 2, stride 0: y has shape %v, want (2, 3, 4, 4)", y.Shape())
	}
}

// The backward op says that second derivatives are not implemented, and
// ops of different configs hash apart.
func TestMaxPool2dOps(t *testing.T) {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float64, 4, G.WithShape(1, 2, 6, 6), G.WithName("x"))
	hashes := map[uint32]string{}
	for _, cfg := range []MaxPool2dConfig{
		{Kernel: [2]int{3, 3}, Stride: [2]int{2, 2}, Pad: [2]int{1, 1}},
		{Kernel: [2]int{3, 3}, Stride: [2]int{2, 2}},
		{Kernel: [2]int{3, 3}, Stride: [2]int{1, 2}, Pad: [2]int{1, 1}},
		{Kernel: [2]int{2, 3}, Stride: [2]int{2, 2}, Pad: [2]int{1, 1}},
	} {
		s, err := maxPoolShapeOf(x, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range []*specOp{maxPoolOp(s), maxPoolGradOp(s)} {
			h := op.Hashcode()
			if prev, ok := hashes[h]; ok {
				t.Errorf("%v hashes like %v", op, prev)
			}
			hashes[h] = op.String()
		}
		dy := G.NewTensor(g, tensor.Float64, 4, G.WithShape(s.y...))
		_, err = maxPoolGradOp(s).SymDiff(G.Nodes{x, dy}, nil, x)
		if err == nil || !strings.Contains(err.Error(), "ops: MaxPool2d: second derivatives are not implemented") {
			t.Errorf("second derivative: got %v", err)
		}
	}
}

// The backward kernel ops picks: the tiled one for the ResNet stem's
// pooling and 3x3 windows of stride 1, the per-pixel one for FPN P6's
// windows of one pixel and for windows too many for a tile.
func TestMaxPool2dBackwardKernel(t *testing.T) {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float32, 4, G.WithShape(1, 2, 30, 37), G.WithName("x"))
	for _, c := range []struct {
		cfg   MaxPool2dConfig
		tiled bool
	}{
		{MaxPool2dConfig{Kernel: [2]int{3, 3}, Stride: [2]int{2, 2}, Pad: [2]int{1, 1}}, true},
		{MaxPool2dConfig{Kernel: [2]int{1, 1}, Stride: [2]int{2, 2}}, false},
		{MaxPool2dConfig{Kernel: [2]int{2, 2}}, true},
		{MaxPool2dConfig{Kernel: [2]int{3, 3}, Stride: [2]int{1, 1}, Pad: [2]int{1, 1}}, true},
		{MaxPool2dConfig{Kernel: [2]int{12, 12}, Stride: [2]int{1, 1}, Pad: [2]int{6, 6}}, false},
	} {
		s, err := maxPoolShapeOf(x, c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if s.tiled() != c.tiled {
			t.Errorf("%+v: tiled() = %t, want %t", c.cfg, s.tiled(), c.tiled)
		}
	}
}
