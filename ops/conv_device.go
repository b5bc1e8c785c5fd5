package ops

import (
	"fmt"
	"math"
	"math/bits"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// The GPU path of Conv and of ConvBN's convolution: kernels/conv.cu, one
// implicit-GEMM kernel template for the forward pass (bias or BatchNorm
// scale/shift, residual and ReLU in its epilogue, and for ConvBN in training
// the batch statistics), the data gradient and the weight gradient (split
// along its long reduction when the GEMM has too few tiles to fill the GPU),
// and for float32 the cp.async pipelines of conv_pipe for all three and, on
// Hopper, conv_sm90a.cu's warpgroup MMAs. conv.cu's header says how the
// kernels' names spell their design.

// convTF32 reports whether dt's convolutions on dev multiply in TF32 on the
// tensor cores: float32 ones do unless dev's GemmMath is GemmExact
// (backend.Device.SetGemmMath), which runs every float32 convolution GEMM
// (forward, data and weight gradients; Conv, ConvBN, ConvTranspose) on
// conv.cu's fma_m64_i64_f32 kernels in full float32, with no operand
// rounded to TF32 on the way: not the weights' copies, not the gradient
// that the ReLU's or BatchNorm's backward pass leaves for the GEMMs. This is
// the one place that decides; every kernel choice and every rounding for
// the tensor cores asks it.
func convTF32(dev *backend.Device, dt tensor.Dtype) bool {
	return dt == tensor.Float32 && dev.GemmMath() != backend.GemmExact
}

// fastDiv returns the constants of FastDiv (conv.cuh) for divisor d >= 1:
// with l = ceil(log2 d), mul = ceil(2^(31+l)/d) and shr = l-1,
// umulhi(n, mul) >> shr = n/d for every 0 <= n < 2^31 (conv.cuh explains
// why); d == 1 has mul 0.
func fastDiv(d int) cuda.FastDiv {
	f := cuda.FastDiv{D: int32(d)}
	if d == 1 {
		return f
	}
	l := bits.Len32(uint32(d - 1))
	f.Mul = uint32((uint64(1)<<(31+l) + uint64(d) - 1) / uint64(d))
	f.Shr = uint32(l - 1)
	return f
}

// The three GEMMs of conv.cu (ConvMode).
const (
	convFprop = iota
	convDgrad
	convWgrad
)

var convModeNames = [...]string{"fprop", "dgrad", "wgrad"}

// convTileN is the columns of every GEMM kernel's block tile (output pixels;
// wgrad: taps) for dt, and convTileK the depth of its k-tiles.
func convTileN(dt tensor.Dtype) int {
	if dt == tensor.Float32 {
		return cuda.ConvF32TileN
	}
	return cuda.ConvF64TileN
}

func convTileK(dt tensor.Dtype) int {
	if dt == tensor.Float32 {
		return cuda.ConvF32TileK
	}
	return cuda.ConvF64TileK
}

// convGemmKernel is a kernel of conv.cu or conv_sm90a.cu that runs one of a
// convolution's GEMMs.
type convGemmKernel = cuda.Kernel[cuda.ConvGemmParams]

// convKernelChoice is a GEMM's kernel with what its launch needs: its
// dynamic shared memory, the rows of its block tile (the columns are
// convTileN for all) and its threads per block.
type convKernelChoice struct {
	kernel            convGemmKernel
	smem, bm, threads int
}

// convPassKernels are the kernels of one GEMM (convFprop, convDgrad or
// convWgrad), by design; a pass that has no kernel of a design has a zero
// choice there.
type convPassKernels struct {
	// conv_gemm (loads double-buffered in registers, 64-bit offsets, dy's
	// ReLU mask applied as it is staged): the float64 kernel, the full
	// float32 one (a device in GemmExact: convTF32), and the TF32 one of
	// last resort, which runs every GEMM.
	fmaM64I64F64, fmaM64I64F32, mmaM128I64 convKernelChoice
	// conv_pipe: the cp.async ring of 3 stages, where its 32-bit offsets
	// fit (convPipeFits); fprop's other tiles are variants, launched only
	// when forced (setConvKernel).
	mmaM128S3, mmaM256S4, mmaM128S3T128 convKernelChoice
	// conv_sm90a.cu's, which convWgmmaPick chooses among (wgrad has no
	// m128_s4).
	wgmmaM128S3, wgmmaM256S4, wgmmaM128S4 convKernelChoice
}

// convKernels are the GEMM kernels by pass, with their launch shapes as
// kernels/cuda exports them.
var convKernels = [3]convPassKernels{
	convFprop: {
		fmaM64I64F64:  convKernelChoice{cuda.ConvFpropFmaM64I64F64, cuda.ConvFpropFmaM64I64F64SmemBytes, cuda.ConvFmaM64I64TileM, cuda.ConvF64Threads},
		fmaM64I64F32:  convKernelChoice{cuda.ConvFpropFmaM64I64F32, cuda.ConvFpropFmaM64I64F32SmemBytes, cuda.ConvFmaM64I64TileM, cuda.ConvF32Threads},
		mmaM128I64:    convKernelChoice{cuda.ConvFpropMmaM128I64F32, cuda.ConvFpropMmaM128I64SmemBytes, cuda.ConvMmaM128I64TileM, cuda.ConvF32Threads},
		mmaM128S3:     convKernelChoice{cuda.ConvFpropMmaM128S3F32, cuda.ConvFpropMmaM128S3SmemBytes, cuda.ConvMmaM128S3TileM, cuda.ConvF32Threads},
		mmaM256S4:     convKernelChoice{cuda.ConvFpropMmaM256S4F32, cuda.ConvFpropMmaM256S4SmemBytes, cuda.ConvMmaM256S4TileM, cuda.ConvF32Threads},
		mmaM128S3T128: convKernelChoice{cuda.ConvFpropMmaM128S3T128F32, cuda.ConvFpropMmaM128S3T128SmemBytes, cuda.ConvMmaM128S3T128TileM, cuda.ConvMmaM128S3T128Threads},
		wgmmaM128S3:   convKernelChoice{cuda.ConvFpropWgmmaM128S3F32, cuda.ConvFpropWgmmaM128S3SmemBytes, cuda.ConvWgmmaM128S3TileM, cuda.ConvWgmmaThreads},
		wgmmaM256S4:   convKernelChoice{cuda.ConvFpropWgmmaM256S4F32, cuda.ConvFpropWgmmaM256S4SmemBytes, cuda.ConvWgmmaM256S4TileM, cuda.ConvWgmmaThreads},
		wgmmaM128S4:   convKernelChoice{cuda.ConvFpropWgmmaM128S4F32, cuda.ConvFpropWgmmaM128S4SmemBytes, cuda.ConvWgmmaM128S4TileM, cuda.ConvWgmmaThreads},
	},
	convDgrad: {
		fmaM64I64F64: convKernelChoice{cuda.ConvDgradFmaM64I64F64, cuda.ConvDgradFmaM64I64F64SmemBytes, cuda.ConvFmaM64I64TileM, cuda.ConvF64Threads},
		fmaM64I64F32: convKernelChoice{cuda.ConvDgradFmaM64I64F32, cuda.ConvDgradFmaM64I64F32SmemBytes, cuda.ConvFmaM64I64TileM, cuda.ConvF32Threads},
		mmaM128I64:   convKernelChoice{cuda.ConvDgradMmaM128I64F32, cuda.ConvDgradMmaM128I64SmemBytes, cuda.ConvMmaM128I64TileM, cuda.ConvF32Threads},
		mmaM128S3:    convKernelChoice{cuda.ConvDgradMmaM128S3F32, cuda.ConvDgradMmaM128S3SmemBytes, cuda.ConvMmaM128S3TileM, cuda.ConvF32Threads},
		wgmmaM128S3:  convKernelChoice{cuda.ConvDgradWgmmaM128S3F32, cuda.ConvDgradWgmmaM128S3SmemBytes, cuda.ConvWgmmaM128S3TileM, cuda.ConvWgmmaThreads},
		wgmmaM256S4:  convKernelChoice{cuda.ConvDgradWgmmaM256S4F32, cuda.ConvDgradWgmmaM256S4SmemBytes, cuda.ConvWgmmaM256S4TileM, cuda.ConvWgmmaThreads},
		wgmmaM128S4:  convKernelChoice{cuda.ConvDgradWgmmaM128S4F32, cuda.ConvDgradWgmmaM128S4SmemBytes, cuda.ConvWgmmaM128S4TileM, cuda.ConvWgmmaThreads},
	},
	convWgrad: {
		fmaM64I64F64: convKernelChoice{cuda.ConvWgradFmaM64I64F64, cuda.ConvWgradFmaM64I64F64SmemBytes, cuda.ConvFmaM64I64TileM, cuda.ConvF64Threads},
		fmaM64I64F32: convKernelChoice{cuda.ConvWgradFmaM64I64F32, cuda.ConvWgradFmaM64I64F32SmemBytes, cuda.ConvFmaM64I64TileM, cuda.ConvF32Threads},
		mmaM128I64:   convKernelChoice{cuda.ConvWgradMmaM128I64F32, cuda.ConvWgradMmaM128I64SmemBytes, cuda.ConvMmaM128I64TileM, cuda.ConvF32Threads},
		mmaM128S3:    convKernelChoice{cuda.ConvWgradMmaM128S3F32, cuda.ConvWgradMmaM128S3SmemBytes, cuda.ConvMmaM128S3TileM, cuda.ConvF32Threads},
		wgmmaM128S3:  convKernelChoice{cuda.ConvWgradWgmmaM128S3F32, cuda.ConvWgradWgmmaM128S3SmemBytes, cuda.ConvWgmmaM128S3TileM, cuda.ConvWgmmaThreads},
		wgmmaM256S4:  convKernelChoice{cuda.ConvWgradWgmmaM256S4F32, cuda.ConvWgradWgmmaM256S4SmemBytes, cuda.ConvWgmmaM256S4TileM, cuda.ConvWgmmaThreads},
	},
}

// find returns the TF32 kernel of ks that k names (the kernels that can be
// forced, setConvKernel).
func (ks *convPassKernels) find(k convGemmKernel) (convKernelChoice, bool) {
	for _, c := range [...]convKernelChoice{ks.mmaM128I64, ks.mmaM128S3, ks.mmaM256S4, ks.mmaM128S3T128,
		ks.wgmmaM128S3, ks.wgmmaM256S4, ks.wgmmaM128S4} {
		if c.kernel != "" && c.kernel == k {
			return c, true
		}
	}
	return convKernelChoice{}, false
}

// convWgmma reports whether k is a kernel of conv_sm90a.cu.
func convWgmma(k convGemmKernel) bool {
	return k.Module() == cuda.ConvFpropWgmmaM128S3F32.Module()
}

// convRegisterStaged reports whether k is one of conv_gemm's kernels, which
// stage their loads through registers: they apply dy's ReLU mask on the way
// and run one block per SM. The others copy with cp.async, without looking
// at the data.
func convRegisterStaged(k convGemmKernel) bool {
	for _, ks := range &convKernels {
		if k == ks.mmaM128I64.kernel || k == ks.fmaM64I64F32.kernel || k == ks.fmaM64I64F64.kernel {
			return true
		}
	}
	return false
}

// convSM90a reports whether dev runs conv_sm90a.cu's kernels (sm90aError);
// where it does not, the float32 GEMMs use conv.cu's kernels, which run
// everywhere.
func convSM90a(dev *backend.Device) bool {
	return convWgmmaError(dev) == nil
}

// convWgmmaError is why dev does not run conv_sm90a.cu's kernels, or nil.
func convWgmmaError(dev *backend.Device) error {
	k := cuda.ConvFpropWgmmaM128S3F32
	return sm90aError(dev, k.Module(), k.Name())
}

// convKernelKey keys, on a Device, the TF32 kernel that tests and
// benchmarks which compare the kernels force for one of the GEMMs
// (convFprop, convDgrad or convWgrad) instead of convKernel's choice: a
// convGemmKernel, which must fit the launch.
type convKernelKey int

// setConvKernel forces kernel for the float32 GEMMs of mode on dev; ""
// gives the choice back to convKernel.
func setConvKernel(dev *backend.Device, mode int, kernel convGemmKernel) {
	if kernel == "" {
		dev.SetValue(convKernelKey(mode), nil)
		return
	}
	dev.SetValue(convKernelKey(mode), kernel)
}

// convPipeFits reports whether the m128_s3 kernel of mode (conv_pipe's)
// can run args, and if not why. fprop and wgrad gather x adding their
// offsets in 32-bit ints, whose sums, column part plus row part, stay
// below (N+1)*Cin*H*W; wgrad also copies dy's rows 16 bytes at a time.
// dgrad: stride 1, and its offsets into dy, a column part (an image's
// offset plus (ih+PadH)*OutW + iw+PadW) plus a row part (co*OutH*OutW -
// kh*DilH*OutW - kw*DilW), within 32 bits.
func convPipeFits(mode int, args cuda.ConvGemmParams) (bool, string) {
	if mode == convDgrad {
		if args.StrideH != 1 || args.StrideW != 1 {
			return false, "strided dgrad"
		}
		if int64(args.N+1)*int64(args.Cout)*int64(args.OutH)*int64(args.OutW)+
			int64(args.H+args.PadH+1)*int64(args.W+args.PadW+1) > math.MaxInt32 {
			return false, "dy exceeds its 32-bit offsets"
		}
		return true, ""
	}
	if x := int64(args.N+1) * int64(args.Cin) * int64(args.H) * int64(args.W); x > math.MaxInt32 {
		return false, fmt.Sprintf("(N+1)*Cin*H*W = %d exceeds its 32-bit offsets into x", x)
	}
	if mode == convWgrad && (int64(args.OutH)*int64(args.OutW)%4 != 0 || args.A%16 != 0) {
		return false, "OutH*OutW % 4 != 0 or dy not 16-byte aligned"
	}
	return true, ""
}

// convKernel chooses the kernel of a GEMM on gpu: the first of those that
// can run it, in the order below, whose dynamic shared memory the GPU
// gives a block (convGPU.fit); where none does, an error naming the GEMM,
// its convolution and the bytes. float64: fma_m64_i64_f64. float32 on a
// device in GemmExact (convTF32): fma_m64_i64_f32, which runs every GEMM;
// a kernel forced there is an error, all of them being TF32. Otherwise:
// conv_sm90a.cu's where they run (convWgmmaFits, and conv_pipe's
// conditions, convPipeFits; which one by convWgmmaPick), then mma_m128_s3
// where its conditions hold, then mma_m128_i64, which runs every GEMM in
// the least shared memory (70 KiB, wgrad 74: sm_86 and sm_89 give a block
// 99 KiB, less than m128_s3's 107). The other tiles of conv_pipe,
// mma_m256_s4 (fewer fragment loads per MMA, half the blocks) and
// mma_m128_s3_t128 (m256_s4's warps on the m128 tile), do not beat
// mma_m128_s3 on TARGETS.md's cases (BenchmarkGPUConvFpropVariants times
// them): they run only when forced. A kernel forced on the device
// (setConvKernel) is taken instead, or the error that says why it cannot
// run the GEMM.
func convKernel(dt tensor.Dtype, mode int, args cuda.ConvGemmParams, gpu convGPU) (convKernelChoice, error) {
	ks := &convKernels[mode]
	switch {
	case dt != tensor.Float32:
		return gpu.fit(mode, args, ks.fmaM64I64F64)
	case gpu.exact && gpu.forced[mode] != "":
		return convKernelChoice{}, fmt.Errorf("%s multiplies in TF32, and the device's float32 GEMMs are %v", gpu.forced[mode].Name(), backend.GemmExact)
	case gpu.exact:
		return gpu.fit(mode, args, ks.fmaM64I64F32)
	}
	fits, why := convPipeFits(mode, args)
	wgmmaOK, wgmmaWhy := convWgmmaFits(mode, args, gpu.sm90a)
	wgmmaOK = wgmmaOK && fits
	if gpu.forced[mode] != "" {
		return convForced(mode, args, gpu, fits, why, wgmmaOK, wgmmaWhy)
	}
	if wgmmaOK {
		if c, ok := convWgmmaPick(mode, args, gpu); ok {
			return c, nil
		}
	}
	if fits {
		return gpu.fit(mode, args, ks.mmaM128S3, ks.mmaM128I64)
	}
	return gpu.fit(mode, args, ks.mmaM128I64)
}

// convForced returns the kernel forced for mode on gpu (setConvKernel), or
// why it cannot run the GEMM args: fits (why) says whether conv_pipe's
// conditions hold, wgmmaOK (wgmmaWhy) whether conv_sm90a.cu's kernels run
// it.
func convForced(mode int, args cuda.ConvGemmParams, gpu convGPU, fits bool, why string, wgmmaOK bool, wgmmaWhy string) (convKernelChoice, error) {
	ks := &convKernels[mode]
	forced := gpu.forced[mode]
	c, ok := ks.find(forced)
	switch {
	case !ok:
		return convKernelChoice{}, fmt.Errorf("no float32 %s kernel %q", convModeNames[mode], forced)
	case c != ks.mmaM128I64 && !fits:
		return convKernelChoice{}, fmt.Errorf("%s: %s", forced.Name(), why)
	case convWgmma(forced) && !wgmmaOK:
		return convKernelChoice{}, fmt.Errorf("%s: %s", forced.Name(), wgmmaWhy)
	}
	return gpu.fit(mode, args, c)
}

// convGPU is what the choice of a conv kernel needs to know of the GPU.
type convGPU struct {
	optIn  int               // shared memory a block may opt in to
	sms    int               // streaming multiprocessors
	sm90a  bool              // runs conv_sm90a.cu's kernels (convSM90a)
	exact  bool              // float32 GEMMs in full float32, not TF32 (convTF32)
	forced [3]convGemmKernel // per GEMM, the float32 kernel forced there (setConvKernel), or ""
}

func convGPUOf(dev *backend.Device) convGPU {
	_, optIn := dev.MaxSharedMemory()
	gpu := convGPU{optIn: optIn, sms: dev.SMCount(), sm90a: convSM90a(dev), exact: !convTF32(dev, tensor.Float32)}
	for mode := range gpu.forced {
		gpu.forced[mode], _ = dev.Value(convKernelKey(mode)).(convGemmKernel)
	}
	return gpu
}

// fits reports whether gpu gives a block of c its dynamic shared memory
// (launchConvGemm opts in beyond the default 48 KiB). The kernels have no
// static shared memory (kernels/cuda's TestKernelsSharedMemory checks), so
// that is all they take.
func (gpu convGPU) fits(c convKernelChoice) bool { return c.smem <= gpu.optIn }

// fit returns the first of cs that fits gpu, or an error naming the GEMM
// of mode, its convolution, the least shared memory among cs and what the
// GPU allows.
func (gpu convGPU) fit(mode int, args cuda.ConvGemmParams, cs ...convKernelChoice) (convKernelChoice, error) {
	least := cs[0]
	for _, c := range cs {
		if gpu.fits(c) {
			return c, nil
		}
		if c.smem < least.smem {
			least = c
		}
	}
	return convKernelChoice{}, fmt.Errorf("%s of x [%d %d %d %d] by w [%d %d %d %d] needs %d bytes of shared memory per block (%s); this GPU allows %d",
		convModeNames[mode], args.N, args.Cin, args.H, args.W, args.Cout, args.Cin, args.KH, args.KW,
		least.smem, least.kernel.Name(), gpu.optIn)
}

// convWgmmaPick chooses among conv_sm90a.cu's kernels for a GEMM that they
// run (convWgmmaFits), and reports whether one fits the GPU's shared
// memory. Forward and dgrad: m256_s4 (256 channels a tile: each gathered
// pixel feeds twice the MMAs; one block per SM) for GEMMs of more than one
// 128-channel tile with at least four waves of its tiles; m128_s4 (one
// block per SM, MMAs overlapping the next k-tile's barrier and copies)
// when m128_s3's tiles fill at most one wave, where two blocks per SM have
// nothing to hide behind each other; else m128_s3 (two blocks per SM).
// Wgrad: m256_s4 above 128 channels, else m128_s3. BENCHMARKS.md ("The
// kernels") has the measurements behind the rule.
func convWgmmaPick(mode int, args cuda.ConvGemmParams, gpu convGPU) (convKernelChoice, bool) {
	ks := &convKernels[mode]
	many := int(args.M) > cuda.ConvWgmmaM128S3TileM
	if mode == convWgrad {
		switch {
		case many && gpu.fits(ks.wgmmaM256S4):
			return ks.wgmmaM256S4, true
		case gpu.fits(ks.wgmmaM128S3):
			return ks.wgmmaM128S3, true
		}
		return convKernelChoice{}, false
	}
	tiles := func(bm int) int { return ceilDiv(int(args.M), bm) * ceilDiv(int(args.Ncols), cuda.ConvF32TileN) }
	switch {
	case many && tiles(ks.wgmmaM256S4.bm) >= 4*gpu.sms && gpu.fits(ks.wgmmaM256S4):
		return ks.wgmmaM256S4, true
	case tiles(ks.wgmmaM128S4.bm) <= gpu.sms && gpu.fits(ks.wgmmaM128S4):
		return ks.wgmmaM128S4, true
	case gpu.fits(ks.wgmmaM128S3):
		return ks.wgmmaM128S3, true
	}
	return convKernelChoice{}, false
}

// convNoSM90a is why a GPU runs none of conv_sm90a.cu's kernels.
const convNoSM90a = "needs a compute capability 9.0 GPU whose driver compiles the sm_90a PTX"

// convWgmmaFits reports whether conv_sm90a.cu's kernels can run a GEMM of
// mode on a GPU (sm90a: convSM90a) where conv_pipe's conditions hold, and
// if not why; whether one fits the GPU's shared memory is convWgmmaPick's
// to say. Forward and dgrad read the weights as they come: K % 4 == 0 and
// 16-byte aligned. Wgrad's A is dy', a rounded copy in scratch memory
// (aligned), with rows of OutH*OutW % 4 == 0 (convPipeFits).
func convWgmmaFits(mode int, args cuda.ConvGemmParams, sm90a bool) (bool, string) {
	switch {
	case !sm90a:
		return false, convNoSM90a
	case mode != convWgrad && (args.K%4 != 0 || args.A%16 != 0):
		return false, fmt.Sprintf("K = %d must be a multiple of 4 and the weights 16-byte aligned", args.K)
	}
	return true, ""
}

// convUnmasked reports whether a kernel leaves dy's ReLU mask to the
// caller (the cp.async and wgmma kernels).
func convUnmasked(k convGemmKernel) bool {
	return !convRegisterStaged(k)
}

// convBlocksPerSM is how many blocks of choice share an SM, by shared
// memory (each block also takes 1 KiB of the SM's for the system; an SM
// has optIn + 1 KiB): conv_gemm's one, the others by their shared memory
// (at most two).
func convBlocksPerSM(choice convKernelChoice, optIn int) int {
	if convRegisterStaged(choice.kernel) {
		return 1
	}
	return max(1, min(2, (optIn+1024)/(choice.smem+1024)))
}

// maskedGrad returns dy masked by y > 0 in scratch memory (relu_mask of
// conv_bn.cu) for the kernels that do not mask as they copy, and a func to
// free it after the launches that read it are queued. Costs a pass over dy
// and y per backward op; conv.cu says why it is cheaper than masking in
// the kernels.
func (s convShape) maskedGrad(op string, dev *backend.Device, y, dy backend.DevicePtr) (backend.DevicePtr, func(), error) {
	n := int64(s.p.N) * int64(s.p.Cout) * int64(s.p.OutH) * int64(s.p.OutW)
	k, err := cuda.ReLUMask(s.dt)
	if err != nil {
		return 0, nil, fmt.Errorf("ops: %s: %w", op, err)
	}
	buf, err := dev.Alloc(n * int64(s.dt.Size()))
	if err != nil {
		return 0, nil, fmt.Errorf("ops: %s: masked gradient: %w", op, err)
	}
	free := func() { dev.Free(buf) }
	if err := k.Launch(dev, dev.GridStride(n, bnThreads), cuda.MaskParams{Y: y, DY: dy, DX: buf, N: n}); err != nil {
		free()
		return 0, nil, fmt.Errorf("ops: %s: %w", op, err)
	}
	return buf, free, nil
}

// gemm returns the GEMM of pass mode (convFprop, convDgrad or convWgrad):
// the convolution's geometry, the GEMM's sizes and divisors, no operands;
// the caller sets those.
func (s convShape) gemm(mode int) cuda.ConvGemmParams {
	p := s.p
	args := cuda.ConvGemmParams{
		N: int32(p.N), Cin: int32(p.Cin), H: int32(p.H), W: int32(p.W),
		Cout: int32(p.Cout), KH: int32(p.KH), KW: int32(p.KW),
		StrideH: int32(p.StrideH), StrideW: int32(p.StrideW),
		PadH: int32(p.PadH), PadW: int32(p.PadW), DilH: int32(p.DilationH), DilW: int32(p.DilationW),
		OutH: int32(p.OutH), OutW: int32(p.OutW),
		DivKK: fastDiv(p.KH * p.KW), DivKW: fastDiv(p.KW),
		DivImg: fastDiv(1), DivRow: fastDiv(1), DivQ: fastDiv(1), DivQW: fastDiv(1),
		DivSh: fastDiv(p.StrideH), DivSw: fastDiv(p.StrideW),
	}
	switch mode {
	case convFprop:
		args.M, args.Ncols, args.K = int32(p.Cout), int32(p.N*p.OutH*p.OutW), int32(p.Cin*p.KH*p.KW)
		args.DivImg, args.DivRow = fastDiv(p.OutH*p.OutW), fastDiv(p.OutW)
	case convDgrad:
		args.M, args.Ncols, args.K = int32(p.Cin), int32(p.N*p.H*p.W), int32(p.Cout*p.KH*p.KW)
		args.DivImg, args.DivRow = fastDiv(p.H*p.W), fastDiv(p.W)
	case convWgrad:
		args.M, args.Ncols, args.K = int32(p.Cout), int32(p.Cin*p.KH*p.KW), int32(p.N*p.OutH*p.OutW)
		args.DivQ, args.DivQW = fastDiv(p.OutH*p.OutW), fastDiv(p.OutW)
	}
	return args
}

// checkDeviceSizes checks that the indices the kernels keep in 32-bit ints
// fit: per-image offsets and the GEMM sizes, with a tile of slack since
// kernels form indices up to one tile past the end; and that displacements
// within an image stay clear, by a factor of 4, of the kernels' "far
// outside" mark.
func (s convShape) checkDeviceSizes(op string) error {
	p := s.p
	const slack = 256
	const far = cuda.ConvFarIndex / 4
	for _, c := range []struct {
		name         string
		value, limit int
	}{
		{"Cin*H*W", p.Cin * p.H * p.W, math.MaxInt32 - slack},
		{"Cout*OutH*OutW", p.Cout * p.OutH * p.OutW, math.MaxInt32 - slack},
		{"N*OutH*OutW", p.N * p.OutH * p.OutW, math.MaxInt32 - slack},
		{"N*H*W", p.N * p.H * p.W, math.MaxInt32 - slack},
		{"Cin*KH*KW", p.Cin * p.KH * p.KW, math.MaxInt32 - slack},
		{"Cout*KH*KW", p.Cout * p.KH * p.KW, math.MaxInt32 - slack},
		{"H+2*PadH+DilationH*KH", p.H + 2*p.PadH + p.DilationH*p.KH, far},
		{"W+2*PadW+DilationW*KW", p.W + 2*p.PadW + p.DilationW*p.KW, far},
	} {
		if c.value > c.limit {
			return fmt.Errorf("ops: %s: %s = %d is too large for the CUDA kernels' 32-bit indices", op, c.name, c.value)
		}
	}
	return nil
}

// launchConvGemm queues the kernel convKernel chooses for args (operands,
// GEMM sizes and divisors set; args.Mask == 0 for the kernels that leave
// the mask to the caller, convUnmasked) in splits splits of the reduction
// (1 but for wgrad).
func launchConvGemm(op string, dev *backend.Device, dt tensor.Dtype, mode int, args cuda.ConvGemmParams, splits int) error {
	byDefault, _ := dev.MaxSharedMemory()
	choice, err := convKernel(dt, mode, args, convGPUOf(dev))
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	if args.Mask != 0 && convUnmasked(choice.kernel) {
		return fmt.Errorf("ops: %s: %s needs dy masked beforehand", op, choice.kernel.Name())
	}
	k, err := choice.kernel.Load(dev)
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	if mode == convFprop && convWgmma(choice.kernel) {
		// The wgmma kernels read the weights rounded to TF32: a rounded
		// copy ([Cout][K] as [Cout][1][K]), freed once queued work is
		// done with it (the allocator hands a block out again only to
		// work queued later).
		n := int64(args.M) * int64(args.K)
		wr, err := dev.Alloc(4 * n)
		if err != nil {
			return fmt.Errorf("ops: %s: rounded weights: %w", op, err)
		}
		defer dev.Free(wr)
		rargs := cuda.WeightTParams{W: args.A, WT: wr, N: n, Cout: args.M, Cin: 1, KK: args.K, RoundTF32: 1}
		if err := cuda.ConvTransposeWeightsF32.Launch(dev, dev.GridStride(n, 256), rargs); err != nil {
			return fmt.Errorf("ops: %s: %w", op, err)
		}
		args.A = wr
	}
	smem := choice.smem
	if smem > byDefault {
		if err := k.SetMaxDynamicSharedMemory(smem); err != nil {
			return fmt.Errorf("ops: %s: %w", op, err)
		}
	}
	tilesM := ceilDiv(int(args.M), choice.bm)
	tiles := tilesM * ceilDiv(int(args.Ncols), convTileN(dt))
	kTiles := ceilDiv(int(args.K), convTileK(dt))
	if tiles > math.MaxInt32 || splits > 65535 {
		return fmt.Errorf("ops: %s: %d tiles in %d splits exceed the CUDA grid", op, tiles, splits)
	}
	args.TilesM = int32(tilesM)
	args.KTilesPerSplit = int32(ceilDiv(kTiles, splits))
	cfg := backend.LaunchConfig{
		Grid:      backend.Dim3{X: uint32(tiles), Y: 1, Z: uint32(splits)},
		Block:     backend.Dim3{X: uint32(choice.threads), Y: 1, Z: 1},
		SharedMem: uint32(smem),
	}
	if err := choice.kernel.Launch(dev, cfg, args); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	return nil
}

// forward queues y = act(conv(x, w) + bias) on dev. With stats != 0 (a
// ConvBN layer in training) the epilogue also writes the per-channel
// statistics of y there, one record per column tile (convStatsOf).
func (s convShape) forward(op string, dev *backend.Device, x, w, bias, y, stats backend.DevicePtr) error {
	args := s.gemm(convFprop)
	args.A, args.B, args.Out, args.Shift, args.Stats = w, x, y, bias, stats
	args.ReLU = boolInt32(s.p.ReLU)
	return launchConvGemm(op, dev, s.dt, convFprop, args, 1)
}

// forwardDevice is convOp's device launcher.
func (s convShape) forwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "Conv"
	if err := s.checkDeviceSizes(name); err != nil {
		return nil, err
	}
	var b backend.DevicePtr
	if s.bias {
		b = a.ptr[2]
	}
	y, yPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	var stats backend.DevicePtr
	if s.bn != nil && s.bn.Training {
		stats = yPtr + backend.DevicePtr(s.stats().off*int(s.dt.Size()))
	}
	if err := s.forward(name, a.dev, a.ptr[0], a.ptr[1], b, yPtr, stats); err != nil {
		return nil, err
	}
	return y, nil
}

// dgradDevice is convDgradOp's device launcher.
func (s convShape) dgradDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "Conv backward"
	if err := s.checkDeviceSizes(name); err != nil {
		return nil, err
	}
	w, y, dy := a.ptr[0], a.ptr[1], a.ptr[2]
	dx, dxPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	if !s.p.ReLU {
		y = 0
	}
	if err := s.dgrad(name, a.dev, w, y, dy, dxPtr); err != nil {
		return nil, err
	}
	return dx, nil
}

// dgrad queues dx = conv^T(w, dy masked by y > 0 when y != 0). The weights
// are first transposed to [Cin][Cout][KH][KW] in scratch memory, so that
// the GEMM reads its A operand along the reduction as fprop does.
func (s convShape) dgrad(op string, dev *backend.Device, w, y, dy, dx backend.DevicePtr) error {
	p := s.p
	kk := p.KH * p.KW
	nw := p.Cout * p.Cin * kk
	wt, err := dev.Alloc(int64(nw) * int64(s.dt.Size()))
	if err != nil {
		return fmt.Errorf("ops: %s: transposed weights: %w", op, err)
	}
	// Free queues nothing: the block is handed out again only to work
	// queued after this launch.
	defer dev.Free(wt)
	tk, err := cuda.ConvTransposeWeights(s.dt)
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	// TF32 GEMMs: rounded to TF32 as well, which the wgmma kernels need and
	// the others do anyway as they stage their operands.
	targs := cuda.WeightTParams{W: w, WT: wt, N: int64(nw), Cout: int32(p.Cout), Cin: int32(p.Cin), KK: int32(kk),
		RoundTF32: boolInt32(convTF32(dev, s.dt))}
	if err := tk.Launch(dev, dev.GridStride(int64(nw), 256), targs); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	args := s.gemm(convDgrad)
	args.A, args.B, args.Mask, args.Out = wt, dy, y, dx
	choice, err := convKernel(s.dt, convDgrad, args, convGPUOf(dev))
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	if y != 0 && convUnmasked(choice.kernel) {
		masked, free, err := s.maskedGrad(op, dev, y, dy)
		if err != nil {
			return err
		}
		defer free()
		args.B, args.Mask = masked, 0
	}
	return launchConvGemm(op, dev, s.dt, convDgrad, args, 1)
}

// wgradDevice is convWgradOp's device launcher.
func (s convShape) wgradDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "Conv backward"
	if err := s.checkDeviceSizes(name); err != nil {
		return nil, err
	}
	x, y, dy := a.ptr[0], a.ptr[1], a.ptr[2]
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	if !s.p.ReLU {
		y = 0
	}
	var db backend.DevicePtr
	if s.bias {
		db = outPtr + backend.DevicePtr(s.wShape().TotalSize()*int(s.dt.Size()))
	}
	if err := s.wgrad(name, a.dev, x, y, dy, outPtr, db); err != nil {
		return nil, err
	}
	return out, nil
}

// wgradSplits chooses how many splits of its reduction the wgrad GEMM
// runs in: its output (Cout x Cin*KH*KW) has few tiles, and its reduction
// (N*OutH*OutW) is long. The cost model counts, per split count, the waves
// of blocks (one block per SM, what the float32 kernel's registers allow)
// times what each block runs: its k-tiles (about a microsecond each) and
// about one more for its prologue and epilogue; plus the pass that sums the
// partial tiles (at about 3 TB/s). More splits must win by 5%: they cost
// workspace memory the model does not price.
func wgradSplits(tiles, kTiles, slots, outBytes int) int {
	best, bestCost := 1, math.Inf(1)
	for s := 1; s <= min(kTiles, 64); s++ {
		kps := ceilDiv(kTiles, s)
		if ceilDiv(kTiles, kps) != s {
			continue // the same as a smaller count
		}
		if s > 1 && int64(s)*int64(outBytes) > 1<<30 {
			break
		}
		waves := ceilDiv(tiles*s, max(slots, 1))
		cost := float64(waves * (kps + 1))
		if s > 1 {
			cost += float64((s+1)*outBytes) / 3e6
		}
		if cost < 0.95*bestCost {
			best, bestCost = s, cost
		}
	}
	return best
}

// wgrad queues dw (and db, when db != 0) from x and dy masked by y > 0
// when y != 0. With more than one split, the partial tiles go to scratch
// memory and a second kernel sums them in split order. conv_sm90a.cu's
// kernels read dy' masked and rounded to TF32: as it comes when s.gradReady,
// else from a pass of their own (maskedGradTF32), which also sums db.
func (s convShape) wgrad(op string, dev *backend.Device, x, y, dy, dw, db backend.DevicePtr) error {
	p := s.p
	args := s.gemm(convWgrad)
	args.A, args.B, args.Mask = dy, x, y
	elem := int64(s.dt.Size())
	nw := int64(p.Cout) * int64(args.Ncols)
	gpu := convGPUOf(dev)
	choice, err := convKernel(s.dt, convWgrad, args, gpu)
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	slots := dev.SMCount() * convBlocksPerSM(choice, gpu.optIn)
	gemmDB := db // the bias gradient the GEMM sums, if any
	switch {
	case convWgmma(choice.kernel) && s.gradReady:
		// dy came masked and rounded from the layer's one pass over it
		// (convGradOp, bnGradApplyOp); the bias gradient came with it.
	case convWgmma(choice.kernel):
		masked, free, err := s.maskedGradTF32(op, dev, y, dy, db)
		if err != nil {
			return err
		}
		defer free()
		args.A, args.Mask, gemmDB = masked, 0, 0
	case y != 0 && convUnmasked(choice.kernel):
		masked, free, err := s.maskedGrad(op, dev, y, dy)
		if err != nil {
			return err
		}
		defer free()
		args.A, args.Mask = masked, 0
	}
	tiles := ceilDiv(p.Cout, choice.bm) * ceilDiv(int(args.Ncols), convTileN(s.dt))
	splits := wgradSplits(tiles, ceilDiv(int(args.K), convTileK(s.dt)), slots, int(nw*elem))
	if splits == 1 {
		args.Out, args.BiasGrad = dw, gemmDB
		return launchConvGemm(op, dev, s.dt, convWgrad, args, 1)
	}
	ws, err := dev.Alloc(int64(splits) * nw * elem)
	if err != nil {
		return fmt.Errorf("ops: %s: split-K workspace: %w", op, err)
	}
	defer dev.Free(ws)
	args.Out = ws
	var bws backend.DevicePtr
	if gemmDB != 0 {
		if bws, err = dev.Alloc(int64(splits) * int64(p.Cout) * elem); err != nil {
			return fmt.Errorf("ops: %s: split-K workspace: %w", op, err)
		}
		defer dev.Free(bws)
		args.BiasGrad = bws
	}
	if err := launchConvGemm(op, dev, s.dt, convWgrad, args, splits); err != nil {
		return err
	}
	return s.splitKReduce(op, dev, ws, dw, nw, bws, gemmDB, splits)
}

// splitKReduce queues out[i] = sum_s ws[s*n + i] for i < n and, when bws is
// non-zero, bout[c] = sum_s bws[s*Cout + c], in split order.
func (s convShape) splitKReduce(op string, dev *backend.Device, ws, out backend.DevicePtr, n int64, bws, bout backend.DevicePtr, splits int) error {
	k, err := cuda.ConvSplitKReduce(s.dt)
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	rargs := cuda.SplitKParams{WS: ws, Out: out, BiasWS: bws, BiasOut: bout, N: n, M: int32(s.p.Cout), Splits: int32(splits)}
	if err := k.Launch(dev, dev.GridStride(n, 256), rargs); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	return nil
}

// maskSumChunk is the elements of a plane of dy that one block of
// relu_mask_sum_tf32 / relu_mask_sum takes.
const maskSumChunk = 4096

// maskedGradTF32 returns dy masked by y > 0 (y may be 0: no mask) and
// rounded to TF32 in scratch memory (float32), for conv_sm90a.cu's wgrad,
// and a func to free it once the launches that read it are queued; with
// db != 0 it also queues db, the per-channel sums of the unrounded masked
// dy.
func (s convShape) maskedGradTF32(op string, dev *backend.Device, y, dy, db backend.DevicePtr) (backend.DevicePtr, func(), error) {
	n := int64(s.p.N) * int64(s.p.Cout) * int64(s.p.OutH*s.p.OutW)
	buf, err := dev.Alloc(4 * n)
	if err != nil {
		return 0, nil, fmt.Errorf("ops: %s: masked gradient: %w", op, err)
	}
	if err := s.gradOperand(op, dev, y, dy, buf, db); err != nil {
		dev.Free(buf)
		return 0, nil, err
	}
	return buf, func() { dev.Free(buf) }, nil
}

// gradOperand queues g = dy masked by y > 0 (y may be 0: no mask) into out,
// rounded to TF32 where the backward GEMMs multiply in TF32 (convTF32:
// relu_mask_sum_tf32), else as it is (relu_mask_sum); with db != 0 also db
// = the per-channel sums of the unrounded g (per chunk of each plane, then
// over the chunks in a fixed order). One pass over dy and y.
func (s convShape) gradOperand(op string, dev *backend.Device, y, dy, out, db backend.DevicePtr) error {
	p := s.p
	plane := p.OutH * p.OutW
	chunks := ceilDiv(plane, maskSumChunk)
	k, err := cuda.ReLUMaskSum(s.dt)
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	// Planes of whole float4s: every plane starts 16-byte aligned when the
	// tensors do (a view may not).
	vec4 := s.dt == tensor.Float32 && plane%4 == 0 && (y|dy|out)%16 == 0
	switch tf32 := convTF32(dev, s.dt); {
	case tf32 && vec4:
		k = cuda.ReLUMaskSumTF32Vec4F32
	case tf32:
		k = cuda.ReLUMaskSumTF32F32
	case vec4:
		k = cuda.ReLUMaskSumVec4F32
	}
	var partial backend.DevicePtr
	if db != 0 {
		if partial, err = dev.Alloc(int64(s.dt.Size()) * int64(p.N*chunks*p.Cout)); err != nil {
			return fmt.Errorf("ops: %s: bias gradient: %w", op, err)
		}
		// Free queues nothing: the block is handed out again only to work
		// queued after these launches.
		defer dev.Free(partial)
	}
	cfg := backend.LaunchConfig{
		Grid:      backend.Dim3{X: uint32(p.N * p.Cout * chunks), Y: 1, Z: 1},
		Block:     backend.Dim3{X: bnThreads, Y: 1, Z: 1},
		SharedMem: cuda.MaskSumScratchBytes,
	}
	margs := cuda.MaskSumParams{Y: y, DY: dy, DX: out, Partial: partial, C: int32(p.Cout), Plane: int32(plane),
		Chunk: maskSumChunk, Chunks: int32(chunks)}
	if err := k.Launch(dev, cfg, margs); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	if db != 0 {
		// Split-K's reduction over N*chunks "splits" of Cout sums.
		return s.splitKReduce(op, dev, partial, db, int64(p.Cout), 0, 0, p.N*chunks)
	}
	return nil
}

// gradDevice is convGradOp's device launcher.
func (s convShape) gradDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "Conv backward"
	if err := s.checkDeviceSizes(name); err != nil {
		return nil, err
	}
	y, dy := a.ptr[0], a.ptr[1]
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	if !s.p.ReLU {
		y = 0
	}
	var db backend.DevicePtr
	if s.bias {
		db = outPtr + backend.DevicePtr(s.yShape().TotalSize()*int(s.dt.Size()))
	}
	if err := s.gradOperand(name, a.dev, y, dy, outPtr, db); err != nil {
		return nil, err
	}
	return out, nil
}
