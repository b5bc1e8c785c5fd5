package kernels

import (
	"fmt"
	"slices"
)

// PermuteParams is a permutation of a contiguous tensor's axes in the form
// kernels/layout.cu's permute kernels take it: axes of size one dropped,
// and output axes that are neighbours in the input too merged into one.
// Dims are the output's sizes, outermost first; InStrides[k] and
// OutStrides[k] the strides, in elements, of the input and of the
// (contiguous) output along output axis k. TileAxis is -1 when the input's
// innermost axis stays innermost (InStrides[last] == 1: permute_copy),
// else the output axis that is the input's innermost (permute_tile).
type PermuteParams struct {
	Dims, InStrides, OutStrides []int
	TileAxis                    int
}

// NewPermuteParams returns the permutation that makes out axis k of the
// input's axis perm[k], for an input of the given shape; perm must be a
// permutation of 0..len(shape)-1. A tensor of one element, or a
// permutation that merges to one axis, is a plain copy: Dims holds its
// size.
func NewPermuteParams(shape, perm []int) PermuteParams {
	// Input axes of size one play no part.
	var axes []int // the input axes kept, in output order
	for _, a := range perm {
		if shape[a] != 1 {
			axes = append(axes, a)
		}
	}
	if len(axes) == 0 {
		return PermuteParams{Dims: []int{1}, InStrides: []int{1}, OutStrides: []int{1}, TileAxis: -1}
	}
	// Input strides of the kept axes (contiguous input).
	stride := make([]int, len(shape))
	s := 1
	for a := len(shape) - 1; a >= 0; a-- {
		stride[a] = s
		s *= shape[a]
	}
	// Merge output neighbours that are input neighbours too, in the same
	// order (the next kept input axis after a is a's successor among the
	// kept axes).
	kept := slices.Sorted(slices.Values(axes))
	succ := map[int]int{}
	for i := 0; i+1 < len(kept); i++ {
		succ[kept[i]] = kept[i+1]
	}
	var p PermuteParams
	for i, a := range axes {
		if i > 0 {
			if next, ok := succ[axes[i-1]]; ok && next == a {
				// Merged: one axis of both sizes, with the inner one's
				// stride (the contiguous input's outer stride is the
				// inner's times its size).
				last := len(p.Dims) - 1
				p.Dims[last] *= shape[a]
				p.InStrides[last] = stride[a]
				continue
			}
		}
		p.Dims = append(p.Dims, shape[a])
		p.InStrides = append(p.InStrides, stride[a])
	}
	p.OutStrides = make([]int, len(p.Dims))
	s = 1
	p.TileAxis = -1
	for k := len(p.Dims) - 1; k >= 0; k-- {
		p.OutStrides[k] = s
		s *= p.Dims[k]
		if p.InStrides[k] == 1 && k != len(p.Dims)-1 {
			p.TileAxis = k
		}
	}
	return p
}

// String shows the canonical form, as tests and op configs name it.
func (p PermuteParams) String() string {
	return fmt.Sprintf("dims=%v,in=%v,tile=%d", p.Dims, p.InStrides, p.TileAxis)
}

// permuteGrain is the fewest output elements a goroutine is given.
const permuteGrain = 1 << 15

// Permute writes out, the contiguous permutation p of in: out's element at
// coordinates c (over p.Dims) is in's at sum c[k]*InStrides[k]. Rows of the
// output's innermost axis are copied in order, as permute_copy's threads
// write them.
func Permute[T any](p PermuteParams, in, out []T) {
	last := len(p.Dims) - 1
	inner, stride := p.Dims[last], p.InStrides[last]
	rows := len(out) / inner
	parallelFor(rows, max(1, permuteGrain/inner), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			rest, off := r, 0
			for k := last - 1; k >= 0; k-- {
				q := rest / p.Dims[k]
				off += (rest - q*p.Dims[k]) * p.InStrides[k]
				rest = q
			}
			dst := out[r*inner : (r+1)*inner]
			if stride == 1 {
				copy(dst, in[off:off+inner])
				continue
			}
			for c := range dst {
				dst[c] = in[off+c*stride]
			}
		}
	})
}

// CopyRows copies rows rows of cols elements from src, a row every
// srcStride elements, to dst, a row every dstStride elements: copy_rows.
func CopyRows[T any](rows, cols, srcStride, dstStride int, src, dst []T) {
	parallelFor(rows, max(1, permuteGrain/max(cols, 1)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			copy(dst[r*dstStride:r*dstStride+cols], src[r*srcStride:r*srcStride+cols])
		}
	})
}

// GatherRows writes out's row i ([k, d]) as x's row idx[i] (x [n, d]). An
// index outside [0, n) gives a zero row, as the GPU's does, and the error
// naming the first such i.
func GatherRows[T any](n, d int, x []T, idx []int, out []T) error {
	bad := -1
	var zero T
	for i, s := range idx {
		dst := out[i*d : (i+1)*d]
		if s < 0 || s >= n {
			if bad < 0 {
				bad = i
			}
			for c := range dst {
				dst[c] = zero
			}
			continue
		}
		copy(dst, x[s*d:(s+1)*d])
	}
	if bad >= 0 {
		return fmt.Errorf("index %d is %d, outside [0, %d)", bad, idx[bad], n)
	}
	return nil
}

// GatherRowsBackward writes dx ([n, d]), the gradient of GatherRows: zero,
// plus dy's row i onto row idx[i] for each i in increasing order (the
// order gather_scatter walks its chains in, so the same bits); rows of bad
// indices add nothing.
func GatherRowsBackward[T Float](n, d int, dy []T, idx []int, dx []T) {
	clear(dx)
	for i, s := range idx {
		if s < 0 || s >= n {
			continue
		}
		dst, src := dx[s*d:(s+1)*d], dy[i*d:(i+1)*d]
		for c := range dst {
			dst[c] += src[c]
		}
	}
}
