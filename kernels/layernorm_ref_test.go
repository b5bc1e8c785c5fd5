package kernels_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/kernels"
)

// refLayerNorm is the definition of kernels.LayerNormParams and of its
// gradients, in float64 (two passes; sums in row order).
func refLayerNorm(rows, c int, eps float64, x, gamma, beta, dy []float64) (y, dx, dgamma, dbeta []float64) {
	y, dx = make([]float64, rows*c), make([]float64, rows*c)
	dgamma, dbeta = make([]float64, c), make([]float64, c)
	for r := range rows {
		xr, dyr := x[r*c:(r+1)*c], dy[r*c:(r+1)*c]
		var mean, v float64
		for _, e := range xr {
			mean += e
		}
		mean /= float64(c)
		for _, e := range xr {
			v += (e - mean) * (e - mean)
		}
		rstd := 1 / math.Sqrt(v/float64(c)+eps)
		xh, g := make([]float64, c), make([]float64, c)
		var a, b float64
		for j, e := range xr {
			xh[j], g[j] = (e-mean)*rstd, dyr[j]
			if gamma != nil {
				g[j] *= gamma[j]
			}
			a, b = a+g[j], b+g[j]*xh[j]
			y[r*c+j] = xh[j]
			if gamma != nil {
				y[r*c+j] *= gamma[j]
			}
			if beta != nil {
				y[r*c+j] += beta[j]
			}
			dgamma[j] += dyr[j] * xh[j]
			dbeta[j] += dyr[j]
		}
		for j := range xr {
			dx[r*c+j] = rstd * (g[j] - a/float64(c) - xh[j]*b/float64(c))
		}
	}
	return y, dx, dgamma, dbeta
}

func to64[T kernels.Float](v []T) []float64 {
	if v == nil {
		return nil
	}
	out := make([]float64, len(v))
	for i, e := range v {
		out[i] = float64(e)
	}
	return out
}

// The CPU twins against the float64 definition, with autograd's forward
// tolerances, on every geometry: warp rows of 1 and 4 KiB, block rows of
// chunks and of single elements, one row and many, with the column sums'
// default blocks and with one block (which then adds every row), with and
// without gamma and beta. Rows are of order 1, as TolForward32 is stated
// for, with spreads of 0.25 at least.
//
// float32 takes 13 rows at most: a column sum of more rows, accumulated
// in float32 (as PyTorch's CUDA kernels accumulate it), that cancels to
// near zero keeps the rounding of its partial sums, which at 200 rows
// already reaches TolForward32's 1e-6 absolute (0.9 of the bound for dbeta,
// 1.3 for dgamma, whose terms are rounded too). float64 takes thousands of
// rows; and the GPU's column sums are the CPU twin's bit for bit (ops'
// GPU tests), whatever the rows.
func TestLayerNormTwinsMatchDefinition(t *testing.T) {
	shapes := [][2]int{{13, 1}, {13, 3}, {13, 32}, {13, 256}, {1, 256}, {13, 512}, {13, 1030}, {13, 1032}, {9, 4096}}
	for _, s := range shapes {
		t.Run(fmt.Sprintf("float32/%dx%d", s[0], s[1]), func(t *testing.T) { testTwinMatches[float32](t, s[0], s[1]) })
	}
	for _, s := range append(shapes, [2]int{2100, 1030}, [2]int{3000, 32}) {
		t.Run(fmt.Sprintf("float64/%dx%d", s[0], s[1]), func(t *testing.T) { testTwinMatches[float64](t, s[0], s[1]) })
	}
}

func testTwinMatches[T kernels.Float](t *testing.T, rows, c int) {
	rng := rand.New(rand.NewPCG(uint64(rows), uint64(c)))
	size, tol := 4, autograd.TolForward32
	if _, ok := any(T(0)).(float64); ok {
		size, tol = 8, autograd.TolForward64
	}
	const eps = 1e-5
	x, dy := make([]T, rows*c), make([]T, rows*c)
	gamma, beta := make([]T, c), make([]T, c)
	for r := range rows {
		off, scale := rng.Float64()-0.5, 0.5+0.5*rng.Float64()
		u := make([]float64, c)
		for sd := 0.0; c > 1 && sd < 0.5; {
			var m, ss float64
			for j := range u {
				u[j] = 2*rng.Float64() - 1
				m += u[j]
			}
			m /= float64(c)
			for _, e := range u {
				ss += (e - m) * (e - m)
			}
			sd = math.Sqrt(ss / float64(c))
		}
		for j := range c {
			x[r*c+j] = T(off + scale*u[j])
		}
	}
	for i := range dy {
		dy[i] = T(2*rng.Float64() - 1)
	}
	for j := range c {
		gamma[j], beta[j] = T(0.5+rng.Float64()), T(2*rng.Float64()-1)
	}
	def := kernels.NewLayerNormParams(rows, c, size, eps)
	one := def
	one.Blocks = 1
	for _, p := range []kernels.LayerNormParams{def, one} {
		for _, affine := range []struct{ gamma, beta bool }{{true, true}, {false, false}, {true, false}, {false, true}} {
			testTwinAffine(t, p, tol, x, dy, gamma, beta, affine.gamma, affine.beta)
		}
	}
}

// testTwinAffine checks the twins of p, with gamma and beta or without,
// against the definition.
func testTwinAffine[T kernels.Float](t *testing.T, p kernels.LayerNormParams, tol autograd.Tolerance, x, dy, gamma, beta []T, hasGamma, hasBeta bool) {
	rows, c := p.Rows, p.C
	var g, b, dg, db []T
	xIn := x
	if hasGamma {
		g, dg = gamma, make([]T, c)
	} else {
		xIn = nil // dbeta alone reads no x
	}
	if hasBeta {
		b, db = beta, make([]T, c)
	}
	// eps as the kernels add it: in T.
	wy, wdx, wdg, wdb := refLayerNorm(rows, c, float64(T(p.Eps)), to64(x), to64(g), to64(b), to64(dy))
	y, dx := make([]T, rows*c), make([]T, rows*c)
	kernels.LayerNormForward(p, x, g, b, y)
	kernels.LayerNormBackwardDX(p, x, g, dy, dx)
	kernels.LayerNormBackwardParams(p, xIn, dy, dg, db)
	check := func(what string, got []T, want []float64) {
		if err := tol.Compare(to64(got), want); err != nil {
			t.Errorf("blocks=%d gamma=%t beta=%t: %s: %v", p.Blocks, hasGamma, hasBeta, what, err)
		}
		if w := tol.Worst(to64(got), want); w > 0.5 {
			t.Logf("blocks=%d gamma=%t beta=%t: %s: the worst element at %.3g of the bound", p.Blocks, hasGamma, hasBeta, what, w)
		}
	}
	check("y", y, wy)
	check("dx", dx, wdx)
	if hasGamma {
		check("dgamma", dg, wdg)
	}
	if hasBeta {
		check("dbeta", db, wdb)
	}
}
