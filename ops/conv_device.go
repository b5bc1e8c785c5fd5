package ops

import (
	"fmt"
	"math"
	"math/bits"
	"strings"
	"unsafe"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// The GPU path of Conv and of ConvBN's convolution: kernels/conv.cu, one
// implicit-GEMM kernel template for the forward pass (bias or BatchNorm
// scale/shift, residual and ReLU in its epilogue, and for ConvBN in training
// the batch statistics), the data gradient and the weight gradient (split
// along its long reduction when the GEMM has too few tiles to fill the GPU),
// and for float32 the cp.async pipelines of conv_pipe for all three.

// fastDivArgs mirrors FastDiv in kernels/conv.cuh: division of a
// non-negative int32 by d as a multiply-high and a shift.
type fastDivArgs struct {
	D        int32
	Mul, Shr uint32
	Unused   int32
}

// fastDiv returns the constants for divisor d >= 1: with l = ceil(log2 d),
// mul = ceil(2^(31+l)/d) and shr = l-1, umulhi(n, mul) >> shr = n/d for
// every 0 <= n < 2^31 (conv.cuh explains why); d == 1 has mul 0.
func fastDiv(d int) fastDivArgs {
	f := fastDivArgs{D: int32(d)}
	if d == 1 {
		return f
	}
	l := bits.Len32(uint32(d - 1))
	f.Mul = uint32((uint64(1)<<(31+l) + uint64(d) - 1) / uint64(d))
	f.Shr = uint32(l - 1)
	return f
}

// div is the kernel's fdiv, for tests.
func (f fastDivArgs) div(n int32) int32 {
	if f.Mul == 0 {
		return n
	}
	return int32(uint32((uint64(uint32(n))*uint64(f.Mul))>>32) >> f.Shr)
}

// convGemmArgs mirrors ConvGemmParams in kernels/conv.cuh field for field.
type convGemmArgs struct {
	A, B, Mask, Out        backend.DevicePtr
	Scale, Shift, Residual backend.DevicePtr
	Stats, BiasGrad        backend.DevicePtr
	N, Cin, H, W           int32
	Cout, KH, KW           int32
	StrideH, StrideW       int32
	PadH, PadW, DilH, DilW int32
	OutH, OutW             int32
	ReLU                   int32
	M, NCols, K            int32
	TilesM, KTilesPerSplit int32
	Unused                 int32
	DivKK, DivKW           fastDivArgs
	DivImg, DivRow         fastDivArgs
	DivQ, DivQW            fastDivArgs
	DivStrideH, DivStrideW fastDivArgs
}

// splitKArgs mirrors SplitKParams and weightTArgs WeightTParams (conv.cu).
type splitKArgs struct {
	WS, Out, BiasWS, BiasOut backend.DevicePtr
	N                        int64
	M, Splits                int32
}

type weightTArgs struct {
	W, WT                    backend.DevicePtr
	N                        int64
	Cout, Cin, KK, RoundTF32 int32
}

var (
	_ [288]byte = [unsafe.Sizeof(convGemmArgs{})]byte{}
	_ [48]byte  = [unsafe.Sizeof(splitKArgs{})]byte{}
	_ [40]byte  = [unsafe.Sizeof(weightTArgs{})]byte{}
)

// The three GEMMs of conv.cu (ConvMode).
const (
	convFprop = iota
	convDgrad
	convWgrad
)

var convModeNames = [...]string{"fprop", "dgrad", "wgrad"}

// convTile mirrors ConvTile<T> in conv.cu: block tile, threads and the
// padding of the shared-memory rows.
type convTile struct {
	bm, bn, bk, threads int
	padA, padB, padC    int
	elem                int
}

var (
	convTileF32 = convTile{bm: 128, bn: 128, bk: 32, threads: 256, padA: 4, padB: 8, padC: 8, elem: 4}
	convTileF64 = convTile{bm: 64, bn: 64, bk: 16, threads: 256, padA: 1, padB: 1, padC: 1, elem: 8}
)

func convTileFor(dt tensor.Dtype) convTile {
	if dt == tensor.Float32 {
		return convTileF32
	}
	return convTileF64
}

// smemBytes is GemmShape<T, mode>::kSmemBytes: two stages of the A and B
// tiles, or the C tile of the epilogue over them, and for wgrad a table of
// 16 bytes per column. conv.cu pins the values with static_asserts.
func (t convTile) smemBytes(mode int) int {
	lda := t.bk + t.padA
	a := t.bm * lda
	b := t.bk * (t.bn + t.padB)
	if mode == convWgrad {
		b = t.bn * lda
	}
	pipe := 2 * (a + b) * t.elem
	c := t.bm * (t.bn + t.padC) * t.elem
	main := (max(pipe, c) + 15) / 16 * 16
	if mode == convWgrad {
		main += 16 * t.bn
	}
	return main
}

// The float32 forward kernels of conv.cu: conv_gemm's register-staged loop
// (v1), and the cp.async pipelines of conv_pipe: v2 (v1's 128x128
// tile and warps of 64x32, two blocks per SM), v3 (256x128, warps of
// 64x64, one block per SM) and v4 (128x128, four warps of 64x64, two blocks
// per SM). All four compute the same results, bit for bit; convKernel
// chooses.
const (
	convFpropF32V1 = "conv_fprop_f32"
	convFpropF32V2 = "conv_fprop_f32_v2"
	convFpropF32V3 = "conv_fprop_f32_v3"
	convFpropF32V4 = "conv_fprop_f32_v4"
)

// The float32 backward kernels: conv_gemm's (v1) and the cp.async
// pipelines of conv_pipe (v2, v1's 128x128 tile and warps, two blocks per
// SM). dgrad v2 runs stride-1 layers only; wgrad v2 needs OutH*OutW % 4 ==
// 0 and dy 16-byte aligned (its 16-byte copies of dy). Neither applies the
// ReLU mask of dy as it copies: dgrad and wgrad mask dy into scratch memory
// first (maskedGrad). dgrad v2 agrees with v1 bit for bit; so does wgrad
// v2's dw for the same splits (its bias gradient adds in another order).
const (
	convDgradF32V1 = "conv_dgrad_f32"
	convDgradF32V2 = "conv_dgrad_f32_v2"
	convWgradF32V1 = "conv_wgrad_f32"
	convWgradF32V2 = "conv_wgrad_f32_v2"
)

// The wgmma kernels of conv_sm90a.cu (module conv_sm90a, PTX the driver
// compiles for sm_90a): fprop and stride-1 dgrad on conv_pipe's loads and
// epilogue, with the weights read by the MMAs straight from shared memory.
// They run on compute capability 9.0 GPUs only, need K % 4 == 0 and the
// weights 16-byte aligned (16-byte copies of their rows), and, like dgrad
// v2, dy masked beforehand. WgmmaPipe::kSmemBytes in conv_sm90a.cu pins
// their shared memory.
const (
	convFpropF32V5  = "conv_fprop_f32_v5"
	convDgradF32V5  = "conv_dgrad_f32_v5"
	convFpropF32V6  = "conv_fprop_f32_v6"
	convDgradF32V6  = "conv_dgrad_f32_v6"
	convFpropF32V7  = "conv_fprop_f32_v7"
	convDgradF32V7  = "conv_dgrad_f32_v7"
	convWgradF32V5  = "conv_wgrad_f32_v5"
	convWgradF32V6  = "conv_wgrad_f32_v6"
	convWgmmaSmem   = 104448
	convWgmmaV6Smem = 203776
	convWgmmaV7Smem = 138240
	convWgradV5Smem = 107520
	convWgradV6Smem = 207872
)

// convWgmma reports whether name is a kernel of conv_sm90a.cu.
func convWgmma(name string) bool {
	switch name {
	case convFpropF32V5, convDgradF32V5, convFpropF32V6, convDgradF32V6, convFpropF32V7, convDgradF32V7,
		convWgradF32V5, convWgradF32V6:
		return true
	}
	return false
}

// convModule is the module (kernels/<module>.cu) of a conv kernel.
func convModule(name string) string {
	if convWgmma(name) {
		return "conv_sm90a"
	}
	return "conv"
}

// convSM90a reports whether dev runs conv_sm90a.cu's kernels (sm90aError);
// where it does not, the float32 GEMMs use conv.cu's kernels, which run
// everywhere.
func convSM90a(dev *backend.Device) bool {
	return convWgmmaError(dev) == nil
}

// convWgmmaError is why dev does not run conv_sm90a.cu's kernels, or nil.
func convWgmmaError(dev *backend.Device) error {
	return sm90aError(dev, convModule(convFpropF32V5), convFpropF32V5)
}

// convKernelKey keys, on a Device, the float32 kernel that tests and
// benchmarks which compare the kernels force for one of the GEMMs
// (convFprop, convDgrad or convWgrad) instead of convKernel's choice: its
// name, which must fit the launch.
type convKernelKey int

// setConvKernel forces kernel for the float32 GEMMs of mode on dev; ""
// gives the choice back to convKernel.
func setConvKernel(dev *backend.Device, mode int, kernel string) {
	if kernel == "" {
		dev.SetValue(convKernelKey(mode), nil)
		return
	}
	dev.SetValue(convKernelKey(mode), kernel)
}

// The shared memory of the pipelined kernels, FpropPipe::kSmemBytes in
// conv.cu (which pins them): stages of the A and B tiles (or the C tile
// over them), then a ring of four k-tiles' row tables of 16 bytes a row
// (wgrad: its column table, as large). B rows are convTileF32's, k-major
// (BK rows of BN+padB) or, for wgrad, n-major (BN rows of BK+padA); C rows
// are convTileF32's; A's rows are bm.
func convPipeSmemBytes(bm, stages int, nMajorB bool) int {
	t := convTileF32
	b := t.bk * (t.bn + t.padB)
	if nMajorB {
		b = t.bn * (t.bk + t.padA)
	}
	pipe := stages * (bm*(t.bk+t.padA) + b) * t.elem
	c := bm * (t.bn + t.padC) * t.elem
	return (max(pipe, c)+15)/16*16 + 4*t.bk*16
}

var (
	convFpropV2Smem = convPipeSmemBytes(128, 3, false)
	convFpropV3Smem = convPipeSmemBytes(256, 4, false)
	convFpropV4Smem = convPipeSmemBytes(128, 3, false)
	convDgradV2Smem = convPipeSmemBytes(128, 3, false)
	convWgradV2Smem = convPipeSmemBytes(128, 3, true)
)

// convFpropPipeFits reports whether the pipelined kernels can run the
// forward GEMM of args: they add their offsets into x in 32-bit ints,
// whose sums, column part plus row part, stay below (N+1)*Cin*H*W.
// wgrad v2 gathers x the same way.
func convFpropPipeFits(args convGemmArgs) bool {
	return int64(args.N+1)*int64(args.Cin)*int64(args.H)*int64(args.W) <= math.MaxInt32
}

// convBackwardPipeFits reports whether the v2 kernel of a backward GEMM can
// run args, and if not why. dgrad v2: stride 1, and its offsets into dy,
// a column part (an image's offset plus (ih+PadH)*OutW + iw+PadW) plus a
// row part (co*OutH*OutW - kh*DilH*OutW - kw*DilW), within 32 bits.
// wgrad v2: fprop's offsets into x, and 16-byte copies of dy's rows.
func convBackwardPipeFits(mode int, args convGemmArgs) (bool, string) {
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
	if !convFpropPipeFits(args) {
		return false, "x exceeds its 32-bit offsets"
	}
	if int64(args.OutH)*int64(args.OutW)%4 != 0 || args.A%16 != 0 {
		return false, "OutH*OutW % 4 != 0 or dy not 16-byte aligned"
	}
	return true, ""
}

// convKernelChoice is a GEMM's kernel, its dynamic shared memory, the rows
// of its block tile (the columns are convTileFor(dt).bn for all) and its
// threads per block.
type convKernelChoice struct {
	name              string
	smem, bm, threads int
}

// convKernel chooses the kernel of a GEMM on gpu. For float32 forward
// GEMMs: conv_sm90a.cu's where they run (convWgmmaFits; which one by
// convWgmmaPick), else v2, and v1 only where v2's offsets do not fit. The
// conv.cu kernels measured on an H200
// (BenchmarkGPUConvFpropVariants, TARGETS.md cases): v2 0.096 / 1.331 /
// 0.048 ms on resnet_c3_3x3 / fpn_p2_3x3 / resnet_c4_1x1; v4, whose warp
// tiles read a third less shared memory per MMA, 0.096 / 1.332 / 0.055;
// v3 0.168 / 1.338 / 0.078; v1 0.214 / 3.260 / 0.098. v3 and v4 only by
// override. For float32 dgrad and wgrad, convBackwardKernel.
func convKernel(dt tensor.Dtype, mode int, args convGemmArgs, gpu convGPU) (convKernelChoice, error) {
	optIn, sm90a := gpu.optIn, gpu.sm90a
	t := convTileFor(dt)
	generic := convKernelChoice{"conv_" + convModeNames[mode] + "_" + dtypeSuffix(dt), t.smemBytes(mode), t.bm, t.threads}
	if dt != tensor.Float32 {
		return generic, nil
	}
	if mode != convFprop {
		return convBackwardKernel(mode, args, gpu, generic)
	}
	v2 := convKernelChoice{convFpropF32V2, convFpropV2Smem, 128, 256}
	v5 := convKernelChoice{convFpropF32V5, convWgmmaSmem, 128, 256}
	v3 := convKernelChoice{convFpropF32V3, convFpropV3Smem, 256, 256}
	v4 := convKernelChoice{convFpropF32V4, convFpropV4Smem, 128, 128}
	fits := convFpropPipeFits(args)
	var want convKernelChoice
	switch gpu.forced[convFprop] {
	case "":
		if !fits {
			return generic, nil
		}
		if ok, _ := convWgmmaFits(args, optIn, sm90a); ok {
			return convWgmmaPick(mode, args, gpu), nil
		}
		return v2, nil
	case convFpropF32V5, convFpropF32V6, convFpropF32V7:
		want = v5
		switch gpu.forced[convFprop] {
		case convFpropF32V6:
			want = convKernelChoice{convFpropF32V6, convWgmmaV6Smem, 256, 256}
		case convFpropF32V7:
			want = convKernelChoice{convFpropF32V7, convWgmmaV7Smem, 128, 256}
		}
		if ok, why := convWgmmaFits(args, optIn, sm90a); !ok {
			return convKernelChoice{}, fmt.Errorf("%s: %s", want.name, why)
		}
	case convFpropF32V1:
		return generic, nil
	case convFpropF32V2:
		want = v2
	case convFpropF32V3:
		want = v3
	case convFpropF32V4:
		want = v4
	default:
		return convKernelChoice{}, fmt.Errorf("no float32 forward kernel %q", gpu.forced[convFprop])
	}
	if !fits {
		return convKernelChoice{}, fmt.Errorf("%s: (N+1)*Cin*H*W = %d exceeds its 32-bit offsets", want.name,
			int64(args.N+1)*int64(args.Cin)*int64(args.H)*int64(args.W))
	}
	if want.smem > optIn {
		return convKernelChoice{}, fmt.Errorf("%s needs %d bytes of shared memory per block; this GPU allows %d", want.name, want.smem, optIn)
	}
	return want, nil
}

// convGPU is what the choice of a conv kernel needs to know of the GPU.
type convGPU struct {
	optIn  int       // shared memory a block may opt in to
	sms    int       // streaming multiprocessors
	sm90a  bool      // runs conv_sm90a.cu's kernels (convSM90a)
	forced [3]string // per GEMM, the float32 kernel forced there (setConvKernel), or ""
}

func convGPUOf(dev *backend.Device) convGPU {
	_, optIn := dev.MaxSharedMemory()
	gpu := convGPU{optIn: optIn, sms: dev.SMCount(), sm90a: convSM90a(dev)}
	for mode := range gpu.forced {
		gpu.forced[mode], _ = dev.Value(convKernelKey(mode)).(string)
	}
	return gpu
}

// convWgmmaPick chooses among conv_sm90a.cu's kernels for a forward or
// dgrad GEMM that they run (convWgmmaFits): v6 (256 channels a tile, one
// block per SM) for GEMMs of more than 128 rows with at least four waves
// of its tiles; v7 (128 channels, one block per SM, MMAs overlapping the
// next k-tile's barrier) when v5's tiles fill at most one wave; else v5
// (128 channels, two blocks per SM). Measured on an H200
// (BenchmarkGPUConv*Variants), forward / dgrad ms: resnet_c3_3x3 v5
// 0.068 / 0.080, v6 0.101 / 0.106, v7 0.079 / 0.086; fpn_p2_3x3 v5 0.883 /
// 0.972, v6 0.743 / 0.771, v7 1.027 / 1.069; resnet_c4_1x1 v5 0.038 /
// 0.046, v6 0.049 / 0.043, v7 0.034 / 0.045.
func convWgmmaPick(mode int, args convGemmArgs, gpu convGPU) convKernelChoice {
	tiles := func(bm int) int { return ceilDiv(int(args.M), bm) * ceilDiv(int(args.NCols), convTileF32.bn) }
	v5, v6, v7 := convFpropF32V5, convFpropF32V6, convFpropF32V7
	if mode == convDgrad {
		v5, v6, v7 = convDgradF32V5, convDgradF32V6, convDgradF32V7
	}
	switch {
	case args.M > 128 && tiles(256) >= 4*gpu.sms && convWgmmaV6Smem <= gpu.optIn:
		return convKernelChoice{v6, convWgmmaV6Smem, 256, 256}
	case tiles(128) <= gpu.sms && convWgmmaV7Smem <= gpu.optIn:
		return convKernelChoice{v7, convWgmmaV7Smem, 128, 256}
	}
	return convKernelChoice{v5, convWgmmaSmem, 128, 256}
}

// convWgmmaFits reports whether conv_sm90a.cu's kernels can run a forward
// or stride-1 dgrad GEMM (whose other conditions are v2's), and if not why.
func convWgmmaFits(args convGemmArgs, optIn int, sm90a bool) (bool, string) {
	switch {
	case !sm90a:
		return false, "needs a compute capability 9.0 GPU whose driver compiles the sm_90a PTX"
	case args.K%4 != 0 || args.A%16 != 0:
		return false, fmt.Sprintf("K = %d must be a multiple of 4 and the weights 16-byte aligned", args.K)
	case convWgmmaSmem > optIn:
		return false, fmt.Sprintf("needs %d bytes of shared memory per block; this GPU allows %d", convWgmmaSmem, optIn)
	}
	return true, ""
}

// convBackwardKernel chooses the float32 dgrad or wgrad kernel: for dgrad,
// v5 where it runs, then v2 where it applies (convBackwardPipeFits) and the
// GPU gives a block its shared memory, else v1 (generic); for wgrad, v2 or
// v1. A kernel forced on the device (setConvKernel) is taken instead.
func convBackwardKernel(mode int, args convGemmArgs, gpu convGPU, generic convKernelChoice) (convKernelChoice, error) {
	optIn, sm90a := gpu.optIn, gpu.sm90a
	override, v1, v2 := gpu.forced[mode], convDgradF32V1, convKernelChoice{convDgradF32V2, convDgradV2Smem, 128, 256}
	if mode == convWgrad {
		v1, v2 = convWgradF32V1, convKernelChoice{convWgradF32V2, convWgradV2Smem, 128, 256}
	}
	fits, why := convBackwardPipeFits(mode, args)
	v5ok, v5why := convWgmmaFits(args, optIn, sm90a)
	if mode == convWgrad {
		// wgrad's A is dy', a rounded copy in scratch memory (aligned),
		// with rows of P = OutH*OutW % 4 == 0 (fits).
		v5ok, v5why = sm90a, "needs a compute capability 9.0 GPU whose driver compiles the sm_90a PTX"
	}
	v5ok = v5ok && fits
	wv5 := convKernelChoice{convWgradF32V5, convWgradV5Smem, 128, 256}
	wv6 := convKernelChoice{convWgradF32V6, convWgradV6Smem, 256, 256}
	switch override {
	case "":
		if v5ok && mode == convWgrad {
			if args.M > 128 && wv6.smem <= optIn {
				return wv6, nil
			}
			if wv5.smem <= optIn {
				return wv5, nil
			}
		} else if v5ok {
			return convWgmmaPick(mode, args, gpu), nil
		}
		if !fits || v2.smem > optIn {
			return generic, nil
		}
		return v2, nil
	case convWgradF32V5, convWgradF32V6:
		if mode != convWgrad {
			return convKernelChoice{}, fmt.Errorf("no float32 %s kernel %q", convModeNames[mode], override)
		}
		if !fits {
			return convKernelChoice{}, fmt.Errorf("%s: %s", override, why)
		}
		if !v5ok {
			return convKernelChoice{}, fmt.Errorf("%s: %s", override, v5why)
		}
		c := wv5
		if override == convWgradF32V6 {
			c = wv6
		}
		if c.smem > optIn {
			return convKernelChoice{}, fmt.Errorf("%s needs %d bytes of shared memory per block; this GPU allows %d", override, c.smem, optIn)
		}
		return c, nil
	case convDgradF32V5, convDgradF32V6, convDgradF32V7:
		if mode != convDgrad {
			return convKernelChoice{}, fmt.Errorf("no float32 %s kernel %q", convModeNames[mode], override)
		}
		if !fits {
			return convKernelChoice{}, fmt.Errorf("%s: %s", override, why)
		}
		if !v5ok {
			return convKernelChoice{}, fmt.Errorf("%s: %s", override, v5why)
		}
		if override != convDgradF32V5 {
			c := convKernelChoice{convDgradF32V6, convWgmmaV6Smem, 256, 256}
			if override == convDgradF32V7 {
				c = convKernelChoice{convDgradF32V7, convWgmmaV7Smem, 128, 256}
			}
			if c.smem > optIn {
				return convKernelChoice{}, fmt.Errorf("%s needs %d bytes of shared memory per block; this GPU allows %d", override, c.smem, optIn)
			}
			return c, nil
		}
		return convKernelChoice{convDgradF32V5, convWgmmaSmem, 128, 256}, nil
	case v1:
		return generic, nil
	case v2.name:
	default:
		return convKernelChoice{}, fmt.Errorf("no float32 %s kernel %q", convModeNames[mode], override)
	}
	if !fits {
		return convKernelChoice{}, fmt.Errorf("%s: %s", v2.name, why)
	}
	if v2.smem > optIn {
		return convKernelChoice{}, fmt.Errorf("%s needs %d bytes of shared memory per block; this GPU allows %d", v2.name, v2.smem, optIn)
	}
	return v2, nil
}

// convUnmasked reports whether a kernel leaves dy's ReLU mask to the
// caller (the cp.async backward kernels).
func convUnmasked(name string) bool {
	return name == convDgradF32V2 || name == convWgradF32V2 ||
		(convWgmma(name) && (strings.HasPrefix(name, "conv_dgrad") || strings.HasPrefix(name, "conv_wgrad")))
}

// convBlocksPerSM is how many blocks of choice share an SM, by shared
// memory (each block also takes 1 KiB of the SM's for the system; an SM
// has optIn + 1 KiB): the v2 and wgmma kernels, by their shared memory (at most two).
func convBlocksPerSM(choice convKernelChoice, optIn int) int {
	if choice.name == convWgradF32V2 || choice.name == convDgradF32V2 || convWgmma(choice.name) {
		return max(1, min(2, (optIn+1024)/(choice.smem+1024)))
	}
	return 1
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

// gemmArgs fills the geometry of the convolution; the caller sets the
// operands and the GEMM.
func (s convShape) gemmArgs() convGemmArgs {
	p := s.p
	return convGemmArgs{
		N: int32(p.N), Cin: int32(p.Cin), H: int32(p.H), W: int32(p.W),
		Cout: int32(p.Cout), KH: int32(p.KH), KW: int32(p.KW),
		StrideH: int32(p.StrideH), StrideW: int32(p.StrideW),
		PadH: int32(p.PadH), PadW: int32(p.PadW), DilH: int32(p.DilationH), DilW: int32(p.DilationW),
		OutH: int32(p.OutH), OutW: int32(p.OutW),
		DivKK: fastDiv(p.KH * p.KW), DivKW: fastDiv(p.KW),
		DivImg: fastDiv(1), DivRow: fastDiv(1), DivQ: fastDiv(1), DivQW: fastDiv(1),
		DivStrideH: fastDiv(p.StrideH), DivStrideW: fastDiv(p.StrideW),
	}
}

// checkDeviceSizes checks that the indices the kernels keep in 32-bit ints
// fit: per-image offsets and the GEMM sizes, with a tile of slack since
// kernels form indices up to one tile past the end; and that displacements
// within an image stay clear of the kernels' "far outside" mark, 2^29.
func (s convShape) checkDeviceSizes(op string) error {
	p := s.p
	const slack = 256
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
		{"H+2*PadH+DilationH*KH", p.H + 2*p.PadH + p.DilationH*p.KH, 1 << 27},
		{"W+2*PadW+DilationW*KW", p.W + 2*p.PadW + p.DilationW*p.KW, 1 << 27},
	} {
		if c.value > c.limit {
			return fmt.Errorf("ops: %s: %s = %d is too large for the CUDA kernels' 32-bit indices", op, c.name, c.value)
		}
	}
	return nil
}

// launchConvGemm queues the kernel convKernel chooses (conv_<mode>_<dtype>,
// or for float32 GEMMs conv_fprop_f32_v2, _v3 or _v4, conv_dgrad_f32_v2,
// conv_wgrad_f32_v2, which need args.Mask == 0) for args
// (operands, GEMM sizes and divisors set) in splits splits of the
// reduction (1 but for wgrad).
func launchConvGemm(op string, dev *backend.Device, dt tensor.Dtype, mode int, args convGemmArgs, splits int) error {
	t := convTileFor(dt)
	byDefault, _ := dev.MaxSharedMemory()
	choice, err := convKernel(dt, mode, args, convGPUOf(dev))
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	if args.Mask != 0 && convUnmasked(choice.name) {
		return fmt.Errorf("ops: %s: %s needs dy masked beforehand", op, choice.name)
	}
	k, err := dev.Kernel(convModule(choice.name), choice.name)
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	if mode == convFprop && convWgmma(choice.name) {
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
		rk, err := dev.Kernel("conv", "conv_transpose_weights_f32")
		if err != nil {
			return fmt.Errorf("ops: %s: %w", op, err)
		}
		rargs := weightTArgs{W: args.A, WT: wr, N: n, Cout: args.M, Cin: 1, KK: args.K, RoundTF32: 1}
		if err := backend.Launch(rk, dev.GridStride(n, 256), rargs); err != nil {
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
	tiles := tilesM * ceilDiv(int(args.NCols), t.bn)
	kTiles := ceilDiv(int(args.K), t.bk)
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
	if err := backend.Launch(k, cfg, args); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	return nil
}

// forward queues y = act(conv(x, w) + bias) on dev. With stats != 0 (a
// ConvBN layer in training) the epilogue also writes the per-channel
// statistics of y there, one record per column tile (convStatsOf).
func (s convShape) forward(op string, dev *backend.Device, x, w, bias, y, stats backend.DevicePtr) error {
	p := s.p
	args := s.gemmArgs()
	args.A, args.B, args.Out, args.Shift, args.Stats = w, x, y, bias, stats
	args.ReLU = boolInt32(p.ReLU)
	args.M, args.NCols, args.K = int32(p.Cout), int32(p.N*p.OutH*p.OutW), int32(p.Cin*p.KH*p.KW)
	args.DivImg, args.DivRow = fastDiv(p.OutH*p.OutW), fastDiv(p.OutW)
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
	tk, err := dev.Kernel("conv", "conv_transpose_weights_"+dtypeSuffix(s.dt))
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	// float32: rounded to TF32 as well, which the wgmma kernels need and
	// the others do anyway as they stage their operands.
	targs := weightTArgs{W: w, WT: wt, N: int64(nw), Cout: int32(p.Cout), Cin: int32(p.Cin), KK: int32(kk),
		RoundTF32: boolInt32(s.dt == tensor.Float32)}
	if err := backend.Launch(tk, dev.GridStride(int64(nw), 256), targs); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	args := s.gemmArgs()
	args.A, args.B, args.Mask, args.Out = wt, dy, y, dx
	args.M, args.NCols, args.K = int32(p.Cin), int32(p.N*p.H*p.W), int32(p.Cout*kk)
	args.DivImg, args.DivRow = fastDiv(p.H*p.W), fastDiv(p.W)
	if choice, err := convKernel(s.dt, convDgrad, args, convGPUOf(dev)); err == nil && y != 0 && convUnmasked(choice.name) {
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
	t := convTileFor(s.dt)
	args := s.gemmArgs()
	args.A, args.B, args.Mask = dy, x, y
	args.M, args.NCols, args.K = int32(p.Cout), int32(p.Cin*p.KH*p.KW), int32(p.N*p.OutH*p.OutW)
	args.DivQ, args.DivQW = fastDiv(p.OutH*p.OutW), fastDiv(p.OutW)
	elem := int64(s.dt.Size())
	nw := int64(p.Cout) * int64(args.NCols)
	bm := t.bm
	slots := dev.SMCount()
	gpu := convGPUOf(dev)
	gemmDB := db // the bias gradient the GEMM sums, if any
	if choice, err := convKernel(s.dt, convWgrad, args, gpu); err == nil {
		bm = choice.bm
		slots *= convBlocksPerSM(choice, gpu.optIn)
		switch {
		case convWgmma(choice.name) && s.gradReady:
			// dy came masked and rounded from the layer's one pass over
			// it (convGradOp, bnGradApplyOp); the bias gradient came with it.
		case convWgmma(choice.name):
			masked, free, err := s.maskedGradTF32(op, dev, y, dy, db)
			if err != nil {
				return err
			}
			defer free()
			args.A, args.Mask, gemmDB = masked, 0, 0
		case y != 0 && convUnmasked(choice.name):
			masked, free, err := s.maskedGrad(op, dev, y, dy)
			if err != nil {
				return err
			}
			defer free()
			args.A, args.Mask = masked, 0
		}
	}
	tiles := ceilDiv(p.Cout, bm) * ceilDiv(int(args.NCols), t.bn)
	splits := wgradSplits(tiles, ceilDiv(int(args.K), t.bk), slots, int(nw*elem))
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
	k, err := dev.Kernel("conv", "conv_splitk_reduce_"+dtypeSuffix(s.dt))
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	rargs := splitKArgs{WS: ws, Out: out, BiasWS: bws, BiasOut: bout, N: n, M: int32(s.p.Cout), Splits: int32(splits)}
	if err := backend.Launch(k, dev.GridStride(n, 256), rargs); err != nil {
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
// rounded to TF32 in float32 (what the backward GEMMs read:
// relu_mask_sum_tf32), as it is in float64 (relu_mask_sum); with db != 0
// also db = the
// per-channel sums of the unrounded g (per chunk of each plane, then over
// the chunks in a fixed order). One pass over dy and y.
func (s convShape) gradOperand(op string, dev *backend.Device, y, dy, out, db backend.DevicePtr) error {
	p := s.p
	plane := p.OutH * p.OutW
	chunks := ceilDiv(plane, maskSumChunk)
	k := cuda.ReLUMaskSumF64
	if s.dt == tensor.Float32 {
		k = cuda.ReLUMaskSumTF32F32
		if plane%4 == 0 && (y|dy|out)%16 == 0 {
			// Planes of whole float4s: every plane starts 16-byte aligned
			// when the tensors do (a view may not).
			k = cuda.ReLUMaskSumTF32Vec4F32
		}
	}
	var partial backend.DevicePtr
	if db != 0 {
		var err error
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
