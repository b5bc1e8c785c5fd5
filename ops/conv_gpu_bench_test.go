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

// partOf queues dst = elements [off, off+len(dst)) of the device tensor
// src: the copy autograd's unpack op makes of a packed gradient's part.
func partOf(dev *backend.Device, dst, src *tensor.Dense, off int) error {
	base, err := dev.Ptr(src)
	if err != nil {
		return err
	}
	size := int64(src.Dtype().Size())
	return dev.Engine().Memcpy(dst, backend.Memory{Ptr: base + backend.DevicePtr(int64(off)*size), Size: int64(dst.Shape().TotalSize()) * size})
}

// BenchmarkGPUConv times, on TARGETS.md's shapes in float32 (TF32 tensor
// cores), the ops of each graph as the layers' SymDiffs build it:
//
//   - pass=fwd: Conv with bias and ReLU;
//   - pass=bwd: its backward: convGradOp (dy masked, rounded to TF32, the
//     bias gradient summed: one pass), dgrad and wgrad reading its output
//     where it lies, and the copy of the bias gradient out of it;
//   - pass=convbn_fwd: a ConvBN layer with ReLU in training: the
//     convolution with the batch statistics in its epilogue, then
//     BatchNorm+ReLU;
//   - pass=convbn_bwd: its backward: bnGradStatsOp (the reduction),
//     bnGradApplyOp (dz, rounded to TF32), dgrad, wgrad, and the copies of
//     dgamma and dbeta.
//
// For a side-by-side in one run, pass=bwd_twopasses and
// pass=convbn_bwd_twopasses run the work the graphs did before the
// backward's elementwise work went into one pass: the ReLU mask pass, then
// the wgrad's own pass that rounds to TF32 (and sums the bias gradient);
// for ConvBN, dz exact, copied out of the packed [dz | dgamma | dbeta]
// vector the backward op wrote then, and rounded by the wgrad's own pass.
// Backward counts the FLOPs of its two GEMMs, twice the forward's.
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
		var free []*tensor.Dense
		do := func(op G.Op, in ...G.Value) *tensor.Dense {
			v, err := op.Do(in...)
			if err != nil {
				b.Fatal(err)
			}
			free = append(free, v.(*tensor.Dense))
			return v.(*tensor.Dense)
		}
		x, w, bias := dev1(-1, 1, s.xShape()...), dev1(-0.05, 0.05, s.wShape()...), dev1(-0.1, 0.1, p.Cout)
		dy := dev1(-1, 1, s.yShape()...)
		free = append(free, x, w, bias, dy)
		ny := s.yShape().TotalSize()

		// Conv's backward as its SymDiff builds it.
		back := s
		back.p.ReLU, back.bias, back.gradReady, back.gradPacked = false, false, true, true
		fwd, prep, dgrad, wgrad := &convOp{s}, &convGradOp{s}, &convDgradOp{back}, &convWgradOp{back}
		y := do(fwd, x, w, bias)
		g := do(prep, y, dy)
		dx, dw := do(dgrad, w, y, g), do(wgrad, x, y, g)
		zeros := func(shape ...int) *tensor.Dense {
			d := toDev(b, dev, fromFloat64s(dt, filled(tensor.Shape(shape).TotalSize(), 0), shape...))
			free = append(free, d)
			return d
		}
		db := zeros(p.Cout)
		// The structure before: mask pass, wgrad rounding in a pass of its own.
		old := s
		old.p.ReLU = false
		mask, dgradOld, wgradOld := &reluMaskOp{shape: s.yShape(), dt: dt}, &convDgradOp{old}, &convWgradOp{old}
		dym := do(mask, y, dy)
		dwb := do(wgradOld, x, y, dym)

		name := fmt.Sprintf("impl=cuda/dtype=float32/case=%s/pass=", c.name)
		b.Run(name+"fwd", func(b *testing.B) {
			convBenchLoop(b, dev, flops, func() error {
				_, err := fwd.UsePreallocDo(y, x, w, bias)
				return err
			})
		})
		b.Run(name+"bwd", func(b *testing.B) {
			convBenchLoop(b, dev, 2*flops, func() error {
				if _, err := prep.UsePreallocDo(g, y, dy); err != nil {
					return err
				}
				if _, err := dgrad.UsePreallocDo(dx, w, y, g); err != nil {
					return err
				}
				if _, err := wgrad.UsePreallocDo(dw, x, y, g); err != nil {
					return err
				}
				return partOf(dev, db, g, ny)
			})
		})
		b.Run(name+"bwd_twopasses", func(b *testing.B) {
			convBenchLoop(b, dev, 2*flops, func() error {
				if _, err := mask.UsePreallocDo(dym, y, dy); err != nil {
					return err
				}
				if _, err := dgradOld.UsePreallocDo(dx, w, y, dym); err != nil {
					return err
				}
				_, err := wgradOld.UsePreallocDo(dwb, x, y, dym)
				return err
			})
		})

		// ConvBN: a bias-free convolution linked to its BatchNorm, running
		// statistics on the GPU (nothing waits for the host), as ConvBN
		// builds them.
		bn := &BatchNorm{
			RunningMean: toDev(b, dev, fromFloat64s(dt, filled(p.Cout, 0), p.Cout)),
			RunningVar:  toDev(b, dev, fromFloat64s(dt, filled(p.Cout, 1), p.Cout)),
			Momentum:    DefaultMomentum, Eps: DefaultEps, Training: true,
		}
		link := &bnStatsLink{bn: bn}
		cs := convShape{p: p, dt: dt, stats: link, gradReady: true}
		cs.p.ReLU = false
		bs := bnShape{n: p.N, c: p.Cout, h: p.OutH, w: p.OutW, eps: DefaultEps, momentum: DefaultMomentum,
			act: ActReLU, dt: dt, bn: bn, stats: link, gemmDz: true}
		gamma, beta := dev1(0.5, 1.5, p.Cout), dev1(-0.5, 0.5, p.Cout)
		free = append(free, gamma, beta, bn.RunningMean, bn.RunningVar)
		cfwd, bfwd, bstats, bapply := &convOp{cs}, &bnOp{bs}, &bnGradStatsOp{bs}, &bnGradApplyOp{bs}
		cdgrad, cwgrad := &convDgradOp{cs}, &convWgradOp{cs}
		z := do(cfwd, x, w)
		yb := do(bfwd, z, gamma, beta)
		stats := do(bstats, z, gamma, yb, dy)
		dz := do(bapply, z, yb, dy, stats)
		dw2 := do(cwgrad, x, z, dz)
		dgamma, dbeta := zeros(p.Cout), zeros(p.Cout)
		// The structure before: dz exact, written into a packed vector and
		// copied out of it, rounded by the wgrad's own pass (a copy of dz
		// costs what the copy out of the packed vector did).
		csOld, bsOld := cs, bs
		csOld.gradReady, bsOld.gemmDz = false, false
		bapplyOld, cwgradOld := &bnGradApplyOp{bsOld}, &convWgradOp{csOld}
		dzWritten, dzOld := zeros(s.yShape()...), zeros(s.yShape()...)
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
				if _, err := bstats.UsePreallocDo(stats, z, gamma, yb, dy); err != nil {
					return err
				}
				if _, err := bapply.UsePreallocDo(dz, z, yb, dy, stats); err != nil {
					return err
				}
				if err := partOf(dev, dgamma, stats, 0); err != nil {
					return err
				}
				if err := partOf(dev, dbeta, stats, p.Cout); err != nil {
					return err
				}
				if _, err := cdgrad.UsePreallocDo(dx, w, z, dz); err != nil {
					return err
				}
				_, err := cwgrad.UsePreallocDo(dw2, x, z, dz)
				return err
			})
		})
		b.Run(name+"convbn_bwd_twopasses", func(b *testing.B) {
			convBenchLoop(b, dev, 2*flops, func() error {
				if _, err := bstats.UsePreallocDo(stats, z, gamma, yb, dy); err != nil {
					return err
				}
				if _, err := bapplyOld.UsePreallocDo(dzWritten, z, yb, dy, stats); err != nil {
					return err
				}
				if err := partOf(dev, dzOld, dzWritten, 0); err != nil {
					return err
				}
				if err := partOf(dev, dgamma, stats, 0); err != nil {
					return err
				}
				if err := partOf(dev, dbeta, stats, p.Cout); err != nil {
					return err
				}
				if _, err := cdgrad.UsePreallocDo(dx, w, z, dzOld); err != nil {
					return err
				}
				_, err := cwgradOld.UsePreallocDo(dw2, x, z, dzOld)
				return err
			})
		})
		for _, v := range free {
			if err := dev.FreeDense(v); err != nil {
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
