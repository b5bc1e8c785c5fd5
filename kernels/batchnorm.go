package kernels

import "math"

// BatchNormParams describes BatchNorm2d over z [N,C,H,W] (HW = H*W) fused
// with a residual and an activation, as one layer of a ResNet computes it:
//
//	y = act(gamma[c]*(z - mean[c])/sqrt(var[c] + Eps) + beta[c] + residual)
//
// In training mode mean and var are the batch's, over the M = N*HW values of
// each channel (var biased, divided by M), and the running statistics move
// toward them: running = (1-Momentum)*running + Momentum*batch, with the
// unbiased variance (divided by M-1) for the running variance, as PyTorch's
// BatchNorm2d. In inference mode the running statistics are used. The CUDA
// kernels take the same struct by value.
type BatchNormParams struct {
	N, C, HW      int
	Eps, Momentum float64
	Training      bool
	// ReLU applies max(.,0) to the output and masks dy with y > 0 in the
	// backward pass.
	ReLU bool
}

// BatchNormStats computes the mean and the biased variance of every channel
// of z. It makes two passes, the second over deviations from the mean, since
// E[z^2]-E[z]^2 loses all precision when the mean is large against the
// spread (as it is for conv outputs with a large bias). The per-channel sums
// accumulate in float64 whatever T is, as PyTorch's CPU kernels do: they add
// up N*H*W terms, and in float32 their rounding, amplified by the
// cancellation inside the BatchNorm gradient, would cost several digits of
// the float32 result.
func BatchNormStats[T Float](p BatchNormParams, z, mean, variance []T) {
	m := float64(p.N * p.HW)
	plane := p.C * p.HW
	parallelFor(p.C, 1, func(c0, c1 int) {
		for c := c0; c < c1; c++ {
			var s float64
			for n := range p.N {
				s += sum64(z[n*plane+c*p.HW : n*plane+(c+1)*p.HW])
			}
			mu := T(s / m)
			var ss float64
			for n := range p.N {
				ss += sumSquaredDev64(z[n*plane+c*p.HW:n*plane+(c+1)*p.HW], mu)
			}
			mean[c], variance[c] = mu, T(ss/m)
		}
	})
}

// sum64 returns the sum of s accumulated in float64, four partial sums at
// a time.
func sum64[T Float](s []T) float64 {
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(s); i += 4 {
		q := s[i : i+4 : i+4]
		s0 += float64(q[0])
		s1 += float64(q[1])
		s2 += float64(q[2])
		s3 += float64(q[3])
	}
	for ; i < len(s); i++ {
		s0 += float64(s[i])
	}
	return (s0 + s1) + (s2 + s3)
}

// sumSquaredDev64 returns sum (s[i]-mu)^2 accumulated in float64; each
// deviation is taken in T, as the forward pass takes it.
func sumSquaredDev64[T Float](s []T, mu T) float64 {
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(s); i += 4 {
		q := s[i : i+4 : i+4]
		d0, d1, d2, d3 := float64(q[0]-mu), float64(q[1]-mu), float64(q[2]-mu), float64(q[3]-mu)
		s0 += d0 * d0
		s1 += d1 * d1
		s2 += d2 * d2
		s3 += d3 * d3
	}
	for ; i < len(s); i++ {
		d := float64(s[i] - mu)
		s0 += d * d
	}
	return (s0 + s1) + (s2 + s3)
}

// invStd returns 1/sqrt(v+eps) in T. The square root is taken in float64
// and rounded once, which for float32 is the correctly rounded float32
// square root.
func invStd[T Float](v T, eps float64) T {
	return 1 / T(math.Sqrt(float64(v+T(eps))))
}

// BNCoefStride is the number of per-channel constants the BatchNorm passes
// hand each other (mirroring kCoefStride in conv.cuh). The forward's
// (BatchNormCoef, read by BatchNormApply and by both backward passes):
//
//	coef[c*BNCoefStride+0..4] = center, scale, shift, mean, invstd
//
// with y = act((z - center)*scale + shift + residual). The backward's
// (BatchNormBackwardStats, read by BatchNormBackwardApply):
//
//	bcoef[c*BNCoefStride+0..4] = mean, invstd, gamma*invstd, mean(g), mean(g*xhat)
//
// The rest of each channel's stride is zero.
const BNCoefStride = 8

// BatchNormCoef computes the forward pass's per-channel constants (see
// BNCoefStride) from z in training mode, updating runMean and runVar in
// place (M = N*HW must be over 1: the ops package checks it), or from the
// running statistics in inference mode.
func BatchNormCoef[T Float](p BatchNormParams, z, gamma, beta, runMean, runVar, coef []T) {
	// In training the batch mean is subtracted before scaling, which keeps
	// the precision of z's deviations when the mean is large; in inference
	// the running statistics fold into one multiply-add, scale =
	// gamma/sqrt(rv+eps), shift = beta - rm*scale.
	clear(coef[:p.C*BNCoefStride])
	if p.Training {
		mean, variance := make([]T, p.C), make([]T, p.C)
		BatchNormStats(p, z, mean, variance)
		m := T(p.N * p.HW)
		mom := T(p.Momentum)
		for c := range p.C {
			is := invStd(variance[c], p.Eps)
			cf := coef[c*BNCoefStride:]
			cf[0], cf[1], cf[2], cf[3], cf[4] = mean[c], gamma[c]*is, beta[c], mean[c], is
			runMean[c] = (1-mom)*runMean[c] + mom*mean[c]
			runVar[c] = (1-mom)*runVar[c] + mom*variance[c]*m/(m-1)
		}
		return
	}
	for c := range p.C {
		is := invStd(runVar[c], p.Eps)
		scale := gamma[c] * is
		cf := coef[c*BNCoefStride:]
		cf[0], cf[1], cf[2], cf[3], cf[4] = 0, scale, beta[c]-runMean[c]*scale, runMean[c], is
	}
}

// BatchNormApply computes y from z with BatchNormCoef's constants;
// residual may be nil. Each element costs one multiply-add.
func BatchNormApply[T Float](p BatchNormParams, z, coef, residual, y []T) {
	parallelFor(p.N*p.C, 1, func(lo, hi int) {
		for row := lo; row < hi; row++ {
			cf := coef[(row%p.C)*BNCoefStride:]
			off := row * p.HW
			affine(y[off:off+p.HW], z[off:off+p.HW], rowOf(residual, off, p.HW), cf[0], cf[1], cf[2], p.ReLU)
		}
	})
}

// BatchNormForward computes y from z (see BatchNormParams): BatchNormCoef,
// then BatchNormApply.
func BatchNormForward[T Float](p BatchNormParams, z, gamma, beta, residual, runMean, runVar, y []T) {
	coef := make([]T, p.C*BNCoefStride)
	BatchNormCoef(p, z, gamma, beta, runMean, runVar, coef)
	BatchNormApply(p, z, coef, residual, y)
}

// rowOf returns t[off:off+n], or nil for a nil t.
func rowOf[T Float](t []T, off, n int) []T {
	if t == nil {
		return nil
	}
	return t[off : off+n]
}

// BatchNormBackward computes the gradients of BatchNormForward with respect
// to z, gamma and beta from dy, given the forward's constants (coef) and
// residual (nil if none): BatchNormBackwardStats, then
// BatchNormBackwardApply. dz, dgamma and dbeta are overwritten.
func BatchNormBackward[T Float](p BatchNormParams, z, gamma, coef, residual, dy, dz, dgamma, dbeta []T) {
	bcoef := make([]T, p.C*BNCoefStride)
	BatchNormBackwardStats(p, z, gamma, coef, residual, dy, dgamma, dbeta, bcoef)
	BatchNormBackwardApply(p, z, coef, residual, dy, bcoef, dz)
}

// reluGrad returns g for the row of z at off: dy's row where the layer's
// output is positive when p.ReLU, else dy's row. The output is recomputed
// into buf (the row's length) from z, the residual and the forward's
// constants with BatchNormApply's own expressions, so the mask is the
// forward's y > 0 bit for bit, without reading y.
func reluGrad[T Float](p BatchNormParams, buf, dy, z, coef, residual []T, off int) []T {
	n := len(buf)
	if !p.ReLU {
		return dy[off : off+n]
	}
	cf := coef[((off/p.HW)%p.C)*BNCoefStride:]
	affine(buf, z[off:off+n], rowOf(residual, off, n), cf[0], cf[1], cf[2], true)
	gate(buf, dy[off:off+n], buf)
	return buf
}

// BatchNormBackwardStats is the reduction of the backward pass: dbeta =
// sum(g) and dgamma = sum(g*xhat), accumulated in float64 like the
// statistics, and the per-channel constants (bcoef, BNCoefStride per
// channel) of
//
//	dz = gamma*invstd * (g - mean(g) - xhat*mean(g*xhat)),  xhat = (z-mean)*invstd
//
// where g is dy masked by the forward's y > 0 when p.ReLU (reluGrad), and
// mean and invstd are the forward's (coef): the batch's in training mode,
// the running ones in inference mode, where dz = g*gamma*invstd. The
// residual's gradient is g itself (MaskReLU).
func BatchNormBackwardStats[T Float](p BatchNormParams, z, gamma, coef, residual, dy, dgamma, dbeta, bcoef []T) {
	plane := p.C * p.HW
	m := float64(p.N * p.HW)
	parallelFor(p.C, 1, func(c0, c1 int) {
		g := make([]T, p.HW)
		for c := c0; c < c1; c++ {
			fc := coef[c*BNCoefStride:]
			mu, is := fc[3], fc[4]
			// sum(g) and sum(g*xhat) = istd*sum(g*(z-mean)), per row first.
			var sg, sgz float64
			for n := range p.N {
				off := n*plane + c*p.HW
				gr := reluGrad(p, g, dy, z, coef, residual, off)
				sg += sum64(gr)
				sgz += dotDev64(gr, z[off:off+p.HW], mu)
			}
			sgx := sgz * float64(is)
			dbeta[c], dgamma[c] = T(sg), T(sgx)
			cf := bcoef[c*BNCoefStride : (c+1)*BNCoefStride]
			clear(cf)
			cf[0], cf[1], cf[2], cf[3], cf[4] = mu, is, gamma[c]*is, T(sg/m), T(sgx/m)
		}
	})
}

// BatchNormBackwardApply writes dz from BatchNormBackwardStats' constants
// (bcoef): one more read of z and dy (and of the residual, for the mask of
// a layer with a residual and a ReLU).
func BatchNormBackwardApply[T Float](p BatchNormParams, z, coef, residual, dy, bcoef, dz []T) {
	parallelFor(p.N*p.C, 1, func(lo, hi int) {
		g := make([]T, p.HW)
		for row := lo; row < hi; row++ {
			off := row * p.HW
			cf := bcoef[(row%p.C)*BNCoefStride:]
			mu, is, k, mg, mgx := cf[0], cf[1], cf[2], cf[3], cf[4]
			gr := reluGrad(p, g, dy, z, coef, residual, off)
			zr, dzr := z[off:off+p.HW], dz[off:off+p.HW]
			if p.Training {
				for i, v := range gr {
					xhat := (zr[i] - mu) * is
					dzr[i] = k * (v - mg - xhat*mgx)
				}
			} else {
				for i, v := range gr {
					dzr[i] = k * v
				}
			}
		}
	})
}

// MaskReLUSums sets g = dy where y > 0 and 0 elsewhere (y may be nil: no
// mask) over [N,C,HW] tensors and, when sums is non-nil, sums[c] = the sum
// of channel c of g, accumulated in float64: a Conv layer's gradient for
// its two GEMMs and its bias gradient, in one pass.
func MaskReLUSums[T Float](n, c, hw int, y, dy, g, sums []T) {
	plane := c * hw
	parallelFor(c, 1, func(c0, c1 int) {
		for ch := c0; ch < c1; ch++ {
			var s float64
			for i := range n {
				off := i*plane + ch*hw
				gr, dr := g[off:off+hw], dy[off:off+hw]
				if y == nil {
					copy(gr, dr)
				} else {
					gate(gr, dr, y[off:off+hw])
				}
				s += sum64(gr)
			}
			if sums != nil {
				sums[ch] = T(s)
			}
		}
	})
}

// dotDev64 returns sum g[i]*(z[i]-mu) accumulated in float64, each
// deviation taken in T.
func dotDev64[T Float](g, z []T, mu T) float64 {
	z = z[:len(g)]
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(g); i += 4 {
		gq, zq := g[i:i+4:i+4], z[i:i+4:i+4]
		s0 += float64(gq[0]) * float64(zq[0]-mu)
		s1 += float64(gq[1]) * float64(zq[1]-mu)
		s2 += float64(gq[2]) * float64(zq[2]-mu)
		s3 += float64(gq[3]) * float64(zq[3]-mu)
	}
	for ; i < len(g); i++ {
		s0 += float64(g[i]) * float64(z[i]-mu)
	}
	return (s0 + s1) + (s2 + s3)
}

// MaskReLU sets dx = dy where y > 0 and 0 elsewhere: the gradient that
// reaches the residual of a layer ending in ReLU. dx may be dy.
func MaskReLU[T Float](y, dy, dx []T) {
	const chunk = 1 << 14
	parallelFor(ceilDiv(len(dx), chunk), 1, func(lo, hi int) {
		a, b := lo*chunk, min(hi*chunk, len(dx))
		gate(dx[a:b], dy[a:b], y[a:b])
	})
}
