package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// The twins against the definition, on planes [N*C, H, W]: y[p, i, j] =
// x[p, i/f, j/f], and dx[p, i, j] the sum of dy over y's pixels that copy
// x's (i, j). dy holds multiples of 1/8, so every sum is exact and the
// comparison too; rows enough for several goroutines.
func TestUpsampleNearestMatchesDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, 10))
	for _, c := range []struct{ planes, h, w, f int }{
		{1, 1, 1, 1}, {2, 3, 5, 1}, {2, 3, 5, 2}, {3, 1, 1, 2}, {6, 40, 33, 2}, {2, 7, 9, 3}, {1, 5, 4, 4},
	} {
		t.Run(fmt.Sprintf("%+v", c), func(t *testing.T) {
			p := UpsampleParams{Rows: c.planes * c.h, W: c.w, Factor: c.f}
			oh, ow := c.h*c.f, c.w*c.f
			x := make([]float64, c.planes*c.h*c.w)
			dy := make([]float64, c.planes*oh*ow)
			for i := range x {
				x[i] = float64(rng.IntN(65)-32) / 8
			}
			for i := range dy {
				dy[i] = float64(rng.IntN(65)-32) / 8
			}
			y, dx := make([]float64, len(dy)), make([]float64, len(x))
			UpsampleNearestForward(p, x, y)
			UpsampleNearestBackward(p, dy, dx)
			want := make([]float64, len(x))
			for pl := range c.planes {
				for i := range oh {
					for j := range ow {
						o, src := (pl*oh+i)*ow+j, (pl*c.h+i/c.f)*c.w+j/c.f
						if y[o] != x[src] {
							t.Fatalf("y[%d, %d, %d] = %v, want x[%d, %d, %d] = %v", pl, i, j, y[o], pl, i/c.f, j/c.f, x[src])
						}
						want[src] += dy[o]
					}
				}
			}
			for i := range dx {
				if dx[i] != want[i] {
					t.Fatalf("dx[%d] = %v, want %v", i, dx[i], want[i])
				}
			}
		})
	}
}

// The backward's order, which upsample.cu's kernels share: each row of a
// block summed from zero, the row sums added from zero. In float32 another
// order changes bits; a block of -0 sums to +0.
func TestUpsampleNearestBackwardOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, 11))
	p := UpsampleParams{Rows: 5, W: 3, Factor: 3}
	ow := p.W * p.Factor
	dy := make([]float32, p.Rows*p.Factor*ow)
	for i := range dy {
		dy[i] = float32(rng.Float64()*2 - 1)
	}
	dx := make([]float32, p.Rows*p.W)
	UpsampleNearestBackward(p, dy, dx)
	for row := range p.Rows {
		for col := range p.W {
			var sum float32
			for r := range p.Factor {
				var rs float32
				for c := range p.Factor {
					rs += dy[(row*p.Factor+r)*ow+col*p.Factor+c]
				}
				sum += rs
			}
			if got := dx[row*p.W+col]; math.Float32bits(got) != math.Float32bits(sum) {
				t.Errorf("dx[%d, %d] = %v, want %v", row, col, got, sum)
			}
		}
	}
	for i := range dy {
		dy[i] = float32(math.Copysign(0, -1))
	}
	UpsampleNearestBackward(p, dy, dx)
	for i, v := range dx {
		if math.Float32bits(v) != 0 {
			t.Fatalf("dx[%d] = %v of a block of -0, want +0", i, v)
		}
	}
}
