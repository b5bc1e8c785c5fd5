package kernels

import (
	"fmt"
	"math"
)

// RoIAlignParams describes one RoIAlign call: input [N,C,H,W], RoIs [K,5]
// rows (batch_index, x1, y1, x2, y2) in input-image coordinates, output
// [K,C,PooledH,PooledW]. The CUDA kernels take the same struct by value.
type RoIAlignParams struct {
	N, C, H, W       int
	K                int
	PooledH, PooledW int
	SpatialScale     float64
	SamplingRatio    int  // <= 0: adaptive, ceil(roi_size/pooled_size) per bin side
	Aligned          bool // subtract half a pixel after scaling, as torchvision's aligned=True
	// Level, if not nil, restricts the call to the RoIs of one level of a
	// feature pyramid (MultiLevelRoIAlign): the others are skipped, their
	// rows of the output left as they are and nothing scattered for them.
	Level *RoILevel
}

// RoILevel is one level of a feature pyramid as MultiLevelRoIAlign assigns
// RoIs to levels: the RoIs whose RoILevelSize lies in [Lo, Hi). The CUDA
// kernels take it as level_lo and level_hi.
type RoILevel struct {
	Lo, Hi float64
}

// Holds reports whether the RoI with corners (x1, y1) and (x2, y2) is of
// the level.
func (l *RoILevel) Holds(x1, y1, x2, y2 float64) bool {
	s := RoILevelSize(x1, y1, x2, y2)
	return s >= l.Lo && s < l.Hi
}

// RoILevelSize is the size by which MultiLevelRoIAlign gives a RoI with
// corners (x1, y1) and (x2, y2) its level: sqrt(w*h), -Inf for an empty,
// inverted or NaN box (the finest level), and at most math.MaxFloat64, so
// that an infinite box stays below a bound of +Inf (the coarsest level).
// roialign.cu's roi_level_size computes it the same way, bit for bit.
func RoILevelSize(x1, y1, x2, y2 float64) float64 {
	w, h := x2-x1, y2-y1
	if !(w > 0 && h > 0) {
		return math.Inf(-1)
	}
	return min(math.Sqrt(w*h), math.MaxFloat64)
}

// inLevel reports whether RoI row roi is one the call works on.
func inLevel[T Float](p *RoIAlignParams, roi []T) bool {
	if p.Level == nil {
		return true
	}
	return p.Level.Holds(float64(roi[1]), float64(roi[2]), float64(roi[3]), float64(roi[4]))
}

// MaxAdaptiveGrid bounds the samples per bin side that adaptive sampling may
// ask for (ceil(roi_size/pooled_size)). Real RoIs need a few; a RoI needing
// more than this spans thousands of feature pixels per bin and would take
// minutes, so it is reported as an error instead.
const MaxAdaptiveGrid = 1024

// roiGeom is the geometry torchvision derives from one RoI row.
type roiGeom[T Float] struct {
	skip           bool // another level's RoI (RoIAlignParams.Level)
	batch          int
	startY, startX T
	binH, binW     T
	gridH, gridW   int // samples per bin side, >= 0
	count          T   // divisor of each bin's sum, max(gridH*gridW, 1)
}

// roiGeometry computes a RoI's geometry exactly as torchvision does, in T.
// It returns an error for a batch index outside [0,N) (or NaN) and for an
// adaptive grid over MaxAdaptiveGrid.
func roiGeometry[T Float](p *RoIAlignParams, k int, roi []T) (g roiGeom[T], err error) {
	// torchvision truncates the batch index to an int; a value in (-1, N)
	// truncates into [0, N). Written so NaN fails.
	b := roi[0]
	if !(b > -1 && b < T(p.N)) {
		return g, fmt.Errorf("roi %d has batch index %v, want a value in [0, %d)", k, b, p.N)
	}
	g.batch = int(b)
	scale := T(p.SpatialScale)
	var offset T
	if p.Aligned {
		offset = 0.5
	}
	// The conversions round each product before the subtraction (the Go
	// spec lets a compiler fuse them otherwise), as the GPU kernels do
	// (mul_sub_rn in bilinear.cuh): the adaptive grid is a ceiling of what
	// follows.
	g.startX = T(roi[1]*scale) - offset
	g.startY = T(roi[2]*scale) - offset
	endX := T(roi[3]*scale) - offset
	endY := T(roi[4]*scale) - offset
	roiW := endX - g.startX
	roiH := endY - g.startY
	if !p.Aligned {
		// Legacy mode forces malformed RoIs to be at least 1x1. max keeps
		// a NaN size NaN (as torchvision's CPU std::max does): the RoI's
		// samples are then NaN, outside the map, and it pools zeros, as
		// one with a NaN corner does in aligned mode. roi_geometry in
		// roialign.cu does the same.
		roiW = max(roiW, 1)
		roiH = max(roiH, 1)
	}
	g.binH = roiH / T(p.PooledH)
	g.binW = roiW / T(p.PooledW)
	if p.SamplingRatio > 0 {
		g.gridH, g.gridW = p.SamplingRatio, p.SamplingRatio
	} else {
		if g.gridH, err = adaptiveGrid(g.binH, k); err != nil {
			return g, err
		}
		if g.gridW, err = adaptiveGrid(g.binW, k); err != nil {
			return g, err
		}
	}
	g.count = T(max(g.gridH*g.gridW, 1))
	return g, nil
}

// adaptiveGrid is ceil(binSize) as an int. A RoI of negative size (possible
// with aligned=True) gets no samples, as in torchvision, whose loops do not
// run; a NaN or infinite size also gets none, since every sample of such a
// RoI lies outside the map anyway.
func adaptiveGrid[T Float](binSize T, k int) (int, error) {
	c := math.Ceil(float64(binSize))
	switch {
	case !(c > 0): // also NaN
		return 0, nil
	case math.IsInf(c, 1):
		return 0, nil
	case c > MaxAdaptiveGrid:
		return 0, fmt.Errorf("roi %d needs %v samples per bin side with adaptive sampling, more than %d: use a fixed SamplingRatio", k, c, MaxAdaptiveGrid)
	}
	return int(c), nil
}

// planBins fills tp with the taps of every sample of every bin of a RoI,
// bin-major then sample-major (iy, ix), in the order torchvision sums them.
// A sample outside the map gets zero taps. tp must hold
// PooledH*PooledW*gridH*gridW taps.
func planBins[T Float](p *RoIAlignParams, g *roiGeom[T], tp []taps[T]) {
	i := 0
	for ph := range p.PooledH {
		for pw := range p.PooledW {
			for iy := range g.gridH {
				// Same expression and evaluation order as torchvision, so the
				// float32 sample positions match it bit for bit.
				// T(...) rounds b*bin before the sum, as sample_coord in
				// bilinear.cuh does: a fused rounding can put a sample on
				// the other side of the map's edge (see there).
				y := g.startY + T(T(ph)*g.binH) + T(float32(iy)+0.5)*g.binH/T(g.gridH)
				for ix := range g.gridW {
					x := g.startX + T(T(pw)*g.binW) + T(float32(ix)+0.5)*g.binW/T(g.gridW)
					tp[i], _ = roiTaps(y, x, p.H, p.W)
					i++
				}
			}
		}
	}
}

// RoIAlignForward computes out[k,c,ph,pw], the average of bilinear samples
// of x over bin (ph,pw) of RoI k. The taps of each RoI are computed once and
// shared by all channels. It returns an error, before writing anything, for a
// RoI with a bad batch index or an excessive adaptive grid. With p.Level it
// writes the rows of that level's RoIs only, and checks only those.
func RoIAlignForward[T Float](p RoIAlignParams, x, rois, out []T) error {
	geoms, err := roiGeometries(&p, rois)
	if err != nil {
		return err
	}
	bins := p.PooledH * p.PooledW
	mapSize := p.H * p.W
	parallelFor(p.K, 1, func(k0, k1 int) {
		var tp []taps[T]
		for k := k0; k < k1; k++ {
			g := &geoms[k]
			if g.skip {
				continue
			}
			samples := g.gridH * g.gridW
			tp = grow(tp, bins*samples)
			planBins(&p, g, tp)
			for c := range p.C {
				m := x[(g.batch*p.C+c)*mapSize:][:mapSize]
				o := out[(k*p.C+c)*bins:][:bins]
				for b := range bins {
					var sum T
					for _, t := range tp[b*samples : (b+1)*samples] {
						sum += t.sample(m)
					}
					o[b] = sum / g.count
				}
			}
		}
	})
	return nil
}

// RoIAlignBackward computes the gradient of RoIAlign with respect to x: it
// zeroes gradX, then scatters gradOut[k,c,ph,pw]*w/count onto the four taps
// of every sample of every bin. It is the CPU twin of the atomicAdd kernel:
// here work is split by channel so that no two goroutines add to the same
// element, and RoIs are visited in order, so the result is deterministic.
// With p.Level only that level's RoIs scatter (and are checked).
func RoIAlignBackward[T Float](p RoIAlignParams, rois, gradOut, gradX []T) error {
	geoms, err := roiGeometries(&p, rois)
	if err != nil {
		return err
	}
	clear(gradX)
	bins := p.PooledH * p.PooledW
	mapSize := p.H * p.W
	// Plan the taps of a block of RoIs in parallel, then scatter the block in
	// parallel over channels. Blocks bound the memory the plans take.
	const block = 64
	plans := make([][]taps[T], block)
	for k0 := 0; k0 < p.K; k0 += block {
		k1 := min(k0+block, p.K)
		parallelFor(k1-k0, 1, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				g := &geoms[k0+i]
				if g.skip {
					continue
				}
				plans[i] = grow(plans[i], bins*g.gridH*g.gridW)
				planBins(&p, g, plans[i])
			}
		})
		parallelFor(p.C, 1, func(c0, c1 int) {
			for k := k0; k < k1; k++ {
				g := &geoms[k]
				if g.skip {
					continue
				}
				samples := g.gridH * g.gridW
				tp := plans[k-k0]
				for c := c0; c < c1; c++ {
					m := gradX[(g.batch*p.C+c)*mapSize:][:mapSize]
					gb := gradOut[(k*p.C+c)*bins:][:bins]
					for b := range bins {
						grad := gb[b]
						for _, t := range tp[b*samples : (b+1)*samples] {
							for i := range 4 {
								if t.in[i] {
									// (g*w)/count, torchvision's order of operations.
									m[t.off[i]] += grad * t.w[i] / g.count
								}
							}
						}
					}
				}
			}
		})
	}
	return nil
}

func roiGeometries[T Float](p *RoIAlignParams, rois []T) ([]roiGeom[T], error) {
	geoms := make([]roiGeom[T], p.K)
	for k := range p.K {
		if !inLevel(p, rois[k*5:k*5+5]) {
			geoms[k].skip = true
			continue
		}
		g, err := roiGeometry(p, k, rois[k*5:k*5+5])
		if err != nil {
			return nil, err
		}
		geoms[k] = g
	}
	return geoms, nil
}

// grow returns s resized to n elements, reusing its memory when it can.
func grow[E any](s []E, n int) []E {
	if cap(s) < n {
		return make([]E, n)
	}
	return s[:n]
}
