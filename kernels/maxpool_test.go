package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// maxPoolRef is max pooling by its definition, in float64: each window's
// winner by PyTorch's rule (scanned row by row; greater, or NaN, wins),
// and the backward scattering each dy to its window's winner, windows in
// order.
func maxPoolRef(p MaxPool2dParams, x, dy []float64) (y, dx []float64) {
	y = make([]float64, p.Planes*p.OutH*p.OutW)
	dx = make([]float64, len(x))
	for pl := range p.Planes {
		for oh := range p.OutH {
			for ow := range p.OutW {
				best, arg := math.Inf(-1), -1
				for kh := range p.KH {
					for kw := range p.KW {
						ih, iw := oh*p.StrideH-p.PadH+kh, ow*p.StrideW-p.PadW+kw
						if ih < 0 || ih >= p.H || iw < 0 || iw >= p.W {
							continue
						}
						i := (pl*p.H+ih)*p.W + iw
						if arg < 0 {
							arg = i
						}
						if v := x[i]; v > best || math.IsNaN(v) {
							best, arg = v, i
						}
					}
				}
				o := (pl*p.OutH+oh)*p.OutW + ow
				y[o] = best
				dx[arg] += dy[o]
			}
		}
	}
	return y, dx
}

func maxPoolCase(planes, h, w, k, s, pad int) MaxPool2dParams {
	return MaxPool2dParams{
		Planes: planes, H: h, W: w, KH: k, KW: k, StrideH: s, StrideW: s, PadH: pad, PadW: pad,
		OutH: (h+2*pad-k)/s + 1, OutW: (w+2*pad-k)/s + 1,
	}
}

// The twins against the definition: the ResNet stem's pooling (3, 2, 1),
// FPN's P6 (1, 2, 0), overlapping and disjoint windows, kernels as large as
// the input, rectangular windows; values drawn from a few integers so that
// ties are common, with NaNs and -inf planted. Sums of dy are exact (dy
// small integers), so the comparison is exact.
func TestMaxPool2dMatchesDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 40))
	cases := []MaxPool2dParams{
		maxPoolCase(3, 9, 12, 3, 2, 1),
		maxPoolCase(2, 8, 8, 1, 2, 0),
		maxPoolCase(2, 7, 5, 1, 2, 0),
		maxPoolCase(4, 6, 7, 2, 2, 0),
		maxPoolCase(2, 6, 6, 3, 1, 1),
		maxPoolCase(1, 5, 5, 5, 1, 2),
		maxPoolCase(2, 9, 9, 4, 3, 2),
		{Planes: 3, H: 7, W: 9, KH: 3, KW: 2, StrideH: 1, StrideW: 3, PadH: 1, PadW: 1, OutH: 7, OutW: 4},
	}
	for _, p := range cases {
		for _, special := range []bool{false, true} {
			name := fmt.Sprintf("%+v/special=%t", p, special)
			x := make([]float64, p.Planes*p.H*p.W)
			for i := range x {
				x[i] = float64(rng.IntN(4))
				if special {
					switch rng.IntN(12) {
					case 0:
						x[i] = math.NaN()
					case 1, 2, 3:
						x[i] = math.Inf(-1)
					}
				}
			}
			dy := make([]float64, p.Planes*p.OutH*p.OutW)
			for i := range dy {
				dy[i] = float64(1 + rng.IntN(8))
			}
			wantY, wantDx := maxPoolRef(p, x, dy)
			t.Run("f64/"+name, func(t *testing.T) {
				y, dx := make([]float64, len(dy)), make([]float64, len(x))
				MaxPool2dForward(p, x, y)
				MaxPool2dBackward(p, x, dy, dx)
				checkExact(t, "y", y, wantY)
				checkExact(t, "dx", dx, wantDx)
			})
			t.Run("f32/"+name, func(t *testing.T) {
				x32, dy32 := to32(x), to32(dy)
				y, dx := make([]float32, len(dy)), make([]float32, len(x))
				MaxPool2dForward(p, x32, y)
				MaxPool2dBackward(p, x32, dy32, dx)
				checkExact(t, "y", from32(y), wantY)
				checkExact(t, "dx", from32(dx), wantDx)
			})
		}
	}
}

// A plane large enough to be split between goroutines gives the same bits
// as the definition.
func TestMaxPool2dParallel(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 41))
	p := maxPoolCase(3, 64, 96, 3, 2, 1)
	x := make([]float64, p.Planes*p.H*p.W)
	for i := range x {
		x[i] = rng.Float64()
	}
	dy := make([]float64, p.Planes*p.OutH*p.OutW)
	for i := range dy {
		dy[i] = rng.Float64()
	}
	wantY, wantDx := maxPoolRef(p, x, dy)
	y, dx := make([]float64, len(dy)), make([]float64, len(x))
	MaxPool2dForward(p, x, y)
	MaxPool2dBackward(p, x, dy, dx)
	checkExact(t, "y", y, wantY)
	// A pixel that wins two windows adds their dy in window order, as
	// the reference does.
	checkExact(t, "dx", dx, wantDx)
}

func checkExact(t *testing.T, what string, got, want []float64) {
	t.Helper()
	for i := range want {
		if got[i] != want[i] && !(math.IsNaN(got[i]) && math.IsNaN(want[i])) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

func to32(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, f := range v {
		out[i] = float32(f)
	}
	return out
}

func from32(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, f := range v {
		out[i] = float64(f)
	}
	return out
}
