package ops

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

// randTensor returns a tensor of dtype dt with elements uniform in [lo, hi).
func randTensor(rng *rand.Rand, dt tensor.Dtype, lo, hi float64, shape ...int) *tensor.Dense {
	n := tensor.Shape(shape).TotalSize()
	v := make([]float64, n)
	for i := range v {
		v[i] = lo + (hi-lo)*rng.Float64()
	}
	return fromFloat64s(dt, v, shape...)
}

// fromFloat64s builds a tensor of dtype dt holding v.
func fromFloat64s(dt tensor.Dtype, v []float64, shape ...int) *tensor.Dense {
	switch dt {
	case tensor.Float32:
		f := make([]float32, len(v))
		for i, x := range v {
			f[i] = float32(x)
		}
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(f))
	case tensor.Float64:
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(append([]float64(nil), v...)))
	}
	panic(fmt.Sprintf("unsupported dtype %v", dt))
}

// toFloat64s returns the elements of a float32 or float64 value as float64.
func toFloat64s(t testing.TB, v G.Value) []float64 {
	t.Helper()
	if v.Shape().TotalSize() == 0 && v.Shape().Dims() > 0 {
		return []float64{} // Data panics on an empty tensor
	}
	switch d := backend.HostData(v).(type) {
	case []float64:
		return append([]float64(nil), d...)
	case []float32:
		f := make([]float64, len(d))
		for i, x := range d {
			f[i] = float64(x)
		}
		return f
	case float64:
		return []float64{d}
	case float32:
		return []float64{float64(d)}
	}
	t.Fatalf("unexpected value %T", v)
	return nil
}

// cast returns d converted to dtype dt.
func cast(t testing.TB, d *tensor.Dense, dt tensor.Dtype) *tensor.Dense {
	return fromFloat64s(dt, toFloat64s(t, d), d.Shape()...)
}

// runGraph builds a graph with one input node per tensor, applies build and
// runs it, returning the output's elements as float64 (and its shape), or the
// error of building or running.
func runGraph(t testing.TB, inputs []*tensor.Dense, build func(g *G.ExprGraph, in G.Nodes) (*G.Node, error)) ([]float64, tensor.Shape, error) {
	t.Helper()
	g := G.NewGraph()
	nodes := make(G.Nodes, len(inputs))
	for i, d := range inputs {
		nodes[i] = G.NodeFromAny(g, d, G.WithName(fmt.Sprintf("in%d", i)))
	}
	out, err := build(g, nodes)
	if err != nil {
		return nil, nil, err
	}
	var v G.Value
	G.Read(out, &v)
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		return nil, nil, err
	}
	return toFloat64s(t, v), v.Shape().Clone(), nil
}

// loadJSON decodes a reference file written by a generator script in
// testdata/ (each script says how to regenerate its file).
func loadJSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decoding %s: %v", path, err)
	}
}

// gradOf builds a graph with one input node per tensor, computes
// loss = sum(build(...) ⊙ proj) and returns the gradients of loss with respect
// to the inputs whose index is in wrt, as float64.
func gradOf(t testing.TB, inputs []*tensor.Dense, proj *tensor.Dense, wrt []int, build func(g *G.ExprGraph, in G.Nodes) (*G.Node, error)) [][]float64 {
	t.Helper()
	g := G.NewGraph()
	nodes := make(G.Nodes, len(inputs))
	for i, d := range inputs {
		nodes[i] = G.NodeFromAny(g, d, G.WithName(fmt.Sprintf("in%d", i)))
	}
	out, err := build(g, nodes)
	if err != nil {
		t.Fatal(err)
	}
	p := G.NodeFromAny(g, proj, G.WithName("proj"))
	prod, err := G.HadamardProd(out, p)
	if err != nil {
		t.Fatal(err)
	}
	loss, err := G.Sum(prod)
	if err != nil {
		t.Fatal(err)
	}
	var wrtNodes G.Nodes
	for _, i := range wrt {
		wrtNodes = append(wrtNodes, nodes[i])
	}
	grads, err := G.Grad(loss, wrtNodes...)
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]G.Value, len(grads))
	for i := range grads {
		G.Read(grads[i], &vals[i])
	}
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		t.Fatal(err)
	}
	res := make([][]float64, len(vals))
	for i, v := range vals {
		res[i] = toFloat64s(t, v)
	}
	return res
}

// adamLosses differentiates loss with respect to learnables, runs steps
// Adam steps of rate lr on the graph and returns the loss before each step.
func adamLosses(t *testing.T, g *G.ExprGraph, loss *G.Node, learnables G.Nodes, lr float64, steps int) []float64 {
	t.Helper()
	if _, err := G.Grad(loss, learnables...); err != nil {
		t.Fatal(err)
	}
	var lv G.Value
	G.Read(loss, &lv)
	m := G.NewTapeMachine(g, G.BindDualValues(learnables...))
	defer m.Close()
	solver := G.NewAdamSolver(G.WithLearnRate(lr))
	var losses []float64
	for range steps {
		if err := m.RunAll(); err != nil {
			t.Fatal(err)
		}
		losses = append(losses, toFloat64s(t, lv)[0])
		if err := solver.Step(G.NodesToValueGrads(learnables)); err != nil {
			t.Fatal(err)
		}
		m.Reset()
	}
	return losses
}
