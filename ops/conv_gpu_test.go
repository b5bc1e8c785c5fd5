package ops

// Tests of the GPU path of Conv and ConvBN (kernels/conv.cu, conv_bn.cu):
// every op on the device against its CPU twin, gradient checks with the ops
// on the device, and a training loop's memory. float32 convolutions multiply
// in TF32 on tensor cores and are compared with autograd.TolTF32, except on
// inputs that TF32 represents exactly (small integers), where the GPU must
// match the CPU to TolParity32; everything else uses TolParity32 or
// TolParity64. The GPU tests need a binary built with -tags stheno_cuda
// (make gpu-bins) and a GPU, and skip visibly anywhere else; the tests of
// the launch arithmetic run everywhere.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// fastDivide is the kernels' fdiv (conv.cuh): n/f.D by f's multiply-high
// and shift.
func fastDivide(f cuda.FastDiv, n int32) int32 {
	if f.Mul == 0 {
		return n
	}
	return int32(uint32((uint64(uint32(n))*uint64(f.Mul))>>32) >> f.Shr)
}

func TestConvFastDiv(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	ns := []int32{0, 1, 2, 3, 7, 8, 9, 255, 256, 1 << 20, 1<<30 - 1, 1 << 30, math.MaxInt32 - 1, math.MaxInt32}
	var ds []int
	for d := 1; d <= 3000; d++ {
		ds = append(ds, d)
	}
	ds = append(ds, 65535, 65536, 1<<20+1, 1<<30-1, 1<<30, 1<<30+1, math.MaxInt32-1, math.MaxInt32)
	for _, d := range ds {
		f := fastDiv(d)
		for i := range len(ns) + 200 {
			n := rng.Int32()
			if i < len(ns) {
				n = ns[i]
			} else if i%2 == 0 {
				n = int32(rng.IntN(min(4*d, math.MaxInt32)))
			}
			if got, want := fastDivide(f, n), n/int32(d); got != want {
				t.Fatalf("fastDivide(fastDiv(%d), %d) = %d, want %d (mul %#x, shr %d)", d, n, got, want, f.Mul, f.Shr)
			}
		}
	}
}

// convKernels pairs each kernel with the launch shape kernels/cuda exports
// for it: check the pairs against the kernels' own declarations. Each is
// its pass's, in the module its name says; its block is the size of its
// __launch_bounds__ (a launch of fewer threads would leave rows of the tile
// unstaged); its name spells its tile's rows (m<bm>) and, but for 256, its
// threads (t<threads>); and the variants ops never chooses are what the
// generator found inside #if STHENO_KERNEL_VARIANTS, and no other.
func TestConvKernelTable(t *testing.T) {
	seen := map[convGemmKernel]bool{}
	for mode, ks := range convKernels {
		for named, c := range map[string]convKernelChoice{
			"fma_m64_i64_f64": ks.fmaM64I64F64, "fma_m64_i64_f32": ks.fmaM64I64F32,
			"mma_m128_i64_f32": ks.mmaM128I64, "mma_m128_s3_f32": ks.mmaM128S3,
			"mma_m256_s4_f32": ks.mmaM256S4, "mma_m128_s3_t128_f32": ks.mmaM128S3T128,
			"wgmma_m128_s3_f32": ks.wgmmaM128S3, "wgmma_m256_s4_f32": ks.wgmmaM256S4, "wgmma_m128_s4_f32": ks.wgmmaM128S4,
		} {
			if c.kernel == "" {
				continue
			}
			seen[c.kernel] = true
			design := named[:len(named)-len("_f32")]
			if want := "conv_" + convModeNames[mode] + "_" + named; c.kernel.Name() != want {
				t.Errorf("%s's %s is %s, want %s", convModeNames[mode], design, c.kernel.Name(), want)
			}
			if want := map[bool]string{true: "conv_sm90a", false: "conv"}[strings.HasPrefix(design, "wgmma")]; c.kernel.Module() != want {
				t.Errorf("%s: module %s, want %s", c.kernel, c.kernel.Module(), want)
			}
			info, ok := cuda.Lookup(string(c.kernel))
			if !ok {
				t.Errorf("%s: not a kernel of kernels/cuda", c.kernel)
				continue
			}
			if info.MaxThreads != c.threads {
				t.Errorf("%s: blocks of %d threads, __launch_bounds__(%d)", c.kernel, c.threads, info.MaxThreads)
			}
			if !strings.Contains(design, fmt.Sprintf("_m%d", c.bm)) {
				t.Errorf("%s: tiles of %d rows", c.kernel, c.bm)
			}
			if (c.threads != 256) != strings.Contains(design, fmt.Sprintf("_t%d", c.threads)) {
				t.Errorf("%s: blocks of %d threads", c.kernel, c.threads)
			}
			if variant := c == ks.mmaM256S4 || c == ks.mmaM128S3T128; info.Variant != variant {
				t.Errorf("%s: a variant in kernels/cuda: %v; ops chooses it: %v", c.kernel, info.Variant, !variant)
			}
			if c.smem <= 0 || c.smem%16 != 0 {
				t.Errorf("%s: %d bytes of shared memory", c.kernel, c.smem)
			}
		}
	}
	// Every GEMM kernel of the two modules is in the table.
	for _, k := range cuda.Kernels() {
		if k.Params == "ConvGemmParams" && !seen[convGemmKernel(k.Module+"."+k.Name)] {
			t.Errorf("%s.%s is in no pass of convKernels", k.Module, k.Name)
		}
	}
}

// convKernel chooses, for float32 forward GEMMs, mma_m128_s3, mma_m128_i64
// only where its offsets or its shared memory do not fit; for float32
// dgrad and wgrad,
// mma_m128_s3 where it applies (stride 1; OutH*OutW % 4 == 0 and dy
// aligned) and fits, else mma_m128_i64; unless the overrides say otherwise;
// conv_gemm's fma_m64_i64_f64 kernels for float64; and on a device in
// GemmExact its fma_m64_i64_f32 kernels for every float32 GEMM, which no
// forced TF32 kernel replaces.
func TestConvKernelChoice(t *testing.T) {
	const hopper, ampere = 232448, 166912
	// Stride 1 and an output the size of the input (3x3 pad 1, or 1x1).
	gemm := func(n, cin, h, w, m, ncols int) cuda.ConvGemmParams {
		return cuda.ConvGemmParams{N: int32(n), Cin: int32(cin), H: int32(h), W: int32(w), M: int32(m), Ncols: int32(ncols),
			Cout: int32(m), StrideH: 1, StrideW: 1, OutH: int32(h), OutW: int32(w)}
	}
	fpn := gemm(2, 256, 200, 336, 256, 2*200*336)
	c3 := gemm(8, 128, 56, 56, 128, 8*56*56)
	c4 := gemm(8, 1024, 28, 28, 256, 8*28*28)
	huge := gemm(64, 256, 400, 400, 64, 64*400*400) // (N+1)*Cin*H*W > 2^31: mma_m128_i64
	fk, dk, wk := &convKernels[convFprop], &convKernels[convDgrad], &convKernels[convWgrad]
	i64, s3, m256, t128, f64 := fk.mmaM128I64, fk.mmaM128S3, fk.mmaM256S4, fk.mmaM128S3T128, fk.fmaM64I64F64
	di64, ds3 := dk.mmaM128I64, dk.mmaM128S3
	wi64, ws3 := wk.mmaM128I64, wk.mmaM128S3
	for _, c := range []struct {
		choice            convKernelChoice
		smem, bm, threads int
	}{
		{i64, 71680, 128, 256}, {s3, 109568, 128, 256}, {m256, 219136, 256, 256}, {t128, 109568, 128, 128},
		{f64, 34048, 64, 256}, {di64, 71680, 128, 256}, {ds3, 109568, 128, 256}, {dk.fmaM64I64F64, 34048, 64, 256},
		{wi64, 75776, 128, 256}, {ws3, 112640, 128, 256}, {wk.fmaM64I64F64, 35840, 64, 256},
		{fk.fmaM64I64F32, 49920, 64, 256}, {dk.fmaM64I64F32, 49920, 64, 256}, {wk.fmaM64I64F32, 52736, 64, 256},
	} {
		// conv.cu's values, as kernels/cuda exports them.
		if c.choice.smem != c.smem || c.choice.bm != c.bm || c.choice.threads != c.threads {
			t.Errorf("%+v, want %d bytes, %d rows, %d threads", c.choice, c.smem, c.bm, c.threads)
		}
	}
	bogus := func(name string) convGemmKernel { return convGemmKernel("conv." + name) }
	strided := c3
	strided.StrideH, strided.OutH, strided.OutW = 2, 28, 56
	oddOut := gemm(2, 5, 7, 9, 11, 2*7*9) // OutH*OutW = 63
	unaligned := c3
	unaligned.A = 4
	for _, c := range []struct {
		override convGemmKernel
		dt       tensor.Dtype
		mode     int
		args     cuda.ConvGemmParams
		optIn    int
		want     convKernelChoice // zero: an error
	}{
		{"", tensor.Float32, convFprop, fpn, hopper, s3},
		{"", tensor.Float32, convFprop, fpn, ampere, s3},
		{"", tensor.Float32, convFprop, c3, hopper, s3},
		{"", tensor.Float32, convFprop, c4, hopper, s3},
		{"", tensor.Float32, convFprop, huge, hopper, i64},
		{"", tensor.Float32, convDgrad, fpn, hopper, ds3},
		{"", tensor.Float32, convDgrad, fpn, ampere, ds3},
		{"", tensor.Float32, convDgrad, c3, hopper, ds3},
		{"", tensor.Float32, convDgrad, c4, hopper, ds3},
		{"", tensor.Float32, convDgrad, strided, hopper, di64},
		{"", tensor.Float32, convWgrad, fpn, hopper, ws3},
		{"", tensor.Float32, convWgrad, fpn, ampere, ws3},
		{"", tensor.Float32, convWgrad, c3, hopper, ws3},
		{"", tensor.Float32, convWgrad, c4, hopper, ws3},
		{"", tensor.Float32, convWgrad, strided, hopper, ws3}, // wgrad's m128_s3 takes strides
		{"", tensor.Float32, convWgrad, oddOut, hopper, wi64},
		{"", tensor.Float32, convWgrad, unaligned, hopper, wi64},
		{"", tensor.Float32, convWgrad, huge, hopper, wi64},
		{"", tensor.Float32, convWgrad, fpn, 100000, wi64}, // too little shared memory
		{"", tensor.Float64, convDgrad, fpn, hopper, dk.fmaM64I64F64},
		{di64.kernel, tensor.Float32, convDgrad, fpn, hopper, di64},
		{ds3.kernel, tensor.Float32, convDgrad, fpn, hopper, ds3},
		{ds3.kernel, tensor.Float32, convDgrad, strided, hopper, convKernelChoice{}},
		{bogus("conv_dgrad_mma_m64_s9_f32"), tensor.Float32, convDgrad, fpn, hopper, convKernelChoice{}},
		{s3.kernel, tensor.Float32, convDgrad, fpn, hopper, convKernelChoice{}}, // another pass's
		{wi64.kernel, tensor.Float32, convWgrad, fpn, hopper, wi64},
		{ws3.kernel, tensor.Float32, convWgrad, c4, hopper, ws3},
		{ws3.kernel, tensor.Float32, convWgrad, oddOut, hopper, convKernelChoice{}},
		{ws3.kernel, tensor.Float32, convWgrad, fpn, 100000, convKernelChoice{}},
		{ws3.kernel, tensor.Float64, convWgrad, fpn, hopper, wk.fmaM64I64F64},
		{"", tensor.Float64, convFprop, fpn, hopper, f64},
		{i64.kernel, tensor.Float32, convFprop, fpn, hopper, i64},
		{s3.kernel, tensor.Float32, convFprop, fpn, hopper, s3},
		{m256.kernel, tensor.Float32, convFprop, c3, hopper, m256},
		{t128.kernel, tensor.Float32, convFprop, c4, hopper, t128},
		{s3.kernel, tensor.Float64, convFprop, fpn, hopper, f64},
		{s3.kernel, tensor.Float32, convFprop, huge, hopper, convKernelChoice{}},
		{t128.kernel, tensor.Float32, convFprop, huge, hopper, convKernelChoice{}},
		{m256.kernel, tensor.Float32, convFprop, fpn, ampere, convKernelChoice{}},
		{bogus("conv_fprop_mma_m64_s9_f32"), tensor.Float32, convFprop, fpn, hopper, convKernelChoice{}},
	} {
		gpu := convGPU{optIn: c.optIn, sms: 132}
		gpu.forced[c.mode] = c.override
		got, err := convKernel(c.dt, c.mode, c.args, gpu)
		what := fmt.Sprintf("override %q, %v %s, %+v, opt-in %d", c.override, c.dt, convModeNames[c.mode], c.args, c.optIn)
		if c.want == (convKernelChoice{}) {
			if err == nil {
				t.Errorf("%s: got %+v, want an error", what, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: got %+v, %v; want %+v", what, got, err, c.want)
		}
	}
	// GemmExact: every float32 GEMM on fma_m64_i64_f32, whatever its shape
	// and the GPU; float64 as before; a forced kernel, TF32 all, an error;
	// and an error where the GPU gives a block less than its shared memory.
	for _, args := range []cuda.ConvGemmParams{fpn, c3, c4, huge, strided, oddOut, unaligned} {
		for mode := range convKernels {
			ks := &convKernels[mode]
			for _, sm90a := range []bool{false, true} {
				for _, optIn := range []int{hopper, ampere, 101376, 48 << 10} {
					gpu := convGPU{optIn: optIn, sms: 132, sm90a: sm90a, exact: true}
					what := fmt.Sprintf("GemmExact, %s, sm90a %v, opt-in %d, %+v", convModeNames[mode], sm90a, optIn, args)
					got, err := convKernel(tensor.Float32, mode, args, gpu)
					switch {
					case optIn < ks.fmaM64I64F32.smem && err == nil:
						t.Errorf("%s: got %+v, want an error: it does not fit", what, got)
					case optIn >= ks.fmaM64I64F32.smem && (err != nil || got != ks.fmaM64I64F32):
						t.Errorf("%s: got %+v, %v; want %s", what, got, err, ks.fmaM64I64F32.kernel.Name())
					}
					if got, err := convKernel(tensor.Float64, mode, args, gpu); err != nil || got != ks.fmaM64I64F64 {
						t.Errorf("%s, float64: got %+v, %v; want %s", what, got, err, ks.fmaM64I64F64.kernel.Name())
					}
					gpu.forced[mode] = ks.mmaM128I64.kernel
					if got, err := convKernel(tensor.Float32, mode, args, gpu); err == nil {
						t.Errorf("%s, %s forced: got %+v, want an error", what, ks.mmaM128I64.kernel.Name(), got)
					}
				}
			}
		}
	}
}

// On a GPU that runs conv_sm90a.cu (sm90a), forward and stride-1 dgrad
// GEMMs take the wgmma kernels (m128_s3, m256_s4 or m128_s4 by
// convWgmmaPick) when K % 4 == 0 and the weights are 16-byte aligned, and
// fall back as before otherwise; wgrad takes m256_s4 or m128_s3.
func TestConvKernelChoiceSM90a(t *testing.T) {
	const hopper = 232448
	gemm := func(n, cin, h, w, m, ncols, k int) cuda.ConvGemmParams {
		return cuda.ConvGemmParams{N: int32(n), Cin: int32(cin), H: int32(h), W: int32(w), M: int32(m), Ncols: int32(ncols),
			K: int32(k), Cout: int32(m), StrideH: 1, StrideW: 1, OutH: int32(h), OutW: int32(w)}
	}
	fpn := gemm(2, 256, 200, 336, 256, 2*200*336, 256*9)
	c3 := gemm(8, 128, 56, 56, 128, 8*56*56, 128*9)
	c4 := gemm(8, 1024, 28, 28, 256, 8*28*28, 1024)
	stem := gemm(2, 3, 224, 224, 64, 2*112*112, 3*49) // K = 147
	strided := fpn
	strided.StrideH, strided.OutH = 2, 100
	unaligned := fpn
	unaligned.A = 4
	huge := gemm(64, 256, 400, 400, 64, 64*400*400, 256*9)
	fk, dk, wk := &convKernels[convFprop], &convKernels[convDgrad], &convKernels[convWgrad]
	for _, c := range []struct {
		choice convKernelChoice
		smem   int
		bm     int
	}{
		{fk.wgmmaM128S3, 104448, 128}, {fk.wgmmaM256S4, 203776, 256}, {fk.wgmmaM128S4, 138240, 128},
		{dk.wgmmaM128S3, 104448, 128}, {dk.wgmmaM256S4, 203776, 256}, {dk.wgmmaM128S4, 138240, 128},
		{wk.wgmmaM128S3, 107520, 128}, {wk.wgmmaM256S4, 207872, 256},
	} {
		// conv_sm90a.cu's values, as kernels/cuda exports them.
		if c.choice.smem != c.smem || c.choice.bm != c.bm || c.choice.threads != 256 {
			t.Errorf("%+v, want %d bytes, %d rows, 256 threads", c.choice, c.smem, c.bm)
		}
	}
	m128s3, m256s4, m128s4 := fk.wgmmaM128S3, fk.wgmmaM256S4, fk.wgmmaM128S4
	dm128s3, dm256s4 := dk.wgmmaM128S3, dk.wgmmaM256S4
	wm128s3, wm256s4 := wk.wgmmaM128S3, wk.wgmmaM256S4
	s3, ds3, di64, ws3 := fk.mmaM128S3, dk.mmaM128S3, dk.mmaM128I64, wk.mmaM128S3
	for _, c := range []struct {
		override convGemmKernel
		mode     int
		args     cuda.ConvGemmParams
		sm90a    bool
		optIn    int
		want     convKernelChoice // zero: an error
	}{
		{"", convFprop, fpn, true, hopper, m256s4},
		{"", convFprop, c3, true, hopper, m128s3},
		{"", convFprop, c4, true, hopper, m128s4},
		{"", convFprop, fpn, true, 150000, m128s3}, // m256_s4 does not fit
		{"", convFprop, fpn, false, hopper, s3},
		{"", convFprop, stem, true, hopper, s3},
		{"", convFprop, unaligned, true, hopper, s3},
		{"", convFprop, fpn, true, 100000, fk.mmaM128I64}, // neither wgmma's nor m128_s3's fits
		{"", convFprop, huge, true, hopper, fk.mmaM128I64},
		{"", convDgrad, fpn, true, hopper, dm256s4},
		{"", convDgrad, c3, true, hopper, dm128s3},
		{"", convDgrad, fpn, false, hopper, ds3},
		{"", convDgrad, strided, true, hopper, di64},
		{"", convWgrad, fpn, true, hopper, wm256s4},
		{"", convWgrad, c3, true, hopper, wm128s3},
		{"", convWgrad, fpn, false, hopper, ws3},
		{wm128s3.kernel, convWgrad, fpn, true, hopper, wm128s3},
		{wm128s3.kernel, convWgrad, fpn, false, hopper, convKernelChoice{}},
		{wm128s3.kernel, convDgrad, fpn, true, hopper, convKernelChoice{}},
		{m128s3.kernel, convFprop, fpn, true, hopper, m128s3},
		{m256s4.kernel, convFprop, fpn, true, hopper, m256s4},
		{m256s4.kernel, convFprop, fpn, true, 166912, convKernelChoice{}}, // A100's opt-in: too little shared memory
		{dm256s4.kernel, convDgrad, fpn, true, hopper, dm256s4},
		{m128s3.kernel, convFprop, fpn, false, hopper, convKernelChoice{}},
		{m128s3.kernel, convFprop, stem, true, hopper, convKernelChoice{}},
		{m128s3.kernel, convFprop, huge, true, hopper, convKernelChoice{}},
		{s3.kernel, convFprop, fpn, true, hopper, s3},
		{dm128s3.kernel, convDgrad, fpn, true, hopper, dm128s3},
		{dm128s3.kernel, convDgrad, strided, true, hopper, convKernelChoice{}},
		{dm128s3.kernel, convWgrad, fpn, true, hopper, convKernelChoice{}},
		{ds3.kernel, convDgrad, fpn, true, hopper, ds3},
	} {
		gpu := convGPU{optIn: c.optIn, sms: 132, sm90a: c.sm90a}
		gpu.forced[c.mode] = c.override
		got, err := convKernel(tensor.Float32, c.mode, c.args, gpu)
		what := fmt.Sprintf("override %q, %s, sm90a %v, opt-in %d, %+v", c.override, convModeNames[c.mode], c.sm90a, c.optIn, c.args)
		if c.want == (convKernelChoice{}) {
			if err == nil {
				t.Errorf("%s: got %+v, want an error", what, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: got %+v, %v; want %+v", what, got, err, c.want)
		}
		if convWgmma(got.kernel) != strings.Contains(got.kernel.Name(), "_wgmma_") {
			t.Errorf("%s: module %s for %s", what, got.kernel.Module(), got.kernel.Name())
		}
	}
}

// wgrad's mma_m128_s3 runs two blocks per SM where shared memory allows
// (Hopper), which wgradSplits counts; mma_m128_i64 one.
func TestConvBlocksPerSM(t *testing.T) {
	const hopper, ampere = 232448, 166912
	wv2 := convKernels[convWgrad].mmaM128S3
	wv1 := convKernels[convWgrad].mmaM128I64
	for _, c := range []struct {
		choice convKernelChoice
		optIn  int
		want   int
	}{{wv2, hopper, 2}, {wv2, ampere, 1}, {wv1, hopper, 1}} {
		if got := convBlocksPerSM(c.choice, c.optIn); got != c.want {
			t.Errorf("%s, opt-in %d: %d blocks per SM, want %d", c.choice.kernel, c.optIn, got, c.want)
		}
	}
}

// convTestGPUs are the GPUs the choice tests fake: CUDA's
// MAX_SHARED_MEMORY_PER_BLOCK_OPTIN for their compute capability and an SM
// count of one of them. sm_86 and sm_89 (RTX 30xx and 40xx, A10, A40, L4,
// L40) give a block 99 KiB, less than mma_m128_s3's 107 KiB.
var convTestGPUs = []struct {
	name string
	gpu  convGPU
}{
	{"sm_80", convGPU{optIn: 166912, sms: 108}}, // A100
	{"sm_86", convGPU{optIn: 101376, sms: 84}},  // A40
	{"sm_89", convGPU{optIn: 101376, sms: 142}}, // L40
	{"sm_90", convGPU{optIn: 232448, sms: 132}}, // H100 without sm_90a's PTX (an old driver)
	{"sm_90a", convGPU{optIn: 232448, sms: 132, sm90a: true}},
}

// convSmemCases are TARGETS.md's convolutions, the ResNet layers around
// them (strided 3x3, the 7x7 stem, 1x1 of many channels) and the small
// layers of examples/maskrcnn on 64x64 images, with the float32 kernels
// each GEMM took on sm_80 and sm_90 and on sm_90a (fprop, dgrad, wgrad:
// the kernels' names between conv_<pass>_ and _f32) before convKernel
// checked shared memory: where everything fits, the checks change nothing.
var convSmemCases = []struct {
	convGPUCase
	sm80, sm90a [3]string
}{
	{convGPUCase{"resnet_c3_3x3", []int{8, 128, 56, 56}, []int{128, 128, 3, 3}, ConvConfig{Pad: [2]int{1, 1}}},
		[3]string{"mma_m128_s3", "mma_m128_s3", "mma_m128_s3"}, [3]string{"wgmma_m128_s3", "wgmma_m128_s3", "wgmma_m128_s3"}},
	{convGPUCase{"fpn_p2_3x3", []int{2, 256, 200, 336}, []int{256, 256, 3, 3}, ConvConfig{Pad: [2]int{1, 1}}},
		[3]string{"mma_m128_s3", "mma_m128_s3", "mma_m128_s3"}, [3]string{"wgmma_m256_s4", "wgmma_m256_s4", "wgmma_m256_s4"}},
	{convGPUCase{"resnet_c4_1x1", []int{8, 1024, 28, 28}, []int{256, 1024, 1, 1}, ConvConfig{}},
		[3]string{"mma_m128_s3", "mma_m128_s3", "mma_m128_s3"}, [3]string{"wgmma_m128_s4", "wgmma_m128_s3", "wgmma_m256_s4"}},
	{convGPUCase{"3x3 stride 2", []int{8, 128, 56, 56}, []int{256, 128, 3, 3}, ConvConfig{Stride: [2]int{2, 2}, Pad: [2]int{1, 1}}},
		[3]string{"mma_m128_s3", "mma_m128_i64", "mma_m128_s3"}, [3]string{"wgmma_m128_s4", "mma_m128_i64", "wgmma_m256_s4"}},
	{convGPUCase{"7x7 stem", []int{8, 3, 224, 224}, []int{64, 3, 7, 7}, ConvConfig{Stride: [2]int{2, 2}, Pad: [2]int{3, 3}}},
		[3]string{"mma_m128_s3", "mma_m128_i64", "mma_m128_s3"}, [3]string{"mma_m128_s3", "mma_m128_i64", "wgmma_m128_s3"}},
	{convGPUCase{"1x1 of 3136 channels (box head)", []int{512, 3136, 1, 1}, []int{256, 3136, 1, 1}, ConvConfig{}},
		[3]string{"mma_m128_s3", "mma_m128_s3", "mma_m128_i64"}, [3]string{"wgmma_m128_s4", "wgmma_m128_s4", "mma_m128_i64"}},
	{convGPUCase{"resnet_c5_1x1", []int{8, 2048, 14, 14}, []int{512, 2048, 1, 1}, ConvConfig{}},
		[3]string{"mma_m128_s3", "mma_m128_s3", "mma_m128_s3"}, [3]string{"wgmma_m128_s4", "wgmma_m128_s3", "wgmma_m256_s4"}},
	{convGPUCase{"maskrcnn stem", []int{4, 3, 64, 64}, []int{16, 3, 3, 3}, ConvConfig{Stride: [2]int{2, 2}, Pad: [2]int{1, 1}}},
		[3]string{"mma_m128_s3", "mma_m128_i64", "mma_m128_s3"}, [3]string{"mma_m128_s3", "mma_m128_i64", "wgmma_m128_s3"}},
	{convGPUCase{"maskrcnn stage", []int{4, 32, 16, 16}, []int{32, 32, 3, 3}, ConvConfig{Pad: [2]int{1, 1}}},
		[3]string{"mma_m128_s3", "mma_m128_s3", "mma_m128_s3"}, [3]string{"wgmma_m128_s4", "wgmma_m128_s4", "wgmma_m128_s3"}},
	{convGPUCase{"maskrcnn fpn output", []int{4, 64, 16, 16}, []int{64, 64, 3, 3}, ConvConfig{Pad: [2]int{1, 1}}},
		[3]string{"mma_m128_s3", "mma_m128_s3", "mma_m128_s3"}, [3]string{"wgmma_m128_s4", "wgmma_m128_s4", "wgmma_m128_s3"}},
	{convGPUCase{"maskrcnn rpn 1x1", []int{4, 64, 8, 8}, []int{12, 64, 1, 1}, ConvConfig{}},
		[3]string{"mma_m128_s3", "mma_m128_s3", "mma_m128_s3"}, [3]string{"wgmma_m128_s4", "wgmma_m128_s4", "wgmma_m128_s3"}},
	{convGPUCase{"maskrcnn mask head", []int{64, 64, 14, 14}, []int{32, 64, 3, 3}, ConvConfig{Pad: [2]int{1, 1}}},
		[3]string{"mma_m128_s3", "mma_m128_s3", "mma_m128_s3"}, [3]string{"wgmma_m128_s4", "wgmma_m128_s4", "wgmma_m128_s3"}},
}

// TestConvKernelSharedMemory: on every GPU of convTestGPUs, each GEMM of
// convSmemCases gets a kernel whose dynamic shared memory fits the GPU's
// opt-in limit: on sm_86 and sm_89 mma_m128_i64 for every float32 GEMM
// (fprop's m128_s3 does not fit), on sm_80 and sm_90 (with or without
// sm_90a) what it got before the limit was checked, and float64's
// fma_m64_i64 everywhere. A GPU of 64 KiB, where no float32 kernel fits,
// gets an error naming the GEMM, the convolution's shape, the bytes needed
// and the bytes allowed. And for every opt-in limit from 48 KiB to
// Hopper's, the choice fits or, only where the least of the kernels that
// run the GEMM does not, is that error.
func TestConvKernelSharedMemory(t *testing.T) {
	design := func(mode int, c convKernelChoice) string {
		return strings.TrimSuffix(strings.TrimPrefix(c.kernel.Name(), "conv_"+convModeNames[mode]+"_"), "_f32")
	}
	for _, sc := range convSmemCases {
		for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
			s := sc.shape(t, dt, false, true)
			for _, g := range convTestGPUs {
				for mode := range convKernels {
					what := fmt.Sprintf("%s, %v %s on %s", sc.name, dt, convModeNames[mode], g.name)
					c, err := convKernel(dt, mode, s.gemm(mode), g.gpu)
					if err != nil {
						t.Errorf("%s: %v", what, err)
						continue
					}
					if c.smem > g.gpu.optIn {
						t.Errorf("%s: %s needs %d bytes of shared memory; the GPU allows %d", what, c.kernel.Name(), c.smem, g.gpu.optIn)
					}
					want := convKernels[mode].fmaM64I64F64.kernel.Name()
					if dt == tensor.Float32 {
						switch g.name {
						case "sm_86", "sm_89":
							want = "mma_m128_i64"
						case "sm_90a":
							want = sc.sm90a[mode]
						default:
							want = sc.sm80[mode]
						}
						if got := design(mode, c); got != want {
							t.Errorf("%s: %s, want %s", what, got, want)
						}
					} else if c.kernel.Name() != want {
						t.Errorf("%s: %s, want %s", what, c.kernel.Name(), want)
					}
				}
			}
		}
	}

	// Too little shared memory for any float32 kernel.
	s := convSmemCases[0].shape(t, tensor.Float32, false, true)
	small := convGPU{optIn: 64 << 10, sms: 132, sm90a: true}
	for mode, need := range [3]int{71680, 71680, 75776} { // mma_m128_i64's
		c, err := convKernel(tensor.Float32, mode, s.gemm(mode), small)
		for _, want := range []string{
			convModeNames[mode] + " of x [8 128 56 56] by w [128 128 3 3]",
			fmt.Sprintf("needs %d bytes of shared memory per block", need),
			"this GPU allows 65536",
		} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s with 64 KiB per block: %+v, %v; want an error saying %q", convModeNames[mode], c, err, want)
			}
		}
		if err != nil {
			t.Log(err) // launchConvGemm prefixes "ops: Conv: " or "ops: Conv backward: "
		}
	}

	// Every limit: a choice that fits, or the error where nothing can.
	limits := []int{48 << 10, 64 << 10}
	for _, ks := range convKernels {
		for _, c := range []convKernelChoice{ks.fmaM64I64F64, ks.fmaM64I64F32, ks.mmaM128I64, ks.mmaM128S3, ks.wgmmaM128S3, ks.wgmmaM256S4, ks.wgmmaM128S4} {
			if c.kernel != "" {
				limits = append(limits, c.smem-1, c.smem)
			}
		}
	}
	limits = append(limits, 101376, 166912, 232448)
	for _, sc := range convSmemCases {
		for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
			s := sc.shape(t, dt, false, true)
			for _, sm90a := range []bool{false, true} {
				for _, optIn := range limits {
					gpu := convGPU{optIn: optIn, sms: 132, sm90a: sm90a}
					for mode := range convKernels {
						ks := &convKernels[mode]
						least := ks.mmaM128I64.smem
						if dt == tensor.Float64 {
							least = ks.fmaM64I64F64.smem
						}
						c, err := convKernel(dt, mode, s.gemm(mode), gpu)
						what := fmt.Sprintf("%s, %v %s, sm90a %v, opt-in %d", sc.name, dt, convModeNames[mode], sm90a, optIn)
						switch {
						case optIn < least && err == nil:
							t.Errorf("%s: %s, want an error: no kernel fits", what, c.kernel.Name())
						case optIn >= least && err != nil:
							t.Errorf("%s: %v", what, err)
						case err == nil && c.smem > optIn:
							t.Errorf("%s: %s needs %d bytes", what, c.kernel.Name(), c.smem)
						}
					}
				}
			}
		}
	}
}

// convFitting returns the kernels of cs whose shared memory dev gives a
// block, and logs the others as not tested.
func convFitting(t *testing.T, dev *backend.Device, cs ...convKernelChoice) []convKernelChoice {
	t.Helper()
	gpu := convGPUOf(dev)
	var fit []convKernelChoice
	for _, c := range cs {
		if !gpu.fits(c) {
			t.Logf("%s needs %d bytes of shared memory per block, this GPU allows %d: not tested", c.kernel.Name(), c.smem, gpu.optIn)
			continue
		}
		fit = append(fit, c)
	}
	return fit
}

// convGPUCase is a convolution of the GPU tests.
type convGPUCase struct {
	name   string
	xs, ws []int
	cfg    ConvConfig
}

// convGPUCases cover what the kernels' tiling and gathers must get right:
// shapes that are not multiples of the tiles, several tiles along every
// GEMM dimension, 1x1, 3x3, the ResNet stem (7x7 stride 2), dilation,
// unequal strides and pads. Input ranges keep TF32 results within
// TolTF32's regime (natural size up to 5).
var convGPUCases = []convGPUCase{
	{"3x3 pad 1", []int{2, 5, 9, 11}, []int{7, 5, 3, 3}, ConvConfig{Pad: [2]int{1, 1}}},
	{"1x1", []int{2, 9, 6, 7}, []int{13, 9, 1, 1}, ConvConfig{}},
	{"7x7 stride 2 pad 3 (stem)", []int{2, 3, 23, 21}, []int{8, 3, 7, 7}, ConvConfig{Stride: [2]int{2, 2}, Pad: [2]int{3, 3}}},
	{"3x3 dilation 2 pad 2", []int{1, 4, 11, 10}, []int{6, 4, 3, 3}, ConvConfig{Pad: [2]int{2, 2}, Dilation: [2]int{2, 2}}},
	{"2x3 stride (2,1) pad (0,1) dilation (1,2)", []int{2, 2, 9, 10}, []int{5, 2, 2, 3},
		ConvConfig{Stride: [2]int{2, 1}, Pad: [2]int{0, 1}, Dilation: [2]int{1, 2}}},
	{"2x4 pad (1,2), odd sizes", []int{3, 7, 5, 13}, []int{3, 7, 2, 4}, ConvConfig{Pad: [2]int{1, 2}}},
	// Two tiles of output channels, four of pixels, nine k-tiles; wgrad
	// splits its reduction.
	{"3x3 130 channels", []int{2, 24, 14, 14}, []int{130, 24, 3, 3}, ConvConfig{Pad: [2]int{1, 1}}},
}

func (c convGPUCase) shape(t testing.TB, dt tensor.Dtype, bias, relu bool) convShape {
	t.Helper()
	g := G.NewGraph()
	x := G.NewTensor(g, dt, 4, G.WithShape(c.xs...))
	w := G.NewTensor(g, dt, 4, G.WithShape(c.ws...))
	p, _, err := convParams("test", x, w, c.cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.ReLU = relu
	return convShape{p: p, bias: bias, dt: dt}
}

// intTensor draws integers in [lo, hi]: TF32 represents them exactly, and
// float32 sums of a few thousand of them too, so a TF32 convolution of such
// tensors is exact.
func intTensor(rng *rand.Rand, dt tensor.Dtype, lo, hi int, shape ...int) *tensor.Dense {
	v := make([]float64, tensor.Shape(shape).TotalSize())
	for i := range v {
		v[i] = float64(lo + rng.IntN(hi-lo+1))
	}
	return fromFloat64s(dt, v, shape...)
}

// segment is a part of an op's output compared with one tolerance.
type segment struct {
	n   int // elements; 0: the rest
	tol autograd.Tolerance
}

// parityBy runs op on host inputs and on copies of them on the device and
// compares the outputs segment by segment; then it runs the device op again
// into a NaN-poisoned buffer, which the op must overwrite entirely.
func parityBy(t *testing.T, dev *backend.Device, op G.Op, segs []segment, inputs ...*tensor.Dense) {
	t.Helper()
	parityOf(t, dev, op, op, segs, inputs...)
}

// parityOf is parityBy with a separate op for the CPU, for ops that hold
// state of their own placement (a BatchNorm's running statistics).
func parityOf(t *testing.T, dev *backend.Device, cpuOp, op G.Op, segs []segment, inputs ...*tensor.Dense) {
	t.Helper()
	host := make([]G.Value, len(inputs))
	onDev := make([]G.Value, len(inputs))
	for i, d := range inputs {
		host[i] = d
		onDev[i] = toDev(t, dev, d)
	}
	want, err := cpuOp.Do(host...)
	if err != nil {
		t.Fatalf("CPU: %v", err)
	}
	wantF := toFloat64s(t, want)
	compare := func(what string, got G.Value) {
		t.Helper()
		g := fromDev(t, dev, got)
		if len(g) != len(wantF) {
			t.Fatalf("%v: %s has %d elements, want %d", op, what, len(g), len(wantF))
		}
		off := 0
		for _, s := range segs {
			n := s.n
			if n == 0 {
				n = len(g) - off
			}
			if err := s.tol.Compare(g[off:off+n], wantF[off:off+n]); err != nil {
				t.Errorf("%v: %s, elements [%d,%d): GPU vs CPU: %v", op, what, off, off+n, err)
			}
			t.Logf("%v: %s, elements [%d,%d): GPU vs CPU: the worst element at %.3g of the bound",
				op, what, off, off+n, s.tol.Worst(g[off:off+n], wantF[off:off+n]))
			off += n
		}
	}
	got, err := op.Do(onDev...)
	if err != nil {
		t.Fatalf("GPU: %v", err)
	}
	compare("new output", got)
	poison := toDev(t, dev, fromFloat64s(got.Dtype(), filled(got.Shape().TotalSize(), math.NaN()), got.Shape()...))
	again, err := op.(G.UsePreallocDoer).UsePreallocDo(poison, onDev...)
	if err != nil {
		t.Fatalf("GPU, reused buffer: %v", err)
	}
	if again != G.Value(poison) {
		t.Errorf("%v: the op did not reuse a buffer of the right shape", op)
	}
	compare("reused buffer", again)
}

// convTols returns the tolerances of a convolution result and of the
// plain float32 sums that go with it (the bias gradient).
func convTols(dt tensor.Dtype, exact bool) (gemm, sums autograd.Tolerance) {
	switch {
	case dt == tensor.Float64:
		return autograd.TolParity64, autograd.TolParity64
	case exact:
		return autograd.TolParity32, autograd.TolParity32
	}
	return autograd.TolTF32, autograd.TolParity32
}

func TestGPUConvParity(t *testing.T) {
	dev := gpu(t)
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for ci, c := range convGPUCases {
			for _, exact := range []bool{false, true} {
				if exact && dt == tensor.Float64 {
					continue
				}
				for _, variant := range []struct {
					bias, relu bool
				}{{true, true}, {false, false}} {
					name := fmt.Sprintf("%v/%s/bias=%t/relu=%t/exact=%t", dt, c.name, variant.bias, variant.relu, exact)
					t.Run(name, func(t *testing.T) {
						rng := rand.New(rand.NewPCG(uint64(ci), 5))
						s := c.shape(t, dt, variant.bias, variant.relu)
						draw := func(lo, hi float64, shape ...int) *tensor.Dense {
							if exact {
								return intTensor(rng, dt, int(lo*2), int(hi*2), shape...)
							}
							return randTensor(rng, dt, lo, hi, shape...)
						}
						x := draw(-1, 1, s.xShape()...)
						w := draw(-0.5, 0.5, s.wShape()...)
						if c.name == "3x3 130 channels" && !exact {
							w = draw(-0.25, 0.25, s.wShape()...) // K = 216: keep the result's size near 1
						}
						in := []*tensor.Dense{x, w}
						if variant.bias {
							in = append(in, draw(-0.5, 0.5, s.bShape()...))
						}
						gemm, sums := convTols(dt, exact)
						parityBy(t, dev, convOp(s), []segment{{tol: gemm}}, in...)
						// The backward ops read y for the ReLU mask: the CPU's y,
						// so that both sides mask alike.
						y, err := convOp(s).Do(toValues(in)...)
						if err != nil {
							t.Fatal(err)
						}
						// wgrad sums up to 392 products dy*x: dy in [-0.5, 0.5]
						// keeps them within TolTF32's regime.
						dy := draw(-0.5, 0.5, s.yShape()...)
						parityBy(t, dev, convDgradOp(s), []segment{{tol: gemm}}, w, y.(*tensor.Dense), dy)
						segs := []segment{{tol: gemm}}
						if variant.bias {
							segs = []segment{{n: s.wShape().TotalSize(), tol: gemm}, {tol: sums}}
						}
						parityBy(t, dev, convWgradOp(s), segs, x, y.(*tensor.Dense), dy)
						if !variant.relu {
							return
						}
						// The backward as Conv's SymDiff builds it: convGradOp's
						// one pass, then dgrad and wgrad reading its output
						// where it lies, as the GPU leaves it (g rounded to
						// TF32 in float32) on both sides.
						prep := convGradOp(s)
						ny := s.yShape().TotalSize()
						segs = []segment{{n: ny, tol: tf32Tol(dt, !exact, sums)}, {tol: sums}}
						parityBy(t, dev, prep, segs, y.(*tensor.Dense), dy)
						g, err := prep.Do(y, dy)
						if err != nil {
							t.Fatal(err)
						}
						gp := roundedTF32(g.(*tensor.Dense), ny)
						back := s
						back.p.ReLU, back.bias, back.gradReady, back.gradPacked = false, false, true, variant.bias
						parityBy(t, dev, convDgradOp(back), []segment{{tol: gemm}}, w, y.(*tensor.Dense), gp)
						parityBy(t, dev, convWgradOp(back), []segment{{tol: gemm}}, x, y.(*tensor.Dense), gp)
					})
				}
			}
		}
	}
}

// roundedTF32 returns a copy of d with its first n elements rounded to TF32
// (to nearest, ties away from zero, as cvt.rna.tf32) in float32, as the
// GPU's convGradOp and bnGradApplyOp leave them; float64 is copied as it is.
func roundedTF32(d *tensor.Dense, n int) *tensor.Dense {
	c := d.Clone().(*tensor.Dense)
	if v, ok := c.Data().([]float32); ok {
		for i := range v[:n] {
			u := math.Float32bits(v[i])
			if math.Abs(float64(v[i])) <= math.MaxFloat32 { // not Inf or NaN
				u += 0x1000 // half a TF32 ulp, on the magnitude
			}
			v[i] = math.Float32frombits(u &^ 0x1fff)
		}
	}
	return c
}

// convGradOp, the one pass of a Conv layer's backward with a ReLU, against
// the CPU: g (rounded to TF32 on the GPU in float32, and then a TF32 value)
// and the bias gradient, over planes of whole float4s and not, of one and of
// two reduction chunks, with and without a bias.
func TestGPUConvGradParity(t *testing.T) {
	dev := gpu(t)
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for ci, c := range []convGPUCase{
			{"odd plane", []int{2, 3, 5, 7}, []int{5, 3, 1, 1}, ConvConfig{}},
			{"plane of float4s", []int{3, 2, 4, 6}, []int{7, 2, 1, 1}, ConvConfig{}},
			{"two chunks", []int{1, 2, 65, 67}, []int{3, 2, 1, 1}, ConvConfig{}},
		} {
			for _, bias := range []bool{false, true} {
				t.Run(fmt.Sprintf("%v/%s/bias=%t", dt, c.name, bias), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(ci), 13))
					s := c.shape(t, dt, bias, true)
					y := randTensor(rng, dt, -1, 1, s.yShape()...) // half of it masked
					dy := randTensor(rng, dt, -1, 1, s.yShape()...)
					ny := s.yShape().TotalSize()
					segs := []segment{{n: ny, tol: tf32Tol(dt, true, parityTol(dt))}, {tol: parityTol(dt)}}
					parityBy(t, dev, convGradOp(s), segs, y, dy)
					if dt == tensor.Float32 {
						expectTF32(t, dev, convGradOp(s), ny, y, dy)
					}
				})
			}
		}
	}
}

// convFpropVariantCases are convGPUCases and cases that take the other
// paths of the pipelined kernels: weights copied 16 bytes at a time (K a
// multiple of 4) over several k-tiles, a 7x7 filter (49 taps: bounds by
// compares, not tap masks) with K a multiple of 4, two tiles of
// mma_m256_s4's 256 rows (three of the others' 128), and pointwise gathers
// (1x1, stride 1, images of a multiple of 4 pixels: 16-byte copies of x).
var convFpropVariantCases = append(convGPUCases[:len(convGPUCases):len(convGPUCases)],
	convGPUCase{"1x1 stride 2, K=64", []int{3, 64, 11, 13}, []int{40, 64, 1, 1}, ConvConfig{Stride: [2]int{2, 2}}},
	convGPUCase{"5x5 pad 2, K=100", []int{1, 4, 7, 13}, []int{9, 4, 5, 5}, ConvConfig{Pad: [2]int{2, 2}}},
	convGPUCase{"7x7 stride 2 pad 3, K=196", []int{2, 4, 23, 21}, []int{8, 4, 7, 7}, ConvConfig{Stride: [2]int{2, 2}, Pad: [2]int{3, 3}}},
	convGPUCase{"3x3 pad 1, 2x3 tiles, K=288", []int{2, 32, 13, 11}, []int{200, 32, 3, 3}, ConvConfig{Pad: [2]int{1, 1}}},
	convGPUCase{"3x3 pad 1, 300 channels, K=72", []int{1, 8, 12, 13}, []int{300, 8, 3, 3}, ConvConfig{Pad: [2]int{1, 1}}},
	convGPUCase{"1x1 pointwise, K=12", []int{2, 12, 6, 10}, []int{20, 12, 1, 1}, ConvConfig{}},
	convGPUCase{"1x1 pointwise, K=9, 2 row tiles", []int{3, 9, 8, 8}, []int{140, 9, 1, 1}, ConvConfig{}},
)

// The float32 forward kernels (setConvKernel on convFprop): each against the
// CPU twin through the op, as TestGPUConvParity does; then conv_pipe's
// (mma_m128_s3, mma_m128_s3_t128, mma_m256_s4) against conv_gemm's
// mma_m128_i64 with every part of the epilogue (scale, shift, residual,
// ReLU and the BatchNorm statistics): each output is the same sum of
// products of the same TF32 operands in the same order in all four, so
// they must agree bit for bit. The variants ops never chooses are tested
// where the modules hold them (make kernels VARIANTS=1).
func TestGPUConvFpropVariants(t *testing.T) {
	dev := gpu(t)
	defer setConvKernel(dev, convFprop, "")
	dt := tensor.Float32
	fk := &convKernels[convFprop]
	kernels := convFitting(t, dev, fk.mmaM128I64, fk.mmaM128S3, fk.mmaM128S3T128, fk.mmaM256S4)
	// conv_sm90a.cu's wgmma kernels sum each k-step of 8 inside the MMA, in
	// an order of their own: they are compared with the CPU, not bit for
	// bit.
	parityKernels := kernels
	if err := convWgmmaError(dev); err == nil {
		parityKernels = append(parityKernels[:len(kernels):len(kernels)], convFitting(t, dev, fk.wgmmaM128S3, fk.wgmmaM256S4, fk.wgmmaM128S4)...)
	} else if major, minor := dev.ComputeCapability(); major == 9 && minor == 0 {
		t.Errorf("%s does not load on this compute capability 9.0 GPU: %v", fk.wgmmaM128S3.kernel.Name(), err)
	} else {
		t.Logf("%s: not tested: %v", fk.wgmmaM128S3.kernel.Name(), err)
	}
	for ci, c := range convFpropVariantCases {
		bigK := c.ws[1]*c.ws[2]*c.ws[3] >= 100
		for _, kc := range parityKernels {
			kernel := kc.kernel
			for _, exact := range []bool{false, true} {
				for _, variant := range []struct {
					bias, relu bool
				}{{true, true}, {false, false}} {
					name := fmt.Sprintf("%s/%s/bias=%t/relu=%t/exact=%t", kernel.Name(), c.name, variant.bias, variant.relu, exact)
					t.Run(name, func(t *testing.T) {
						skipUnbuiltVariant(t, kernel.Module(), kernel.Name())
						setConvKernel(dev, convFprop, kernel)
						rng := rand.New(rand.NewPCG(uint64(ci), 8))
						s := c.shape(t, dt, variant.bias, variant.relu)
						if k := s.p.Cin * s.p.KH * s.p.KW; convWgmma(kernel) && k%4 != 0 {
							t.Skipf("%s needs K %% 4 == 0, K = %d", kernel.Name(), k)
						}
						draw := func(lo, hi float64, shape ...int) *tensor.Dense {
							if exact {
								return intTensor(rng, dt, int(lo*2), int(hi*2), shape...)
							}
							return randTensor(rng, dt, lo, hi, shape...)
						}
						x := draw(-1, 1, s.xShape()...)
						w := draw(-0.5, 0.5, s.wShape()...)
						if bigK && !exact {
							w = draw(-0.25, 0.25, s.wShape()...) // keep the result's size near 1
						}
						in := []*tensor.Dense{x, w}
						if variant.bias {
							in = append(in, draw(-0.5, 0.5, s.bShape()...))
						}
						gemm, _ := convTols(dt, exact)
						parityBy(t, dev, convOp(s), []segment{{tol: gemm}}, in...)
					})
				}
			}
		}
		t.Run("same-bits-as-mma_m128_i64/"+c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(ci), 9))
			s := c.shape(t, dt, false, true)
			p := s.p
			ptr := func(d *tensor.Dense) backend.DevicePtr {
				t.Helper()
				pp, err := dev.Ptr(toDev(t, dev, d))
				if err != nil {
					t.Fatal(err)
				}
				return pp
			}
			args := s.gemm(convFprop)
			args.A = ptr(randTensor(rng, dt, -0.25, 0.25, s.wShape()...))
			args.B = ptr(randTensor(rng, dt, -1, 1, s.xShape()...))
			args.Scale = ptr(randTensor(rng, dt, 0.5, 1.5, p.Cout))
			args.Shift = ptr(randTensor(rng, dt, -0.5, 0.5, p.Cout))
			args.Residual = ptr(randTensor(rng, dt, -1, 1, s.yShape()...))
			args.ReLU = 1
			slots := ceilDiv(int(args.Ncols), cuda.ConvF32TileN)
			run := func(t *testing.T, kernel convGemmKernel) (y, stats []float64) {
				t.Helper()
				setConvKernel(dev, convFprop, kernel)
				yd := toDev(t, dev, fromFloat64s(dt, filled(s.yShape().TotalSize(), math.NaN()), s.yShape()...))
				sd := toDev(t, dev, fromFloat64s(tensor.Float64, filled(slots*p.Cout*bnRecForward, math.NaN()), slots*p.Cout*bnRecForward))
				a := args
				var err error
				if a.Out, err = dev.Ptr(yd); err != nil {
					t.Fatal(err)
				}
				if a.Stats, err = dev.Ptr(sd); err != nil {
					t.Fatal(err)
				}
				if err := launchConvGemm("test", dev, dt, convFprop, a, 1); err != nil {
					t.Fatal(err)
				}
				return fromDev(t, dev, yd), fromDev(t, dev, sd)
			}
			y0, stats0 := run(t, kernels[0].kernel)
			for _, kc := range kernels[1:] {
				kernel := kc.kernel
				t.Run(convDesign(kernel), func(t *testing.T) {
					skipUnbuiltVariant(t, kernel.Module(), kernel.Name())
					y, stats := run(t, kernel)
					for _, o := range []struct {
						what   string
						v0, vk []float64
					}{{"y", y0, y}, {"statistics", stats0, stats}} {
						bad := 0
						for i := range o.v0 {
							if math.Float64bits(o.v0[i]) != math.Float64bits(o.vk[i]) || math.IsNaN(o.vk[i]) {
								if bad < 5 {
									t.Errorf("%s[%d]: %s %v, %s %v", o.what, i, kernel.Name(), o.vk[i], kernels[0].kernel.Name(), o.v0[i])
								}
								bad++
							}
						}
						if bad > 0 {
							t.Errorf("%s: %d of %d values differ between %s and %s (or are NaN)", o.what, bad, len(o.v0), kernel.Name(), kernels[0].kernel.Name())
						}
					}
				})
			}
		})
	}
}

// convDesign is a GEMM kernel's name without its pass and dtype:
// mma_m128_s3 for conv_fprop_mma_m128_s3_f32.
func convDesign(k convGemmKernel) string {
	n := k.Name()
	for _, pass := range convModeNames {
		n = strings.TrimPrefix(n, "conv_"+pass+"_")
	}
	return strings.TrimSuffix(strings.TrimSuffix(n, "_f32"), "_f64")
}

// convBackwardVariantCases are convFpropVariantCases (several of them with
// OutH*OutW % 4 == 0, which wgrad's mma_m128_s3 needs) and a dgrad of two
// row tiles.
var convBackwardVariantCases = append(convFpropVariantCases[:len(convFpropVariantCases):len(convFpropVariantCases)],
	convGPUCase{"3x3 pad 1, 150 input channels", []int{2, 150, 6, 10}, []int{40, 150, 3, 3}, ConvConfig{Pad: [2]int{1, 1}}},
)

// The float32 backward kernels (setConvKernel on convDgrad and
// convWgrad): each against the CPU twin through the ops, as
// TestGPUConvParity does, with bias and ReLU (the cp.async and wgmma
// kernels read dy masked beforehand) and without; mma_m128_s3 is skipped,
// visibly, where it does not apply (strided dgrad; wgrad with OutH*OutW %
// 4 != 0). Then dgrad's mma_m128_s3 against mma_m128_i64 through the op,
// and wgrad's mma_m128_s3 dw against mma_m128_i64's in one split: the same
// sums of the same TF32 products in the same order, so bit for bit.
func TestGPUConvBackwardVariants(t *testing.T) {
	dev := gpu(t)
	defer setConvKernel(dev, convWgrad, "")
	defer setConvKernel(dev, convDgrad, "")
	dt := tensor.Float32
	dk, wk := &convKernels[convDgrad], &convKernels[convWgrad]
	for ci, c := range convBackwardVariantCases {
		bigK := c.ws[1]*c.ws[2]*c.ws[3] >= 100
		for _, mode := range []int{convDgrad, convWgrad} {
			ks := &convKernels[mode]
			choices := []convKernelChoice{ks.mmaM128I64, ks.mmaM128S3}
			wgmma := []convKernelChoice{ks.wgmmaM128S3, ks.wgmmaM256S4}
			if mode == convDgrad {
				wgmma = append(wgmma, ks.wgmmaM128S4)
			}
			if err := convWgmmaError(dev); err == nil {
				choices = append(choices, wgmma...)
			} else if ci == 0 {
				t.Logf("%s's wgmma kernels: not tested: %v", convModeNames[mode], err)
			}
			var kernels []convGemmKernel
			for _, c := range convFitting(t, dev, choices...) {
				kernels = append(kernels, c.kernel)
			}
			for _, kernel := range kernels {
				for _, exact := range []bool{false, true} {
					for _, variant := range []struct {
						bias, relu bool
					}{{true, true}, {false, false}} {
						name := fmt.Sprintf("%s/%s/bias=%t/relu=%t/exact=%t", kernel.Name(), c.name, variant.bias, variant.relu, exact)
						t.Run(name, func(t *testing.T) {
							skipUnbuiltVariant(t, kernel.Module(), kernel.Name())
							s := c.shape(t, dt, variant.bias, variant.relu)
							if fits, why := convPipeFits(mode, s.gemm(mode)); kernel != kernels[0] && !fits {
								t.Skipf("%s does not apply: %s", kernel.Name(), why)
							}
							if k := s.p.Cout * s.p.KH * s.p.KW; convWgmma(kernel) && mode == convDgrad && k%4 != 0 {
								t.Skipf("%s needs K %% 4 == 0, K = %d", kernel.Name(), k)
							}
							setConvKernel(dev, mode, kernel)
							defer setConvKernel(dev, mode, "")
							rng := rand.New(rand.NewPCG(uint64(ci), 12))
							draw := func(lo, hi float64, shape ...int) *tensor.Dense {
								if exact {
									return intTensor(rng, dt, int(lo*2), int(hi*2), shape...)
								}
								return randTensor(rng, dt, lo, hi, shape...)
							}
							x := draw(-1, 1, s.xShape()...)
							w := draw(-0.5, 0.5, s.wShape()...)
							if bigK && !exact {
								w = draw(-0.25, 0.25, s.wShape()...) // keep the result's size near 1
							}
							in := []*tensor.Dense{x, w}
							if variant.bias {
								in = append(in, draw(-0.5, 0.5, s.bShape()...))
							}
							// The CPU's y masks dy on both sides alike.
							y, err := convOp(s).Do(toValues(in)...)
							if err != nil {
								t.Fatal(err)
							}
							dy := draw(-0.5, 0.5, s.yShape()...)
							gemm, sums := convTols(dt, exact)
							if mode == convDgrad {
								parityBy(t, dev, convDgradOp(s), []segment{{tol: gemm}}, w, y.(*tensor.Dense), dy)
								return
							}
							segs := []segment{{tol: gemm}}
							if variant.bias {
								segs = []segment{{n: s.wShape().TotalSize(), tol: gemm}, {tol: sums}}
							}
							parityBy(t, dev, convWgradOp(s), segs, x, y.(*tensor.Dense), dy)
						})
					}
				}
			}
		}
		t.Run("same-bits-as-mma_m128_i64/"+c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(ci), 13))
			s := c.shape(t, dt, true, true)
			p := s.p
			x := toDev(t, dev, randTensor(rng, dt, -1, 1, s.xShape()...))
			w := toDev(t, dev, randTensor(rng, dt, -0.25, 0.25, s.wShape()...))
			y := toDev(t, dev, randTensor(rng, dt, -1, 1, s.yShape()...)) // masks about half of dy
			dy := toDev(t, dev, randTensor(rng, dt, -0.5, 0.5, s.yShape()...))
			sameBits := func(what string, i64, s3 []float64, n int) {
				t.Helper()
				bad := 0
				for i := range n {
					if math.Float64bits(i64[i]) != math.Float64bits(s3[i]) || math.IsNaN(s3[i]) {
						if bad < 5 {
							t.Errorf("%s[%d]: mma_m128_s3 %v, mma_m128_i64 %v", what, i, s3[i], i64[i])
						}
						bad++
					}
				}
				if bad > 0 {
					t.Errorf("%s: %d of %d values differ between mma_m128_s3 and mma_m128_i64 (or are NaN)", what, bad, n)
				}
			}
			if fits, why := convPipeFits(convDgrad, s.gemm(convDgrad)); fits {
				var dx [2][]float64
				for i, kernel := range []convGemmKernel{dk.mmaM128I64.kernel, dk.mmaM128S3.kernel} {
					setConvKernel(dev, convDgrad, kernel)
					got, err := convDgradOp(s).Do(w, y, dy)
					setConvKernel(dev, convDgrad, "")
					if err != nil {
						t.Fatal(err)
					}
					dx[i] = fromDev(t, dev, got)
				}
				sameBits("dx", dx[0], dx[1], len(dx[0]))
			} else {
				t.Logf("dgrad's mma_m128_s3 does not apply: %s", why)
			}
			args := s.gemm(convWgrad)
			args.A, args.B = devPtr(t, dev, dy), devPtr(t, dev, x)
			if fits, why := convPipeFits(convWgrad, args); !fits {
				t.Logf("wgrad's mma_m128_s3 does not apply: %s", why)
				return
			}
			nw := s.wShape().TotalSize()
			var dwb [2][]float64
			for i, kernel := range []convGemmKernel{wk.mmaM128I64.kernel, wk.mmaM128S3.kernel} {
				out := toDev(t, dev, fromFloat64s(dt, filled(nw+p.Cout, math.NaN()), nw+p.Cout))
				args.Out = devPtr(t, dev, out)
				args.BiasGrad = args.Out + backend.DevicePtr(4*nw)
				setConvKernel(dev, convWgrad, kernel)
				err := launchConvGemm("test", dev, dt, convWgrad, args, 1)
				setConvKernel(dev, convWgrad, "")
				if err != nil {
					t.Fatal(err)
				}
				dwb[i] = fromDev(t, dev, out)
			}
			sameBits("dw", dwb[0], dwb[1], nw)
			if err := autograd.TolParity32.Compare(dwb[1][nw:], dwb[0][nw:]); err != nil {
				t.Errorf("bias gradient, mma_m128_s3 vs mma_m128_i64: %v", err)
			}
		})
	}
}

// devPtr is d's device pointer.
func devPtr(t *testing.T, dev *backend.Device, d *tensor.Dense) backend.DevicePtr {
	t.Helper()
	p, err := dev.Ptr(d)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func toValues(ds []*tensor.Dense) []G.Value {
	v := make([]G.Value, len(ds))
	for i, d := range ds {
		v[i] = d
	}
	return v
}

// The forward kernel's epilogue can apply a per-channel scale and shift
// and a residual before the ReLU: an inference BatchNorm folded into the
// convolution. Checked against the CPU convolution followed by the CPU
// BatchNorm in inference mode.
func TestGPUConvEpilogueFoldsBatchNorm(t *testing.T) {
	dev := gpu(t)
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for ci, c := range convGPUCases[:3] {
			t.Run(fmt.Sprintf("%v/%s", dt, c.name), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(ci), 6))
				s := c.shape(t, dt, false, false)
				p := s.p
				x := intTensor(rng, dt, -2, 2, s.xShape()...)
				w := intTensor(rng, dt, -2, 2, s.wShape()...)
				res := randTensor(rng, dt, -1, 1, s.yShape()...)
				gamma := randTensor(rng, dt, 0.5, 1.5, p.Cout)
				beta := randTensor(rng, dt, -0.5, 0.5, p.Cout)
				rm := randTensor(rng, dt, -1, 1, p.Cout)
				rv := randTensor(rng, dt, 0.5, 2, p.Cout)
				bp := kernels.BatchNormParams{N: p.N, C: p.Cout, HW: p.OutH * p.OutW, Eps: 1e-3, ReLU: true}
				z := tensor.New(tensor.Of(dt), tensor.WithShape(s.yShape()...))
				want := tensor.New(tensor.Of(dt), tensor.WithShape(s.yShape()...))
				scale := make([]float64, p.Cout)
				shift := make([]float64, p.Cout)
				switch dt {
				case tensor.Float32:
					kernels.ConvForward(p, x.Float32s(), w.Float32s(), nil, z.Float32s())
					kernels.BatchNormForward(bp, z.Float32s(), gamma.Float32s(), beta.Float32s(), res.Float32s(), rm.Float32s(), rv.Float32s(), want.Float32s())
					for i := range scale {
						// BatchNormForward's expressions, rounding for rounding.
						sc := gamma.Float32s()[i] * (1 / float32(math.Sqrt(float64(rv.Float32s()[i]+float32(1e-3)))))
						scale[i], shift[i] = float64(sc), float64(beta.Float32s()[i]-rm.Float32s()[i]*sc)
					}
				default:
					kernels.ConvForward(p, x.Float64s(), w.Float64s(), nil, z.Float64s())
					kernels.BatchNormForward(bp, z.Float64s(), gamma.Float64s(), beta.Float64s(), res.Float64s(), rm.Float64s(), rv.Float64s(), want.Float64s())
					for i := range scale {
						sc := gamma.Float64s()[i] * (1 / math.Sqrt(rv.Float64s()[i]+1e-3))
						scale[i], shift[i] = sc, beta.Float64s()[i]-rm.Float64s()[i]*sc
					}
				}
				ptr := func(d *tensor.Dense) backend.DevicePtr {
					pp, err := dev.Ptr(toDev(t, dev, d))
					if err != nil {
						t.Fatal(err)
					}
					return pp
				}
				y, err := dev.NewDense(dt, s.yShape()...)
				if err != nil {
					t.Fatal(err)
				}
				yPtr, err := dev.Ptr(y)
				if err != nil {
					t.Fatal(err)
				}
				args := s.gemm(convFprop)
				args.A, args.B, args.Out = ptr(w), ptr(x), yPtr
				args.Scale, args.Shift = ptr(fromFloat64s(dt, scale, p.Cout)), ptr(fromFloat64s(dt, shift, p.Cout))
				args.Residual, args.ReLU = ptr(res), 1
				if err := launchConvGemm("test", dev, dt, convFprop, args, 1); err != nil {
					t.Fatal(err)
				}
				// The CPU folds nothing: its rounding differs by a few ulps
				// of the normalised output.
				if err := parityTol(dt).Compare(fromDev(t, dev, y), toFloat64s(t, want)); err != nil {
					t.Error(err)
				}
			})
		}
	}
}

// bnGPULayer makes a BatchNorm layer for the op tests: running statistics
// copied from rm and rv, on the host or on dev.
func bnGPULayer(t *testing.T, dev *backend.Device, rm, rv *tensor.Dense, training, onDevice bool) *BatchNorm {
	t.Helper()
	bn := &BatchNorm{RunningMean: rm.Clone().(*tensor.Dense), RunningVar: rv.Clone().(*tensor.Dense), Training: training}
	if onDevice {
		bn.RunningMean, bn.RunningVar = toDev(t, dev, rm), toDev(t, dev, rv)
	}
	return bn
}

func runningOf(t *testing.T, dev *backend.Device, d *tensor.Dense) []float64 {
	t.Helper()
	if backend.IsDevice(d) {
		return fromDev(t, dev, d)
	}
	return toFloat64s(t, d)
}

// The BatchNorm ops on z given directly (the op reduces the statistics
// itself), against the CPU, in training and inference, with running
// statistics in host memory and on the GPU.
func TestGPUBatchNormOpsParity(t *testing.T) {
	dev := gpu(t)
	shapes := [][4]int{
		{2, 3, 5, 7},   // odd plane: scalar apply
		{3, 5, 4, 4},   // plane of a multiple of 4: float4 apply
		{1, 2, 65, 67}, // a plane of two reduction chunks
	}
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		tol := parityTol(dt)
		for si, sh := range shapes {
			for _, training := range []bool{true, false} {
				for _, act := range []Activation{ActNone, ActReLU} {
					for _, onDevice := range []bool{false, true} {
						residual := act == ActReLU
						name := fmt.Sprintf("%v/%v/training=%t/act=%v/running-on-gpu=%t", dt, sh, training, act, onDevice)
						t.Run(name, func(t *testing.T) {
							rng := rand.New(rand.NewPCG(uint64(si), 7))
							n, c, h, w := sh[0], sh[1], sh[2], sh[3]
							// A mean far from zero against the spread tests the
							// statistics' precision.
							z := randTensor(rng, dt, 1, 3, n, c, h, w)
							gamma := randTensor(rng, dt, 0.5, 1.5, c)
							beta := randTensor(rng, dt, -0.5, 0.5, c)
							rm := randTensor(rng, dt, -0.5, 0.5, c)
							rv := randTensor(rng, dt, 0.5, 2, c)
							shape := func(bn *BatchNorm) bnShape {
								return bnShape{n: n, c: c, h: h, w: w, eps: 1e-3, momentum: 0.2, act: act, residual: residual, dt: dt, bn: bn}
							}
							cpuBN := bnGPULayer(t, dev, rm, rv, training, false)
							gpuBN := bnGPULayer(t, dev, rm, rv, training, onDevice)
							in := []*tensor.Dense{z, gamma, beta}
							if residual {
								in = append(in, randTensor(rng, dt, -1, 1, n, c, h, w))
							}
							// The constants, then y from them (the CPU's
							// constants on both sides, as for the backward).
							cpuCoef, err := bnCoefOp(shape(cpuBN)).Do(toValues(in[:3])...)
							if err != nil {
								t.Fatal(err)
							}
							var onDev []G.Value
							for _, d := range in {
								onDev = append(onDev, toDev(t, dev, d))
							}
							gotCoef, err := bnCoefOp(shape(gpuBN)).Do(onDev[:3]...)
							if err != nil {
								t.Fatal(err)
							}
							if err := tol.Compare(fromDev(t, dev, gotCoef), toFloat64s(t, cpuCoef)); err != nil {
								t.Errorf("constants: %v", err)
							}
							coef := cpuCoef.(*tensor.Dense)
							fwdIn := []*tensor.Dense{z, gamma, beta, coef}
							if residual {
								fwdIn = append(fwdIn, in[3])
							}
							want, err := bnOp(shape(cpuBN)).Do(toValues(fwdIn)...)
							if err != nil {
								t.Fatal(err)
							}
							parityOf(t, dev, bnOp(shape(cpuBN)), bnOp(shape(gpuBN)), []segment{{tol: tol}}, fwdIn...)
							if err := tol.Compare(runningOf(t, dev, gpuBN.RunningMean), toFloat64s(t, cpuBN.RunningMean)); err != nil {
								t.Errorf("running mean: %v", err)
							}
							if err := tol.Compare(runningOf(t, dev, gpuBN.RunningVar), toFloat64s(t, cpuBN.RunningVar)); err != nil {
								t.Errorf("running variance: %v", err)
							}
							// Backward, from the CPU's constants.
							dy := randTensor(rng, dt, -1, 1, n, c, h, w)
							s := shape(bnGPULayer(t, dev, rm, rv, training, onDevice))
							cpuS := shape(bnGPULayer(t, dev, rm, rv, training, false))
							statsIn := []*tensor.Dense{z, gamma, coef, dy}
							if residual {
								statsIn = append(statsIn, in[3])
							}
							parityOf(t, dev, bnGradStatsOp(cpuS), bnGradStatsOp(s), []segment{{tol: tol}}, statsIn...)
							// dz from the CPU's constants on both sides; with
							// gemmDz the GPU stores it rounded to TF32 in float32.
							stats, err := bnGradStatsOp(cpuS).Do(toValues(statsIn)...)
							if err != nil {
								t.Fatal(err)
							}
							applyIn := []*tensor.Dense{z, coef, dy, stats.(*tensor.Dense)}
							if residual {
								applyIn = append(applyIn, in[3])
							}
							for _, gemmDz := range []bool{false, true} {
								s, cpuS := s, cpuS
								s.gemmDz, cpuS.gemmDz = gemmDz, gemmDz
								parityOf(t, dev, bnGradApplyOp(cpuS), bnGradApplyOp(s), []segment{{tol: tf32Tol(dt, gemmDz, tol)}}, applyIn...)
								if gemmDz && dt == tensor.Float32 {
									expectTF32(t, dev, bnGradApplyOp(s), n*c*h*w, applyIn...)
								}
							}
							if act == ActReLU {
								parityBy(t, dev, reluMaskOp(s.zShape(), dt), []segment{{tol: tol}}, want.(*tensor.Dense), dy)
							}
						})
					}
				}
			}
		}
	}
}

// tf32Tol is the tolerance of a GPU output stored rounded to TF32 (rounded,
// float32) against its exact CPU twin: TolTF32, which holds a rounding of up
// to 2^-11 of the value (2^-10 when the GPU's and the CPU's float32 values
// lie on either side of a rounding boundary); tol otherwise.
func tf32Tol(dt tensor.Dtype, rounded bool, tol autograd.Tolerance) autograd.Tolerance {
	if rounded && dt == tensor.Float32 {
		return autograd.TolTF32
	}
	return tol
}

// expectTF32 runs op on device copies of inputs and checks that the first n
// elements of its float32 output are TF32 values, whose low 13 mantissa
// bits are zero: what the backward GEMMs read as they are.
func expectTF32(t *testing.T, dev *backend.Device, op G.Op, n int, inputs ...*tensor.Dense) {
	t.Helper()
	onDev := make([]G.Value, len(inputs))
	for i, d := range inputs {
		onDev[i] = toDev(t, dev, d)
	}
	got, err := op.Do(onDev...)
	if err != nil {
		t.Fatalf("GPU: %v", err)
	}
	for i, v := range fromDev(t, dev, got)[:n] {
		if u := math.Float32bits(float32(v)); u&0x1fff != 0 {
			t.Fatalf("%v: element %d = %v (bits %#x) is not a TF32 value", op, i, v, u)
		}
	}
}

// The ReLU mask passes the gradient only where y > 0: not at 0, not at NaN.
func TestGPUReLUMaskEdges(t *testing.T) {
	dev := gpu(t)
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		y := fromFloat64s(dt, []float64{1, 0, -1, math.NaN(), math.Inf(1), 1e-30, -0.0}, 7)
		dy := fromFloat64s(dt, []float64{2, 3, 4, 5, 6, 7, 8}, 7)
		parityBy(t, dev, reluMaskOp(tensor.Shape{7}, dt), []segment{{tol: parityTol(dt)}}, y, dy)
	}
}

// convBNGPUGraph builds ConvBN on device copies of its host inputs and
// returns its output and the gradients of sum(y ⊙ proj) with respect to the
// inputs, read on the host, after one run.
func convBNGPUGraph(t *testing.T, dev *backend.Device, in []*tensor.Dense, proj *tensor.Dense, cfg ConvConfig, bn *BatchNorm) (y []float64, grads [][]float64, handOffs int) {
	t.Helper()
	g := G.NewGraph()
	nodes := make(G.Nodes, len(in))
	onDev := make(G.Nodes, len(in))
	for i, d := range in {
		nodes[i] = G.NodeFromAny(g, d, G.WithName(fmt.Sprintf("in%d", i)))
		var err error
		if onDev[i], err = ToDevice(nodes[i], dev); err != nil {
			t.Fatal(err)
		}
	}
	bn.Gamma, bn.Beta = onDev[2], onDev[3]
	var res *G.Node
	if len(in) > 4 {
		res = onDev[4]
	}
	out, err := ConvBN(onDev[0], onDev[1], bn, res, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !hasBatchNormOp(g) {
		t.Fatal("no BatchNorm op in the graph")
	}
	hostOut, err := ToHost(out)
	if err != nil {
		t.Fatal(err)
	}
	prod, err := G.HadamardProd(hostOut, G.NodeFromAny(g, proj, G.WithName("proj")))
	if err != nil {
		t.Fatal(err)
	}
	loss, err := G.Sum(prod)
	if err != nil {
		t.Fatal(err)
	}
	gs, err := G.Grad(loss, nodes...)
	if err != nil {
		t.Fatal(err)
	}
	var yv G.Value
	G.Read(hostOut, &yv)
	gv := make([]G.Value, len(gs))
	for i := range gs {
		G.Read(gs[i], &gv[i])
	}
	m := G.NewTapeMachine(g, G.WithEngine(dev.Engine()))
	defer m.Close()
	before := bnHandOffs(dev)
	if err := m.RunAll(); err != nil {
		t.Fatal(err)
	}
	handOffs = bnHandOffs(dev) - before
	y = toFloat64s(t, yv)
	for _, v := range gv {
		grads = append(grads, toFloat64s(t, v))
	}
	return y, grads, handOffs
}

// hasBatchNormOp reports whether g holds a ConvBN layer's BatchNorm op.
func hasBatchNormOp(g *G.ExprGraph) bool {
	for _, n := range g.AllNodes() {
		if op, ok := n.Op().(*specOp); ok && op.kind == "BatchNorm" {
			return true
		}
	}
	return false
}

// ConvBN through a TapeMachine on the GPU against the same graph on the
// CPU: output, every gradient and the running statistics. In training the
// convolution's epilogue must hand its statistics to the BatchNorm op.
func TestGPUConvBNGraphParity(t *testing.T) {
	dev := gpu(t)
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		tol := autograd.TolParity64
		if dt == tensor.Float32 {
			tol = autograd.TolTF32
		}
		for ci, c := range []struct {
			name     string
			xs, ws   []int
			cfg      ConvConfig
			training bool
			residual bool
			onDevice bool
		}{
			{"train 3x3", []int{2, 4, 5, 6}, []int{5, 4, 3, 3}, ConvConfig{Pad: [2]int{1, 1}}, true, false, false},
			{"train residual relu stride 2", []int{2, 3, 9, 8}, []int{6, 3, 3, 3}, ConvConfig{Stride: [2]int{2, 2}, Pad: [2]int{1, 1}, Act: ActReLU}, true, true, false},
			{"train relu, running on gpu", []int{2, 4, 5, 6}, []int{5, 4, 3, 3}, ConvConfig{Pad: [2]int{1, 1}, Act: ActReLU}, true, false, true},
			{"eval residual relu 1x1", []int{2, 6, 4, 5}, []int{7, 6, 1, 1}, ConvConfig{Act: ActReLU}, false, true, false},
			{"eval, running on gpu", []int{2, 4, 5, 6}, []int{5, 4, 3, 3}, ConvConfig{Pad: [2]int{1, 1}}, false, false, true},
		} {
			t.Run(fmt.Sprintf("%v/%s", dt, c.name), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(ci), 8))
				cout := c.ws[0]
				layer := bnLayer{
					rm:       randTensor(rng, tensor.Float64, -0.5, 0.5, cout).Float64s(),
					rv:       randTensor(rng, tensor.Float64, 0.5, 2, cout).Float64s(),
					momentum: 0.2, eps: 1e-3, training: c.training,
				}
				in := []*tensor.Dense{
					randTensor(rng, dt, -1, 1, c.xs...), randTensor(rng, dt, -0.5, 0.5, c.ws...),
					randTensor(rng, dt, 0.5, 1.5, cout), randTensor(rng, dt, -0.5, 0.5, cout),
				}
				var cpuBN *BatchNorm
				_, yShape, err := runGraph(t, in, convBNWith(c.cfg, layer, nil))
				if err != nil {
					t.Fatal(err)
				}
				if c.residual {
					in = append(in, randTensor(rng, dt, -1, 1, yShape...))
				}
				proj := randTensor(rng, dt, -1, 1, yShape...)
				wantY, wantGrads, err := runWithGrads(t, in, proj, convBNWith(c.cfg, layer, &cpuBN))
				if err != nil {
					t.Fatal(err)
				}
				rm, rv := fromFloat64s(dt, layer.rm, cout), fromFloat64s(dt, layer.rv, cout)
				gpuBN := bnGPULayer(t, dev, rm, rv, c.training, c.onDevice)
				gpuBN.Momentum, gpuBN.Eps = layer.momentum, layer.eps
				y, grads, handOffs := convBNGPUGraph(t, dev, in, proj, c.cfg, gpuBN)
				if err := tol.Compare(y, wantY); err != nil {
					t.Errorf("y: %v", err)
				}
				for i, name := range []string{"x", "w", "gamma", "beta", "residual"}[:len(in)] {
					if err := tol.Compare(grads[i], wantGrads[i]); err != nil {
						t.Errorf("gradient of %s: %v", name, err)
					}
				}
				if err := tol.Compare(runningOf(t, dev, gpuBN.RunningMean), toFloat64s(t, cpuBN.RunningMean)); err != nil {
					t.Errorf("running mean: %v", err)
				}
				if err := tol.Compare(runningOf(t, dev, gpuBN.RunningVar), toFloat64s(t, cpuBN.RunningVar)); err != nil {
					t.Errorf("running variance: %v", err)
				}
				if c.training && handOffs != 1 {
					t.Errorf("the BatchNorm op took the convolution's statistics %d times, want 1", handOffs)
				}
				if !c.training && handOffs != 0 {
					t.Errorf("in inference the BatchNorm op took statistics %d times", handOffs)
				}
			})
		}
	}
}

// Gradient checks with Conv and ConvBN on the GPU, float64: inputs and the
// loss on the host, ToDevice and ToHost around the op.
func TestGPUConvGradCheck(t *testing.T) {
	dev := gpu(t)
	engine := G.WithEngine(dev.Engine())
	onGPU := func(build convBuilder) convBuilder {
		return func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
			d := make(G.Nodes, len(in))
			for i, n := range in {
				var err error
				if d[i], err = ToDevice(n, dev); err != nil {
					return nil, err
				}
			}
			y, err := build(g, d)
			if err != nil {
				return nil, err
			}
			return ToHost(y)
		}
	}
	convs := []struct {
		name   string
		xs, ws []int
		cfg    ConvConfig
		bias   bool
	}{
		{"3x3 pad 1 relu bias", []int{2, 2, 5, 6}, []int{3, 2, 3, 3}, ConvConfig{Pad: [2]int{1, 1}, Act: ActReLU}, true},
		{"7x7 stride 2 pad 3", []int{1, 2, 9, 8}, []int{2, 2, 7, 7}, ConvConfig{Stride: [2]int{2, 2}, Pad: [2]int{3, 3}}, true},
		{"dilation 2 pad 2", []int{1, 2, 7, 7}, []int{2, 2, 3, 3}, ConvConfig{Pad: [2]int{2, 2}, Dilation: [2]int{2, 2}}, false},
		{"stride (2,1) relu", []int{2, 2, 6, 7}, []int{2, 2, 2, 3}, ConvConfig{Stride: [2]int{2, 1}, Pad: [2]int{0, 1}, Act: ActReLU}, true},
	}
	for _, c := range convs {
		for seed := uint64(1); seed <= 2; seed++ {
			t.Run(fmt.Sprintf("Conv/%s/seed=%d", c.name, seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 31))
				draw := func() []*tensor.Dense {
					in := []*tensor.Dense{randTensor(rng, tensor.Float64, -1, 1, c.xs...), randTensor(rng, tensor.Float64, -0.5, 0.5, c.ws...)}
					if c.bias {
						in = append(in, randTensor(rng, tensor.Float64, -0.5, 0.5, c.ws[0]))
					}
					return in
				}
				in := draw()
				if c.cfg.Act == ActReLU {
					linear := c.cfg
					linear.Act = ActNone
					in = drawAwayFromKink(t, draw, func(in []*tensor.Dense) []float64 {
						y, _, err := runGraph(t, in, convWith(linear))
						if err != nil {
							t.Fatal(err)
						}
						return y
					})
				}
				inputs := []autograd.Input{{Name: "x", Value: in[0]}, {Name: "w", Value: in[1]}}
				if c.bias {
					inputs = append(inputs, autograd.Input{Name: "bias", Value: in[2]})
				}
				results, err := autograd.CheckGrad(onGPU(convWith(c.cfg)), inputs, seed, engine)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range results {
					if r.Scale == 0 {
						t.Errorf("%s: all gradients are zero: the check proves nothing", r.Name)
					}
				}
			})
		}
	}
	bns := []struct {
		name     string
		xs, ws   []int
		cfg      ConvConfig
		training bool
		residual bool
	}{
		{"train", []int{2, 2, 4, 5}, []int{3, 2, 3, 3}, ConvConfig{Pad: [2]int{1, 1}}, true, false},
		{"train residual relu stride 2", []int{2, 2, 6, 5}, []int{3, 2, 3, 3}, ConvConfig{Stride: [2]int{2, 2}, Pad: [2]int{1, 1}, Act: ActReLU}, true, true},
		{"eval residual relu", []int{2, 2, 4, 5}, []int{3, 2, 1, 1}, ConvConfig{Act: ActReLU}, false, true},
	}
	for _, c := range bns {
		for seed := uint64(1); seed <= 2; seed++ {
			t.Run(fmt.Sprintf("ConvBN/%s/seed=%d", c.name, seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 37))
				cout := c.ws[0]
				layer := bnLayer{
					rm:       randTensor(rng, tensor.Float64, -0.5, 0.5, cout).Float64s(),
					rv:       randTensor(rng, tensor.Float64, 0.5, 2, cout).Float64s(),
					momentum: 0.2, eps: 1e-3, training: c.training,
				}
				draw := func() []*tensor.Dense {
					in := []*tensor.Dense{randTensor(rng, tensor.Float64, -1, 1, c.xs...), randTensor(rng, tensor.Float64, -0.5, 0.5, c.ws...),
						randTensor(rng, tensor.Float64, 0.5, 1.5, cout), randTensor(rng, tensor.Float64, -0.5, 0.5, cout)}
					if c.residual {
						_, shape, err := runGraph(t, in[:4], convBNWith(ConvConfig{Stride: c.cfg.Stride, Pad: c.cfg.Pad}, layer, nil))
						if err != nil {
							t.Fatal(err)
						}
						in = append(in, randTensor(rng, tensor.Float64, -1, 1, shape...))
					}
					return in
				}
				in := draw()
				if c.cfg.Act == ActReLU {
					linear := c.cfg
					linear.Act = ActNone
					in = drawAwayFromKink(t, draw, func(in []*tensor.Dense) []float64 {
						y, _, err := runGraph(t, in, convBNWith(linear, layer, nil))
						if err != nil {
							t.Fatal(err)
						}
						return y
					})
				}
				inputs := []autograd.Input{{Name: "x", Value: in[0]}, {Name: "w", Value: in[1]},
					{Name: "gamma", Value: in[2]}, {Name: "beta", Value: in[3]}}
				if c.residual {
					inputs = append(inputs, autograd.Input{Name: "residual", Value: in[4]})
				}
				results, err := autograd.CheckGrad(onGPU(convBNWith(c.cfg, layer, nil)), inputs, seed, engine)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range results {
					if r.Scale == 0 {
						t.Errorf("%s: all gradients are zero: the check proves nothing", r.Name)
					}
				}
			})
		}
	}
}

// Training steps of a ConvBN layer on the GPU (parameters and running
// statistics on the device, a Scope per step) leave device memory where it
// started, hand the convolution's statistics over at every step, and
// lower the loss.
func TestGPUConvBNTrainingSteps(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(9, 9))
	dt := tensor.Float32
	const cout = 8
	x := toDev(t, dev, randTensor(rng, dt, -1, 1, 4, 6, 10, 10))
	w := toDev(t, dev, randTensor(rng, dt, -0.3, 0.3, cout, 6, 3, 3))
	gamma := toDev(t, dev, randTensor(rng, dt, 0.5, 1.5, cout))
	beta := toDev(t, dev, randTensor(rng, dt, -0.5, 0.5, cout))
	target := randTensor(rng, dt, 0, 1, 4, cout, 10, 10)
	bn := bnGPULayer(t, dev, fromFloat64s(dt, filled(cout, 0), cout), fromFloat64s(dt, filled(cout, 1), cout), true, true)
	bn.Momentum, bn.Eps = 0.1, 1e-5
	start := dev.MemStats()

	g := G.NewGraph()
	xn := G.NodeFromAny(g, x, G.WithName("x"))
	wn := G.NodeFromAny(g, w, G.WithName("w"))
	bn.Gamma = G.NodeFromAny(g, gamma, G.WithName("gamma"))
	bn.Beta = G.NodeFromAny(g, beta, G.WithName("beta"))
	must := func(n *G.Node, err error) *G.Node {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	y := must(ConvBN(xn, wn, bn, nil, ConvConfig{Pad: [2]int{1, 1}, Act: ActReLU}))
	diff := must(G.Sub(must(ToHost(y)), G.NodeFromAny(g, target, G.WithName("target"))))
	loss := must(G.Mean(must(G.Square(diff))))
	grads, err := G.Grad(loss, wn, bn.Gamma, bn.Beta)
	if err != nil {
		t.Fatal(err)
	}
	hasBN := hasBatchNormOp(g)
	var lossVal G.Value
	G.Read(loss, &lossVal)
	m := G.NewTapeMachine(g, G.WithEngine(dev.Engine()))
	defer m.Close()
	const steps = 15
	handOffs := bnHandOffs(dev)
	var first, last float64
	var afterFirst backend.MemStats
	for step := range steps {
		scope, err := dev.BeginScope()
		if err != nil {
			t.Fatal(err)
		}
		if err := m.RunAll(); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		last = toFloat64s(t, lossVal)[0]
		if step == 0 {
			first = last
		}
		for i, p := range []*tensor.Dense{w, gamma, beta} {
			if err := dev.Axpy(-0.5, grads[i].Value().(*tensor.Dense), p); err != nil {
				t.Fatal(err)
			}
		}
		if err := scope.End(); err != nil {
			t.Fatal(err)
		}
		m.Reset()
		if step == 0 {
			afterFirst = dev.MemStats()
		}
	}
	end := dev.MemStats()
	handOffs = bnHandOffs(dev) - handOffs
	t.Logf("loss %.4f -> %.4f; memory at start %+v, after step 1 %+v, after %d steps %+v", first, last, start, afterFirst, steps, end)
	if !(last < first) {
		t.Errorf("loss did not fall: %v -> %v", first, last)
	}
	if !hasBN {
		t.Fatal("no BatchNorm op in the graph")
	}
	if handOffs != steps {
		t.Errorf("statistics handed over %d times in %d steps", handOffs, steps)
	}
	if end.InUse != start.InUse {
		t.Errorf("bytes in use: %d at the start, %d after %d steps", start.InUse, end.InUse, steps)
	}
	if end.DriverAllocs != afterFirst.DriverAllocs {
		t.Errorf("steps 2..%d called cuMemAlloc: %d -> %d", steps, afterFirst.DriverAllocs, end.DriverAllocs)
	}
}
