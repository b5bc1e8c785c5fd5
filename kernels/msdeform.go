package kernels

// MSDeformAttnParams describes one multi-scale deformable attention call:
// value [N,S,M,D] holds L feature maps, level l of H[l] x W[l] pixels starting
// at pixel Start[l] along S; samplingLoc [N,Lq,M,L,P,2] holds normalised (x,y)
// locations, attnWeight [N,Lq,M,L,P] their weights; the output is
// [N,Lq,M*D]. H, W and Start have L elements each; the CUDA launcher packs
// them into the int32 [L][3] table msdeform.cu reads, as Deformable-DETR
// passes spatial_shapes and level_start_index.
type MSDeformAttnParams struct {
	N, S, M, D int
	Lq, L, P   int
	H, W       []int
	Start      []int
}

// minParallelWork is roughly the number of multiply-adds below which a chunk
// of work is not worth a goroutine of its own.
const minParallelWork = 1 << 14

// grainFor returns the parallelFor grain for items costing work multiply-adds
// each.
func grainFor(work int) int {
	return minParallelWork/max(work, 1) + 1
}

// MSDeformAttnForward computes out[n,q,m*D+d], the sum over levels l and
// points p of attnWeight[n,q,m,l,p] times the bilinear sample of channel d of
// head m of level l at samplingLoc[n,q,m,l,p], as grid_sample does it
// (bilinear, zero padding, align_corners=False). It overwrites every element
// of out. Work is split over (n,q); each (n,q,m) is the work of one group of
// lanes of the CUDA kernel (msDeformForwardThread).
func MSDeformAttnForward[T Float](p MSDeformAttnParams, value, loc, weight, out []T) {
	zero := make([]T, p.D) // read only, shared by all goroutines
	work := p.M * p.L * p.P * p.D
	parallelFor(p.N*p.Lq, grainFor(work), func(lo, hi int) {
		for nq := lo; nq < hi; nq++ {
			n, q := nq/p.Lq, nq%p.Lq
			for m := range p.M {
				msDeformForwardThread(&p, value, loc, weight, out, n, q, m, zero)
			}
		}
	})
}

// MSDeformAttnBackward computes the gradients of MSDeformAttn with respect to
// value, samplingLoc and attnWeight given gradOut [N,Lq,M*D]. It zeroes its
// three outputs, then scatters into gradValue and writes the location and
// weight gradients of every point that samples its map.
//
// gradValue is a scatter (atomicAdd on the GPU). Here work is split over
// (n,m) pairs: every element the work of (n,q,m) writes, in gradValue,
// gradLoc and gradWeight alike, belongs to its own (n,m), so no two goroutines
// write the same element, and queries are visited in order, so the result does
// not depend on the number of goroutines.
func MSDeformAttnBackward[T Float](p MSDeformAttnParams, value, loc, weight, gradOut, gradValue, gradLoc, gradWeight []T) {
	clear(gradValue)
	clear(gradLoc)
	clear(gradWeight)
	zero := make([]T, p.D)
	work := p.Lq * p.L * p.P * p.D
	parallelFor(p.N*p.M, grainFor(work), func(lo, hi int) {
		// Corners outside the map scatter here (weight 0 times the gradient,
		// NaN if the gradient is), so the channel loop needs no branch and
		// the shared zero row is never written. Nothing reads it.
		sink := make([]T, p.D)
		for nm := lo; nm < hi; nm++ {
			n, m := nm/p.M, nm%p.M
			for q := range p.Lq {
				msDeformBackwardThread(&p, value, loc, weight, gradOut, gradValue, gradLoc, gradWeight, n, q, m, zero, sink)
			}
		}
	})
}

// point is one sampling point (n,q,m,l,p) as a thread sees it.
type point[T Float] struct {
	i    int // index into attnWeight, and i*2 into samplingLoc
	base int // element of value holding channel 0 of pixel (0,0) of the level for head m
	h, w int // level size
}

// msDeformPoint locates point pt of level l of thread (n,q,m).
func msDeformPoint[T Float](p *MSDeformAttnParams, n, q, m, l, pt int) point[T] {
	return point[T]{
		i:    (((n*p.Lq+q)*p.M+m)*p.L+l)*p.P + pt,
		base: ((n*p.S+p.Start[l])*p.M + m) * p.D,
		h:    p.H[l],
		w:    p.W[l],
	}
}

// taps maps the point's normalised location to pixels the way grid_sample
// with align_corners=False does, and returns its bilinear taps; ok is false
// when no corner lies inside the map (also for NaN and infinite locations).
//
// The conversions round the product before the subtraction: without them
// the Go spec lets a compiler fuse the two into one multiply-add (arm64's
// does), which rounds once and, for a coordinate within an ulp of an
// integer, picks another cell than the GPU kernels (pixel_coord in
// bilinear.cuh), with a location gradient a whole pixel step away.
func (pt *point[T]) taps(loc []T) (t taps[T], ok bool) {
	x := T(loc[2*pt.i]*T(pt.w)) - 0.5
	y := T(loc[2*pt.i+1]*T(pt.h)) - 0.5
	return gridTaps(y, x, pt.h, pt.w)
}

// rows returns, for each corner of t, the D channels of that pixel of m
// (value or gradValue, pixels M*D elements apart), or outside for a corner
// outside the map: a zero row to read, or a sink to write. The kernels then
// run one branch-free loop over channels, where the CUDA kernel tests t.in
// per corner.
func (pt *point[T]) rows(t *taps[T], m []T, stride, d int, outside []T) (r [4][]T) {
	for c := range 4 {
		if t.in[c] {
			o := pt.base + t.off[c]*stride
			r[c] = m[o : o+d]
		} else {
			r[c] = outside
		}
	}
	return r
}

// msDeformForwardThread is the work of one group of lanes of the CUDA
// kernel (msdeform_forward in msdeform.cu): head m of query q of image n, all
// D channels. On the GPU, lane i of the group takes channels i, i+G, ...;
// here the channel loop is innermost, but each output element still adds the
// same terms in the same order. zero holds D zeros.
func msDeformForwardThread[T Float](p *MSDeformAttnParams, value, loc, weight, out []T, n, q, m int, zero []T) {
	nd := p.D
	o := out[((n*p.Lq+q)*p.M+m)*nd:][:nd]
	clear(o)
	stride := p.M * p.D
	for l := range p.L {
		for k := range p.P {
			pt := msDeformPoint[T](p, n, q, m, l, k)
			t, ok := pt.taps(loc)
			if !ok {
				// Nothing is added, not even weight*0: a point outside
				// every map leaves the output alone even when its weight is
				// not finite, as in Deformable-DETR's kernel.
				continue
			}
			a := weight[pt.i]
			r := pt.rows(&t, value, stride, nd, zero[:nd])
			v0, v1, v2, v3 := r[0][:nd], r[1][:nd], r[2][:nd], r[3][:nd]
			// Locals, so that the compiler keeps the weights in registers
			// instead of reloading t (whose address escaped) every channel.
			w0, w1, w2, w3 := t.w[0], t.w[1], t.w[2], t.w[3]
			for d := range o {
				// Sample first, then weight it: the order of
				// Deformable-DETR's kernel and of grid_sample followed by the
				// weighted sum.
				o[d] += a * (w0*v0[d] + w1*v1[d] + w2*v2[d] + w3*v3[d])
			}
		}
	}
}

// msDeformBackwardThread is the backward work of one group of lanes of the
// CUDA kernel (msdeform_backward in msdeform.cu): head m of query q of image
// n, all D channels. It adds to gradValue (atomicAdd on the GPU) and writes
// each point's location and weight gradients, sums over channels that the
// GPU reduces across the lanes of the group. zero holds D zeros; sink is D
// long and owned by the caller's goroutine.
func msDeformBackwardThread[T Float](p *MSDeformAttnParams, value, loc, weight, gradOut, gradValue, gradLoc, gradWeight []T, n, q, m int, zero, sink []T) {
	nd := p.D
	g := gradOut[((n*p.Lq+q)*p.M+m)*nd:][:nd]
	stride := p.M * p.D
	for l := range p.L {
		for k := range p.P {
			pt := msDeformPoint[T](p, n, q, m, l, k)
			t, ok := pt.taps(loc)
			if !ok {
				// The forward pass skipped this point, so its gradients stay
				// 0, whatever grid_sample would say exactly on the border of
				// the range (where its sample is 0 anyway).
				continue
			}
			a := weight[pt.i]
			r := pt.rows(&t, value, stride, nd, zero[:nd])
			v0, v1, v2, v3 := r[0][:nd], r[1][:nd], r[2][:nd], r[3][:nd]
			gr := pt.rows(&t, gradValue, stride, nd, sink[:nd])
			g0, g1, g2, g3 := gr[0][:nd], gr[1][:nd], gr[2][:nd], gr[3][:nd]
			w0, w1, w2, w3 := t.w[0], t.w[1], t.w[2], t.w[3]
			ly, lx := t.ly, t.lx
			hy, hx := 1-ly, 1-lx
			var dw, dx, dy T
			for d := range g {
				gd := g[d]
				dw += gd * (w0*v0[d] + w1*v1[d] + w2*v2[d] + w3*v3[d])
				// d sample/dx and d sample/dy in pixels, corners outside
				// reading 0 as in the forward pass.
				dx += gd * (hy*(v1[d]-v0[d]) + ly*(v3[d]-v2[d]))
				dy += gd * (hx*(v2[d]-v0[d]) + lx*(v3[d]-v1[d]))
				ag := a * gd
				g0[d] += w0 * ag
				g1[d] += w1 * ag
				g2[d] += w2 * ag
				g3[d] += w3 * ag
			}
			gradWeight[pt.i] = dw
			// The pixel coordinate is loc*size - 0.5, so d/dloc = size * d/dpixel.
			gradLoc[2*pt.i] = a * dx * T(pt.w)
			gradLoc[2*pt.i+1] = a * dy * T(pt.h)
		}
	}
}
