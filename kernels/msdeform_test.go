package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// msDeformTestParams returns params for levels of the given sizes.
func msDeformTestParams(n, lq, m, d, p int, sizes ...[2]int) MSDeformAttnParams {
	ps := MSDeformAttnParams{N: n, M: m, D: d, Lq: lq, L: len(sizes), P: p}
	for _, s := range sizes {
		ps.H = append(ps.H, s[0])
		ps.W = append(ps.W, s[1])
		ps.Start = append(ps.Start, ps.S)
		ps.S += s[0] * s[1]
	}
	return ps
}

type msDeformBuffers struct {
	value, loc, weight, gradOut    []float64
	out, gradValue, gradLoc, gradW []float64
}

func newMSDeformBuffers(rng *rand.Rand, p MSDeformAttnParams) *msDeformBuffers {
	uniform := func(lo, hi float64, n int) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = lo + (hi-lo)*rng.Float64()
		}
		return v
	}
	nw := p.N * p.Lq * p.M * p.L * p.P
	return &msDeformBuffers{
		value:     uniform(-1, 1, p.N*p.S*p.M*p.D),
		loc:       uniform(-0.2, 1.2, 2*nw),
		weight:    uniform(-1, 1, nw),
		gradOut:   uniform(-1, 1, p.N*p.Lq*p.M*p.D),
		out:       make([]float64, p.N*p.Lq*p.M*p.D),
		gradValue: make([]float64, p.N*p.S*p.M*p.D),
		gradLoc:   make([]float64, 2*nw),
		gradW:     make([]float64, nw),
	}
}

func (b *msDeformBuffers) run(p MSDeformAttnParams) {
	MSDeformAttnForward(p, b.value, b.loc, b.weight, b.out)
	MSDeformAttnBackward(p, b.value, b.loc, b.weight, b.gradOut, b.gradValue, b.gradLoc, b.gradW)
}

// The split of work over goroutines does not change a single bit of either
// pass: no two goroutines add to the same element, and each element receives
// its terms in the same order.
func TestMSDeformAttnDeterministic(t *testing.T) {
	p := msDeformTestParams(2, 200, 4, 16, 4, [2]int{16, 16}, [2]int{8, 8}, [2]int{3, 5})
	rng := rand.New(rand.NewPCG(1, 2))
	ref := newMSDeformBuffers(rng, p)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	ref.run(p)
	for _, procs := range []int{2, 3, 8} {
		runtime.GOMAXPROCS(procs)
		b := *ref
		b.out = make([]float64, len(ref.out))
		b.gradValue = make([]float64, len(ref.gradValue))
		b.gradLoc = make([]float64, len(ref.gradLoc))
		b.gradW = make([]float64, len(ref.gradW))
		b.run(p)
		for _, c := range []struct {
			name      string
			got, want []float64
		}{{"out", b.out, ref.out}, {"gradValue", b.gradValue, ref.gradValue}, {"gradLoc", b.gradLoc, ref.gradLoc}, {"gradWeight", b.gradW, ref.gradW}} {
			for i := range c.want {
				if math.Float64bits(c.got[i]) != math.Float64bits(c.want[i]) {
					t.Fatalf("GOMAXPROCS=%d: %s[%d] = %v, want %v as with one goroutine", procs, c.name, i, c.got[i], c.want[i])
				}
			}
		}
	}
}

// Points of different queries are independent: a NaN in one query's output
// gradient must not reach the location or weight gradients of another, even
// where their points share pixels and some corners fall outside the map.
func TestMSDeformAttnBackwardIsolatesQueries(t *testing.T) {
	p := msDeformTestParams(1, 2, 2, 3, 3, [2]int{3, 4}, [2]int{1, 2})
	for _, procs := range []int{1, 4} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			rng := rand.New(rand.NewPCG(3, 4))
			clean := newMSDeformBuffers(rng, p)
			clean.run(p)
			poisoned := *clean
			poisoned.gradOut = append([]float64(nil), clean.gradOut...)
			poisoned.gradValue = make([]float64, len(clean.gradValue))
			poisoned.gradLoc = make([]float64, len(clean.gradLoc))
			poisoned.gradW = make([]float64, len(clean.gradW))
			perQuery := p.M * p.D
			for i := range perQuery { // query 0
				poisoned.gradOut[i] = math.NaN()
			}
			poisoned.run(p)
			perQueryPts := p.M * p.L * p.P
			for i := perQueryPts; i < 2*perQueryPts; i++ { // query 1
				if poisoned.gradW[i] != clean.gradW[i] || poisoned.gradLoc[2*i] != clean.gradLoc[2*i] || poisoned.gradLoc[2*i+1] != clean.gradLoc[2*i+1] {
					t.Fatalf("point %d of query 1: gradients (%v, %v, %v), want (%v, %v, %v) as without the NaN",
						i, poisoned.gradW[i], poisoned.gradLoc[2*i], poisoned.gradLoc[2*i+1], clean.gradW[i], clean.gradLoc[2*i], clean.gradLoc[2*i+1])
				}
			}
		})
	}
}
