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

// attentionCase is one case of testdata/attention.json (gen_attention.py).
type attentionCase struct {
	Name       string
	E, H       int
	L, S, N    int
	Self       bool
	BatchFirst bool `json:"batch_first"`
	Inputs     [][]float64
	Mask       []bool // true: ignore the key
	Params     [][]float64
	R, Rw      []float64
	Out        []float64
	Weights    []float64
	Grads      [][]float64
}

func (c attentionCase) shapes() (q, kv []int) {
	if c.BatchFirst {
		return []int{c.N, c.L, c.E}, []int{c.N, c.S, c.E}
	}
	return []int{c.L, c.N, c.E}, []int{c.S, c.N, c.E}
}

// values returns the case's tensors in dtype dt: the inputs (x, or query,
// key and value), then the four parameters, then the mask if any.
func (c attentionCase) values(t *testing.T, dt tensor.Dtype) []*tensor.Dense {
	q, kv := c.shapes()
	var vals []*tensor.Dense
	for i, x := range c.Inputs {
		sh := q
		if i > 0 {
			sh = kv
		}
		vals = append(vals, fromFloat64s(dt, x, sh...))
	}
	e := c.E
	for i, sh := range [][]int{{3 * e, e}, {3 * e}, {e, e}, {e}} {
		vals = append(vals, fromFloat64s(dt, c.Params[i], sh...))
	}
	if c.Mask != nil {
		m, err := KeyPaddingMask(c.Mask, c.N, c.S, dt)
		if err != nil {
			t.Fatal(err)
		}
		vals = append(vals, m)
	}
	return vals
}

// build applies MultiHeadAttention to nodes laid out as values gives them.
func (c attentionCase) build(nodes G.Nodes) (out, weights *G.Node, err error) {
	q, k, v := nodes[0], nodes[0], nodes[0]
	rest := nodes[1:]
	if !c.Self {
		k, v, rest = nodes[1], nodes[2], nodes[3:]
	}
	w := AttentionWeights{InProjWeight: rest[0], InProjBias: rest[1], OutProjWeight: rest[2], OutProjBias: rest[3]}
	var mask *G.Node
	if len(rest) > 4 {
		mask = rest[4]
	}
	return MultiHeadAttention(q, k, v, w, mask, AttentionConfig{NumHeads: c.H, BatchFirst: c.BatchFirst, NeedWeights: true})
}

func TestMultiHeadAttentionMatchesPyTorch(t *testing.T) {
	var ref struct {
		Torch string
		Cases []attentionCase
	}
	loadJSON(t, "testdata/attention.json", &ref)
	if len(ref.Cases) == 0 {
		t.Fatal("no cases in testdata/attention.json")
	}
	for _, c := range ref.Cases {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			tol := autograd.TolForward64
			if dt == tensor.Float32 {
				tol = autograd.TolForward32
			}
			g := G.NewGraph()
			vals := c.values(t, dt)
			nodes := make(G.Nodes, len(vals))
			for i, v := range vals {
				nodes[i] = G.NodeFromAny(g, v, G.WithName("in"+string(rune('a'+i))))
			}
			out, weights, err := c.build(nodes)
			if err != nil {
				t.Fatalf("%s %v: %v", c.Name, dt, err)
			}
			r := G.NodeFromAny(g, fromFloat64s(dt, c.R, out.Shape()...), G.WithName("r"))
			rw := G.NodeFromAny(g, fromFloat64s(dt, c.Rw, weights.Shape()...), G.WithName("rw"))
			loss := G.Must(G.Add(G.Must(G.Sum(G.Must(G.HadamardProd(out, r)))), G.Must(G.Sum(G.Must(G.HadamardProd(weights, rw))))))
			wrt := nodes[:len(c.Grads)]
			grads, err := G.Grad(loss, wrt...)
			if err != nil {
				t.Fatalf("%s %v: %v", c.Name, dt, err)
			}
			var outV, wV G.Value
			G.Read(out, &outV)
			G.Read(weights, &wV)
			gv := make([]G.Value, len(grads))
			for i := range grads {
				G.Read(grads[i], &gv[i])
			}
			m := G.NewTapeMachine(g)
			if err := m.RunAll(); err != nil {
				t.Fatalf("%s %v: %v", c.Name, dt, err)
			}
			m.Close()
			if err := tol.Compare(toFloat64s(t, outV), c.Out); err != nil {
				t.Errorf("%s %v: out: %v", c.Name, dt, err)
			}
			if err := tol.Compare(toFloat64s(t, wV), c.Weights); err != nil {
				t.Errorf("%s %v: weights: %v", c.Name, dt, err)
			}
			for i := range grads {
				if err := tol.Compare(toFloat64s(t, gv[i]), c.Grads[i]); err != nil {
					t.Errorf("%s %v: gradient %d: %v", c.Name, dt, i, err)
				}
			}
		}
	}
}

// A float64 gradient check of the composite: self- and cross-attention,
// both layouts, a mask, with respect to the inputs and every parameter
// (the loss projects the output and the head-averaged weights).
func TestMultiHeadAttentionGradCheck(t *testing.T) {
	for i, c := range []struct {
		name       string
		self, bf   bool
		masked     bool
		e, h, l, s int
		n          int
	}{
		{"self", true, false, false, 4, 2, 3, 3, 2},
		{"cross masked", false, false, true, 4, 2, 2, 4, 2},
		{"cross batch first", false, true, false, 6, 3, 3, 2, 1},
	} {
		rng := rand.New(rand.NewPCG(uint64(i), 26))
		ac := attentionCase{E: c.e, H: c.h, L: c.l, S: c.s, N: c.n, Self: c.self, BatchFirst: c.bf}
		q, kv := ac.shapes()
		var inputs []autograd.Input
		add := func(name string, lo, hi float64, sh ...int) {
			inputs = append(inputs, autograd.Input{Name: name, Value: randTensor(rng, tensor.Float64, lo, hi, sh...)})
		}
		add("query", -1, 1, q...)
		if !c.self {
			add("key", -1, 1, kv...)
			add("value", -1, 1, kv...)
		}
		add("in_proj_weight", -0.5, 0.5, 3*c.e, c.e)
		add("in_proj_bias", -0.5, 0.5, 3*c.e)
		add("out_proj_weight", -0.5, 0.5, c.e, c.e)
		add("out_proj_bias", -0.5, 0.5, c.e)
		if c.masked {
			ignore := make([]bool, c.n*c.s)
			ignore[1], ignore[c.s+2] = true, true
			m, err := KeyPaddingMask(ignore, c.n, c.s, tensor.Float64)
			if err != nil {
				t.Fatal(err)
			}
			inputs = append(inputs, autograd.Input{Name: "mask", Value: m, NoGrad: true})
		}
		_, err := autograd.CheckGrad(func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
			out, weights, err := ac.build(in)
			if err != nil {
				return nil, err
			}
			// Both outputs in one: the weights flattened after out.
			o, err := Reshape(out, -1)
			if err != nil {
				return nil, err
			}
			w, err := Reshape(weights, -1)
			if err != nil {
				return nil, err
			}
			return Concat(0, o, w)
		}, inputs, uint64(i))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

func TestMultiHeadAttentionBadInput(t *testing.T) {
	g := G.NewGraph()
	node := func(dt tensor.Dtype, shape ...int) *G.Node {
		return G.NewTensor(g, dt, len(shape), G.WithShape(shape...))
	}
	q := node(tensor.Float32, 3, 2, 8)
	kv := node(tensor.Float32, 5, 2, 8)
	w := AttentionWeights{InProjWeight: node(tensor.Float32, 24, 8), InProjBias: node(tensor.Float32, 24), OutProjWeight: node(tensor.Float32, 8, 8), OutProjBias: node(tensor.Float32, 8)}
	cfg := AttentionConfig{NumHeads: 2}
	for _, c := range []struct {
		name string
		run  func() error
		want string
	}{
		{"heads", func() error {
			_, _, err := MultiHeadAttention(q, kv, kv, w, nil, AttentionConfig{NumHeads: 3})
			return err
		}, "NumHeads 3 must be positive and divide E = 8"},
		{"query rank", func() error {
			_, _, err := MultiHeadAttention(node(tensor.Float32, 3, 8), kv, kv, w, nil, cfg)
			return err
		}, "query must have shape [L N E], got (3, 8)"},
		{"key batch", func() error {
			_, _, err := MultiHeadAttention(q, node(tensor.Float32, 5, 3, 8), node(tensor.Float32, 5, 3, 8), w, nil, cfg)
			return err
		}, "key (5, 3, 8) must be [S N E] with query (3, 2, 8)'s N = 2 and E = 8"},
		{"value shape", func() error {
			_, _, err := MultiHeadAttention(q, kv, node(tensor.Float32, 4, 2, 8), w, nil, cfg)
			return err
		}, "key (5, 2, 8) and value (4, 2, 8) must have one shape"},
		{"in proj", func() error {
			w2 := w
			w2.InProjWeight = node(tensor.Float32, 8, 8)
			_, _, err := MultiHeadAttention(q, kv, kv, w2, nil, cfg)
			return err
		}, "InProjWeight must have shape (24, 8), got (8, 8)"},
		{"no out proj", func() error {
			w2 := w
			w2.OutProjWeight = nil
			_, _, err := MultiHeadAttention(q, kv, kv, w2, nil, cfg)
			return err
		}, "OutProjWeight is nil"},
		{"mask shape", func() error {
			_, _, err := MultiHeadAttention(q, kv, kv, w, node(tensor.Float32, 2, 3), cfg)
			return err
		}, "keyPaddingMask must have shape (2, 5), got (2, 3)"},
		{"dtype", func() error {
			_, _, err := MultiHeadAttention(q, node(tensor.Float64, 5, 2, 8), kv, w, nil, cfg)
			return err
		}, "key has dtype float64, want float32"},
	} {
		err := c.run()
		if err == nil || !strings.HasPrefix(err.Error(), "ops: MultiHeadAttention: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
		}
	}
	if _, err := KeyPaddingMask([]bool{true}, 1, 2, tensor.Float32); err == nil {
		t.Error("KeyPaddingMask of the wrong length: no error")
	}
	m, err := KeyPaddingMask([]bool{false, true}, 1, 2, tensor.Float32)
	if err != nil || m.Float32s()[0] != 0 || !math.IsInf(float64(m.Float32s()[1]), -1) {
		t.Errorf("KeyPaddingMask: %v %v", m, err)
	}
}
