package ops

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
)

// attentionRun is a MultiHeadAttention graph, forward and backward, on the
// host (dev nil) or with every value on dev: query (also key and value when
// self), key, value, the four parameters and the mask (if any) as vals,
// the output's gradient r given (Backpropagate, so that no loss needs the
// host). run executes it once; out and grads read the results as float64.
type attentionRun struct {
	dev   *backend.Device
	m     G.VM
	out   *G.Node
	grads G.Nodes
	held  []*tensor.Dense // device values to free
}

func newAttentionRun(t testing.TB, dev *backend.Device, vals []*tensor.Dense, r *tensor.Dense, self bool, cfg AttentionConfig, mask bool) *attentionRun {
	t.Helper()
	ar := &attentionRun{dev: dev}
	g := G.NewGraph()
	nodes := make(G.Nodes, len(vals))
	for i, v := range vals {
		if dev != nil {
			v = toDev(t, dev, v)
			ar.held = append(ar.held, v)
		}
		nodes[i] = G.NodeFromAny(g, v, G.WithName(fmt.Sprintf("v%d", i)))
	}
	q, k, v := nodes[0], nodes[0], nodes[0]
	rest := nodes[1:]
	if !self {
		k, v, rest = nodes[1], nodes[2], nodes[3:]
	}
	w := AttentionWeights{InProjWeight: rest[0], InProjBias: rest[1], OutProjWeight: rest[2], OutProjBias: rest[3]}
	var mk *G.Node
	if mask {
		mk = rest[4]
	}
	out, _, err := MultiHeadAttention(q, k, v, w, mk, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rv := r
	if dev != nil {
		rv = toDev(t, dev, r)
		ar.held = append(ar.held, rv)
	}
	rn := G.NodeFromAny(g, rv, G.WithName("r"))
	wrt := nodes
	if mask {
		wrt = nodes[:len(nodes)-1]
	}
	if ar.grads, err = G.Backpropagate(G.Nodes{out}, G.Nodes{rn}, wrt); err != nil {
		t.Fatal(err)
	}
	ar.out = out
	if dev != nil {
		ar.m = G.NewTapeMachine(g, G.WithEngine(dev.Engine()))
	} else {
		ar.m = G.NewTapeMachine(g)
	}
	return ar
}

func (ar *attentionRun) run() error {
	ar.m.Reset()
	return ar.m.RunAll()
}

// values returns the output and the gradients as float64s: read on the
// node values (they are the tape's last, so no later op reuses their
// registers), copied from the device when there.
func (ar *attentionRun) values(t testing.TB) [][]float64 {
	t.Helper()
	var res [][]float64
	for _, n := range append(G.Nodes{ar.out}, ar.grads...) {
		if ar.dev != nil {
			res = append(res, fromDev(t, ar.dev, n.Value()))
		} else {
			res = append(res, toFloat64s(t, n.Value()))
		}
	}
	return res
}

func (ar *attentionRun) close() {
	ar.m.Close()
	for _, d := range ar.held {
		ar.dev.FreeDense(d)
	}
}

// attentionInputs draws the values newAttentionRun takes, of order 1.
func attentionInputs(rng *rand.Rand, dt tensor.Dtype, e, l, s, n int, self, batchFirst, mask bool) ([]*tensor.Dense, *tensor.Dense) {
	q, kv := []int{l, n, e}, []int{s, n, e}
	if batchFirst {
		q, kv = []int{n, l, e}, []int{n, s, e}
	}
	vals := []*tensor.Dense{randTensor(rng, dt, -1, 1, q...)}
	if !self {
		vals = append(vals, randTensor(rng, dt, -1, 1, kv...), randTensor(rng, dt, -1, 1, kv...))
	}
	vals = append(vals,
		randTensor(rng, dt, -0.3, 0.3, 3*e, e), randTensor(rng, dt, -0.3, 0.3, 3*e),
		randTensor(rng, dt, -0.3, 0.3, e, e), randTensor(rng, dt, -0.3, 0.3, e))
	if mask {
		ignore := make([]bool, n*s)
		for i := range ignore {
			ignore[i] = i%7 == 3
		}
		m, _ := KeyPaddingMask(ignore, n, s, dt)
		vals = append(vals, m)
	}
	return vals, randTensor(rng, dt, -1, 1, q...)
}

// MultiHeadAttention's graph on the GPU against the same graph on the CPU,
// output and every gradient, float32 (TolParity32) and float64
// (TolParity64): self-attention at a small DETR decoder shape,
// cross-attention with a mask, batch first. Then the op of attention.go
// alone and the head mean, forward and backward. The GPU's GEMMs multiply
// in full float32 here: in TF32 each of the chain's products would differ
// from the CPU's by TF32's rounding, which TestGPULinearParity bounds op by
// op; what this test checks is the composition.
func TestGPUMultiHeadAttentionParity(t *testing.T) {
	dev := gpu(t)
	defer dev.SetGemmMath(dev.GemmMath())
	dev.SetGemmMath(backend.GemmExact)
	rng := rand.New(rand.NewPCG(26, 9))
	for _, c := range []struct {
		name             string
		e, h, l, s, n    int
		self, bf, masked bool
	}{
		{"self_decoder_small", 64, 8, 30, 30, 2, true, false, false},
		{"cross_masked", 32, 4, 20, 45, 2, false, false, true},
		{"cross_batch_first", 32, 2, 7, 13, 3, false, true, true},
	} {
		for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
			t.Run(fmt.Sprintf("%s/%v", c.name, dt), func(t *testing.T) {
				vals, r := attentionInputs(rng, dt, c.e, c.l, c.s, c.n, c.self, c.bf, c.masked)
				cfg := AttentionConfig{NumHeads: c.h, BatchFirst: c.bf}
				host := newAttentionRun(t, nil, vals, r, c.self, cfg, c.masked)
				defer host.m.Close()
				if err := host.run(); err != nil {
					t.Fatal(err)
				}
				want := host.values(t)
				onDev := newAttentionRun(t, dev, vals, r, c.self, cfg, c.masked)
				defer onDev.close()
				if err := onDev.run(); err != nil {
					t.Fatal(err)
				}
				got := onDev.values(t)
				for i := range want {
					if err := parityTol(dt).Compare(got[i], want[i]); err != nil {
						t.Errorf("result %d (0: out, then the gradients): GPU vs CPU: %v", i, err)
					}
				}
			})
		}
	}
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		s := scaleMaskShape{p: kernels.AttentionParams{N: 2, H: 8, L: 30, S: 45, Scale: 0.125}, mask: true, dt: dt}
		m, _ := KeyPaddingMask(make([]bool, 90), 2, 45, dt)
		parity(t, dev, scaleMaskOp(s), dt, randTensor(rng, dt, -3, 3, s.scores()...), m)
		s.mask = false
		parity(t, dev, scaleMaskOp(s), dt, randTensor(rng, dt, -3, 3, s.scores()...))
		parity(t, dev, headMeanOp(s), dt, randTensor(rng, dt, 0, 1, s.scores()...))
		parity(t, dev, headMeanGradOp(s), dt, randTensor(rng, dt, -1, 1, 2, 30, 45))
	}
}

// BenchmarkGPUMultiHeadAttention times MultiHeadAttention forward and
// backward (every gradient: the input and the four parameters) on the GPU
// at DETR's decoder self-attention, 300 queries of E = 256 in 8 heads, 2
// images, float32 ([L, N, E]): a whole tape machine run per iteration,
// CUDA events around it, the median of b.N after 5 untimed runs.
// kernels/bench/anchors_attention.py times torch.nn.MultiheadAttention at
// the same shape.
func BenchmarkGPUMultiHeadAttention(b *testing.B) {
	benchAttention(b, "cuda")
}

// BenchmarkMultiHeadAttention is the same on the CPU (its graph, at the
// same shape).
func BenchmarkMultiHeadAttention(b *testing.B) {
	benchAttention(b, "cpu")
}

func benchAttention(b *testing.B, impl string) {
	const e, h, l, n = 256, 8, 300, 2
	b.Run(fmt.Sprintf("impl=%s/case=decoder_self_300x2x256_h8/pass=fwd_bwd", impl), func(b *testing.B) {
		var dev *backend.Device
		if impl == "cuda" {
			dev = gpu(b)
		}
		rng := rand.New(rand.NewPCG(1, 1))
		vals, r := attentionInputs(rng, tensor.Float32, e, l, l, n, true, false, false)
		ar := newAttentionRun(b, dev, vals, r, true, AttentionConfig{NumHeads: h}, false)
		defer func() {
			if dev != nil {
				ar.close()
			} else {
				ar.m.Close()
			}
		}()
		run := func() error {
			if dev == nil {
				return ar.run()
			}
			scope, err := dev.BeginScope()
			if err != nil {
				return err
			}
			if err := ar.run(); err != nil {
				return err
			}
			return scope.End()
		}
		for range 5 {
			if err := run(); err != nil {
				b.Fatal(err)
			}
		}
		times := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			var t time.Duration
			var err error
			if dev != nil {
				t, err = timeGPU(dev, run)
			} else {
				start := time.Now()
				err = run()
				t = time.Since(start)
			}
			if err != nil {
				b.Fatal(err)
			}
			times = append(times, t)
		}
		b.StopTimer()
		b.ReportMetric(float64(median(times).Nanoseconds())/1e6, "ms")
	})
}

// The host half of TestGPUMultiHeadAttentionParity's graphs (Backpropagate
// from a given output gradient, the mask left out of the gradients) runs
// without a GPU too, and its gradient of x matches G.Grad's of sum(out*r).
func TestMultiHeadAttentionBackpropagate(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 10))
	vals, r := attentionInputs(rng, tensor.Float64, 8, 3, 5, 2, false, true, true)
	cfg := AttentionConfig{NumHeads: 2, BatchFirst: true}
	ar := newAttentionRun(t, nil, vals, r, false, cfg, true)
	defer ar.m.Close()
	if err := ar.run(); err != nil {
		t.Fatal(err)
	}
	got := ar.values(t)
	grads := gradOf(t, vals, r, []int{0, 1, 2}, func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
		w := AttentionWeights{InProjWeight: in[3], InProjBias: in[4], OutProjWeight: in[5], OutProjBias: in[6]}
		out, _, err := MultiHeadAttention(in[0], in[1], in[2], w, in[7], cfg)
		return out, err
	})
	for i := range grads {
		if err := autograd.TolForward64.Compare(got[1+i], grads[i]); err != nil {
			t.Errorf("gradient %d: %v", i, err)
		}
	}
}
