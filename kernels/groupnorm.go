package kernels

import "math"

// GroupNormParams describes group normalisation, as
// torch.nn.functional.group_norm: x [N, C, HW] (NCHW with HW = H*W, or any
// rank >= 2 with the dimensions after the channels flattened), its C
// channels split into Groups groups of C/Groups. Row r = (sample, group)
// is the contiguous run of the group's planes; per row, with its mean and
// biased variance var,
//
//	xhat = (x - mean) * rstd,  rstd = 1/sqrt(var + Eps)
//	y    = xhat*gamma[ch] + beta[ch]   (gamma and beta optional)
//
// with the tile geometry that fixes the order of every sum
// (NewGroupNormParams chooses it from the shape). The CUDA kernels
// (groupnorm.cu, which says why the sums are in float64 and shifted by
// the row's first element) take the same geometry and the CPU twins add in
// their order, rounding every operation as they do, so the two agree bit
// for bit.
type GroupNormParams struct {
	N, C, Groups, HW int
	Eps              float64
	// Vec is the elements of a unit, which a thread reads whole: a 16-byte
	// chunk (4 float32, 2 float64) when HW is a multiple of one, else 1.
	Vec int
	// Tiles is the tiles of GroupNormTile elements a plane splits into,
	// each a block's.
	Tiles int
}

// The geometry of the kernels, as groupnorm.cu states it (ops checks that
// kernels/cuda's generated constants agree).
const (
	// GroupNormThreads is the threads of a tile kernel's block.
	GroupNormThreads = 256
	// GroupNormTile is the elements of a plane one block takes.
	GroupNormTile = 4096
	// GroupNormRowStats is the values per row at the head of the
	// backward's sums: mean, rstd, mean(g), mean(g*xhat), each a pair of
	// T (see split).
	GroupNormRowStats = 4
	// GroupNormInlineRowPartials is the most tile sums a row may have for
	// the forward's blocks to add them each; beyond, a kernel of its own
	// adds them once per row first (in the same order: the bits are the
	// same either way).
	GroupNormInlineRowPartials = 256
)

// NewGroupNormParams returns the parameters and the tile geometry of group
// normalisation of x [n, c, hw] in groups groups, elements of elemBytes
// bytes (4 or 8), which depends on the shape and the dtype alone.
func NewGroupNormParams(n, c, groups, hw, elemBytes int, eps float64) GroupNormParams {
	p := GroupNormParams{N: n, C: c, Groups: groups, HW: hw, Eps: eps, Vec: 1, Tiles: ceilDiv(hw, GroupNormTile)}
	if chunk := 16 / elemBytes; hw%chunk == 0 {
		p.Vec = chunk
	}
	return p
}

// Rows is the number of (sample, group) rows.
func (p GroupNormParams) Rows() int { return p.N * p.Groups }

// SumsLen is the length of the backward's sums (GroupNormBackwardSums):
// GroupNormRowStats values per row, then sum(dy) and sum(dy*xhat) per
// plane, each value a pair of T.
func (p GroupNormParams) SumsLen() int { return 2 * (p.Rows()*GroupNormRowStats + 2*p.N*p.C) }

// split writes v as the pair (hi, lo) of T, hi = T(v) and lo = T(v - hi),
// which join adds back: exactly for float32 (the pair's 48 bits fit in a
// float64), as v itself for float64. float32 so carries the float64 sums'
// precision from GroupNormBackwardSums to GroupNormBackwardDX (groupnorm.cu
// says why that matters). A value past T's range comes back NaN.
func split[T Float](v float64, out []T) {
	hi := T(v)
	out[0], out[1] = hi, T(v-float64(hi))
}

func join[T Float](in []T) float64 { return float64(in[0]) + float64(in[1]) }

func (p GroupNormParams) cpg() int { return p.C / p.Groups }

// RowPartials is the number of tile sums of a row: its channels' tiles.
func (p GroupNormParams) RowPartials() int { return p.cpg() * p.Tiles }

// groupNormTileSums writes the tile sums of every plane's tiles into
// partial, stride apart: of d = x - K (K the row's first element) and d*d,
// then, with dy, of dy and dy*d; each block's threads add their units in
// order and threadSum adds the threads' sums, as the kernels stats and
// bwd_reduce do.
func groupNormTileSums[T Float](p GroupNormParams, x, dy []T, partial []float64) {
	stride := 2
	if dy != nil {
		stride = 4
	}
	cpg, hw, v := p.cpg(), p.HW, p.Vec
	units := hw / v
	items := GroupNormTile / GroupNormThreads / v
	tileUnits := GroupNormTile / v
	parallelFor(p.N*p.C, max(1, 16384/hw), func(lo, hi int) {
		var part [4][GroupNormThreads]float64
		for plane := lo; plane < hi; plane++ {
			k := float64(x[plane/cpg*cpg*hw])
			xp := x[plane*hw : (plane+1)*hw]
			var dyp []T
			if dy != nil {
				dyp = dy[plane*hw : (plane+1)*hw]
			}
			for t := range p.Tiles {
				for tid := range GroupNormThreads {
					var s [4]float64
					for i := range items {
						u := t*tileUnits + tid + i*GroupNormThreads
						if u >= units {
							break
						}
						for e := range v {
							j := u*v + e
							d := float64(xp[j]) - k
							s[0] += d
							s[1] += float64(d * d)
							if dyp != nil {
								g := float64(dyp[j])
								s[2] += g
								s[3] += float64(g * d)
							}
						}
					}
					for m := range stride {
						part[m][tid] = s[m]
					}
				}
				out := partial[(plane*p.Tiles+t)*stride:]
				for m := range stride {
					out[m] = threadSum(part[m][:])
				}
			}
		}
	})
}

// groupNormRowStats returns row's mean and rstd, and its shifted mean ms
// (mean minus the row's first element), from its tiles' sums, stride
// apart: lane l of a warp adds the row's partials l, l+32, ... and a
// butterfly adds the lanes' sums; ms = S1/L, var = S2/L - ms*ms (0 when
// rounding makes it negative), as the kernels' row_stats.
func groupNormRowStats[T Float](p GroupNormParams, x []T, partial []float64, row, stride int) (mean, rstd, ms float64) {
	q := p.cpg() * p.Tiles
	part := partial[row*q*stride:]
	var s1, s2 [32]float64
	for l := range 32 {
		for i := l; i < q; i += 32 {
			s1[l] += part[i*stride]
			s2[l] += part[i*stride+1]
		}
	}
	n := float64(p.cpg() * p.HW)
	ms = butterfly(s1[:]) / n
	v := butterfly(s2[:])/n - float64(ms*ms)
	if v < 0 {
		v = 0
	}
	mean = float64(x[row*p.cpg()*p.HW]) + ms
	return mean, 1 / math.Sqrt(v+p.Eps), ms
}

// GroupNormForward computes y from x (see GroupNormParams); gamma and beta
// may be nil (no scale, no shift). Each row's statistics come from its
// tiles' sums in the kernels' order, and y = T((x - mean)*(rstd*gamma) +
// beta) in float64 with each operation rounded: the kernels' bits.
func GroupNormForward[T Float](p GroupNormParams, x, gamma, beta, y []T) {
	partial := make([]float64, p.N*p.C*p.Tiles*2)
	groupNormTileSums[T](p, x, nil, partial)
	cpg, hw := p.cpg(), p.HW
	parallelFor(p.Rows(), max(1, 16384/(cpg*hw)), func(lo, hi int) {
		for row := lo; row < hi; row++ {
			mean, rstd, _ := groupNormRowStats(p, x, partial, row, 2)
			for k := range cpg {
				plane := row*cpg + k
				ch := plane % p.C
				s, sh := rstd, 0.0
				if gamma != nil {
					s = float64(rstd * float64(gamma[ch]))
				}
				if beta != nil {
					sh = float64(beta[ch])
				}
				xp, yp := x[plane*hw:(plane+1)*hw], y[plane*hw:(plane+1)*hw]
				for j, xv := range xp {
					r := float64((float64(xv) - mean) * s)
					if beta != nil {
						r += sh
					}
					yp[j] = T(r)
				}
			}
		}
	})
}

// GroupNormBackwardSums computes the backward's sums from x, gamma (nil:
// none) and dy, as the kernels bwd_reduce and bwd_finalize, each value a
// pair of T (split): per row, at sums[row*8:], mean, rstd, mean(g),
// mean(g*xhat) (g = dy*gamma); then per plane, at sums[Rows()*8 +
// plane*4:], sum(dy) and sum(dy*xhat). mean and rstd are the forward's
// bit for bit.
func GroupNormBackwardSums[T Float](p GroupNormParams, x, gamma, dy, sums []T) {
	partial := make([]float64, p.N*p.C*p.Tiles*4)
	groupNormTileSums(p, x, dy, partial)
	cpg, rows := p.cpg(), p.Rows()
	planes := sums[rows*GroupNormRowStats*2:]
	n := float64(cpg * p.HW)
	parallelFor(rows, 1, func(lo, hi int) {
		for row := lo; row < hi; row++ {
			mean, rstd, ms := groupNormRowStats(p, x, partial, row, 4)
			var ga, gb [32]float64
			for l := range 32 {
				for k := l; k < cpg; k += 32 {
					plane := row*cpg + k
					var a, bs float64
					for t := range p.Tiles {
						q := partial[(plane*p.Tiles+t)*4:]
						a += q[2]
						bs += q[3]
					}
					bh := float64(rstd * (bs - float64(ms*a)))
					split(a, planes[plane*4:])
					split(bh, planes[plane*4+2:])
					if gamma != nil {
						gm := float64(gamma[plane%p.C])
						ga[l] += float64(gm * a)
						gb[l] += float64(gm * bh)
					} else {
						ga[l] += a
						gb[l] += bh
					}
				}
			}
			o := sums[row*GroupNormRowStats*2:]
			split(mean, o)
			split(rstd, o[2:])
			split(butterfly(ga[:])/n, o[4:])
			split(butterfly(gb[:])/n, o[6:])
		}
	})
}

// GroupNormBackwardDX computes dx from x, gamma (nil: none), dy and the
// backward's sums: dx = T(rstd*((g - mean(g)) - xhat*mean(g*xhat))),
// xhat = (x - mean)*rstd and g = dy*gamma, in float64 from the sums
// (joined), every operation rounded, as the kernel bwd_dx.
func GroupNormBackwardDX[T Float](p GroupNormParams, x, gamma, dy, sums, dx []T) {
	cpg, hw := p.cpg(), p.HW
	parallelFor(p.N*p.C, max(1, 16384/hw), func(lo, hi int) {
		for plane := lo; plane < hi; plane++ {
			st := sums[plane/cpg*GroupNormRowStats*2:]
			mean, rstd, mg, mgx := join(st), join(st[2:]), join(st[4:]), join(st[6:])
			gm := 1.0
			if gamma != nil {
				gm = float64(gamma[plane%p.C])
			}
			xp, dyp, dxp := x[plane*hw:(plane+1)*hw], dy[plane*hw:(plane+1)*hw], dx[plane*hw:(plane+1)*hw]
			for j, xv := range xp {
				xh := float64((float64(xv) - mean) * rstd)
				g := float64(dyp[j])
				if gamma != nil {
					g = float64(g * gm)
				}
				dxp[j] = T(rstd * ((g - mg) - float64(xh*mgx)))
			}
		}
	})
}

// GroupNormBackwardParams computes the gradients of gamma and beta from the
// backward's sums: dgamma[ch] = the sum over samples, in order, of
// sum(dy*xhat) of the sample's plane ch, dbeta[ch] of sum(dy) (joined), in float64,
// as the kernel bwd_params. Either may be nil (not computed).
func GroupNormBackwardParams[T Float](p GroupNormParams, sums, dgamma, dbeta []T) {
	planes := sums[p.Rows()*GroupNormRowStats*2:]
	for ch := range p.C {
		var a, bs float64
		for s := range p.N {
			q := planes[(s*p.C+ch)*4:]
			a += join(q)
			bs += join(q[2:])
		}
		if dgamma != nil {
			dgamma[ch] = T(bs)
		}
		if dbeta != nil {
			dbeta[ch] = T(a)
		}
	}
}
