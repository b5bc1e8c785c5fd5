package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// benchRoIs draws k boxes the way TARGETS.md's RoIAlign cases do: log-uniform
// side 16..512 px, aspect ratio e^[-0.7,0.7], clipped to the image.
func benchRoIs[T Float](rng *rand.Rand, k, n int, imgH, imgW float64) []T {
	rois := make([]T, 0, 5*k)
	for range k {
		side := math.Exp(math.Log(16) + rng.Float64()*(math.Log(512)-math.Log(16)))
		aspect := math.Exp(-0.7 + 1.4*rng.Float64())
		w, h := side*math.Sqrt(aspect), side/math.Sqrt(aspect)
		cx, cy := rng.Float64()*imgW, rng.Float64()*imgH
		x1, x2 := math.Max(cx-w/2, 0), math.Min(cx+w/2, imgW)
		y1, y2 := math.Max(cy-h/2, 0), math.Min(cy+h/2, imgH)
		rois = append(rois, T(rng.IntN(n)), T(x1), T(y1), T(x2), T(y2))
	}
	return rois
}

func randFloats[T Float](rng *rand.Rand, n int) []T {
	s := make([]T, n)
	for i := range s {
		s[i] = T(rng.Float64()*2 - 1)
	}
	return s
}

// The backward scatter is the adjoint of the forward gather:
// <RoIAlign(x), g> = <x, RoIAlignBackward(g)> for any x and g.
func TestRoIAlignBackwardIsAdjoint(t *testing.T) {
	for _, sampling := range []int{0, 2} {
		for _, aligned := range []bool{false, true} {
			rng := rand.New(rand.NewPCG(9, uint64(sampling)))
			p := RoIAlignParams{N: 2, C: 3, H: 17, W: 23, K: 40, PooledH: 3, PooledW: 4,
				SpatialScale: 0.25, SamplingRatio: sampling, Aligned: aligned}
			x := randFloats[float64](rng, p.N*p.C*p.H*p.W)
			rois := benchRoIs[float64](rng, p.K, p.N, 4*float64(p.H), 4*float64(p.W))
			g := randFloats[float64](rng, p.K*p.C*p.PooledH*p.PooledW)
			out := make([]float64, len(g))
			gx := make([]float64, len(x))
			if err := RoIAlignForward(p, x, rois, out); err != nil {
				t.Fatal(err)
			}
			if err := RoIAlignBackward(p, rois, g, gx); err != nil {
				t.Fatal(err)
			}
			var lhs, rhs float64
			for i := range out {
				lhs += out[i] * g[i]
			}
			for i := range x {
				rhs += x[i] * gx[i]
			}
			if math.Abs(lhs-rhs) > 1e-10*math.Max(1, math.Abs(lhs)) || lhs == 0 {
				t.Errorf("sampling=%d aligned=%t: <Ax,g> = %v, <x,A'g> = %v", sampling, aligned, lhs, rhs)
			}
		}
	}
}

type roiBenchCase struct {
	name       string
	n, c, h, w int
	k          int
	pooled     int
	scale      float64
	sampling   int
}

// CPU-sized versions of TARGETS.md's cases (a quarter of the channels).
var roiBenchCases = []roiBenchCase{
	{"box_head_P2", 2, 64, 200, 336, 1024, 7, 0.25, 2},
	{"mask_head_P2", 2, 64, 200, 336, 256, 14, 0.25, 2},
	{"box_head_P2_adaptive", 2, 64, 200, 336, 1024, 7, 0.25, 0},
}

func BenchmarkRoIAlign(b *testing.B) {
	for _, c := range roiBenchCases {
		rng := rand.New(rand.NewPCG(1, 1))
		p := RoIAlignParams{N: c.n, C: c.c, H: c.h, W: c.w, K: c.k, PooledH: c.pooled, PooledW: c.pooled,
			SpatialScale: c.scale, SamplingRatio: c.sampling, Aligned: true}
		x := randFloats[float32](rng, p.N*p.C*p.H*p.W)
		rois := benchRoIs[float32](rng, p.K, p.N, float64(p.H)/c.scale, float64(p.W)/c.scale)
		out := make([]float32, p.K*p.C*p.PooledH*p.PooledW)
		gx := make([]float32, len(x))
		for _, pass := range []string{"fwd", "bwd"} {
			b.Run(fmt.Sprintf("impl=cpu/dtype=float32/case=%s/pass=%s", c.name, pass), func(b *testing.B) {
				for b.Loop() {
					var err error
					if pass == "fwd" {
						err = RoIAlignForward(p, x, rois, out)
					} else {
						err = RoIAlignBackward(p, rois, out, gx)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(p.K)*float64(b.N)/b.Elapsed().Seconds(), "rois/s")
			})
		}
	}
}
