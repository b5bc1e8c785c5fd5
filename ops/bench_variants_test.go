package ops

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/kernels/cuda"
)

// BenchmarkGPUMSDeformAttnVariants times every kernel of msdeform.cu (and
// msdeform_sm90a.cu), defaults and variants (make kernels VARIANTS=1), to
// choose msDeformKernelFor's defaults, forward and backward, on every
// TARGETS.md case.
func BenchmarkGPUMSDeformAttnVariants(b *testing.B) {
	// The _sorted kernels sort the queries first (queryOrder), whatever Lq.
	forward := append([]msDeformKernel{{k: cuda.MSDeformFwdScalarF32, vec: 1}}, msDeformForwardVariants...)
	for _, c := range msDeformPresets {
		sh, value, loc, weight, gy := msDeformBenchInputs(c)
		vb := float64(4 * c.n * sh.s * c.m * c.d)
		lb := float64(4 * c.n * c.lq * c.m * sh.l * c.p * 3)
		ob := float64(4 * c.n * c.lq * c.m * c.d)
		for _, k := range forward {
			tuning := msDeformTuning{kernel: func(bool, tensor.Dtype) msDeformKernel { return k }}
			b.Run("impl=cuda/case="+c.name+"/kernel="+k.k.Name(), func(b *testing.B) {
				dev := gpu(b)
				skipUnrunnableMSDeform(b, dev, k)
				withMSDeformTuning(dev, tuning, func() {
					runCase(b, "cuda", msDeformAttnOp(sh), []*tensor.Dense{value, loc, weight}, vb+lb+ob)
				})
			})
		}
		for _, k := range msDeformBackwardVariants[sh.dt] {
			tuning := msDeformTuning{kernel: func(bool, tensor.Dtype) msDeformKernel { return k }}
			b.Run("impl=cuda/case="+c.name+"/kernel="+k.k.Name(), func(b *testing.B) {
				dev := gpu(b)
				skipUnrunnableMSDeform(b, dev, k)
				withMSDeformTuning(dev, tuning, func() {
					runCase(b, "cuda", msDeformAttnGradOp(sh), []*tensor.Dense{value, loc, weight, gy}, 2*(vb+lb)+ob)
				})
			})
		}
	}
}

// BenchmarkGPURoIAlignVariants times every kernel of roialign.cu on the
// TARGETS.md cases, with the inputs of BenchmarkSuiteRoIAlign, to choose
// roiAlignKernelFor's defaults: forward channels-last after a transpose
// (tap by tap, separable, separable with 16-byte loads) or NCHW (a thread
// a bin with 4 or 8 channels, lanes on sample columns); backward
// channels-last, tap by tap or separable (scalar atomics, or
// roialign_sm90a.cu's vector reductions). The variants run where the build
// has them (make kernels VARIANTS=1).
func BenchmarkGPURoIAlignVariants(b *testing.B) {
	for _, c := range roiPresets {
		s, x, rois, gy := roiBenchInputs(c)
		bytes := float64(4*c.n*c.c*c.h*c.w) + float64(4*c.k*c.c*c.pooled*c.pooled)
		for _, order := range []string{"given", "sorted"} {
			r := rois
			if order == "sorted" {
				r = spatialOrder(rois)
			}
			for _, backward := range []bool{false, true} {
				op, in, pass := G.Op(roiAlignOp(s)), []*tensor.Dense{x, r}, "fwd"
				if backward {
					op, in, pass = roiAlignGradOp(s), []*tensor.Dense{r, gy}, "bwd"
				}
				kvs := roiAlignVariants(backward, s.dt)
				if backward {
					kvs = append(kvs, roiAlignRed4Backwards...)
				} else {
					kvs = append(kvs, roiAlignVec4Forwards...)
					kvs = append(kvs, roiAlignColsVariants(s)...)
				}
				for _, kv := range kvs {
					b.Run("impl=cuda/case="+c.name+"/pass="+pass+"/order="+order+"/kernel="+kv.String(), func(b *testing.B) {
						dev := gpu(b)
						if kv.k.Module() != "roialign" {
							if why := roiAlignRed4Skip(dev, s); why != "" {
								b.Skip(why)
							}
						}
						skipUnbuiltVariant(b, kv.k.Module(), kv.k.Name())
						withRoIAlignKernel(dev, backward, kv, func() { runCase(b, "cuda", op, in, bytes) })
					})
				}
			}
		}
	}
}

// BenchmarkGPURoIAlignSlices times the backward scatter kernels with the
// channels in 1, 2, 4 or 8 slices (roiAlignShape.slices) on the fixed-ratio
// TARGETS.md cases.
func BenchmarkGPURoIAlignSlices(b *testing.B) {
	defer func() { roiAlignSlicesOverride = 0 }()
	for _, c := range roiPresets {
		if c.sampling <= 0 {
			continue
		}
		// The suite's inputs (the map itself is not needed by the backward).
		s, _, rois, gy := roiBenchInputs(c)
		bytes := float64(4*c.n*c.c*c.h*c.w) + float64(4*c.k*c.c*c.pooled*c.pooled)
		for _, slices := range []int{1, 2, 4, 8} {
			roiAlignSlicesOverride = slices
			b.Run(fmt.Sprintf("impl=cuda/case=%s/slices=%d", c.name, slices), func(b *testing.B) {
				runCase(b, "cuda", roiAlignGradOp(s), []*tensor.Dense{rois, gy}, bytes)
			})
		}
	}
}

// spatialOrder returns float32 RoIs [K,5] sorted by image, then by bands of
// 64 pixels of their centre's y, then by their centre's x: an experiment on
// how much the order in which blocks meet the RoIs matters to the cache.
func spatialOrder(rois *tensor.Dense) *tensor.Dense {
	v := rois.Float32s()
	k := len(v) / 5
	idx := make([]int, k)
	for i := range idx {
		idx[i] = i
	}
	key := func(i int) (float32, float32, float32) {
		r := v[5*i : 5*i+5]
		return r[0], float32(int((r[2]+r[4])/2) / 64), (r[1] + r[3]) / 2
	}
	sort.SliceStable(idx, func(a, b int) bool {
		a0, a1, a2 := key(idx[a])
		b0, b1, b2 := key(idx[b])
		if a0 != b0 {
			return a0 < b0
		}
		if a1 != b1 {
			return a1 < b1
		}
		return a2 < b2
	})
	out := make([]float32, 0, len(v))
	for _, i := range idx {
		out = append(out, v[5*i:5*i+5]...)
	}
	return tensor.New(tensor.WithShape(k, 5), tensor.WithBacking(out))
}

// BenchmarkGPUMSDeformAttnQueryOrder times the default MSDeformAttn forward
// on the TARGETS cases with the queries as drawn, taken in the op's spatial
// order (msdeform_sort_cells; sort=on, its cost included) or not
// (sort=off), and with the queries sorted beforehand on the host (by head
// 0's first point at level 0, in bands of 4 rows, then by column): how much
// the order in which warps meet the queries matters to the caches, and how
// much of that the op's own sort gets. The backward does not sort (it
// gained nothing from presorted queries).
func BenchmarkGPUMSDeformAttnQueryOrder(b *testing.B) {
	for _, c := range msDeformPresets {
		sh, value, loc, weight, _ := msDeformBenchInputs(c)
		vb := float64(4 * c.n * sh.s * c.m * c.d)
		lb := float64(4 * c.n * c.lq * c.m * sh.l * c.p * 3)
		ob := float64(4 * c.n * c.lq * c.m * c.d)
		perm := queryOrder(loc, c.n, c.lq, c.levels[0])
		presorted := []*tensor.Dense{value, permuteQueries(loc, perm), permuteQueries(weight, perm)}
		for _, v := range []struct {
			name     string
			override int
			in       []*tensor.Dense
		}{
			{"order=given/sort=off", -1, []*tensor.Dense{value, loc, weight}},
			{"order=given/sort=on", 1, []*tensor.Dense{value, loc, weight}},
			{"order=given/sort=on/band=2", 1, []*tensor.Dense{value, loc, weight}},
			{"order=given/sort=on/band=4", 1, []*tensor.Dense{value, loc, weight}},
			{"order=given/sort=on/band=16", 1, []*tensor.Dense{value, loc, weight}},
			{"order=presorted/sort=off", -1, presorted},
		} {
			b.Run("impl=cuda/case="+c.name+"/pass=fwd/"+v.name, func(b *testing.B) {
				tuning := msDeformTuning{order: v.override}
				if _, rows, ok := strings.Cut(v.name, "/band="); ok {
					tuning.bandRows, _ = strconv.Atoi(rows)
				}
				withMSDeformTuning(gpu(b), tuning, func() { runCase(b, "cuda", msDeformAttnOp(sh), v.in, vb+lb+ob) })
			})
		}
	}
}

// queryOrder sorts each image's queries of loc [N,Lq,...] by the first
// location of each (head 0, level 0, point 0): by bands of 4 rows of
// level lv, then by column. It returns, for each new position, the query
// (n*lq + q) to put there.
func queryOrder(loc *tensor.Dense, n, lq int, lv Level) []int {
	v := loc.Float32s()
	per := len(v) / (n * lq)
	perm := make([]int, n*lq)
	for i := range perm {
		perm[i] = i
	}
	key := func(i int) (int, float32) {
		x, y := v[i*per], v[i*per+1]
		return i/lq*1_000_000 + int(y*float32(lv.H)/4), x
	}
	sort.SliceStable(perm, func(a, b int) bool {
		a0, a1 := key(perm[a])
		b0, b1 := key(perm[b])
		if a0 != b0 {
			return a0 < b0
		}
		return a1 < b1
	})
	return perm
}

// permuteQueries returns t [N,Lq,...] (float32) with query rows in perm's order.
func permuteQueries(t *tensor.Dense, perm []int) *tensor.Dense {
	v := t.Float32s()
	per := len(v) / len(perm)
	out := make([]float32, len(v))
	for i, src := range perm {
		copy(out[i*per:(i+1)*per], v[src*per:(src+1)*per])
	}
	return tensor.New(tensor.WithShape(t.Shape().Clone()...), tensor.WithBacking(out))
}
