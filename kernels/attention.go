package kernels

// AttentionParams is the shape attention.cu's kernels see: scores [N*H, L,
// S], batch index n*H + h, and a key mask [N, S].
type AttentionParams struct {
	N, H, L, S int
	Scale      float64
}

// AttentionScaleMask writes y = scale*x + mask[n, s] over the scores x
// (mask nil: none), as attention.cu's scale_mask: the scaled scores with
// the keys' additive mask (0 to keep a key, -inf to ignore it).
func AttentionScaleMask[T Float](p AttentionParams, x, mask, y []T) {
	scale := T(p.Scale)
	ls := p.L * p.S
	parallelFor(p.N*p.H, 1, func(lo, hi int) {
		for b := lo; b < hi; b++ {
			n := b / p.H
			for j := b * ls; j < (b+1)*ls; j++ {
				v := scale * x[j]
				if mask != nil {
					v += mask[n*p.S+j%p.S]
				}
				y[j] = v
			}
		}
	})
}

// AttentionHeadMean writes y [N, L*S], the mean over the heads of x [N*H,
// L*S], the heads summed in increasing order, as head_mean.
func AttentionHeadMean[T Float](p AttentionParams, x, y []T) {
	ls := p.L * p.S
	for n := range p.N {
		for j := range ls {
			src := x[n*p.H*ls+j:]
			sum := src[0]
			for h := 1; h < p.H; h++ {
				sum += src[h*ls]
			}
			y[n*ls+j] = sum / T(p.H)
		}
	}
}

// AttentionHeadMeanBackward writes dx [N*H, L*S] = dy[n] / H for each
// head, as head_mean_bwd.
func AttentionHeadMeanBackward[T Float](p AttentionParams, dy, dx []T) {
	ls := p.L * p.S
	for b := range p.N * p.H {
		n := b / p.H
		for j := range ls {
			dx[b*ls+j] = dy[n*ls+j] / T(p.H)
		}
	}
}
