package ops

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
)

// layoutCase is one case of testdata/layout.json (gen_layout.py).
type layoutCase struct {
	Op       string
	Shapes   [][]int
	Xs       [][]float64
	OutShape []int `json:"out_shape"`
	Proj     []float64
	Y        []float64
	Grads    [][]float64
	Perm     []int
	Axis     int
	Start    int
	End      int
	New      []int
	Idx      []int
}

func (c layoutCase) String() string {
	return fmt.Sprintf("%s %v perm=%v axis=%d range=%d:%d new=%v idx=%v", c.Op, c.Shapes, c.Perm, c.Axis, c.Start, c.End, c.New, c.Idx)
}

// build applies the case's op to the graph's inputs (the float inputs, then
// the index vector for gather).
func (c layoutCase) build(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
	switch c.Op {
	case "permute":
		return Permute(in[0], c.Perm...)
	case "concat":
		return Concat(c.Axis, in...)
	case "slice":
		return Slice(in[0], c.Axis, c.Start, c.End)
	case "reshape":
		return Reshape(in[0], c.New...)
	case "gather":
		return GatherRows(in[0], in[1])
	}
	return nil, fmt.Errorf("unknown op %q", c.Op)
}

func TestLayoutMatchesPyTorch(t *testing.T) {
	var ref struct {
		Torch string
		Cases []layoutCase
	}
	loadJSON(t, "testdata/layout.json", &ref)
	if len(ref.Cases) == 0 {
		t.Fatal("no cases in testdata/layout.json")
	}
	for _, c := range ref.Cases {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			var inputs []*tensor.Dense
			var wrt []int
			for i, x := range c.Xs {
				inputs = append(inputs, fromFloat64s(dt, x, c.Shapes[i]...))
				wrt = append(wrt, i)
			}
			if c.Op == "gather" {
				inputs = append(inputs, tensor.New(tensor.WithShape(len(c.Idx)), tensor.WithBacking(slices.Clone(c.Idx))))
			}
			got, shape, err := runGraph(t, inputs, c.build)
			if err != nil {
				t.Fatalf("%v %v: %v", c, dt, err)
			}
			if !shape.Eq(tensor.Shape(c.OutShape)) {
				t.Errorf("%v %v: shape %v, PyTorch's %v", c, dt, shape, c.OutShape)
			}
			// Moving elements is exact.
			if !slices.Equal(got, c.Y) {
				t.Errorf("%v %v: y = %v, PyTorch's %v", c, dt, got, c.Y)
			}
			grads := gradOf(t, inputs, fromFloat64s(dt, c.Proj, c.OutShape...), wrt, c.build)
			for i := range wrt {
				if err := autograd.TolForward64.Compare(grads[i], c.Grads[i]); err != nil {
					t.Errorf("%v %v: gradient %d: %v", c, dt, i, err)
				}
			}
		}
	}
}

// Transpose, Split and Detach by hand.
func TestLayoutHandValues(t *testing.T) {
	x := dense64([]int{2, 3}, 1, 2, 3, 4, 5, 6)
	got, shape, err := runGraph(t, []*tensor.Dense{x}, func(_ *G.ExprGraph, in G.Nodes) (*G.Node, error) {
		return Transpose(in[0], -1, 0)
	})
	if err != nil || !shape.Eq(tensor.Shape{3, 2}) || !slices.Equal(got, []float64{1, 4, 2, 5, 3, 6}) {
		t.Errorf("Transpose: %v %v %v", got, shape, err)
	}
	for i, want := range [][]float64{{1, 4}, {2, 3, 5, 6}} {
		got, _, err := runGraph(t, []*tensor.Dense{x}, func(_ *G.ExprGraph, in G.Nodes) (*G.Node, error) {
			parts, err := Split(in[0], 1, 1, 2)
			if err != nil {
				return nil, err
			}
			return parts[i], nil
		})
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("Split part %d: %v (%v), want %v", i, got, err, want)
		}
	}
	// Detach: the value passes, the gradient does not. loss = sum(x *
	// detach(x)) has gradient detach(x) = x, not 2x.
	grads := gradOf(t, []*tensor.Dense{x}, dense64([]int{2, 3}, 1, 1, 1, 1, 1, 1), []int{0}, func(_ *G.ExprGraph, in G.Nodes) (*G.Node, error) {
		d, err := Detach(in[0])
		if err != nil {
			return nil, err
		}
		return G.HadamardProd(in[0], d)
	})
	if !slices.Equal(grads[0], []float64{1, 2, 3, 4, 5, 6}) {
		t.Errorf("Detach: gradient %v, want x", grads[0])
	}
}

func TestLayoutGradCheck(t *testing.T) {
	for i, c := range []struct {
		name   string
		shapes [][]int
		build  func(g *G.ExprGraph, in G.Nodes) (*G.Node, error)
	}{
		{"permute heads", [][]int{{2, 3, 2, 4}}, func(_ *G.ExprGraph, in G.Nodes) (*G.Node, error) { return Permute(in[0], 0, 2, 1, 3) }},
		{"permute channels last", [][]int{{2, 3, 4}}, func(_ *G.ExprGraph, in G.Nodes) (*G.Node, error) { return Permute(in[0], 0, 2, 1) }},
		{"transpose", [][]int{{3, 5}}, func(_ *G.ExprGraph, in G.Nodes) (*G.Node, error) { return Transpose(in[0], 0, 1) }},
		{"concat", [][]int{{2, 3, 2}, {2, 1, 2}, {2, 2, 2}}, func(_ *G.ExprGraph, in G.Nodes) (*G.Node, error) { return Concat(1, in...) }},
		{"slice", [][]int{{3, 6}}, func(_ *G.ExprGraph, in G.Nodes) (*G.Node, error) { return Slice(in[0], 1, 1, 4) }},
		{"slice of slice backward", [][]int{{4, 3}}, func(_ *G.ExprGraph, in G.Nodes) (*G.Node, error) {
			// Slice's backward feeds a Slice again: the linear chain twice.
			s, err := Slice(in[0], 0, 1, 3)
			if err != nil {
				return nil, err
			}
			return Permute(s, 1, 0)
		}},
		{"reshape", [][]int{{2, 6}}, func(_ *G.ExprGraph, in G.Nodes) (*G.Node, error) { return Reshape(in[0], 3, -1) }},
		{"gather repeats", [][]int{{5, 3}}, func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
			idx := G.NodeFromAny(g, tensor.New(tensor.WithShape(4), tensor.WithBacking([]int{4, 0, 4, 2})), G.WithName("idx"))
			return GatherRows(in[0], idx)
		}},
	} {
		for seed := range uint64(2) {
			rng := rand.New(rand.NewPCG(uint64(i), seed))
			var inputs []autograd.Input
			for j, s := range c.shapes {
				inputs = append(inputs, autograd.Input{Name: fmt.Sprintf("x%d", j), Value: randTensor(rng, tensor.Float64, -3, 3, s...)})
			}
			if _, err := autograd.CheckGrad(c.build, inputs, seed); err != nil {
				t.Errorf("%s, seed %d: %v", c.name, seed, err)
			}
		}
	}
}

func TestLayoutBadInput(t *testing.T) {
	g := G.NewGraph()
	node := func(dt tensor.Dtype, name string, shape ...int) *G.Node {
		return G.NewTensor(g, dt, len(shape), G.WithShape(shape...), G.WithName(name))
	}
	x := node(tensor.Float32, "x", 2, 3, 4)
	y := node(tensor.Float64, "y", 2, 3, 4)
	z := node(tensor.Float32, "z", 2, 5, 5)
	xi := node(tensor.Int, "xi", 2, 3)
	idx := node(tensor.Int, "idx", 3)
	for _, c := range []struct {
		name string
		err  func() error
		want string
	}{
		{"permute nil", func() error { _, err := Permute(nil, 0); return err }, "ops: Permute: x is nil"},
		{"permute short", func() error { _, err := Permute(x, 0, 1); return err }, "ops: Permute: perm [0 1] must have one entry per axis of x (2, 3, 4) (3)"},
		{"permute twice", func() error { _, err := Permute(x, 0, 1, -2); return err }, "ops: Permute: perm [0 1 -2] names axis 1 twice"},
		{"permute range", func() error { _, err := Permute(x, 0, 1, 3); return err }, "ops: Permute: perm [0 1 3]: axis 3 is out of range"},
		{"permute int", func() error { _, err := Permute(xi, 1, 0); return err }, "ops: Permute: x must be float32 or float64, got int"},
		{"transpose range", func() error { _, err := Transpose(x, 0, 3); return err }, "ops: Transpose: axis 3 is out of range for x of shape (2, 3, 4): want -3 to 2"},
		{"concat none", func() error { _, err := Concat(0); return err }, "ops: Concat: no inputs"},
		{"concat dtype", func() error { _, err := Concat(0, x, y); return err }, "ops: Concat: xs[1] has dtype float64, want float32"},
		{"concat sizes", func() error { _, err := Concat(1, x, z); return err }, "ops: Concat: xs[1] has shape (2, 5, 5), want xs[0]'s sizes (2, 3, 4) except along axis 1"},
		{"concat axis", func() error { _, err := Concat(3, x, x); return err }, "ops: Concat: axis 3 is out of range for inputs of rank 3: want -3 to 2"},
		{"slice range", func() error { _, err := Slice(x, 1, 2, 2); return err }, "ops: Slice: range 2:2 of axis 1 of x (2, 3, 4): want 0 <= start < end <= 3"},
		{"slice end", func() error { _, err := Slice(x, -1, 0, 5); return err }, "want 0 <= start < end <= 4"},
		{"split sizes", func() error { _, err := Split(x, 1, 1, 1); return err }, "ops: Split: sizes [1 1] add up to 2, want x's size 3 along axis 1"},
		{"reshape count", func() error { _, err := Reshape(x, 5, 5); return err }, "ops: Reshape: x (2, 3, 4) has 24 elements, shape [5 5] holds 25"},
		{"reshape two -1", func() error { _, err := Reshape(x, -1, -1); return err }, "ops: Reshape: shape [-1 -1] has more than one -1"},
		{"reshape -1", func() error { _, err := Reshape(x, 5, -1); return err }, "not a multiple of 5"},
		{"detach nil", func() error { _, err := Detach(nil); return err }, "ops: Detach: x is nil"},
		{"gather idx dtype", func() error { _, err := GatherRows(x, node(tensor.Float32, "f", 3)); return err }, "ops: GatherRows: idx must have dtype int, got float32"},
		{"gather idx rank", func() error { _, err := GatherRows(x, xi); return err }, "ops: GatherRows: idx must have shape [K], got (2, 3)"},
		{"gather x int", func() error { _, err := GatherRows(xi, idx); return err }, "ops: GatherRows: x must be float32 or float64, got int"},
	} {
		if err := c.err(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
		}
	}
}

// Ops with different parameters hash apart.
func TestLayoutOpsHashApart(t *testing.T) {
	s1 := permuteShape{op: "Permute", x: tensor.Shape{2, 3, 4}, perm: []int{0, 2, 1}, out: tensor.Shape{2, 4, 3}, dt: tensor.Float32}
	s2 := s1
	s2.perm = []int{1, 0, 2}
	sl := sliceShape{x: tensor.Shape{4, 3}, axis: 0, start: 0, end: 2, dt: tensor.Float32}
	sl2 := sl
	sl2.start, sl2.end = 2, 4
	hashes := map[uint32]string{}
	for _, op := range []*specOp{permuteOp(s1), permuteOp(s2), sliceOp(sl), sliceOp(sl2), sliceGradOp(sl), sliceGradOp(sl2)} {
		h := op.Hashcode()
		if prev, ok := hashes[h]; ok {
			t.Errorf("%v hashes like %v", op, prev)
		}
		hashes[h] = op.String()
	}
}

// layoutBenchCases are the shapes BenchmarkGPULayout times (DETR's):
// attention's heads [B, L, H, d] -> [B, H, L, d] on the encoder's tokens;
// a feature map flattened to tokens, [N, C, H, W] -> [N, H*W, C]; the
// concatenation of four levels' tokens; selecting 300 of 20,000 rows of
// 256. kernels/bench/anchors_layout.py times PyTorch on the same.
var layoutBenchPermutes = []struct {
	name  string
	shape []int
	perm  []int
}{
	{"heads_2x20000x8x32", []int{2, 20000, 8, 32}, []int{0, 2, 1, 3}},
	{"tokens_2x256x100x150", []int{2, 256, 100, 150}, []int{0, 2, 3, 1}},
}

// layoutBenchLevels are the token counts of Deformable-DETR's four levels
// for an 800x1066 image (strides 8 to 64).
var layoutBenchLevels = []int{100 * 134, 50 * 67, 25 * 34, 13 * 17}
