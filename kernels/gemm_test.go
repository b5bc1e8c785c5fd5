package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func gemmRandSlice[T Float](rng *rand.Rand, n int) []T {
	s := make([]T, n)
	for i := range s {
		s[i] = T(rng.Float64()*2 - 1)
	}
	return s
}

// Every micro-kernel this machine runs agrees exactly with the reference
// definition, for depths around the unrolling and blocking boundaries, with
// and without accumulation into C. The inputs are multiples of 1/8, so every
// sum is exact whatever the order and fusing of the operations.
func TestMicroKernels(t *testing.T) {
	testMicroKernels[float32](t)
	testMicroKernels[float64](t)
}

func testMicroKernels[T Float](t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, mk := range microKernels[T]() {
		ref := refKernel[T](mk.mr, mk.nr)
		for _, k := range []int{0, 1, 2, 3, 7, 64, 257} {
			for _, load := range []bool{false, true} {
				a := convertTo[T](dyadicFloats(rng, k*mk.mr))
				b := convertTo[T](dyadicFloats(rng, k*mk.nr))
				ldc := mk.nr + 3
				c0 := convertTo[T](dyadicFloats(rng, mk.mr*ldc))
				got := append([]T(nil), c0...)
				want := append([]T(nil), c0...)
				mk.fn(k, a, b, got, ldc, load)
				ref.fn(k, a, b, want, ldc, load)
				for i := range got {
					if i%ldc >= mk.nr && got[i] != c0[i] {
						t.Fatalf("%T %s k=%d load=%v: wrote c[%d] outside the tile", got[0], mk.name, k, load, i)
					}
					if got[i] != want[i] {
						t.Fatalf("%T %s k=%d load=%v: c[%d] = %v, want %v", got[0], mk.name, k, load, i, got[i], want[i])
					}
				}
			}
		}
	}
}

// The vector helpers agree bit for bit with their definitions on every
// length around the unrolling, NaN and signed zeros included.
func TestVectorHelpers(t *testing.T) {
	testGateAndAdd[float32](t)
	testGateAndAdd[float64](t)
}

func testGateAndAdd[T Float](t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	nan := T(math.NaN())
	for n := range 40 {
		src := gemmRandSlice[T](rng, n)
		g := gemmRandSlice[T](rng, n)
		for i := range g {
			switch i % 7 {
			case 3:
				g[i] = nan
			case 5:
				g[i] = T(math.Copysign(0, -1))
			case 6:
				g[i] = 0
			}
		}
		got := make([]T, n)
		gate(got, src, g)
		for i := range got {
			want := src[i]
			if !(g[i] > 0) {
				want = 0
			}
			if got[i] != want {
				t.Fatalf("%T n=%d: gate[%d] = %v for src %v and gate %v, want %v", got[0], n, i, got[i], src[i], g[i], want)
			}
		}
		res := gemmRandSlice[T](rng, n)
		for _, withRes := range []bool{false, true} {
			for _, relu := range []bool{false, true} {
				r := res
				if !withRes {
					r = nil
				}
				mu, sc, sh := T(0.25), T(-1.5), T(0.125)
				got := make([]T, n)
				affine(got, g, r, mu, sc, sh, relu)
				for i := range got {
					want := T((g[i]-mu)*sc) + sh // rounded, then added: no fused multiply-add
					if withRes {
						want += r[i]
					}
					if relu && want < 0 {
						want = 0
					}
					same := got[i] == want && math.Signbit(float64(got[i])) == math.Signbit(float64(want))
					if !same && !(want != want && got[i] != got[i]) {
						t.Fatalf("%T n=%d res=%t relu=%t: affine[%d] = %v, want %v", got[0], n, withRes, relu, i, got[i], want)
					}
				}
			}
		}
		sum := append([]T(nil), src...)
		addTo(sum, g)
		for i := range sum {
			if want := src[i] + g[i]; sum[i] != want && !(want != want && sum[i] != sum[i]) {
				t.Fatalf("%T n=%d: add[%d] = %v, want %v", sum[0], n, i, sum[i], want)
			}
		}
	}
}

func BenchmarkMicroKernel(b *testing.B) {
	benchMicroKernel[float32](b)
	benchMicroKernel[float64](b)
}

func benchMicroKernel[T Float](b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, mk := range microKernels[T]() {
		var z T
		b.Run(fmt.Sprintf("dtype=%T/kernel=%s", z, mk.name), func(b *testing.B) {
			const k = 256
			a := gemmRandSlice[T](rng, k*mk.mr)
			bb := gemmRandSlice[T](rng, k*mk.nr)
			c := make([]T, mk.mr*mk.nr)
			for b.Loop() {
				mk.fn(k, a, bb, c, mk.nr, true)
			}
			b.ReportMetric(float64(2*k*mk.mr*mk.nr)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
