package ops

import (
	"fmt"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

// convTargetCases are ../shared/TARGETS.md's fused-convolution cases; the
// anchors (cuDNN through PyTorch, same shapes) are timed by
// kernels/bench/anchors_conv.py.
var convTargetCases = []struct {
	name   string
	xs, ws []int
	cfg    ConvConfig
}{
	{"resnet_c3_3x3", []int{8, 128, 56, 56}, []int{128, 128, 3, 3}, ConvConfig{Pad: [2]int{1, 1}}},
	{"fpn_p2_3x3", []int{2, 256, 200, 336}, []int{256, 256, 3, 3}, ConvConfig{Pad: [2]int{1, 1}}},
	{"resnet_c4_1x1", []int{8, 1024, 28, 28}, []int{256, 1024, 1, 1}, ConvConfig{}},
}

// convBenchLoop times step, which queues work on dev: the timer runs until
// the GPU has finished the last of b.N steps (a b.N loop, not b.Loop, whose
// timer stops before the final Synchronize). It reports milliseconds and
// TFLOP/s for flops per step.
func convBenchLoop(b *testing.B, dev *backend.Device, flops float64, step func() error) {
	b.Helper()
	// Warm-up: module load, shared-memory opt-in, the allocator's cache.
	for range 2 {
		if err := step(); err != nil {
			b.Fatal(err)
		}
	}
	if err := dev.Synchronize(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if err := step(); err != nil {
			b.Fatal(err)
		}
	}
	if err := dev.Synchronize(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	sec := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(sec*1e3, "ms/op")
	b.ReportMetric(flops/sec/1e12, "TFLOP/s")
}

// BenchmarkGPUConv times, on TARGETS.md's shapes in float32 (TF32 tensor
// cores): Conv with bias and ReLU forward (pass=fwd) and backward (dy
// masked by the ReLU once, then dgrad and wgrad with the bias gradient, as
// Conv's SymDiff builds it, pass=bwd); and a ConvBN layer
// with ReLU in training, forward (convolution with the statistics in its
// epilogue, then BatchNorm+ReLU, pass=convbn_fwd) and backward (BatchNorm
// backward, dgrad, wgrad, pass=convbn_bwd). Backward counts the FLOPs of
// its two GEMMs, twice the forward's.
func BenchmarkGPUConv(b *testing.B) {
	dev := gpu(b)
	dt := tensor.Float32
	for ci, c := range convTargetCases {
		rng := rand.New(rand.NewPCG(uint64(ci), 11))
		conv := convGPUCase{name: c.name, xs: c.xs, ws: c.ws, cfg: c.cfg}
		s := conv.shape(b, dt, true, true)
		p := s.p
		flops := 2 * float64(p.N*p.Cout*p.OutH*p.OutW) * float64(p.Cin*p.KH*p.KW)
		dev1 := func(lo, hi float64, shape ...int) *tensor.Dense {
			return toDev(b, dev, randTensor(rng, dt, lo, hi, shape...))
		}
		x, w, bias := dev1(-1, 1, s.xShape()...), dev1(-0.05, 0.05, s.wShape()...), dev1(-0.1, 0.1, p.Cout)
		dy := dev1(-1, 1, s.yShape()...)
		// Backward as Conv's SymDiff builds it: dy masked once by the
		// ReLU, then dgrad and wgrad of the unmasked shape.
		back := s
		back.p.ReLU = false
		fwd, mask, dgrad, wgrad := &convOp{s}, &reluMaskOp{shape: s.yShape(), dt: dt}, &convDgradOp{back}, &convWgradOp{back}
		y, err := fwd.Do(x, w, bias)
		if err != nil {
			b.Fatal(err)
		}
		dym, err := mask.Do(y, dy)
		if err != nil {
			b.Fatal(err)
		}
		dx, err := dgrad.Do(w, y, dym)
		if err != nil {
			b.Fatal(err)
		}
		dwb, err := wgrad.Do(x, y, dym)
		if err != nil {
			b.Fatal(err)
		}
		name := fmt.Sprintf("impl=cuda/dtype=float32/case=%s/pass=", c.name)
		b.Run(name+"fwd", func(b *testing.B) {
			convBenchLoop(b, dev, flops, func() error {
				_, err := fwd.UsePreallocDo(y, x, w, bias)
				return err
			})
		})
		b.Run(name+"bwd", func(b *testing.B) {
			convBenchLoop(b, dev, 2*flops, func() error {
				if _, err := mask.UsePreallocDo(dym, y, dy); err != nil {
					return err
				}
				if _, err := dgrad.UsePreallocDo(dx, w, y, dym); err != nil {
					return err
				}
				_, err := wgrad.UsePreallocDo(dwb, x, y, dym)
				return err
			})
		})

		// ConvBN: a bias-free convolution linked to its BatchNorm, running
		// statistics on the GPU (nothing waits for the host).
		bn := &BatchNorm{
			RunningMean: toDev(b, dev, fromFloat64s(dt, filled(p.Cout, 0), p.Cout)),
			RunningVar:  toDev(b, dev, fromFloat64s(dt, filled(p.Cout, 1), p.Cout)),
			Momentum:    DefaultMomentum, Eps: DefaultEps, Training: true,
		}
		link := &bnStatsLink{bn: bn}
		cs := convShape{p: p, dt: dt, stats: link}
		cs.p.ReLU = false
		bs := bnShape{n: p.N, c: p.Cout, h: p.OutH, w: p.OutW, eps: DefaultEps, momentum: DefaultMomentum,
			act: ActReLU, dt: dt, bn: bn, stats: link}
		gamma, beta := dev1(0.5, 1.5, p.Cout), dev1(-0.5, 0.5, p.Cout)
		cfwd, bfwd, bbwd := &convOp{cs}, &bnOp{bs}, &bnGradOp{bs}
		cdgrad, cwgrad := &convDgradOp{cs}, &convWgradOp{cs}
		z, err := cfwd.Do(x, w)
		if err != nil {
			b.Fatal(err)
		}
		yb, err := bfwd.Do(z, gamma, beta)
		if err != nil {
			b.Fatal(err)
		}
		packed, err := bbwd.Do(z, gamma, yb, dy)
		if err != nil {
			b.Fatal(err)
		}
		// dgrad and wgrad read dz, the first part of packed; a tensor of
		// dz's shape costs them the same.
		dz := dev1(-1, 1, s.yShape()...)
		dw, err := cwgrad.Do(x, z, dz)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name+"convbn_fwd", func(b *testing.B) {
			convBenchLoop(b, dev, flops, func() error {
				zz, err := cfwd.UsePreallocDo(z, x, w)
				if err != nil {
					return err
				}
				_, err = bfwd.UsePreallocDo(yb, zz, gamma, beta)
				return err
			})
			if link.taken == 0 {
				b.Error("the BatchNorm op never took the convolution's statistics")
			}
		})
		b.Run(name+"convbn_bwd", func(b *testing.B) {
			convBenchLoop(b, dev, 2*flops, func() error {
				if _, err := bbwd.UsePreallocDo(packed, z, gamma, yb, dy); err != nil {
					return err
				}
				if _, err := cdgrad.UsePreallocDo(dx, w, z, dz); err != nil {
					return err
				}
				_, err := cwgrad.UsePreallocDo(dw, x, z, dz)
				return err
			})
		})
		for _, v := range []G.Value{x, w, bias, dy, y, dx, dwb, z, yb, packed, dz, dw, gamma, beta, bn.RunningMean, bn.RunningVar} {
			if err := dev.FreeDense(v.(*tensor.Dense)); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkGPUConvFpropVariants times the float32 forward kernels
// (convFpropKernelOverride: v1 to v4) on TARGETS.md's shapes: Conv with bias and
// ReLU, forward only, as BenchmarkGPUConv's pass=fwd, timed the same way.
// Names are benchstat-friendly: .../case=fpn_p2_3x3/kernel=v2.
func BenchmarkGPUConvFpropVariants(b *testing.B) {
	dev := gpu(b)
	dt := tensor.Float32
	defer func() { convFpropKernelOverride = "" }()
	for ci, c := range convTargetCases {
		rng := rand.New(rand.NewPCG(uint64(ci), 11))
		conv := convGPUCase{name: c.name, xs: c.xs, ws: c.ws, cfg: c.cfg}
		s := conv.shape(b, dt, true, true)
		p := s.p
		flops := 2 * float64(p.N*p.Cout*p.OutH*p.OutW) * float64(p.Cin*p.KH*p.KW)
		dev1 := func(lo, hi float64, shape ...int) *tensor.Dense {
			return toDev(b, dev, randTensor(rng, dt, lo, hi, shape...))
		}
		x, w, bias := dev1(-1, 1, s.xShape()...), dev1(-0.05, 0.05, s.wShape()...), dev1(-0.1, 0.1, p.Cout)
		fwd := &convOp{s}
		y, err := fwd.Do(x, w, bias)
		if err != nil {
			b.Fatal(err)
		}
		for _, k := range []struct{ short, name string }{{"v1", convFpropF32V1}, {"v2", convFpropF32V2}, {"v3", convFpropF32V3}, {"v4", convFpropF32V4}, {"v5", convFpropF32V5}, {"v6", convFpropF32V6}, {"v7", convFpropF32V7}} {
			b.Run(fmt.Sprintf("case=%s/kernel=%s", c.name, k.short), func(b *testing.B) {
				if _, optIn := dev.MaxSharedMemory(); k.name == convFpropF32V3 && optIn < convFpropV3Smem {
					b.Skipf("%s needs %d bytes of shared memory per block; this GPU allows %d", k.name, convFpropV3Smem, optIn)
				}
				if err := convWgmmaError(dev); convWgmma(k.name) && err != nil {
					b.Skipf("%s: %v", k.name, err)
				}
				convFpropKernelOverride = k.name
				defer func() { convFpropKernelOverride = "" }()
				convBenchLoop(b, dev, flops, func() error {
					_, err := fwd.UsePreallocDo(y, x, w, bias)
					return err
				})
			})
		}
		for _, v := range []G.Value{x, w, bias, y} {
			if err := dev.FreeDense(v.(*tensor.Dense)); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkGPUConvBackwardVariants times the float32 backward kernels
// (convDgradKernelOverride, convWgradKernelOverride: v1, v2) on TARGETS.md's
// shapes: Conv with bias and ReLU, as BenchmarkGPUConv's pass=bwd, but
// dgrad and wgrad apart (each one GEMM, the forward's FLOPs), timed the
// same way. v2's time includes the pass that masks dy by the ReLU (and, for
// wgrad, the split-K reduction, as v1's). Names are benchstat-friendly:
// .../case=fpn_p2_3x3/pass=dgrad/kernel=v2.
func BenchmarkGPUConvBackwardVariants(b *testing.B) {
	dev := gpu(b)
	dt := tensor.Float32
	defer func() { convDgradKernelOverride, convWgradKernelOverride = "", "" }()
	for ci, c := range convTargetCases {
		rng := rand.New(rand.NewPCG(uint64(ci), 11))
		conv := convGPUCase{name: c.name, xs: c.xs, ws: c.ws, cfg: c.cfg}
		s := conv.shape(b, dt, true, true)
		p := s.p
		flops := 2 * float64(p.N*p.Cout*p.OutH*p.OutW) * float64(p.Cin*p.KH*p.KW)
		dev1 := func(lo, hi float64, shape ...int) *tensor.Dense {
			return toDev(b, dev, randTensor(rng, dt, lo, hi, shape...))
		}
		x, w, bias := dev1(-1, 1, s.xShape()...), dev1(-0.05, 0.05, s.wShape()...), dev1(-0.1, 0.1, p.Cout)
		dy := dev1(-1, 1, s.yShape()...)
		fwd, dgrad, wgrad := &convOp{s}, &convDgradOp{s}, &convWgradOp{s}
		y, err := fwd.Do(x, w, bias)
		if err != nil {
			b.Fatal(err)
		}
		dx, err := dgrad.Do(w, y, dy)
		if err != nil {
			b.Fatal(err)
		}
		dwb, err := wgrad.Do(x, y, dy)
		if err != nil {
			b.Fatal(err)
		}
		for _, k := range []struct {
			pass, short, name string
			step              func() error
		}{
			{"dgrad", "v1", convDgradF32V1, func() error { _, err := dgrad.UsePreallocDo(dx, w, y, dy); return err }},
			{"dgrad", "v2", convDgradF32V2, func() error { _, err := dgrad.UsePreallocDo(dx, w, y, dy); return err }},
			{"dgrad", "v5", convDgradF32V5, func() error { _, err := dgrad.UsePreallocDo(dx, w, y, dy); return err }},
			{"dgrad", "v6", convDgradF32V6, func() error { _, err := dgrad.UsePreallocDo(dx, w, y, dy); return err }},
			{"dgrad", "v7", convDgradF32V7, func() error { _, err := dgrad.UsePreallocDo(dx, w, y, dy); return err }},
			{"wgrad", "v1", convWgradF32V1, func() error { _, err := wgrad.UsePreallocDo(dwb, x, y, dy); return err }},
			{"wgrad", "v2", convWgradF32V2, func() error { _, err := wgrad.UsePreallocDo(dwb, x, y, dy); return err }},
			{"wgrad", "v5", convWgradF32V5, func() error { _, err := wgrad.UsePreallocDo(dwb, x, y, dy); return err }},
			{"wgrad", "v6", convWgradF32V6, func() error { _, err := wgrad.UsePreallocDo(dwb, x, y, dy); return err }},
		} {
			b.Run(fmt.Sprintf("case=%s/pass=%s/kernel=%s", c.name, k.pass, k.short), func(b *testing.B) {
				if err := convWgmmaError(dev); convWgmma(k.name) && err != nil {
					b.Skipf("%s: %v", k.name, err)
				}
				if k.pass == "dgrad" {
					convDgradKernelOverride = k.name
				} else {
					convWgradKernelOverride = k.name
				}
				defer func() { convDgradKernelOverride, convWgradKernelOverride = "", "" }()
				convBenchLoop(b, dev, flops, k.step)
			})
		}
		for _, v := range []G.Value{x, w, bias, dy, y, dx, dwb} {
			if err := dev.FreeDense(v.(*tensor.Dense)); err != nil {
				b.Fatal(err)
			}
		}
	}
}
