package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// RoIAlign on the GPU against its CPU twin (helpers: gpu_test.go).

func TestGPURoIAlignParity(t *testing.T) {
	dev := gpu(t)
	type rcase struct {
		name       string
		n, c, h, w int
		k          int
		cfg        RoIAlignConfig
		roiScale   float64 // image size / feature size, for drawing boxes
	}
	cases := []rcase{
		{"aligned/sampling=2", 2, 3, 9, 11, 25, RoIAlignConfig{3, 2, 0.25, 2, true}, 4},
		{"legacy/sampling=2", 2, 3, 9, 11, 25, RoIAlignConfig{3, 2, 0.25, 2, false}, 4},
		{"aligned/adaptive", 2, 5, 17, 13, 30, RoIAlignConfig{7, 7, 0.5, 0, true}, 2},
		{"legacy/adaptive", 2, 5, 17, 13, 30, RoIAlignConfig{7, 7, 0.5, 0, false}, 2},
		{"sampling=1/pooled=1x4", 1, 2, 6, 7, 9, RoIAlignConfig{1, 4, 0.125, 1, false}, 8},
		{"zero rois", 2, 3, 9, 11, 0, RoIAlignConfig{2, 2, 1, 2, true}, 1},
		// 70 channels: channel groups with a remainder; 300 RoIs: many blocks.
		{"channel groups", 2, 70, 20, 24, 300, RoIAlignConfig{7, 7, 0.25, 2, true}, 4},
		// C % 4 == 0, a last group of 4 channels, 9 samples a bin: on
		// compute capability 9.0 the float32 backward is a vector-
		// reduction kernel (roialign_bwd_nhwc_sep_red4_f32).
		{"channels % 4 == 0", 2, 36, 15, 17, 60, RoIAlignConfig{5, 4, 0.5, 3, true}, 2},
		// C % 4 == 0, 14x14 bins from far below a pixel to a few: taps of
		// a bin share pixels.
		{"channels % 4 == 0/14x14", 2, 40, 30, 34, 50, RoIAlignConfig{14, 14, 0.25, 2, true}, 4},
		{"channels % 4 == 0/adaptive", 2, 8, 17, 13, 30, RoIAlignConfig{7, 7, 0.5, 0, true}, 2},
		// Large boxes: bins with more adaptive samples than shared memory
		// holds take the on-the-fly path (with C % 4 == 0, also in the
		// vector-reduction kernels).
		{"huge adaptive bins", 1, 4, 64, 64, 5, RoIAlignConfig{1, 1, 1, 0, true}, 0.25},
		// Boxes whose bin size is an integer when roi*scale is rounded
		// before the offset is subtracted, as the CPU twin does, and just
		// above or below it when the two are fused into one multiply-add:
		// the adaptive sample count (its ceiling) must agree (boundaryRoIs).
		{"adaptive/bin size at an integer", 1, 8, 70, 70, 2, RoIAlignConfig{7, 7, 1.0 / 3, 0, true}, 3},
		// A box whose sample lies an ulp below -1 (dropped) when start +
		// b*bin is rounded in two steps, as the CPU twin does, and an ulp
		// above it (kept) when fused (edgeRoIs).
		{"sampling=2/sample an ulp from the edge", 1, 8, 20, 20, 1, RoIAlignConfig{7, 7, 0.25, 2, true}, 4},
		// Legacy mode's malformed boxes (malformedRoIs): empty and
		// inverted ones pool 1x1 pixel, a NaN coordinate pools zeros.
		{"legacy/malformed boxes", 2, 3, 9, 11, 8, RoIAlignConfig{3, 2, 0.25, 1, false}, 4},
		{"legacy/malformed boxes/adaptive", 2, 4, 9, 11, 8, RoIAlignConfig{3, 2, 0.25, 0, false}, 4},
	}
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for i, c := range cases {
			t.Run(fmt.Sprintf("%v/%s", dt, c.name), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(i), 3))
				x := randTensor(rng, dt, -1, 1, c.n, c.c, c.h, c.w)
				var rois *tensor.Dense
				if c.k == 0 {
					rois = tensor.New(tensor.Of(dt), tensor.WithShape(0, 5))
				} else {
					rois = randomRoIs(rng, dt, c.k, c.n, float64(c.h)*c.roiScale, float64(c.w)*c.roiScale)
				}
				if c.name == "huge adaptive bins" {
					rois = fromFloat64s(dt, []float64{0, 0, 0, 16, 16, 0, 2, 3, 15, 14, 0, -3, -3, 20, 20, 0, 0, 0, 1, 16, 0, 5, 5, 6, 6}, 5, 5)
				}
				if c.name == "adaptive/bin size at an integer" {
					rois = boundaryRoIs(t, dt, c.cfg)
				}
				if c.name == "sampling=2/sample an ulp from the edge" {
					rois = edgeRoIs(t, dt, c.cfg)
				}
				if strings.HasPrefix(c.name, "legacy/malformed boxes") {
					rois = malformedRoIs(dt)
				}
				s := roiAlignShape{cfg: c.cfg, n: c.n, c: c.c, h: c.h, w: c.w, k: c.k, dt: dt}
				parity(t, dev, roiAlignOp(s), dt, x, rois)
				gy := randTensor(rng, dt, -1, 1, c.k, c.c, c.cfg.PooledH, c.cfg.PooledW)
				parity(t, dev, roiAlignGradOp(s), dt, rois, gy)
				// Every kernel, not only the default (the variants where
				// this build has them).
				for _, kv := range roiAlignVariants(false, dt) {
					t.Run(kv.String(), func(t *testing.T) {
						skipUnbuiltVariant(t, kv.k.Module(), kv.k.Name())
						withRoIAlignKernel(dev, false, kv, func() { parity(t, dev, roiAlignOp(s), dt, x, rois) })
					})
				}
				for _, kv := range roiAlignVariants(true, dt) {
					t.Run(kv.String(), func(t *testing.T) {
						skipUnbuiltVariant(t, kv.k.Module(), kv.k.Name())
						withRoIAlignKernel(dev, true, kv, func() { parity(t, dev, roiAlignGradOp(s), dt, rois, gy) })
					})
				}
				if !s.colsFit() {
					t.Run("roialign_fwd_nchw_cols", func(t *testing.T) {
						t.Skip("needs a sampling ratio of 1 to 4 and PooledW*ratio <= 32")
					})
				}
				for _, kv := range roiAlignColsVariants(s) {
					t.Run(kv.String(), func(t *testing.T) {
						skipUnbuiltVariant(t, kv.k.Module(), kv.k.Name())
						withRoIAlignKernel(dev, false, kv, func() { parity(t, dev, roiAlignOp(s), dt, x, rois) })
					})
				}
				for _, kv := range roiAlignVec4Forwards {
					t.Run(kv.String(), func(t *testing.T) {
						if dt != tensor.Float32 || c.c%4 != 0 {
							t.Skip("float32 with C % 4 == 0 only")
						}
						skipUnbuiltVariant(t, kv.k.Module(), kv.k.Name())
						withRoIAlignKernel(dev, false, kv, func() { parity(t, dev, roiAlignOp(s), dt, x, rois) })
					})
				}
				for _, kv := range roiAlignRed4Backwards {
					t.Run(kv.String(), func(t *testing.T) {
						if why := roiAlignRed4Skip(dev, s); why != "" {
							t.Skip(why)
						}
						skipUnbuiltVariant(t, kv.k.Module(), kv.k.Name())
						withRoIAlignKernel(dev, true, kv, func() { parity(t, dev, roiAlignGradOp(s), dt, rois, gy) })
					})
				}
			})
		}
	}
}

// roiAlignRed4Skip says why roialign_sm90a.cu's kernels do not apply to s
// on dev, or "" when they do.
func roiAlignRed4Skip(dev *backend.Device, s roiAlignShape) string {
	switch {
	case s.dt != tensor.Float32:
		return "float32 only"
	case s.c%4 != 0:
		return fmt.Sprintf("C = %d: needs C %% 4 == 0", s.c)
	}
	k := cuda.RoIAlignBwdNHWCSepRed4F32
	if err := sm90aError(dev, k.Module(), k.Name()); err != nil {
		return fmt.Sprintf("roialign_sm90a does not run here: %v", err)
	}
	return ""
}

// roiAlignVariants lists the forward or backward kernels of roialign.cu
// for dt that take the default launch shape, the variants among them: the
// channels-last ones and, forward, a thread a bin with 4 or 8 channels.
func roiAlignVariants(backward bool, dt tensor.Dtype) []roiAlignKernel {
	pick := func(p roiAlignPicker) cuda.Kernel[cuda.RoIAlignParams] { return roiAlignPick(dt, p) }
	if backward {
		return []roiAlignKernel{{k: pick(cuda.RoIAlignBwdNHWCTapsAtomic)}, {k: pick(cuda.RoIAlignBwdNHWCSepAtomic)}}
	}
	vs := []roiAlignKernel{
		{k: pick(cuda.RoIAlignFwdNHWCTaps)}, {k: pick(cuda.RoIAlignFwdNHWCSep)},
		{k: pick(cuda.RoIAlignFwdNCHWBinC4), cpt: 4}, {k: pick(cuda.RoIAlignFwdNCHWBinC8), cpt: 8},
	}
	if dt == tensor.Float32 {
		vs = append(vs, roiAlignKernel{k: cuda.RoIAlignFwdNCHWBinC4Occ4F32, cpt: 4})
	}
	return vs
}

// roiAlignColsVariants are the roialign_fwd_nchw_cols kernels for s's
// sampling ratio, row-major and channel-major (_cmajor), with the channels
// in colsSlices' count or 4, 16 or 64 slices; none where s does not fit
// them (colsFit).
func roiAlignColsVariants(s roiAlignShape) []roiAlignKernel {
	if !s.colsFit() {
		return nil
	}
	var kvs []roiAlignKernel
	for _, cm := range []bool{false, true} {
		for _, slices := range []int{0, 4, 16, 64} {
			kvs = append(kvs, roiAlignColsKernel(s, cm, slices))
		}
	}
	return kvs
}

// roiAlignVec4Forwards are launches of the separable forward with 16-byte
// loads (float32, C % 4 == 0; roialign_fwd_nhwc_sep_vec4): registers capped
// for 4 blocks per SM (occ4, the default) or not; the bins in chunks of a
// tile (7x7 bins: 2 blocks a RoI), of 16 (4 blocks) or, with channel
// slices, of up to 64 (one block); the channels in 1, 2, 4 or 8 slices.
var roiAlignVec4Forwards = func() []roiAlignKernel {
	vec4, occ4 := cuda.RoIAlignFwdNHWCSepVec4F32, cuda.RoIAlignFwdNHWCSepVec4Occ4F32
	return []roiAlignKernel{
		{k: vec4}, {k: vec4, chunk: 16}, {k: vec4, slices: 2}, {k: vec4, slices: 4}, {k: vec4, slices: 8},
		{k: vec4, chunk: 64, slices: 4}, {k: vec4, chunk: 64, slices: 8},
		{k: occ4, slices: 4}, {k: occ4, slices: 8}, {k: occ4, chunk: 64, slices: 4}, {k: occ4, chunk: 64, slices: 8},
	}
}()

// roiAlignRed4Backwards are roialign_sm90a.cu's float32 backwards with
// vector reductions, tap by tap and separable (the default on compute
// capability 9.0).
var roiAlignRed4Backwards = []roiAlignKernel{{k: cuda.RoIAlignBwdNHWCTapsRed4F32}, {k: cuda.RoIAlignBwdNHWCSepRed4F32}}

// withRoIAlignKernel runs f with kv as dev's kernel for its direction.
func withRoIAlignKernel(dev *backend.Device, backward bool, kv roiAlignKernel, f func()) {
	key := roiAlignKernelKey{backward}
	defer dev.SetValue(key, dev.Value(key))
	dev.SetValue(key, kv)
	f()
}

// Bad RoIs are reported by the next call that waits for the GPU, as any
// error of asynchronous GPU work; the Device stays usable.
func TestGPURoIAlignRunTimeErrors(t *testing.T) {
	dev := gpu(t)
	if err := dev.Synchronize(); err != nil {
		t.Fatal(err)
	}
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for i, c := range []struct {
			roi  []float64
			cfg  RoIAlignConfig
			want string
		}{
			{[]float64{0, 0, 0, 1, 1, 2, 0, 0, 1, 1}, RoIAlignConfig{1, 1, 1, 2, true}, "ops: RoIAlign: a RoI has a batch index outside [0, 2) or NaN"},
			{[]float64{0, 0, 0, 1, 1, math.NaN(), 0, 0, 1, 1}, RoIAlignConfig{1, 1, 1, 2, true}, "a RoI has a batch index outside [0, 2) or NaN"},
			{[]float64{0, 0, 0, 1e7, 1, 0, 0, 0, 1, 1}, RoIAlignConfig{1, 1, 1, 0, true}, "use a fixed SamplingRatio"},
		} {
			s := roiAlignShape{cfg: c.cfg, n: 2, c: 1, h: 4, w: 4, k: 2, dt: dt}
			rois := toDev(t, dev, fromFloat64s(dt, c.roi, 2, 5))
			x := toDev(t, dev, rampImages(dt))
			gy := toDev(t, dev, tensor.New(tensor.Of(dt), tensor.WithShape(2, 1, 1, 1)))
			for _, backward := range []bool{false, true} {
				for _, kv := range roiAlignVariants(backward, dt) {
					t.Run(fmt.Sprintf("%v/case=%d/%s", dt, i, kv), func(t *testing.T) {
						skipUnbuiltVariant(t, kv.k.Module(), kv.k.Name())
						var err error
						withRoIAlignKernel(dev, backward, kv, func() {
							if backward {
								_, err = roiAlignGradOp(s).Do(rois, gy)
							} else {
								_, err = roiAlignOp(s).Do(x, rois)
							}
						})
						if err == nil {
							err = dev.Synchronize()
						}
						if err == nil || !strings.Contains(strings.ReplaceAll(err.Error(), "RoIAlign backward", "RoIAlign"), c.want) {
							t.Errorf("%v %s: error %v, want one containing %q", dt, kv, err, c.want)
						}
					})
				}
			}
			// The error is reported once.
			if err := dev.Synchronize(); err != nil {
				t.Fatalf("%v: the next wait failed too: %v", dt, err)
			}
		}
	}
	// The device is still usable after a reported error.
	x := toDev(t, dev, rampImages(tensor.Float64))
	rois := toDev(t, dev, fromFloat64s(tensor.Float64, []float64{0, 0.5, 0.5, 2.5, 2.5}, 1, 5))
	s := roiAlignShape{cfg: RoIAlignConfig{1, 1, 1, 2, true}, n: 2, c: 1, h: 4, w: 4, k: 1, dt: tensor.Float64}
	out, err := roiAlignOp(s).Do(x, rois)
	if err != nil {
		t.Fatal(err)
	}
	if got := fromDev(t, dev, out); got[0] != 5 {
		t.Errorf("after errors: got %v, want 5", got)
	}
}

// boundaryRoIs returns two boxes (found by a search) whose float32 adaptive
// sample count along one side is 5 or 2 with each product roi*scale rounded
// before the offset is subtracted, and 4 or 3 with the two fused; it fails
// t if that is no longer so.
func boundaryRoIs(t *testing.T, dt tensor.Dtype, cfg RoIAlignConfig) *tensor.Dense {
	t.Helper()
	boxes := []float64{0, 108.359375, 108.359375, 192.359375, 192.359375, 0, 7.234375, 172.3125, 49.234375, 193.3125}
	scale := float32(cfg.SpatialScale)
	grid := func(a, b float32, fused bool) float64 {
		start, end := float32(a*scale)-0.5, float32(b*scale)-0.5
		if fused {
			start = float32(math.FMA(float64(a), float64(scale), -0.5))
			end = float32(math.FMA(float64(b), float64(scale), -0.5))
		}
		return math.Ceil(float64((end - start) / float32(cfg.PooledW)))
	}
	for _, side := range [][2]int{{1, 3}, {6, 8}} {
		a, b := float32(boxes[side[0]]), float32(boxes[side[1]])
		if grid(a, b, false) == grid(a, b, true) {
			t.Fatalf("box side %v..%v: %v samples either way, the case shows nothing", a, b, grid(a, b, false))
		}
	}
	return fromFloat64s(dt, boxes, 2, 5)
}

// malformedRoIs returns 8 boxes (in image pixels, for a scale of 1/4 on a
// 9x11 map): NaN in each coordinate in turn, an empty, an inverted, an
// infinite and one from -Inf. In legacy mode (aligned=false) the empty and
// inverted ones pool a 1x1 region; a NaN width or height stays NaN (Go's
// max, and torchvision's CPU std::max; not 1, as an fmax would make it),
// so that box, like the others, pools zeros.
func malformedRoIs(dt tensor.Dtype) *tensor.Dense {
	nan, inf := math.NaN(), math.Inf(1)
	return fromFloat64s(dt, []float64{
		0, 4, 4, 20, nan,
		1, 4, 4, nan, 20,
		0, nan, 4, 20, 20,
		1, 4, nan, 20, 20,
		0, 8, 8, 8, 30,
		1, 8, 30, 20, 8,
		0, 4, 4, inf, 20,
		1, -inf, 4, 20, 20,
	}, 8, 5)
}

// edgeRoIs returns a box (found by a search) one of whose float32 sample
// columns (bin 5, sample 0) falls below -1 with start + b*bin rounded in two
// steps and above it with the two fused; it fails t if that is no longer so.
func edgeRoIs(t *testing.T, dt tensor.Dtype, cfg RoIAlignConfig) *tensor.Dense {
	t.Helper()
	box := []float64{0, -21.640625, 10, 4.546875, 40}
	scale := float32(cfg.SpatialScale)
	start := float32(float32(box[1])*scale) - 0.5
	bin := (float32(float32(box[3])*scale) - 0.5 - start) / float32(cfg.PooledW)
	q := float32(0.5) * bin / float32(cfg.SamplingRatio)
	twice := start + float32(5*bin) + q
	fused := float32(math.FMA(5, float64(bin), float64(start))) + q
	if (twice >= -1) == (fused >= -1) {
		t.Fatalf("sample at %v rounded in two steps, %v fused: on the same side of -1, the case shows nothing", twice, fused)
	}
	return fromFloat64s(dt, box, 1, 5)
}
