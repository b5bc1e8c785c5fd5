package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// A line of stride Inner is computed exactly as the same line laid out as
// a row: softmax over the middle axis of [outer, n, inner] equals, bit for
// bit, softmax over the last axis of its transpose [outer, inner, n],
// forward and backward, softmax and log-softmax.
func TestSoftmaxStridedLinesAreRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 1))
	const outer, n, inner = 3, 37, 5
	x := make([]float32, outer*n*inner)
	dy := make([]float32, len(x))
	for i := range x {
		x[i] = float32(rng.Float64()*12 - 6)
		dy[i] = float32(rng.Float64()*2 - 1)
	}
	// transpose [outer, n, inner] -> [outer, inner, n]
	tr := func(v []float32) []float32 {
		out := make([]float32, len(v))
		for o := range outer {
			for k := range n {
				for i := range inner {
					out[(o*inner+i)*n+k] = v[(o*n+k)*inner+i]
				}
			}
		}
		return out
	}
	for _, log := range []bool{false, true} {
		strided := SoftmaxParams{Outer: outer, N: n, Inner: inner, Log: log}
		rows := SoftmaxParams{Outer: outer * inner, N: n, Inner: 1, Log: log}
		y, yr := make([]float32, len(x)), make([]float32, len(x))
		SoftmaxForward(strided, x, y)
		SoftmaxForward(rows, tr(x), yr)
		dx, dxr := make([]float32, len(x)), make([]float32, len(x))
		SoftmaxBackward(strided, y, dy, dx)
		SoftmaxBackward(rows, yr, tr(dy), dxr)
		for what, pair := range map[string][2][]float32{"y": {tr(y), yr}, "dx": {tr(dx), dxr}} {
			for i := range pair[0] {
				if math.Float32bits(pair[0][i]) != math.Float32bits(pair[1][i]) {
					t.Fatalf("log=%t: %s element %d: strided %g, as rows %g", log, what, i, pair[0][i], pair[1][i])
				}
			}
		}
	}
}

// Special values line by line, as PyTorch has them: an -inf among finite
// values gives 0 (log: -inf); a NaN, a +inf or a line of -inf only make
// the line NaN; a line of one element is 1 (log: 0). Lines do not mix.
func TestSoftmaxSpecialValues(t *testing.T) {
	inf, nan := math.Inf(1), math.NaN()
	x := []float64{
		math.Inf(-1), 0, // [0 1], log [-inf 0]
		nan, 1, // NaN
		math.Inf(-1), math.Inf(-1), // NaN
		inf, 1, // NaN
		3, 3, // [1/2 1/2]
	}
	want := []float64{0, 1, nan, nan, nan, nan, nan, nan, 0.5, 0.5}
	wantLog := []float64{math.Inf(-1), 0, nan, nan, nan, nan, nan, nan, -math.Ln2, -math.Ln2}
	for _, log := range []bool{false, true} {
		y := make([]float64, len(x))
		SoftmaxForward(SoftmaxParams{Outer: 5, N: 2, Inner: 1, Log: log}, x, y)
		w := want
		if log {
			w = wantLog
		}
		for i := range y {
			if !(y[i] == w[i] || math.IsNaN(y[i]) && math.IsNaN(w[i])) {
				t.Errorf("log=%t: element %d: got %v, want %v", log, i, y[i], w[i])
			}
		}
	}
	one := []float32{-7, float32(inf), 2}
	y := make([]float32, 3)
	SoftmaxForward(SoftmaxParams{Outer: 1, N: 1, Inner: 3}, one, y)
	if y[0] != 1 || !math.IsNaN(float64(y[1])) || y[2] != 1 {
		t.Errorf("lines of one element: got %v, want [1 NaN 1]", y)
	}
	SoftmaxForward(SoftmaxParams{Outer: 3, N: 1, Inner: 1, Log: true}, one, y)
	if y[0] != 0 || !math.IsNaN(float64(y[1])) || y[2] != 0 {
		t.Errorf("log-softmax of lines of one element: got %v, want [0 NaN 0]", y)
	}
}

// The partial sums are added as a warp's butterfly leaves them in lane 0,
// bit for bit, on values of many magnitudes (where the order shows).
func TestSoftmaxTreeSumOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 2))
	for range 100 {
		var lanes [softmaxLanes]float32
		for j := range lanes {
			lanes[j] = float32((rng.Float64() - 0.5) * math.Pow(10, float64(rng.IntN(12))))
		}
		// Lane j's butterfly over offsets 16, 8, 4, 2, 1: at each step it
		// adds its partner's running value to its own.
		bf := lanes
		for off := softmaxLanes / 2; off > 0; off /= 2 {
			next := bf
			for j := range bf {
				next[j] = bf[j] + bf[j^off]
			}
			bf = next
		}
		if got := treeSum(&lanes); math.Float32bits(got) != math.Float32bits(bf[0]) {
			t.Fatalf("treeSum = %v, the butterfly's lane 0 %v", got, bf[0])
		}
	}
}
