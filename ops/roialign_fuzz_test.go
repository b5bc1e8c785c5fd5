package ops

import (
	"math"
	"math/rand/v2"
	"testing"

	"gorgonia.org/tensor"
)

// FuzzRoIAlign feeds arbitrary boxes (NaN, infinities, huge and negative
// values), batch indices, scales and configs to the forward and backward
// kernels. Whatever the input, the op must return an error or a finite
// result: never panic, read out of bounds or hang.
func FuzzRoIAlign(f *testing.F) {
	f.Add(0.0, 1.0, 1.0, 3.0, 3.0, 0.5, int8(2), uint8(2), uint8(2), true, false)
	f.Add(1.0, -5.0, -5.0, 30.0, 2.0, 1.0, int8(0), uint8(1), uint8(3), false, true)
	f.Add(0.0, math.NaN(), 0.0, 1.0, math.Inf(1), 0.25, int8(0), uint8(7), uint8(7), true, false)
	f.Add(0.9, 1e300, -1e300, 1e-300, 5.0, 4.0, int8(-3), uint8(2), uint8(1), false, false)
	f.Add(-0.5, 0.0, 0.0, 0.0, 0.0, 1.0, int8(1), uint8(1), uint8(1), true, true)
	f.Add(2.0, 0.0, 0.0, 1.0, 1.0, 1.0, int8(1), uint8(1), uint8(1), true, true)
	f.Fuzz(func(t *testing.T, b, x1, y1, x2, y2, scale float64, sampling int8, ph, pw uint8, aligned, f32 bool) {
		cfg := RoIAlignConfig{
			PooledH: int(ph%8) + 1, PooledW: int(pw%8) + 1, SpatialScale: scale,
			SamplingRatio: int(sampling % 5), Aligned: aligned,
		}
		if err := cfg.validate(); err != nil {
			return // rejected at graph-build time, tested elsewhere
		}
		dt := tensor.Float64
		if f32 {
			dt = tensor.Float32
		}
		rng := rand.New(rand.NewPCG(1, 2))
		s := roiAlignShape{cfg: cfg, n: 2, c: 2, h: 5, w: 6, k: 2, dt: dt}
		x := randTensor(rng, dt, -1, 1, 2, 2, 5, 6)
		// The fuzzed box and a plain one, so a bad first RoI cannot hide a
		// problem with the second.
		rois := fromFloat64s(dt, []float64{b, x1, y1, x2, y2, 1, 0.5, 0.5, 4, 3}, 2, 5)
		out, err := roiAlignOp(s).Do(x, rois)
		if err != nil {
			return
		}
		for i, v := range toFloat64s(t, out) {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				t.Fatalf("output[%d] = %v for finite input", i, v)
			}
		}
		gy := randTensor(rng, dt, -1, 1, 2, 2, cfg.PooledH, cfg.PooledW)
		gx, err := roiAlignGradOp(s).Do(rois, gy)
		if err != nil {
			t.Fatalf("backward failed where forward succeeded: %v", err)
		}
		for i, v := range toFloat64s(t, gx) {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				t.Fatalf("grad[%d] = %v for finite input", i, v)
			}
		}
	})
}
