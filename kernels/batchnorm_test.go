package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// The backward passes do not read y: they recompute the ReLU's mask from z
// (and the residual) with the forward's constants. The mask must be the
// forward's y > 0 bit for bit, where it is hardest: outputs before the
// ReLU within a few ulps of 0 on either side, NaN and infinities. In
// inference mode dz = gamma*invstd*g, so with dy = 1 dz is zero exactly
// where the mask is.
func TestBatchNormBackwardMaskIsForwards(t *testing.T) {
	for _, residual := range []bool{false, true} {
		// 37: every row has the vector bulk and the scalar tail.
		p := BatchNormParams{N: 2, C: 3, HW: 37, Eps: 1e-3, ReLU: true}
		rng := rand.New(rand.NewPCG(5, 7))
		n := p.N * p.C * p.HW
		draw := func(k int, lo, hi float32) []float32 {
			v := make([]float32, k)
			for i := range v {
				v[i] = lo + (hi-lo)*rng.Float32()
			}
			return v
		}
		gamma, beta := draw(p.C, 0.5, 1.5), draw(p.C, -0.5, 0.5)
		rm, rv := draw(p.C, -1, 1), draw(p.C, 0.5, 2)
		var res []float32
		if residual {
			res = draw(n, -1, 1)
		}
		coef := make([]float32, p.C*BNCoefStride)
		BatchNormCoef(p, nil, gamma, beta, rm, rv, coef) // inference: z is not read
		z := make([]float32, n)
		for i := range z {
			cf := coef[((i/p.HW)%p.C)*BNCoefStride:]
			r := float32(0)
			if residual {
				r = res[i]
			}
			// Where (z - center)*scale + shift + r is about 0, then
			// -4..4 ulps of z from there.
			v := cf[0] + (-r-cf[2])/cf[1]
			for k := i%9 - 4; k != 0; k -= sign(k) {
				v = math.Nextafter32(v, float32(sign(k))*float32(math.Inf(1)))
			}
			z[i] = v
		}
		z[5], z[6], z[7] = float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))
		y := make([]float32, n)
		BatchNormApply(p, z, coef, res, y)
		dy := make([]float32, n)
		for i := range dy {
			dy[i] = 1
		}
		dz, dgamma, dbeta := make([]float32, n), make([]float32, p.C), make([]float32, p.C)
		BatchNormBackward(p, z, gamma, coef, res, dy, dz, dgamma, dbeta)
		pass := 0
		for i := range y {
			if (dz[i] != 0) != (y[i] > 0) {
				t.Errorf("residual=%t: element %d: y = %g but dz = %g", residual, i, y[i], dz[i])
			}
			if y[i] > 0 {
				pass++
			}
		}
		// Both sides of the boundary were there to be told apart.
		if pass < n/4 || pass > 3*n/4 {
			t.Errorf("residual=%t: %d of %d outputs positive: the test no longer sits on the ReLU's boundary", residual, pass, n)
		}
	}
}

func sign(k int) int {
	if k < 0 {
		return -1
	}
	return 1
}
