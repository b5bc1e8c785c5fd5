package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// MSDeformAttn on the GPU against its CPU twin (helpers: gpu_test.go).

// msDeformParityCase is one shape of the MSDeformAttn parity tests.
type msDeformParityCase struct {
	name         string
	n, lq, m, d  int
	levels       []Level
	p            int
	lo, hi       float64 // range of the sampling locations
	nanLocations bool
}

var msDeformParityCases = []msDeformParityCase{
	{"decoder-like", 2, 30, 8, 32, []Level{{10, 17}, {5, 9}, {3, 5}, {2, 3}}, 4, -0.1, 1.1, false},
	{"D=5 (groups of 8 lanes)", 1, 7, 3, 5, []Level{{6, 4}}, 3, 0, 1, false},
	{"D=48 (two channel passes)", 1, 5, 2, 48, []Level{{4, 4}, {2, 3}}, 2, -0.5, 1.5, false},
	// Two passes of 32 lanes x 4 channels (the c4 and red4 backward kernels).
	{"D=256 M2", 1, 4, 2, 256, []Level{{5, 6}, {3, 2}}, 2, -0.2, 1.2, false},
	{"D=1", 2, 3, 1, 1, []Level{{3, 3}}, 1, 0, 1, false},
	{"NaN locations", 1, 9, 2, 8, []Level{{5, 5}, {3, 2}}, 2, -0.2, 1.2, true},
	// More levels than travel with the launch: the table is uploaded.
	{"17 levels", 1, 4, 2, 4, manyLevels(cuda.MSDeformInlineLevels + 1), 2, 0, 1, false},
	// D = 32, the Deformable-DETR head size, which the default kernels'
	// lanes cover in one pass: as many queries as pixels, as in an encoder
	// (the locations are uniform, not around each query's pixel); many
	// samples on few pixels (many atomics on the same addresses); NaN
	// locations.
	{"encoder-like D=32", 2, 321, 8, 32, []Level{{12, 20}, {6, 10}, {3, 5}, {2, 3}}, 4, -0.1, 1.1, false},
	{"crowded D=32", 1, 50, 4, 32, []Level{{2, 2}, {1, 3}}, 4, -0.3, 1.3, false},
	{"NaN locations D=32", 1, 13, 2, 32, []Level{{5, 5}, {3, 2}}, 2, -0.2, 1.2, true},
}

// inputs draws the case's shape and its value, sampling locations, attention
// weights and output gradient from rng.
func (c msDeformParityCase) inputs(t *testing.T, rng *rand.Rand, dt tensor.Dtype) (sh msDeformShape, value, loc, weight, gy *tensor.Dense) {
	s := 0
	for _, lv := range c.levels {
		s += lv.H * lv.W
	}
	l := len(c.levels)
	sh = msDeformShape{n: c.n, s: s, m: c.m, d: c.d, lq: c.lq, l: l, p: c.p, levels: c.levels, dt: dt}
	value = randTensor(rng, dt, -1, 1, c.n, s, c.m, c.d)
	loc = randTensor(rng, dt, c.lo, c.hi, c.n, c.lq, c.m, l, c.p, 2)
	if c.nanLocations {
		v := toFloat64s(t, loc)
		for j := 0; j < len(v); j += 7 {
			v[j] = math.NaN()
		}
		loc = fromFloat64s(dt, v, loc.Shape()...)
	}
	weight = randTensor(rng, dt, 0, 1, c.n, c.lq, c.m, l, c.p)
	gy = randTensor(rng, dt, -1, 1, c.n, c.lq, c.m*c.d)
	return sh, value, loc, weight, gy
}

// withMSDeformTuning runs f with tuning set on dev in place of msdeform's
// rules, then puts back what dev held before.
func withMSDeformTuning(dev *backend.Device, tuning msDeformTuning, f func()) {
	prev := dev.Value(msDeformTuningKey{})
	dev.SetValue(msDeformTuningKey{}, tuning)
	defer dev.SetValue(msDeformTuningKey{}, prev)
	f()
}

func TestGPUMSDeformAttnParity(t *testing.T) {
	dev := gpu(t)
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for i, c := range msDeformParityCases {
			t.Run(fmt.Sprintf("%v/%s", dt, c.name), func(t *testing.T) {
				sh, value, loc, weight, gy := c.inputs(t, rand.New(rand.NewPCG(uint64(i), 4)), dt)
				parity(t, dev, msDeformAttnOp(sh), dt, value, loc, weight)
				parity(t, dev, msDeformGradForParity(sh), dt, value, loc, weight, gy)
			})
		}
	}
}

// A location whose pixel coordinate loc*W - 0.5 is an integer when the
// product is rounded before the subtraction, as the CPU twin does, and
// falls just below it when the two are fused into one multiply-add: every
// kernel must round as the CPU does and pick the same cell, or its location
// gradient is a whole pixel step off (found on TARGETS.md's encoder
// locations, level 2: 0.773809493 * 42). Every point of every query sits
// on that coordinate; the other coordinate is inside a pixel.
func TestGPUMSDeformAttnCellBoundary(t *testing.T) {
	dev := gpu(t)
	const w = 42
	x := float32(0.773809493)
	if rounded, fused := float32(x*float32(w))-0.5, float32(math.FMA(float64(x), w, -0.5)); math.Floor(float64(rounded)) == math.Floor(float64(fused)) {
		t.Fatalf("%v*%d - 0.5: %v rounded twice, %v fused: the same cell, the test shows nothing", x, w, rounded, fused)
	}
	sh := msDeformShape{n: 1, s: 3 * w, m: 8, d: 32, lq: 5, l: 1, p: 2, levels: []Level{{3, w}}, dt: tensor.Float32}
	rng := rand.New(rand.NewPCG(3, 9))
	locs := make([]float64, sh.locShape().TotalSize())
	for i := 0; i < len(locs); i += 2 {
		locs[i], locs[i+1] = float64(x), 0.4
	}
	value := randTensor(rng, tensor.Float32, -1, 1, sh.valueShape()...)
	loc := fromFloat64s(tensor.Float32, locs, sh.locShape()...)
	weight := randTensor(rng, tensor.Float32, 0, 1, sh.weightShape()...)
	gy := randTensor(rng, tensor.Float32, -1, 1, sh.outShape()...)
	// The default (msdeform_sm90a.cu's on compute capability 9.0), then
	// msdeform.cu's float32 default.
	for _, k := range []cuda.Kernel[cuda.MSDeformParams]{"", cuda.MSDeformBwdAtomicC4Rs4Occ3F32} {
		name := k.Name()
		if k == "" {
			name = "default"
		}
		t.Run("kernel="+name, func(t *testing.T) {
			var tuning msDeformTuning
			if k != "" {
				tuning.kernel = func(bool, tensor.Dtype) msDeformKernel { return msDeformKernel{k: k, vec: 4} }
			}
			withMSDeformTuning(dev, tuning, func() {
				parity(t, dev, msDeformGradForParity(sh), tensor.Float32, value, loc, weight, gy)
			})
		})
	}
}

// parityUnits returns an op's outputs in the units in which the tolerance
// table states its bounds (see TolParity32). The one output it changes is
// MSDeformAttn's location gradient: d/dloc = size * d/dpixel, a sum over
// channels and corners of terms of order 1 in pixel units, times the level's
// width or height. The sum's rounding error is what the GPU and the CPU twin
// differ by (both round the pixel coordinate alike, so they take the same
// cell), and it scales with the terms; so the gradient is compared in pixel
// units.
// Rel bounds it alike in either unit; Abs, stated for terms of order 1,
// applies to the pixel-unit sum.
func parityUnits(op G.Op, v []float64) []float64 {
	if g, ok := op.(msDeformGradParity); ok {
		nv, nl := g.sh.valueShape().TotalSize(), g.sh.locShape().TotalSize()
		g.sh.locGradsInPixels(v[nv : nv+nl])
	}
	return v
}

// msDeformGradParity is MSDeformAttn's backward op as parity takes it: with
// its shape, by which parityUnits finds the location gradients.
type msDeformGradParity struct {
	*specOp
	sh msDeformShape
}

func msDeformGradForParity(sh msDeformShape) msDeformGradParity {
	return msDeformGradParity{msDeformAttnGradOp(sh), sh}
}

// locGradsInPixels divides each location gradient (x, y), laid out as the
// sampling locations [N, Lq, M, L, P, 2], by its level's width and height.
func (s msDeformShape) locGradsInPixels(gl []float64) {
	for i := 0; i < len(gl); i += 2 {
		lv := s.levels[(i/2/s.p)%s.l]
		gl[i] /= float64(lv.W)
		gl[i+1] /= float64(lv.H)
	}
}
