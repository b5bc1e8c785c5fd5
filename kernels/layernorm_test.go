package kernels

import (
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
)

// The geometry depends on the shape and the dtype alone: a warp per row
// for rows of whole 16-byte chunks up to 4 KiB, else a block per row.
func TestNewLayerNormParams(t *testing.T) {
	for _, c := range []struct {
		rows, c, size int
		want          LayerNormParams
	}{
		// DETR's encoder tokens, float32: 8 rows a block, 1024 blocks.
		{44446, 256, 4, LayerNormParams{Vec: 4, Warp: true, Threads: 32, Blocks: 1024}},
		{600, 256, 4, LayerNormParams{Vec: 4, Warp: true, Threads: 32, Blocks: 75}},
		{600, 256, 8, LayerNormParams{Vec: 2, Warp: true, Threads: 32, Blocks: 75}},
		{13, 1024, 4, LayerNormParams{Vec: 4, Warp: true, Threads: 32, Blocks: 2}},
		// float64 rows of 1024 are 8 KiB: a block per row.
		{13, 1024, 8, LayerNormParams{Vec: 2, Threads: 128, Blocks: 13}},
		{13, 1032, 4, LayerNormParams{Vec: 4, Threads: 96, Blocks: 13}},
		// Not whole chunks: single elements, a block per row.
		{13, 1030, 4, LayerNormParams{Vec: 1, Threads: 288, Blocks: 13}},
		{13, 3, 4, LayerNormParams{Vec: 1, Threads: 32, Blocks: 13}},
		{5000, 1, 8, LayerNormParams{Vec: 1, Threads: 32, Blocks: 1024}},
		{2, 1 << 20, 4, LayerNormParams{Vec: 4, Threads: 1024, Blocks: 2}},
	} {
		c.want.Rows, c.want.C, c.want.Eps = c.rows, c.c, 1e-5
		if got := NewLayerNormParams(c.rows, c.c, c.size, 1e-5); got != c.want {
			t.Errorf("NewLayerNormParams(%d, %d, %d bytes) = %+v, want %+v", c.rows, c.c, c.size, got, c.want)
		}
	}
}

// lnInputs draws x (rows of order 1 with different means and spreads), dy,
// gamma and beta.
func lnInputs[T Float](rng *rand.Rand, rows, c int) (x, dy, gamma, beta []T) {
	x, dy, gamma, beta = make([]T, rows*c), make([]T, rows*c), make([]T, c), make([]T, c)
	for r := range rows {
		off, scale := rng.Float64()-0.5, 0.5+0.5*rng.Float64()
		for j := range c {
			x[r*c+j] = T(off + scale*(2*rng.Float64()-1))
		}
	}
	for i := range dy {
		dy[i] = T(2*rng.Float64() - 1)
	}
	for j := range c {
		gamma[j], beta[j] = T(0.5+rng.Float64()), T(2*rng.Float64()-1)
	}
	return x, dy, gamma, beta
}

type lnOutputs[T Float] struct{ y, dx, dgamma, dbeta []T }

func lnRun[T Float](p LayerNormParams, x, dy, gamma, beta []T) lnOutputs[T] {
	n := p.Rows * p.C
	o := lnOutputs[T]{y: make([]T, n), dx: make([]T, n), dgamma: make([]T, p.C), dbeta: make([]T, p.C)}
	LayerNormForward(p, x, gamma, beta, o.y)
	LayerNormBackwardDX(p, x, gamma, dy, o.dx)
	LayerNormBackwardParams(p, x, dy, o.dgamma, o.dbeta)
	return o
}

// equalBits reports whether a and b hold the same values, NaN where the
// other has NaN.
func equalBits[T Float](a, b []T) bool {
	return slices.EqualFunc(a, b, func(u, v T) bool { return u == v || u != u && v != v })
}

// The warp kernels add a row as a block kernel of one warp with the same
// units does (lane l: units l, l+32, ...; then the butterfly), so y and dx
// do not depend on which kernel a row of whole chunks takes.
func TestLayerNormWarpAddsAsOneWarpBlock(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 1))
	for _, c := range []int{32, 256, 1000} {
		x, dy, gamma, beta := lnInputs[float32](rng, 9, c)
		p := NewLayerNormParams(9, c, 4, 1e-5)
		if !p.Warp {
			t.Fatalf("c=%d: want the warp geometry, got %+v", c, p)
		}
		q := p
		q.Warp = false
		a, b := lnRun(p, x, dy, gamma, beta), lnRun(q, x, dy, gamma, beta)
		if !equalBits(a.y, b.y) || !equalBits(a.dx, b.dx) {
			t.Errorf("c=%d: the warp and the one-warp block geometries give different y or dx", c)
		}
	}
}

// Every sum's order is fixed by the geometry, not by how parallelFor
// splits the rows: the results are the same bits on one goroutine and on
// several.
func TestLayerNormIndependentOfWorkers(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 2))
	for _, s := range [][2]int{{1000, 256}, {2100, 1030}, {37, 4096}} {
		rows, c := s[0], s[1]
		x, dy, gamma, beta := lnInputs[float32](rng, rows, c)
		p := NewLayerNormParams(rows, c, 4, 1e-5)
		prev := runtime.GOMAXPROCS(1)
		one := lnRun(p, x, dy, gamma, beta)
		runtime.GOMAXPROCS(max(prev, 4))
		many := lnRun(p, x, dy, gamma, beta)
		runtime.GOMAXPROCS(prev)
		for _, o := range []struct {
			name string
			a, b []float32
		}{{"y", one.y, many.y}, {"dx", one.dx, many.dx}, {"dgamma", one.dgamma, many.dgamma}, {"dbeta", one.dbeta, many.dbeta}} {
			if !equalBits(o.a, o.b) {
				t.Errorf("[%d %d]: %s differs between 1 and %d goroutines", rows, c, o.name, max(prev, 4))
			}
		}
	}
}

// Rows whose results are exact: [2, -2, 2, -2, ...] has mean 0 and
// variance 4, so with eps 0 (which the kernels take; ops asks for more)
// rstd is 1/2, xhat ±1 and y = ±gamma + beta; a row of one value has xhat
// 0, so y = beta, dx = 0 and it adds nothing to dgamma.
func TestLayerNormExactRows(t *testing.T) {
	c := 8
	x := []float64{2, -2, 2, -2, 2, -2, 2, -2}
	gamma := []float64{1, 2, 3, 4, 5, 6, 7, 8}
	beta := []float64{0.5, 0, 0, 0, 0, 0, 0, -0.5}
	y := make([]float64, c)
	LayerNormForward(NewLayerNormParams(1, c, 8, 0), x, gamma, beta, y)
	if want := []float64{1.5, -2, 3, -4, 5, -6, 7, -8.5}; !slices.Equal(y, want) {
		t.Errorf("y = %v, want %v", y, want)
	}

	// C = 1: every row is its own mean.
	p := NewLayerNormParams(3, 1, 4, 1e-5)
	x32, dy32 := []float32{3, -7, 0.25}, []float32{1, 2, -3}
	o := lnRun(p, x32, dy32, []float32{2}, []float32{0.75})
	if !slices.Equal(o.y, []float32{0.75, 0.75, 0.75}) || !slices.Equal(o.dx, []float32{0, 0, 0}) ||
		o.dgamma[0] != 0 || o.dbeta[0] != 0 {
		t.Errorf("C = 1: y %v dx %v dgamma %v dbeta %v, want y = beta, dx 0, dgamma 0, dbeta 0 (1+2-3)", o.y, o.dx, o.dgamma, o.dbeta)
	}
}

// A NaN in a row makes that row's y and dx NaN and every dgamma NaN (each
// column sums that row's dy*xhat), as PyTorch's; the other rows and dbeta
// are what they are without it.
func TestLayerNormNaNRow(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 3))
	for _, c := range []int{3, 256, 1030} {
		rows := 5
		x, dy, gamma, beta := lnInputs[float32](rng, rows, c)
		p := NewLayerNormParams(rows, c, 4, 1e-5)
		clean := lnRun(p, x, dy, gamma, beta)
		x[2*c+c/2] = float32(math.NaN())
		o := lnRun(p, x, dy, gamma, beta)
		for r := range rows {
			ys, dxs := o.y[r*c:(r+1)*c], o.dx[r*c:(r+1)*c]
			if r == 2 {
				if slices.ContainsFunc(ys, func(v float32) bool { return v == v }) ||
					slices.ContainsFunc(dxs, func(v float32) bool { return v == v }) {
					t.Errorf("c=%d: the NaN row's y or dx is not all NaN", c)
				}
				continue
			}
			if !equalBits(ys, clean.y[r*c:(r+1)*c]) || !equalBits(dxs, clean.dx[r*c:(r+1)*c]) {
				t.Errorf("c=%d: row %d changed with a NaN in row 2", c, r)
			}
		}
		if slices.ContainsFunc(o.dgamma, func(v float32) bool { return v == v }) {
			t.Errorf("c=%d: dgamma has numbers with a NaN row: %v", c, o.dgamma[:min(c, 5)])
		}
		if !equalBits(o.dbeta, clean.dbeta) {
			t.Errorf("c=%d: dbeta changed with a NaN in x", c)
		}
	}
}

// dbeta alone reads no x; ColSum and the partial sums add dyadic values of
// few bits exactly, in any order, whatever the number of blocks.
func TestLayerNormBackwardParamsExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 4))
	for _, s := range [][2]int{{1, 5}, {13, 256}, {3000, 32}, {2100, 1030}} {
		rows, c := s[0], s[1]
		dy := make([]float32, rows*c)
		want := make([]float64, c)
		for i := range dy {
			dy[i] = float32(rng.IntN(17)-8) / 8
			want[i%c] += float64(dy[i])
		}
		p := NewLayerNormParams(rows, c, 4, 1e-5)
		for _, blocks := range []int{p.Blocks, 1, 7} {
			p.Blocks = min(blocks, rows)
			dbeta := make([]float32, c)
			LayerNormBackwardParams(p, nil, dy, nil, dbeta)
			for j := range c {
				if float64(dbeta[j]) != want[j] {
					t.Fatalf("[%d %d] blocks=%d: dbeta[%d] = %v, want %v", rows, c, p.Blocks, j, dbeta[j], want[j])
				}
			}
		}
	}
	in := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}
	out := make([]float64, 2)
	ColSum(10, 2, in, out)
	if !slices.Equal(out, []float64{100, 110}) {
		t.Errorf("ColSum of 10 rows of 2 = %v, want [100 110]", out)
	}
}
