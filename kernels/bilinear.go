package kernels

import "math"

// taps are the four corners of one bilinear sample of an h×w map, in the
// order (y0,x0), (y0,x1), (y1,x0), (y1,x1) with y1 = y0+1 and x1 = x0+1.
//
// A corner outside the map has in[i] == false, weight 0 and offset 0, so a
// sum of w[i]*map[off[i]] over all four reads only memory inside the map.
// This is the CPU twin of struct Taps in bilinear.cuh: both ops sample through
// it, so RoIAlign and MSDeformAttn cannot drift apart.
type taps[T Float] struct {
	off [4]int  // y*w + x of each corner, within one map
	w   [4]T    // interpolation weight of each corner
	in  [4]bool // corner lies inside the map
	ly  T       // y - y0, needed by gradients w.r.t. the sample position
	lx  T       // x - x0
}

// bilinear returns the taps of a sample at (y, x), corners outside the map
// contributing zero. The caller guarantees -1 < y < h+1 and -1 < x < w+1
// (which also rules out NaN), so the floors fit in an int.
func bilinear[T Float](y, x T, h, w int) taps[T] {
	y0 := int(math.Floor(float64(y)))
	x0 := int(math.Floor(float64(x)))
	// y - y0 is exact in T: y0 is y with its fraction dropped.
	ly := y - T(y0)
	lx := x - T(x0)
	hy := 1 - ly
	hx := 1 - lx
	t := taps[T]{ly: ly, lx: lx}
	ys := [2]int{y0, y0 + 1}
	xs := [2]int{x0, x0 + 1}
	ws := [4]T{hy * hx, hy * lx, ly * hx, ly * lx}
	for i := range 4 {
		yy, xx := ys[i>>1], xs[i&1]
		if yy >= 0 && yy < h && xx >= 0 && xx < w {
			t.off[i] = yy*w + xx
			t.w[i] = ws[i]
			t.in[i] = true
		}
	}
	return t
}

// roiTaps samples the way torchvision's roi_align does: a point more than one
// pixel outside the map contributes nothing (ok == false), and a point inside
// that band is clamped onto the border row or column.
func roiTaps[T Float](y, x T, h, w int) (t taps[T], ok bool) {
	// Written so that NaN takes the "outside" branch.
	if !(y >= -1 && y <= T(h) && x >= -1 && x <= T(w)) {
		return t, false
	}
	// torchvision clamps y <= 0 to 0, and y at or past the last row to the last
	// row, where the lower corner then carries all the weight.
	y = min(max(y, 0), T(h-1))
	x = min(max(x, 0), T(w-1))
	return bilinear(y, x, h, w), true
}

// gridTaps samples the way grid_sample(bilinear, zeros, align_corners=False)
// does after the caller has mapped the normalised location to pixels
// (loc*size - 0.5): points whose four corners all lie outside contribute
// nothing (ok == false); otherwise corners outside are zero.
func gridTaps[T Float](y, x T, h, w int) (t taps[T], ok bool) {
	if !(y > -1 && y < T(h) && x > -1 && x < T(w)) {
		return t, false
	}
	return bilinear(y, x, h, w), true
}

// sample returns the interpolated value of one map, summed in the same order
// as the CUDA kernels and the reference implementations.
func (t *taps[T]) sample(m []T) T {
	return t.w[0]*m[t.off[0]] + t.w[1]*m[t.off[1]] + t.w[2]*m[t.off[2]] + t.w[3]*m[t.off[3]]
}
