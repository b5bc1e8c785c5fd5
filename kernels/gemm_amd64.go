package kernels

import (
	"math"
	"unsafe"
)

// The assembly micro-kernels of gemm_amd64.s. Each writes one MR x NR tile:
// c[i*ldc+j] = (load ? c[i*ldc+j] : 0) + sum_p a[p*MR+i]*b[p*NR+j].

//go:noescape
func gemmF32x6x16AVX2(k int, a, b, c *float32, ldc int, load bool)

//go:noescape
func gemmF64x6x8AVX2(k int, a, b, c *float64, ldc int, load bool)

//go:noescape
func gemmF32x8x32AVX512(k int, a, b, c *float32, ldc int, load bool)

//go:noescape
func gemmF64x8x16AVX512(k int, a, b, c *float64, ldc int, load bool)

// Vector helpers (gemm_amd64.s); n is rounded down to the unrolling, 16
// float32 or 8 float64 elements.

//go:noescape
func gateF32AVX2(dst, src, gate *float32, n int)

//go:noescape
func gateF64AVX2(dst, src, gate *float64, n int)

//go:noescape
func addF32AVX2(dst, src *float32, n int)

//go:noescape
func addF64AVX2(dst, src *float64, n int)

//go:noescape
func affineF32AVX2(dst, src, res *float32, n int, mu, sc, sh, lb float32)

//go:noescape
func affineF64AVX2(dst, src, res *float64, n int, mu, sc, sh, lb float64)

func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)
func xgetbv0() (eax uint32)

// cpuFeatures reports what the micro-kernels need: AVX2 with FMA, and
// AVX-512F, each only when the OS saves the registers it uses on a context
// switch (XCR0), without which the upper halves would be silently lost.
func cpuFeatures() (avx2FMA, avx512 bool) {
	maxLeaf, _, _, _ := cpuid(0, 0)
	if maxLeaf < 7 {
		return false, false
	}
	_, _, ecx1, _ := cpuid(1, 0)
	const fma, osxsave, avx = 1 << 12, 1 << 27, 1 << 28
	if ecx1&(fma|osxsave|avx) != fma|osxsave|avx {
		return false, false
	}
	xcr0 := xgetbv0()
	const sseAVXState = 1<<1 | 1<<2
	const avx512State = 1<<5 | 1<<6 | 1<<7 // opmask, upper ZMM0-15, ZMM16-31
	if xcr0&sseAVXState != sseAVXState {
		return false, false
	}
	_, ebx7, _, _ := cpuid(7, 0)
	const avx2, avx512f = 1 << 5, 1 << 16
	avx2FMA = ebx7&avx2 != 0
	avx512 = avx2FMA && ebx7&avx512f != 0 && xcr0&avx512State == avx512State
	return avx2FMA, avx512
}

// asmKernel wraps an assembly micro-kernel for element type E as a
// microKernel of T (T's underlying type is E). The bounds are checked here,
// once per tile, so the assembly can run unchecked.
func asmKernel[T Float, E float32 | float64](name string, mr, nr int, f func(k int, a, b, c *E, ldc int, load bool)) microKernel[T] {
	return microKernel[T]{name: name, mr: mr, nr: nr, fn: func(k int, a, b, c []T, ldc int, load bool) {
		_ = c[(mr-1)*ldc+nr-1]
		if k == 0 {
			if !load {
				for i := range mr {
					clear(c[i*ldc : i*ldc+nr])
				}
			}
			return
		}
		_ = a[k*mr-1]
		_ = b[k*nr-1]
		f(k, (*E)(unsafe.Pointer(&a[0])), (*E)(unsafe.Pointer(&b[0])), (*E)(unsafe.Pointer(&c[0])), ldc, load)
	}}
}

// vectorHelpers is whether the AVX2 helpers below run: with the avx2 and
// avx512 choices, whose CPUs have AVX2 and FMA, and not with portable,
// which runs no assembly. They give the bits of their Go loops.
var vectorHelpers = cpuChoice != "portable"

// gateVec does as many leading elements of gate as the AVX2 helpers can and
// returns how many it did.
func gateVec[T Float](dst, src, gate []T) int {
	n := len(dst)
	if !vectorHelpers || n < 16 {
		return 0
	}
	_, _ = src[n-1], gate[n-1]
	switch d := any(dst).(type) {
	case []float32:
		n &^= 15
		gateF32AVX2(&d[0], &any(src).([]float32)[0], &any(gate).([]float32)[0], n)
	case []float64:
		n &^= 7
		gateF64AVX2(&d[0], &any(src).([]float64)[0], &any(gate).([]float64)[0], n)
	default:
		return 0
	}
	return n
}

// addVec does as many leading elements of addTo as the AVX2 helpers can
// and returns how many it did.
func addVec[T Float](dst, src []T) int {
	n := len(dst)
	if !vectorHelpers || n < 16 {
		return 0
	}
	_ = src[n-1]
	switch d := any(dst).(type) {
	case []float32:
		n &^= 15
		addF32AVX2(&d[0], &any(src).([]float32)[0], n)
	case []float64:
		n &^= 7
		addF64AVX2(&d[0], &any(src).([]float64)[0], n)
	default:
		return 0
	}
	return n
}

// affineVec does as many leading elements of affine as the AVX2 helpers
// can and returns how many it did.
func affineVec[T Float](dst, src, res []T, mu, sc, sh T, relu bool) int {
	n := len(dst)
	if !vectorHelpers || n < 16 {
		return 0
	}
	_ = src[n-1]
	lb := math.Inf(-1)
	if relu {
		lb = 0
	}
	switch d := any(dst).(type) {
	case []float32:
		n &^= 15
		var r *float32
		if res != nil {
			r = &any(res).([]float32)[0]
			_ = res[n-1]
		}
		affineF32AVX2(&d[0], &any(src).([]float32)[0], r, n, float32(mu), float32(sc), float32(sh), float32(lb))
	case []float64:
		n &^= 7
		var r *float64
		if res != nil {
			r = &any(res).([]float64)[0]
			_ = res[n-1]
		}
		affineF64AVX2(&d[0], &any(src).([]float64)[0], r, n, float64(mu), float64(sc), float64(sh), lb)
	default:
		return 0
	}
	return n
}

// cpuOffers returns the choices of CPUKernelsEnv this CPU can run, best
// first.
func cpuOffers() []string {
	avx2FMA, avx512 := cpuFeatures()
	var names []string
	if avx512 {
		names = append(names, "avx512")
	}
	if avx2FMA {
		names = append(names, "avx2")
	}
	return append(names, "portable")
}

// kernelNamed returns the micro-kernel of the choice name (cpuOffers'):
// 8x32 (float32) or 8x16 (float64) tiles for avx512, 6x16 or 6x8 for avx2,
// the 4x4 Go kernel for portable.
func kernelNamed[T Float](name string) microKernel[T] {
	var z T
	f32 := unsafe.Sizeof(z) == 4
	switch {
	case name == "avx512" && f32:
		return asmKernel[T]("avx512", 8, 32, gemmF32x8x32AVX512)
	case name == "avx512":
		return asmKernel[T]("avx512", 8, 16, gemmF64x8x16AVX512)
	case name == "avx2" && f32:
		return asmKernel[T]("avx2", 6, 16, gemmF32x6x16AVX2)
	case name == "avx2":
		return asmKernel[T]("avx2", 6, 8, gemmF64x6x8AVX2)
	}
	return goKernel[T]()
}
