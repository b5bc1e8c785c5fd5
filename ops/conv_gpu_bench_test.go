package ops

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

// convTargetCases are ../shared/TARGETS.md's fused-convolution cases; the
// anchors (cuDNN through PyTorch, same shapes) are timed by
// kernels/bench/anchors_conv.py.
var convTargetCases = []convGPUCase{
	{"resnet_c3_3x3", []int{8, 128, 56, 56}, []int{128, 128, 3, 3}, ConvConfig{Pad: [2]int{1, 1}}},
	{"fpn_p2_3x3", []int{2, 256, 200, 336}, []int{256, 256, 3, 3}, ConvConfig{Pad: [2]int{1, 1}}},
	{"resnet_c4_1x1", []int{8, 1024, 28, 28}, []int{256, 1024, 1, 1}, ConvConfig{}},
}

// suiteConvCases are the presets and STHENO_BENCH_CONV's cases (see
// bench_test.go), e.g. 'mine:n=8,cin=128,h=56,w=56,cout=128,k=3,stride=1,pad=1,dilation=1'.
func suiteConvCases(b *testing.B) []convGPUCase {
	cases := slices.Clone(convTargetCases)
	names, kvs := benchKV(b, "STHENO_BENCH_CONV")
	for i, kv := range kvs {
		k, st, pad, dil := kvInt(b, kv, "k", 3), kvInt(b, kv, "stride", 1), kvInt(b, kv, "pad", 1), kvInt(b, kv, "dilation", 1)
		cases = append(cases, convGPUCase{names[i],
			[]int{kvInt(b, kv, "n", 1), kvInt(b, kv, "cin", 64), kvInt(b, kv, "h", 56), kvInt(b, kv, "w", 56)},
			[]int{kvInt(b, kv, "cout", 64), kvInt(b, kv, "cin", 64), k, k},
			ConvConfig{Stride: [2]int{st, st}, Pad: [2]int{pad, pad}, Dilation: [2]int{dil, dil}}})
	}
	return cases
}

// tensorPeakTFLOPs is the dense TF32 tensor-core peak of dev at its
// reported peak clock: 2048 TF32 FLOP per clock per SM on Hopper (compute
// capability 9.x: 494.7 TFLOP/s on an H100 SXM at 1830 MHz), 1024 on
// Ampere (8.0: 156 TFLOP/s on an A100 at 1410 MHz); 0 elsewhere.
func tensorPeakTFLOPs(dev *backend.Device) float64 {
	perSM := 0.0
	switch major, minor := dev.ComputeCapability(); {
	case major == 9:
		perSM = 2048
	case major == 8 && minor == 0:
		perSM = 1024
	}
	return perSM * float64(dev.SMCount()) * float64(dev.ClockKHz()) * 1e3 / 1e12
}

// runConvSteps times step, which queues (GPU) or runs (CPU) one pass of a
// layer: on the GPU with CUDA events around each of b.N calls after 5
// untimed ones, reporting the median (ms), its TFLOP/s for flops per call
// and their share of the tensor-core peak (%peak, where known); on the CPU
// with the benchmark's own timer.
func runConvSteps(b *testing.B, dev *backend.Device, flops float64, step func() error) {
	if dev == nil {
		if err := step(); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			if err := step(); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		sec := b.Elapsed().Seconds() / float64(b.N)
		b.ReportMetric(sec*1e3, "ms")
		b.ReportMetric(flops/sec/1e12, "TFLOP/s")
		return
	}
	sec := timeSteps(b, dev, step).Seconds()
	b.ReportMetric(sec*1e3, "ms")
	b.ReportMetric(flops/sec/1e12, "TFLOP/s")
	if peak := tensorPeakTFLOPs(dev); peak > 0 {
		b.ReportMetric(100*flops/sec/1e12/peak, "%peak")
	}
}

// partOf sets dst to elements [off, off+len(dst)) of src, in the memory
// both live in: the copy autograd's unpack op makes of a part of a packed
// gradient.
func partOf(dev *backend.Device, dst, src *tensor.Dense, off int) error {
	if dev == nil {
		switch d := dst.Data().(type) {
		case []float32:
			copy(d, src.Float32s()[off:])
		case []float64:
			copy(d, src.Float64s()[off:])
		}
		return nil
	}
	base, err := dev.Ptr(src)
	if err != nil {
		return err
	}
	size := int64(src.Dtype().Size())
	return dev.Engine().Memcpy(dst, backend.Memory{Ptr: base + backend.DevicePtr(int64(off)*size), Size: int64(dst.Shape().TotalSize()) * size})
}

// BenchmarkSuiteConv times the fused convolution layers in float32 (on the
// GPU, TF32 tensor cores) on TARGETS.md's shapes and STHENO_BENCH_CONV's,
// each pass running the ops its graph runs, as the layers' SymDiffs build
// them:
//
//   - pass=fwd: Conv with bias and ReLU;
//   - pass=bwd: its backward: convGradOp (dy masked, rounded to TF32 on the
//     GPU, the bias gradient summed: one pass), dgrad and wgrad reading its
//     output where it lies, and the copy of the bias gradient out of it;
//   - pass=convbn_fwd: a ConvBN layer with ReLU in training: the
//     convolution with the batch statistics in its epilogue (GPU), the
//     BatchNorm's constants from them (bnCoefOp), then BatchNorm+ReLU;
//   - pass=convbn_bwd: its backward: bnGradStatsOp (the reduction, over z
//     and dy), bnGradApplyOp (dz, rounded to TF32 on the GPU), dgrad,
//     wgrad, and the copies of dgamma and dbeta.
//
// On the GPU, for a side-by-side in one run, pass=bwd_twopasses and
// pass=convbn_bwd_twopasses run the work the graphs did before the
// backward's elementwise work went into one pass: the ReLU mask pass, then
// the wgrad's own pass that rounds to TF32 (and sums the bias gradient);
// for ConvBN, dz exact and copied out of the packed [dz | dgamma | dbeta]
// vector the backward op wrote then (a copy of dz costs the same), and
// rounded by the wgrad's own pass. Backward counts the FLOPs of its two
// GEMMs, twice the forward's.
func BenchmarkSuiteConv(b *testing.B) {
	dt := tensor.Float32
	for ci, c := range suiteConvCases(b) {
		if !selected(c.name) {
			continue
		}
		benchConvCase(b, nil, uint64(ci), c, dt, fmt.Sprintf("impl=cpu/dtype=%v/case=%s/pass=", dt, c.name))
		prefix := fmt.Sprintf("impl=cuda/dtype=%v/case=%s", dt, c.name)
		dev, err := gpuOrNil(b)
		if dev == nil {
			b.Run(prefix, func(b *testing.B) { b.Skipf("no CUDA device: %v", err) })
			continue
		}
		benchConvCase(b, dev, uint64(ci), c, dt, prefix+"/pass=")
	}
}

func benchConvCase(b *testing.B, dev *backend.Device, seed uint64, c convGPUCase, dt tensor.Dtype, name string) {
	rng := rand.New(rand.NewPCG(seed, 11))
	s := c.shape(b, dt, true, true)
	p := s.p
	flops := 2 * float64(p.N*p.Cout*p.OutH*p.OutW) * float64(p.Cin*p.KH*p.KW)
	var free []*tensor.Dense
	defer func() {
		if dev == nil {
			return
		}
		for _, v := range free {
			if err := dev.FreeDense(v); err != nil {
				b.Fatal(err)
			}
		}
	}()
	place := func(d *tensor.Dense) *tensor.Dense {
		if dev != nil {
			d = toDev(b, dev, d)
			free = append(free, d)
		}
		return d
	}
	draw := func(lo, hi float64, shape ...int) *tensor.Dense { return place(randTensor(rng, dt, lo, hi, shape...)) }
	zeros := func(shape ...int) *tensor.Dense {
		return place(fromFloat64s(dt, filled(tensor.Shape(shape).TotalSize(), 0), shape...))
	}
	do := func(op G.Op, in ...G.Value) *tensor.Dense {
		v, err := op.Do(in...)
		if err != nil {
			b.Fatal(err)
		}
		if dev != nil {
			free = append(free, v.(*tensor.Dense))
		}
		return v.(*tensor.Dense)
	}
	run := func(pass string, flops float64, step func() error) {
		b.Run(name+pass, func(b *testing.B) { runConvSteps(b, dev, flops, step) })
	}
	x, w, bias := draw(-1, 1, s.xShape()...), draw(-0.05, 0.05, s.wShape()...), draw(-0.1, 0.1, p.Cout)
	dy := draw(-1, 1, s.yShape()...)
	ny := s.yShape().TotalSize()

	// Conv, and its backward as its SymDiff builds it.
	back := s
	back.p.ReLU, back.bias, back.gradReady, back.gradPacked = false, false, true, true
	fwd, prep, dgrad, wgrad := convOp(s), convGradOp(s), convDgradOp(back), convWgradOp(back)
	y := do(fwd, x, w, bias)
	g := do(prep, y, dy)
	dx, dw, db := do(dgrad, w, y, g), do(wgrad, x, y, g), zeros(p.Cout)
	run("fwd", flops, func() error {
		_, err := fwd.UsePreallocDo(y, x, w, bias)
		return err
	})
	run("bwd", 2*flops, func() error {
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
	if dev != nil {
		// The structure before: mask pass, wgrad rounding in a pass of its own.
		old := s
		old.p.ReLU = false
		mask, dgradOld, wgradOld := reluMaskOp(s.yShape(), dt), convDgradOp(old), convWgradOp(old)
		dym := do(mask, y, dy)
		dwb := do(wgradOld, x, y, dym)
		run("bwd_twopasses", 2*flops, func() error {
			if _, err := mask.UsePreallocDo(dym, y, dy); err != nil {
				return err
			}
			if _, err := dgradOld.UsePreallocDo(dx, w, y, dym); err != nil {
				return err
			}
			_, err := wgradOld.UsePreallocDo(dwb, x, y, dym)
			return err
		})
	}

	// ConvBN: a bias-free convolution whose output [z | statistics] its
	// BatchNorm ops take, running statistics where the layer runs (on the
	// GPU nothing waits for the host), as ConvBN builds them.
	bn := &BatchNorm{
		RunningMean: place(fromFloat64s(dt, filled(p.Cout, 0), p.Cout)),
		RunningVar:  place(fromFloat64s(dt, filled(p.Cout, 1), p.Cout)),
		Momentum:    DefaultMomentum, Eps: DefaultEps, Training: true,
	}
	cs := convShape{p: p, dt: dt, bn: bn, gradReady: true}
	cs.p.ReLU = false
	bs := bnShape{n: p.N, c: p.Cout, h: p.OutH, w: p.OutW, eps: DefaultEps, momentum: DefaultMomentum,
		act: ActReLU, dt: dt, bn: bn, convStats: true, gemmDz: true}
	gamma, beta := draw(0.5, 1.5, p.Cout), draw(-0.5, 0.5, p.Cout)
	cfwd, bcoef, bfwd, bstats, bapply := convOp(cs), bnCoefOp(bs), bnOp(bs), bnGradStatsOp(bs), bnGradApplyOp(bs)
	cdgrad, cwgrad := convDgradOp(cs), convWgradOp(cs)
	z := do(cfwd, x, w)
	coef := do(bcoef, z, gamma, beta)
	yb := do(bfwd, z, gamma, beta, coef)
	stats := do(bstats, z, gamma, coef, dy)
	dz := do(bapply, z, coef, dy, stats)
	dwz := do(cwgrad, x, z, dz)
	dgamma, dbeta := zeros(p.Cout), zeros(p.Cout)
	handOffs := 0
	if dev != nil {
		handOffs = bnHandOffs(dev)
	}
	run("convbn_fwd", flops, func() error {
		zz, err := cfwd.UsePreallocDo(z, x, w)
		if err != nil {
			return err
		}
		cf, err := bcoef.UsePreallocDo(coef, zz, gamma, beta)
		if err != nil {
			return err
		}
		_, err = bfwd.UsePreallocDo(yb, zz, gamma, beta, cf)
		return err
	})
	if dev != nil && bnHandOffs(dev) == handOffs {
		b.Error("the BatchNorm op never took the convolution's statistics")
	}
	bnBackward := func(apply G.UsePreallocDoer, wgrad G.UsePreallocDoer, dzw, dzr *tensor.Dense) func() error {
		return func() error {
			if _, err := bstats.UsePreallocDo(stats, z, gamma, coef, dy); err != nil {
				return err
			}
			if _, err := apply.UsePreallocDo(dzw, z, coef, dy, stats); err != nil {
				return err
			}
			if dzw != dzr { // the copy out of the packed vector the old op wrote
				if err := partOf(dev, dzr, dzw, 0); err != nil {
					return err
				}
			}
			if err := partOf(dev, dgamma, stats, 0); err != nil {
				return err
			}
			if err := partOf(dev, dbeta, stats, p.Cout); err != nil {
				return err
			}
			if _, err := cdgrad.UsePreallocDo(dx, w, z, dzr); err != nil {
				return err
			}
			_, err := wgrad.UsePreallocDo(dwz, x, z, dzr)
			return err
		}
	}
	run("convbn_bwd", 2*flops, bnBackward(bapply, cwgrad, dz, dz))
	if dev != nil {
		csOld, bsOld := cs, bs
		csOld.gradReady, bsOld.gemmDz = false, false
		run("convbn_bwd_twopasses", 2*flops,
			bnBackward(bnGradApplyOp(bsOld), convWgradOp(csOld), zeros(bs.zInShape()...), zeros(bs.zInShape()...)))
	}
}

// BenchmarkGPUConvFpropVariants times the float32 forward kernels
// (setConvKernel on convFprop: each of convKernels' for the pass) on
// TARGETS.md's shapes: Conv with bias and ReLU, forward only, as
// BenchmarkSuiteConv's pass=fwd, timed the same way. The variants ops never
// chooses run where the modules hold them (make kernels VARIANTS=1). Names
// are benchstat-friendly, the kernel named by its design (convDesign):
// .../case=fpn_p2_3x3/kernel=mma_m128_s3.
func BenchmarkGPUConvFpropVariants(b *testing.B) {
	dev := gpu(b)
	dt := tensor.Float32
	defer setConvKernel(dev, convFprop, "")
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
		fwd := convOp(s)
		y, err := fwd.Do(x, w, bias)
		if err != nil {
			b.Fatal(err)
		}
		fk := &convKernels[convFprop]
		for _, k := range []convKernelChoice{fk.mmaM128I64, fk.mmaM128S3, fk.mmaM256S4, fk.mmaM128S3T128,
			fk.wgmmaM128S3, fk.wgmmaM256S4, fk.wgmmaM128S4} {
			b.Run(fmt.Sprintf("case=%s/kernel=%s", c.name, convDesign(k.kernel)), func(b *testing.B) {
				if _, optIn := dev.MaxSharedMemory(); k.smem > optIn {
					b.Skipf("%s needs %d bytes of shared memory per block; this GPU allows %d", k.kernel.Name(), k.smem, optIn)
				}
				if err := convWgmmaError(dev); convWgmma(k.kernel) && err != nil {
					b.Skipf("%s: %v", k.kernel.Name(), err)
				}
				skipUnbuiltVariant(b, k.kernel.Module(), k.kernel.Name())
				setConvKernel(dev, convFprop, k.kernel)
				defer setConvKernel(dev, convFprop, "")
				runConvSteps(b, dev, flops, func() error {
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
// (setConvKernel on convDgrad and convWgrad: each of convKernels' for the
// pass) on TARGETS.md's shapes: Conv with bias and ReLU, dgrad and wgrad
// apart (each one GEMM, the forward's FLOPs), each op given dy unmasked,
// timed as BenchmarkSuiteConv times. mma_m128_s3's time includes the pass
// that masks dy by the ReLU (the wgmma kernels': the pass that also rounds
// it to TF32; and, for wgrad, the split-K reduction, as mma_m128_i64's).
// Names are benchstat-friendly, the kernel named by its design:
// .../case=fpn_p2_3x3/pass=dgrad/kernel=mma_m128_s3.
func BenchmarkGPUConvBackwardVariants(b *testing.B) {
	dev := gpu(b)
	dt := tensor.Float32
	defer setConvKernel(dev, convWgrad, "")
	defer setConvKernel(dev, convDgrad, "")
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
		fwd, dgrad, wgrad := convOp(s), convDgradOp(s), convWgradOp(s)
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
		dgradStep := func() error { _, err := dgrad.UsePreallocDo(dx, w, y, dy); return err }
		wgradStep := func() error { _, err := wgrad.UsePreallocDo(dwb, x, y, dy); return err }
		dk, wk := &convKernels[convDgrad], &convKernels[convWgrad]
		for _, k := range []struct {
			mode   int
			kernel convGemmKernel
			step   func() error
		}{
			{convDgrad, dk.mmaM128I64.kernel, dgradStep},
			{convDgrad, dk.mmaM128S3.kernel, dgradStep},
			{convDgrad, dk.wgmmaM128S3.kernel, dgradStep},
			{convDgrad, dk.wgmmaM256S4.kernel, dgradStep},
			{convDgrad, dk.wgmmaM128S4.kernel, dgradStep},
			{convWgrad, wk.mmaM128I64.kernel, wgradStep},
			{convWgrad, wk.mmaM128S3.kernel, wgradStep},
			{convWgrad, wk.wgmmaM128S3.kernel, wgradStep},
			{convWgrad, wk.wgmmaM256S4.kernel, wgradStep},
		} {
			b.Run(fmt.Sprintf("case=%s/pass=%s/kernel=%s", c.name, convModeNames[k.mode], convDesign(k.kernel)), func(b *testing.B) {
				if err := convWgmmaError(dev); convWgmma(k.kernel) && err != nil {
					b.Skipf("%s: %v", k.kernel.Name(), err)
				}
				skipUnbuiltVariant(b, k.kernel.Module(), k.kernel.Name())
				setConvKernel(dev, k.mode, k.kernel)
				defer setConvKernel(dev, convWgrad, "")
				defer setConvKernel(dev, convDgrad, "")
				runConvSteps(b, dev, flops, k.step)
			})
		}
		for _, v := range []G.Value{x, w, bias, dy, y, dx, dwb} {
			if err := dev.FreeDense(v.(*tensor.Dense)); err != nil {
				b.Fatal(err)
			}
		}
	}
}
