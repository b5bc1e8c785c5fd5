package kernels

import (
	"sync"
)

// The convolution kernels are GEMMs in the style of GotoBLAS/BLIS: operands
// are packed block by block into panels laid out in the exact order a
// register-tiled micro-kernel reads them, and the micro-kernel computes one
// MR x NR tile of C per call with its accumulators in registers. Packing is
// where the convolution's structure lives (im2col gathers, ReLU masks), so
// no im2col matrix is ever materialised: each block is gathered straight into
// the panel the micro-kernel streams from cache.
//
// Panel layouts, for a block of depth kc (the reduction dimension):
//
//	A (M x kc): panels of MR rows; panel i holds a[i*MR+r, p] at p*MR + r.
//	B (kc x N): panels of NR columns; panel j holds b[p, j*NR+c] at p*NR + c.
//
// Rows and columns past the matrix's edge are packed as zeros, so the
// micro-kernel always computes whole tiles; the edges are dropped when C is
// written out.

// microKernel computes one MR x NR tile: for i < mr, j < nr,
// c[i*ldc+j] = (load ? c[i*ldc+j] : 0) + sum_{p<k} a[p*mr+i] * b[p*nr+j].
type microKernel[T Float] struct {
	name   string
	mr, nr int
	fn     func(k int, a, b, c []T, ldc int, load bool)
}

// kcMax bounds the depth of a packed block: a B panel of kcMax x NR stays in
// L1 (32 KiB for the widest kernels) while the A panels stream from L2.
const kcMax = 256

// depthBlocks splits a reduction of length k into blocks of nearly equal
// size, none over kcMax. The split depends on k alone, so results do not
// depend on the number of workers.
func depthBlocks(k int) (n, size int) {
	if k <= 0 {
		return 0, 0
	}
	n = (k + kcMax - 1) / kcMax
	return n, (k + n - 1) / n
}

// goKernel is the portable micro-kernel: a 4x4 tile keeps its sixteen
// accumulators in registers on amd64 and arm64. Each element is the same
// chain over p as in the assembly kernels, but c += a*b is what Go makes of
// it: a multiply and an add, each rounded, on x86-64 (built for GOAMD64 v1
// or v2), and one fused multiply-add, as the assembly does, where Go fuses
// them (arm64, and x86-64 built for GOAMD64=v3 or later).
func goKernel[T Float]() microKernel[T] {
	return microKernel[T]{name: "portable", mr: 4, nr: 4, fn: goKernel4x4[T]}
}

func goKernel4x4[T Float](k int, a, b, c []T, ldc int, load bool) {
	var c00, c01, c02, c03, c10, c11, c12, c13 T
	var c20, c21, c22, c23, c30, c31, c32, c33 T
	a = a[:4*k]
	b = b[:4*k]
	for p := 0; p < len(a); p += 4 {
		ap := a[p : p+4 : p+4]
		bp := b[p : p+4 : p+4]
		b0, b1, b2, b3 := bp[0], bp[1], bp[2], bp[3]
		a0 := ap[0]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		a1 := ap[1]
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
		a2 := ap[2]
		c20 += a2 * b0
		c21 += a2 * b1
		c22 += a2 * b2
		c23 += a2 * b3
		a3 := ap[3]
		c30 += a3 * b0
		c31 += a3 * b1
		c32 += a3 * b2
		c33 += a3 * b3
	}
	rows := [4][4]T{{c00, c01, c02, c03}, {c10, c11, c12, c13}, {c20, c21, c22, c23}, {c30, c31, c32, c33}}
	for i, r := range rows {
		ci := c[i*ldc : i*ldc+4 : i*ldc+4]
		if load {
			for j := range ci {
				ci[j] += r[j]
			}
		} else {
			copy(ci, r[:])
		}
	}
}

// refKernel is the definition of a micro-kernel of any tile shape, loop for
// loop; tests hold every other kernel against it.
func refKernel[T Float](mr, nr int) microKernel[T] {
	return microKernel[T]{name: "ref", mr: mr, nr: nr, fn: func(k int, a, b, c []T, ldc int, load bool) {
		for i := range mr {
			for j := range nr {
				var s T
				for p := range k {
					s += a[p*mr+i] * b[p*nr+j]
				}
				if load {
					c[i*ldc+j] += s
				} else {
					c[i*ldc+j] = s
				}
			}
		}
	}}
}

// The micro-kernels of every choice this CPU offers (CPUKernelsEnv), best
// first, and the chosen one, for each element type.
var (
	kernels32 = offeredKernels[float32]()
	kernels64 = offeredKernels[float64]()
	chosen32  = kernelNamed[float32](cpuChoice)
	chosen64  = kernelNamed[float64](cpuChoice)
)

func offeredKernels[T Float]() []microKernel[T] {
	ks := make([]microKernel[T], len(cpuOffered))
	for i, name := range cpuOffered {
		ks[i] = kernelNamed[T](name)
	}
	return ks
}

// microKernels returns the micro-kernels this machine can run for T, fastest
// first; the last is always the pure-Go one.
func microKernels[T Float]() []microKernel[T] {
	var z T
	switch any(z).(type) {
	case float32:
		return any(kernels32).([]microKernel[T])
	case float64:
		return any(kernels64).([]microKernel[T])
	}
	// A named type with a float underlying type: only the portable kernel
	// can be typed for it without conversions.
	return []microKernel[T]{goKernel[T]()}
}

// chosenKernel is the micro-kernel the exported kernels use: the choice of
// CPUKernelsEnv, by default the CPU's best.
func chosenKernel[T Float]() microKernel[T] {
	var z T
	switch any(z).(type) {
	case float32:
		return any(chosen32).(microKernel[T])
	case float64:
		return any(chosen64).(microKernel[T])
	}
	return goKernel[T]()
}

// roundUp rounds n up to a multiple of m.
func roundUp(n, m int) int { return (n + m - 1) / m * m }

// macroKernel multiplies a packed A block (mPad x kc, MR panels) by a packed
// B block (kc x nPad, NR panels) into c (mPad x nPad, row stride ldc),
// overwriting c when load is false and adding to it otherwise. Each B panel
// is kept in L1 while every A panel passes over it.
func macroKernel[T Float](mk *microKernel[T], kc int, a, b []T, mPad, nPad int, c []T, ldc int, load bool) {
	mr, nr := mk.mr, mk.nr
	for j := 0; j < nPad; j += nr {
		bp := b[j*kc : (j+nr)*kc]
		for i := 0; i < mPad; i += mr {
			mk.fn(kc, a[i*kc:(i+mr)*kc], bp, c[i*ldc+j:], ldc, load)
		}
	}
}

// packPanels packs a rows x depth block of a strided matrix into panels of w
// rows: element (r, p), at src[r*rs+p*ps], goes to dst[(r/w)*depth*w + p*w +
// r%w]. Rows up to the next multiple of w are zero. With mask non-nil (same
// indexing as src) an element counts only where mask > 0: the ReLU mask of
// a gradient, applied as it is read rather than in a pass of its own.
func packPanels[T Float](dst, src, mask []T, rs, ps, rows, depth, w int) {
	if rs == 1 {
		// Row p of every panel is a piece of row p of src: mask the row in
		// one vector pass, then deal it out, reading src row by row.
		var tp *[]T
		if mask != nil {
			tp = getBuf[T](rows)
			defer putBuf(tp)
		}
		for p := range depth {
			s := src[p*ps : p*ps+rows]
			if mask != nil {
				gate(*tp, s, mask[p*ps:p*ps+rows])
				s = *tp
			}
			for r0 := 0; r0 < rows; r0 += w {
				n := min(w, rows-r0)
				d := dst[r0*depth+p*w : r0*depth+(p+1)*w]
				copy(d, s[r0:r0+n])
				if n < w {
					clear(d[n:])
				}
			}
		}
		return
	}
	for r0 := 0; r0 < rows; r0 += w {
		panel := dst[r0*depth : (r0+w)*depth]
		n := min(w, rows-r0)
		if n < w {
			clear(panel)
		}
		for r := range n {
			base := (r0 + r) * rs
			if ps == 1 {
				s := src[base : base+depth]
				if mask == nil {
					for p, v := range s {
						panel[p*w+r] = v
					}
				} else {
					m := mask[base : base+depth]
					for p, v := range s {
						if !(m[p] > 0) {
							v = 0
						}
						panel[p*w+r] = v
					}
				}
				continue
			}
			for p := range depth {
				v := src[base+p*ps]
				if mask != nil && !(mask[base+p*ps] > 0) {
					v = 0
				}
				panel[p*w+r] = v
			}
		}
	}
}

// gate sets dst[i] = src[i] where mask[i] > 0 and 0 elsewhere (also where
// mask[i] is NaN): the ReLU backward, dy masked by y > 0. Go compiles the
// select to a branch, which mispredicts on every other element of real
// activations, so the bulk goes through vector compares where the CPU has
// them. dst may be src.
func gate[T Float](dst, src, mask []T) {
	src, mask = src[:len(dst)], mask[:len(dst)]
	for i := gateVec(dst, src, mask); i < len(dst); i++ {
		v := src[i]
		if !(mask[i] > 0) {
			v = 0
		}
		dst[i] = v
	}
}

// affine sets dst[i] = act((src[i]-mu)*sc + sh + res[i]), res optional (nil)
// and act a ReLU or the identity: the epilogue of the convolution (mu 0, sc
// 1, sh the bias) and the elementwise pass of BatchNorm. The Go tail does the
// operations of the vector bulk in the same order, without fused
// multiply-adds (the conversion of the product forbids Go to fuse it with
// the add, as it otherwise may), so every element rounds alike; like Go's
// max, the ReLU passes NaN through.
func affine[T Float](dst, src, res []T, mu, sc, sh T, relu bool) {
	src = src[:len(dst)]
	if res != nil {
		res = res[:len(dst)]
	}
	for i := affineVec(dst, src, res, mu, sc, sh, relu); i < len(dst); i++ {
		v := T((src[i]-mu)*sc) + sh
		if res != nil {
			v += res[i]
		}
		if relu && v < 0 {
			v = 0
		}
		dst[i] = v
	}
}

// addTo adds src to dst element by element.
func addTo[T Float](dst, src []T) {
	src = src[:len(dst)]
	for i := addVec(dst, src); i < len(dst); i++ {
		dst[i] += src[i]
	}
}

// sum returns the sum of s, with four partial sums: a pairwise-like order
// that is more accurate than one running sum and not bound by the latency
// of one chain of additions.
func sum[T Float](s []T) T {
	var s0, s1, s2, s3 T
	i := 0
	for ; i+4 <= len(s); i += 4 {
		q := s[i : i+4 : i+4]
		s0 += q[0]
		s1 += q[1]
		s2 += q[2]
		s3 += q[3]
	}
	for ; i < len(s); i++ {
		s0 += s[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// bufPool recycles the scratch buffers of packed blocks and C tiles across
// calls: they are hundreds of KiB each, and allocating (and zeroing) them on
// every call would cost a noticeable share of a small convolution.
var bufPool sync.Map // element type (typeKey) -> *sync.Pool of *[]T

func getBuf[T Float](n int) *[]T {
	var z T
	p, _ := bufPool.LoadOrStore(typeKey(z), &sync.Pool{})
	if b, ok := p.(*sync.Pool).Get().(*[]T); ok && cap(*b) >= n {
		*b = (*b)[:n]
		return b
	}
	b := make([]T, n)
	return &b
}

func putBuf[T Float](b *[]T) {
	var z T
	if p, ok := bufPool.Load(typeKey(z)); ok {
		p.(*sync.Pool).Put(b)
	}
}

// typeKey tells float32 from float64 (and from types based on them) for the
// buffer pool.
func typeKey[T Float](z T) any { return any(z) }
