package kernels_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/kernels"
)

// Chunks are cut tensor by tensor from each tensor's first element; a
// tensor of no elements has none.
func TestAdamWChunks(t *testing.T) {
	c := kernels.AdamWChunkElems
	got := kernels.AdamWChunks([]int{1, 0, c, c + 1, 2*c - 1, 5})
	want := []int64{0, 2, 3, 1<<32 | 3, 4, 1<<32 | 4, 5}
	if !slices.Equal(got, want) {
		t.Errorf("AdamWChunks = %#x, want %#x", got, want)
	}
	table, chunks := kernels.AdamWTable([][kernels.AdamWTensorWords]int64{{1, 2, 3, 4, int64(c + 1), 1}, {5, 6, 7, 8, 3, 0}})
	wantTable := []int64{1, 2, 3, 4, int64(c + 1), 1, 5, 6, 7, 8, 3, 0, 0, 1 << 32, 1}
	if chunks != 3 || !slices.Equal(table, wantTable) {
		t.Errorf("AdamWTable = %v, %d chunks; want %v, 3", table, chunks, wantTable)
	}
}

// The norm against a float64 sum, at lengths around the chunks' edges and
// the threads' units: in float64 to TolForward64 (only the order of the
// sum differs), in float32 to TolForward64 too (the squares of floats are
// exact in float64, and so is most of their sum).
func TestAdamWNorm(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 2))
	c := kernels.AdamWChunkElems
	lengths := []int{1, 3, 5, 1023, 1025, c - 1, c, c + 1, 3*c + 7, 0}
	g64 := make([][]float64, len(lengths))
	g32 := make([][]float32, len(lengths))
	want := 0.0
	for i, n := range lengths {
		g64[i], g32[i] = make([]float64, n), make([]float32, n)
		for j := range n {
			v := float32(2*rng.Float64() - 1)
			g64[i][j], g32[i][j] = float64(v), v
			want += float64(v) * float64(v)
		}
	}
	want = math.Sqrt(want)
	if err := autograd.TolForward64.Compare([]float64{kernels.AdamWNorm(g64), kernels.AdamWNorm(g32)}, []float64{want, want}); err != nil {
		t.Error(err)
	}
	// The order depends on the lengths alone: the same bits run after run
	// (the chunks are summed on several goroutines).
	first := kernels.AdamWNorm(g32)
	for range 3 {
		if got := kernels.AdamWNorm(g32); got != first {
			t.Fatalf("AdamWNorm = %v, then %v", first, got)
		}
	}
	if got := kernels.AdamWNorm([][]float32{{}}); got != 0 {
		t.Errorf("the norm of nothing = %v, want 0", got)
	}
	if got := kernels.AdamWNorm([][]float32{{1, float32(math.NaN())}}); !math.IsNaN(got) {
		t.Errorf("the norm of a NaN = %v, want NaN", got)
	}
}

// clip_grad_norm_'s coefficient: capped at 1, NaN through, 0 for an
// infinite norm.
func TestAdamWClipCoef(t *testing.T) {
	for _, c := range []struct{ norm, max, want float64 }{
		{5, 1, 1 / (5 + 1e-6)},
		{0.5, 1, 1},
		{0, 1, 1},
		{math.Inf(1), 1, 0},
		{math.NaN(), 1, math.NaN()},
	} {
		got := kernels.AdamWClipCoef(c.norm, c.max)
		if got != c.want && !(math.IsNaN(got) && math.IsNaN(c.want)) {
			t.Errorf("AdamWClipCoef(%v, %v) = %v, want %v", c.norm, c.max, got, c.want)
		}
	}
}

// The update against its float64 definition (torch's AdamW), three steps
// from random moments, float32 to TolForward32 and float64 to
// TolForward64, with and without clipping; the gradient zeroed or kept.
func TestAdamWUpdate(t *testing.T) {
	testAdamWUpdate[float32](t, autograd.TolForward32)
	testAdamWUpdate[float64](t, autograd.TolForward64)
}

func testAdamWUpdate[T kernels.Float](t *testing.T, tol autograd.Tolerance) {
	rng := rand.New(rand.NewPCG(26, 3))
	const n = 1000
	const beta1, beta2, eps, lr, wd = 0.9, 0.999, 1e-8, 1e-2, 0.05
	for _, clip := range []bool{false, true} {
		p, m, v := make([]T, n), make([]T, n), make([]T, n)
		for i := range n {
			p[i], m[i], v[i] = T(2*rng.Float64()-1), T(0.1*(2*rng.Float64()-1)), T(0.01*rng.Float64())
		}
		for step := 1; step <= 3; step++ {
			g := make([]T, n)
			for i := range g {
				g[i] = T(2*rng.Float64() - 1)
			}
			coef := 0.75
			wp, wm, wv := make([]float64, n), make([]float64, n), make([]float64, n)
			for i := range n {
				gi := float64(g[i])
				if clip {
					gi *= float64(T(coef))
				}
				wm[i] = beta1*float64(m[i]) + (1-beta1)*gi
				wv[i] = beta2*float64(v[i]) + (1-beta2)*gi*gi
				bc1, bc2 := 1-math.Pow(beta1, float64(step)), 1-math.Pow(beta2, float64(step))
				wp[i] = float64(p[i])*(1-lr*wd) - lr/bc1*wm[i]/(math.Sqrt(wv[i])/math.Sqrt(bc2)+eps)
			}
			zero := step != 2
			g0 := slices.Clone(g)
			kernels.AdamWUpdate(kernels.NewAdamWScalars(beta1, beta2, eps, lr, wd, step), coef, clip, zero, p, g, m, v)
			for _, c := range []struct {
				name string
				got  []T
				want []float64
			}{{"p", p, wp}, {"m", m, wm}, {"v", v, wv}} {
				if err := tol.Compare(adamwF64s(c.got), c.want); err != nil {
					t.Errorf("%T clip=%v step %d: %s: %v", p[0], clip, step, c.name, err)
				}
			}
			wantG := g0
			if zero {
				wantG = make([]T, n)
			}
			if !slices.Equal(g, wantG) {
				t.Errorf("%T step %d: zeroGrad=%v: the gradient is %v...", p[0], step, zero, g[:3])
			}
		}
	}
}

func adamwF64s[T kernels.Float](s []T) []float64 {
	out := make([]float64, len(s))
	for i, v := range s {
		out[i] = float64(v)
	}
	return out
}
