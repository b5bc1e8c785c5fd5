package autograd

import (
	"fmt"
	"hash"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func randDense(rng *rand.Rand, shape ...int) *tensor.Dense {
	d := make([]float64, tensor.Shape(shape).TotalSize())
	for i := range d {
		d[i] = rng.Float64()*2 - 1
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(d))
}

// A graph of gorgonia's own ops passes.
func TestGradCheckGorgoniaOps(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	build := func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
		p, err := G.Mul(in[0], in[1]) // matrix product
		if err != nil {
			return nil, err
		}
		return G.Tanh(p)
	}
	inputs := []Input{{Name: "a", Value: randDense(rng, 3, 4)}, {Name: "b", Value: randDense(rng, 4, 2)}}
	results, err := CheckGrad(build, inputs, 7)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 2 {
		t.Fatalf("got %d results, want 2", len(results))
	}
	for _, r := range results {
		if r.Scale == 0 {
			t.Errorf("%s: zero gradient, the check proves nothing", r.Name)
		}
		t.Log(r)
	}
}

// scaleOp computes y = 3x but claims dy/dx = 3*factor, so a gradient check
// must catch any factor other than 1.
type scaleOp struct{ factor float64 }

func (op scaleOp) Arity() int { return 1 }
func (op scaleOp) Type() hm.Type {
	t := G.TensorType{Dims: 1, Of: hm.TypeVariable('a')}
	return hm.NewFnType(t, t)
}
func (op scaleOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	return in[0].(tensor.Shape).Clone(), nil
}
func (op scaleOp) Do(v ...G.Value) (G.Value, error) {
	out := v[0].(*tensor.Dense).Clone().(*tensor.Dense)
	for i, x := range out.Float64s() {
		out.Float64s()[i] = 3 * x
	}
	return out, nil
}
func (op scaleOp) ReturnsPtr() bool      { return false }
func (op scaleOp) CallsExtern() bool     { return false }
func (op scaleOp) OverwritesInput() int  { return -1 }
func (op scaleOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op scaleOp) Hashcode() uint32      { return uint32(op.factor * 1000) }
func (op scaleOp) String() string        { return fmt.Sprintf("scale%v", op.factor) }
func (op scaleOp) DiffWRT(int) []bool    { return []bool{true} }
func (op scaleOp) SymDiff(in G.Nodes, out, grad *G.Node) (G.Nodes, error) {
	c := G.NewConstant(3 * op.factor)
	d, err := G.Mul(grad, c)
	return G.Nodes{d}, err
}

func TestGradCheckCatchesWrongGradient(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, factor := range []float64{1, 1.001, 0.5, -1} {
		build := func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
			return G.ApplyOp(scaleOp{factor}, in[0])
		}
		_, err := CheckGrad(build, []Input{{Name: "x", Value: randDense(rng, 5)}}, 1)
		if factor == 1 && err != nil {
			t.Errorf("factor %v: correct gradient rejected: %v", factor, err)
		}
		if factor != 1 && (err == nil || !strings.Contains(err.Error(), "x:")) {
			t.Errorf("factor %v: wrong gradient accepted (err %v)", factor, err)
		}
	}
}

func TestGradCheckRejectsFloat32(t *testing.T) {
	x := tensor.New(tensor.WithShape(2), tensor.WithBacking([]float32{1, 2}))
	_, err := GradCheck(func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) { return in[0], nil },
		[]Input{{Name: "x", Value: x}}, 1)
	if err == nil {
		t.Fatal("float32 input accepted")
	}
}

func TestUnpack(t *testing.T) {
	g := G.NewGraph()
	packed := G.NodeFromAny(g, tensor.New(tensor.WithShape(7), tensor.WithBacking([]float64{0, 1, 2, 3, 4, 5, 6})))
	parts, err := Unpack(packed, tensor.Shape{2, 2}, tensor.Shape{3})
	if err != nil {
		t.Fatal(err)
	}
	var a, b G.Value
	G.Read(parts[0], &a)
	G.Read(parts[1], &b)
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(a.Data(), a.Shape(), b.Data(), b.Shape()); got != "[0 1 2 3] (2, 2) [4 5 6] (3)" {
		t.Errorf("got %s", got)
	}
	if _, err := Unpack(packed, tensor.Shape{2, 2}); err == nil {
		t.Error("Unpack accepted shapes that do not cover the vector")
	}
}

func TestUnpackAt(t *testing.T) {
	g := G.NewGraph()
	packed := G.NodeFromAny(g, tensor.New(tensor.WithShape(7), tensor.WithBacking([]float64{0, 1, 2, 3, 4, 5, 6})))
	parts, err := UnpackAt(packed, 2, tensor.Shape{2}, tensor.Shape{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	var a, b G.Value
	G.Read(parts[0], &a)
	G.Read(parts[1], &b)
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(a.Data(), a.Shape(), b.Data(), b.Shape()); got != "[2 3] (2) [4 5] (1, 2)" {
		t.Errorf("got %s", got)
	}
	for _, off := range []int{-1, 4} {
		if _, err := UnpackAt(packed, off, tensor.Shape{2}, tensor.Shape{2}); err == nil {
			t.Errorf("UnpackAt accepted offset %d for 4 of 7 elements", off)
		}
	}
}

func TestToleranceCompare(t *testing.T) {
	tol := Tolerance{Abs: 1e-6, Rel: 1e-3}
	cases := []struct {
		got, want []float64
		ok        bool
	}{
		{[]float64{1, 2}, []float64{1, 2}, true},
		{[]float64{1.0009}, []float64{1}, true},
		{[]float64{1.0011}, []float64{1}, false},
		{[]float64{5e-7}, []float64{0}, true},
		{[]float64{2e-6}, []float64{0}, false},
		{[]float64{nan()}, []float64{1}, false},
		{[]float64{1}, []float64{nan()}, false},
		{[]float64{1, 2}, []float64{1}, false},
	}
	for _, c := range cases {
		if err := tol.Compare(c.got, c.want); (err == nil) != c.ok {
			t.Errorf("Compare(%v, %v) = %v, want ok=%v", c.got, c.want, err, c.ok)
		}
	}
}

func TestToleranceWorst(t *testing.T) {
	tol := Tolerance{Abs: 1e-6, Rel: 1e-3}
	for _, c := range []struct {
		got, want []float64
		worst     float64
	}{
		{[]float64{1, 2}, []float64{1, 2}, 0},
		// |diff| 5e-7 on 0: half of Abs; on 2 the bound is 2.001e-3, and
		// |diff| 4.002e-3 is twice it.
		{[]float64{5e-7, 2.004002}, []float64{0, 2}, 2},
		// NaNs are Compare's business, not a margin.
		{[]float64{5e-7, nan()}, []float64{0, 1}, 0.5},
	} {
		if got := tol.Worst(c.got, c.want); math.Abs(got-c.worst) > 1e-9 {
			t.Errorf("Worst(%v, %v) = %v, want %v", c.got, c.want, got, c.worst)
		}
	}
}

func TestTolTF32For(t *testing.T) {
	if got := TolTF32For(0.5); got != TolTF32 {
		t.Errorf("TolTF32For(0.5) = %+v, want TolTF32 %+v", got, TolTF32)
	}
	if got := TolTF32For(50); math.Abs(got.Abs-10*TolTF32.Abs) > 1e-15 || got.Rel != TolTF32.Rel {
		t.Errorf("TolTF32For(50) = %+v, want Abs 10x TolTF32's and its Rel", got)
	}
}

func nan() float64 { var z float64; return z / z }
