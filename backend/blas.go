package backend

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"

	"gorgonia.org/tensor"
)

// Gemm is C = Alpha*op(A)*op(B) + Beta*C for Batch row-major problems,
// queued on a Device's stream by Device.Gemm (cuBLAS on the GPU).
//
// Matrices are row-major, as tensors store them: element (i, j) of a
// matrix with row stride ld is at i*ld + j. op(A) is A, or A^T when TransA:
// A is stored M x K, or K x M when TransA; likewise B is stored K x N, or
// N x K when TransB; C is M x N. Problem p of a batch reads A + p*StrideA,
// B + p*StrideB and writes C + p*StrideC; a stride of 0 shares one matrix
// between problems (one weight matrix for all heads, say), except for C,
// whose problems must not overlap.
//
// K == 0 makes C = Beta*C. Beta == 0 makes C = Alpha*op(A)*op(B) without
// reading C, so C may hold anything, NaNs included.
type Gemm struct {
	TransA, TransB bool // op(A) = A^T when TransA, likewise B
	M, N, K        int  // op(A) is M x K, op(B) is K x N, C is M x N
	A, B, C        DevicePtr
	// LDA, LDB and LDC are the row strides in elements; 0 means packed,
	// the stored matrix's column count.
	LDA, LDB, LDC int
	// Batch is the number of problems; 0 or 1 means one.
	Batch                     int
	StrideA, StrideB, StrideC int64 // elements between problems
	Alpha, Beta               float64
	Dtype                     tensor.Dtype // tensor.Float32 or tensor.Float64
	// Exact multiplies this call's float32 matrices in full float32 even on
	// a Device in GemmTF32: for products that only broadcast or sum (a
	// bias times a ones vector), where TF32 would round the values moved.
	Exact bool
}

func (g Gemm) String() string {
	t := func(b bool) string { return map[bool]string{false: "N", true: "T"}[b] }
	s := fmt.Sprintf("%v %s%s M=%d N=%d K=%d", g.Dtype, t(g.TransA), t(g.TransB), g.M, g.N, g.K)
	if g.Batch > 1 {
		s += fmt.Sprintf(" Batch=%d", g.Batch)
	}
	return s
}

// GemmMath is how a Device multiplies float32 matrices.
type GemmMath int

const (
	// GemmTF32 multiplies on tensor cores in TF32 (float32's exponent and
	// 10 of its 23 mantissa bits; products accumulate in float32), as
	// PyTorch does with allow_tf32 and cuDNN does for convolutions: each
	// product is off by up to ~1e-3 of itself (autograd.TolTF32 bounds the
	// result). It is the default.
	GemmTF32 GemmMath = iota
	// GemmExact multiplies and accumulates in float32 throughout.
	GemmExact
)

func (m GemmMath) String() string {
	switch m {
	case GemmTF32:
		return "TF32"
	case GemmExact:
		return "exact"
	}
	return fmt.Sprintf("GemmMath(%d)", int(m))
}

// SetGemmMath sets how d's float32 Gemms multiply; float64 ones are always
// exact. It applies to Gemms queued after it returns, and to the float32
// convolutions that package ops queues on d after it (Conv, ConvBN and
// ConvTranspose, forward and backward), whose GEMMs run on kernels of their
// own.
func (d *Device) SetGemmMath(m GemmMath) { d.gemmMath.Store(int32(m)) }

// GemmMath returns how d's float32 Gemms multiply (GemmTF32 unless
// SetGemmMath said otherwise).
func (d *Device) GemmMath() GemmMath { return GemmMath(d.gemmMath.Load()) }

// gemmMathSetting holds a Device's GemmMath; its zero value is GemmTF32.
type gemmMathSetting struct{ atomic.Int32 }

// Gemm queues g on d's stream, with cuBLAS, which it loads when first
// needed (see CUBLASEnv); it returns before the GPU is done. It checks g
// first: sizes, row strides, strides between problems and the dtype
// against their allowed ranges, and every operand against the device
// memory in use (a matrix must lie inside one block that Alloc, NewDense or
// ToDevice handed out and that is not yet freed), so that a wrong call is
// an error here rather than a fault later. Pointers to matrices that are
// not read (empty ones; all of them when C is empty) are not checked, and
// may be 0. An empty C (M or N zero) queues nothing.
func (d *Device) Gemm(g Gemm) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	gm := d.GemmMath()
	sh, err := g.check()
	if err == nil && g.Dtype == tensor.Float32 && gm != GemmTF32 && gm != GemmExact {
		err = fmt.Errorf("GemmMath is %v: want GemmTF32 or GemmExact (SetGemmMath)", gm)
	}
	if err != nil {
		return d.errorf("Gemm: %w", err)
	}
	for _, o := range sh.ops {
		if err := d.checkOperand(o); err != nil {
			return d.errorf("Gemm (%v): %w", g, err)
		}
	}
	if g.M == 0 || g.N == 0 || (g.K == 0 && g.Beta == 1) {
		return nil
	}
	d.blasMu.Lock()
	defer d.blasMu.Unlock()
	b, err := d.openBLAS()
	if err != nil {
		return d.errorf("Gemm: %w", err)
	}
	call := g.columnMajor(sh, gm == GemmTF32 && !g.Exact)
	if g.K == 0 {
		// C = Beta*C. Reference BLAS does this for k = 0, but cuBLAS does
		// not document what it does with k = 0; a product of depth 1 with
		// alpha 0 and zero operands is documented and exact (beta*C + 0),
		// and, for beta = 0, does not read C. One zero vector serves as
		// both operands of every problem (strides 0).
		n := max(g.M, g.N)
		z, err := d.alloc(int64(n) * sh.elem)
		if err != nil {
			return d.errorf("Gemm (%v): zeros for K = 0: %w", g, err)
		}
		defer d.mem.free(z)
		if err := d.drv.memset(z, 1, 0, uint64(int64(n)*sh.elem)); err != nil {
			return d.errorf("Gemm (%v): zeros for K = 0: %w", g, err)
		}
		call.k, call.alpha = 1, 0
		call.transA, call.transB = false, false
		call.a, call.lda, call.strideA = DevicePtr(z), int32(g.N), 0
		call.b, call.ldb, call.strideB = DevicePtr(z), 1, 0
	}
	d.counts.gemms.Add(1)
	if err := b.gemm(call); err != nil {
		return d.errorf("Gemm (%v): %w", g, err)
	}
	if d.syncLaunches {
		if err := d.drvSynchronize(); err != nil {
			return d.errorf("Gemm (%v) failed: %w", g, err)
		}
	}
	return nil
}

// BLASLibrary loads cuBLAS for d if no Gemm has yet, and describes it:
// the file opened and the library's version, "libcublas.so.13 (cuBLAS
// 13.0.2)".
func (d *Device) BLASLibrary() (string, error) {
	if err := d.enter(); err != nil {
		return "", err
	}
	defer d.exit()
	d.blasMu.Lock()
	defer d.blasMu.Unlock()
	b, err := d.openBLAS()
	if err != nil {
		return "", d.errorf("%w", err)
	}
	return b.library(), nil
}

// cuBLAS's workspace: what NVIDIA recommends for cublasSetWorkspace, 32 MiB
// on Hopper and 4 MiB before it. It comes from the caching allocator, so
// MemStats counts it and Close frees it.
func blasWorkspaceBytes(major int) int64 {
	if major >= 9 {
		return 32 << 20
	}
	return 4 << 20
}

// openBLAS returns d's cuBLAS handle, making it on first use: the library
// (loaded once per process), a handle on d's stream, and its workspace.
// d.blasMu is held. A failure leaves the rest of the Device working; the
// next call tries again (the library's search is made once per process,
// so a failure to load comes back every time).
func (d *Device) openBLAS() (blasDriver, error) {
	if d.blas != nil {
		return d.blas, nil
	}
	b, err := d.drv.openBLAS()
	if err != nil {
		return nil, err
	}
	if b.canSetWorkspace() {
		size := blasWorkspaceBytes(d.info.major)
		if err := d.blasWorkspace(b, size); err != nil {
			return nil, errors.Join(fmt.Errorf("cuBLAS workspace of %d bytes: %w", size, err), b.close())
		}
	}
	d.blas = b
	return b, nil
}

// blasWorkspace gives b a workspace of size bytes from the cache, which
// belongs to the Device (not to the Scope that happens to be open) and
// goes back with everything else at Close.
func (d *Device) blasWorkspace(b blasDriver, size int64) error {
	ws, err := d.alloc(size)
	if err != nil {
		return err
	}
	if err = d.mem.untag(ws); err == nil {
		err = b.setWorkspace(ws, uint64(size))
	}
	if err != nil {
		return errors.Join(err, d.mem.free(ws))
	}
	return nil
}

// closeBLAS destroys d's cuBLAS handle, if any, before Close gives the
// memory back (the workspace among it); the stream is idle.
func (d *Device) closeBLAS() error {
	d.blasMu.Lock()
	defer d.blasMu.Unlock()
	if d.blas == nil {
		return nil
	}
	err := d.blas.close()
	d.blas = nil
	if err != nil {
		return fmt.Errorf("destroying the cuBLAS handle: %w", err)
	}
	return nil
}

// gemmOperand is one matrix of a Gemm as stored: rows x cols with row
// stride ld, problems stride apart, spanning bytes from ptr (0 if empty).
type gemmOperand struct {
	name       string
	ptr        DevicePtr
	rows, cols int64
	ld, stride int64
	batch      int64
	bytes      int64
}

type gemmShape struct {
	elem  int64 // bytes per element
	batch int64
	ops   [3]gemmOperand // A, B, C
}

const maxInt32 = math.MaxInt32

// check validates g without looking at the device, and returns its
// operands' layout.
func (g Gemm) check() (gemmShape, error) {
	var sh gemmShape
	switch g.Dtype {
	case tensor.Float32:
		sh.elem = 4
	case tensor.Float64:
		sh.elem = 8
	default:
		return sh, fmt.Errorf("Dtype is %v: want tensor.Float32 or tensor.Float64", g.Dtype)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"M", g.M}, {"N", g.N}, {"K", g.K}, {"Batch", g.Batch}} {
		if f.v < 0 || f.v > maxInt32 {
			return sh, fmt.Errorf("%s is %d: want 0 to %d", f.name, f.v, maxInt32)
		}
	}
	sh.batch = int64(max(g.Batch, 1))
	m, n, k := int64(g.M), int64(g.N), int64(g.K)
	stored := func(trans bool, r, c int64) (int64, int64) {
		if trans {
			return c, r
		}
		return r, c
	}
	ar, ac := stored(g.TransA, m, k)
	br, bc := stored(g.TransB, k, n)
	// A fixed array and a layout chosen only for an error: every GEMM of
	// a training step passes here, and the host's time per op counts.
	ops := [3]struct {
		name, ldName, strideName string
		trans                    bool
		ptr                      DevicePtr
		rows, cols               int64
		ld                       int
		stride                   int64
	}{
		{"A", "LDA", "StrideA", g.TransA, g.A, ar, ac, g.LDA, g.StrideA},
		{"B", "LDB", "StrideB", g.TransB, g.B, br, bc, g.LDB, g.StrideB},
		{"C", "LDC", "StrideC", false, g.C, m, n, g.LDC, g.StrideC},
	}
	layout := func(name string, trans bool) string {
		switch {
		case name == "A" && trans:
			return "K x M, TransA"
		case name == "A":
			return "M x K"
		case name == "B" && trans:
			return "N x K, TransB"
		case name == "B":
			return "K x N"
		}
		return "M x N"
	}
	for i := range ops {
		o := &ops[i]
		// cuBLAS wants a row stride of at least 1, also for an empty matrix.
		lo := max(o.cols, 1)
		ld := int64(o.ld)
		if ld == 0 {
			ld = lo
		} else if ld < lo || ld > maxInt32 {
			return sh, fmt.Errorf("%s is %d: want 0 (packed) or %d to %d, %s being stored %d x %d (%s)",
				o.ldName, o.ld, lo, maxInt32, o.name, o.rows, o.cols, layout(o.name, o.trans))
		}
		if o.stride < 0 {
			return sh, fmt.Errorf("%s is %d: want 0 or more elements between problems", o.strideName, o.stride)
		}
		op := gemmOperand{name: o.name, ptr: o.ptr, rows: o.rows, cols: o.cols, ld: ld, stride: o.stride, batch: sh.batch}
		if o.rows == 0 || o.cols == 0 || m == 0 || n == 0 {
			// Never read or written: an empty matrix, or any of them
			// when C is empty and there is nothing to do.
			sh.ops[i] = op
			continue
		}
		if o.ptr == 0 {
			return sh, fmt.Errorf("%s is a null pointer, but it has %d x %d elements", o.name, o.rows, o.cols)
		}
		if int64(o.ptr)%sh.elem != 0 {
			return sh, fmt.Errorf("%s (%#x) is not aligned to its %d-byte elements", o.name, uint64(o.ptr), sh.elem)
		}
		// One problem spans (rows-1)*ld + cols elements (< 2^62); the
		// batch adds (batch-1)*stride, bounded first so nothing overflows.
		one := (o.rows-1)*ld + o.cols
		limit := int64(maxAlloc) / sh.elem
		if sh.batch > 1 && o.stride > (limit-one)/(sh.batch-1) || one > limit {
			return sh, fmt.Errorf("%s spans more than %d bytes (Batch %d, %s %d, %s %d): more than any device holds",
				o.name, int64(maxAlloc), sh.batch, o.strideName, o.stride, o.ldName, ld)
		}
		if o.name == "C" && sh.batch > 1 && o.stride < one {
			return sh, fmt.Errorf("StrideC is %d: want at least (M-1)*LDC + N = %d, so that the %d problems' C do not overlap",
				o.stride, one, sh.batch)
		}
		op.bytes = ((sh.batch-1)*o.stride + one) * sh.elem
		sh.ops[i] = op
	}
	return sh, nil
}

// checkOperand checks that a non-empty operand lies inside one block of
// device memory in use; d is entered.
func (d *Device) checkOperand(o gemmOperand) error {
	if o.bytes == 0 {
		return nil
	}
	b, live, ok := d.mem.lookup(uint64(o.ptr))
	switch {
	case !ok:
		return fmt.Errorf("%s (%#x) is not memory of this device", o.name, uint64(o.ptr))
	case !live:
		return fmt.Errorf("%s (%#x) is in a block that has been freed", o.name, uint64(o.ptr))
	case uint64(o.ptr)+uint64(o.bytes) > b.base+b.size:
		return fmt.Errorf("%s (%#x) spans %d bytes (%d x %d, row stride %d, %d problems %d apart), past the end of its block of %d bytes at %#x",
			o.name, uint64(o.ptr), o.bytes, o.rows, o.cols, o.ld, o.batch, o.stride, b.size, b.base)
	}
	return nil
}

// gemmCall is a Gemm as cuBLAS takes it: column-major, 32-bit sizes and
// row strides, alpha and beta by value.
type gemmCall struct {
	transA, transB   bool
	m, n, k          int32
	a, b, c          DevicePtr
	lda, ldb, ldc    int32
	strideA, strideB int64
	strideC          int64
	batch            int32
	alpha, beta      float64
	dtype            tensor.Dtype
	tf32             bool // float32 only: may multiply in TF32
	elem             int64
}

// columnMajor turns a checked row-major Gemm into cuBLAS's column-major
// call. A row-major matrix with row stride ld is, read column-major with
// leading dimension ld, its transpose. So the row-major C = op(A) op(B) is
// the column-major C^T = op(B)^T op(A)^T: cuBLAS is called with the
// operands swapped (B first, with TransB, then A with TransA) and m and n
// swapped (m = N, n = M), each with its own row stride as the leading
// dimension. No data moves.
func (g Gemm) columnMajor(sh gemmShape, tf32 bool) gemmCall {
	a, b, c := sh.ops[0], sh.ops[1], sh.ops[2]
	return gemmCall{
		transA: g.TransB, transB: g.TransA,
		m: int32(g.N), n: int32(g.M), k: int32(g.K),
		a: b.ptr, lda: int32(b.ld), strideA: b.stride,
		b: a.ptr, ldb: int32(a.ld), strideB: a.stride,
		c: c.ptr, ldc: int32(c.ld), strideC: c.stride,
		batch: int32(sh.batch),
		alpha: g.Alpha, beta: g.Beta,
		dtype: g.Dtype, tf32: tf32 && g.Dtype == tensor.Float32,
		elem: sh.elem,
	}
}

// blasDriver is a cuBLAS handle on a Device's stream (blas_cuda.go), or
// the fake's (fake_test.go).
type blasDriver interface {
	// library describes the library: "libcublas.so.13 (cuBLAS 13.0.2)".
	library() string
	// canSetWorkspace reports whether the library takes a workspace
	// (cublasSetWorkspace_v2); setWorkspace gives it one.
	canSetWorkspace() bool
	setWorkspace(ptr, bytes uint64) error
	// gemm queues one call of cublasGemmEx (batch 1) or
	// cublasGemmStridedBatchedEx.
	gemm(c gemmCall) error
	// close destroys the handle.
	close() error
}

// BLASError is an error returned by a cuBLAS call. Errors from Gemm wrap
// it with the GPU and the problem; errors.As recovers it.
type BLASError struct {
	Call   string // the cuBLAS function, e.g. "cublasGemmEx"
	Status int    // its cublasStatus_t
	Name   string // e.g. "CUBLAS_STATUS_INVALID_VALUE"
	Desc   string // the library's description, if it has one
}

func (e *BLASError) Error() string {
	s := fmt.Sprintf("%s: %s (%d)", e.Call, e.Name, e.Status)
	if e.Desc != "" {
		s += ": " + e.Desc
	}
	return s
}

// The cuBLAS ABI this package uses, from CUDA 11.8's cublas_api.h and
// library_types.h (TestCUBLASABI compares them with the headers where
// installed). The values have not changed through CUDA 13, which only
// added enumerators; the functions used keep their CUDA 11 signatures
// (CUDA 12 added _64 variants under new names beside them).
const (
	cublasOpN = 0 // cublasOperation_t
	cublasOpT = 1

	cudaR32F = 0 // cudaDataType
	cudaR64F = 1

	cublasCompute32F         = 68 // cublasComputeType_t
	cublasCompute32FFastTF32 = 77
	cublasCompute64F         = 70

	cublasDefaultMath = 0  // cublasMath_t: no reduced precision (no TF32)
	cublasGemmDefault = -1 // cublasGemmAlgo_t: the library's heuristic

	libMajorVersion = 0 // libraryPropertyType
	libMinorVersion = 1
	libPatchLevel   = 2
)

// cublasStatusNames are cublasStatus_t's values (cublas_api.h).
var cublasStatusNames = map[int]string{
	0:  "CUBLAS_STATUS_SUCCESS",
	1:  "CUBLAS_STATUS_NOT_INITIALIZED",
	3:  "CUBLAS_STATUS_ALLOC_FAILED",
	7:  "CUBLAS_STATUS_INVALID_VALUE",
	8:  "CUBLAS_STATUS_ARCH_MISMATCH",
	11: "CUBLAS_STATUS_MAPPING_ERROR",
	13: "CUBLAS_STATUS_EXECUTION_FAILED",
	14: "CUBLAS_STATUS_INTERNAL_ERROR",
	15: "CUBLAS_STATUS_NOT_SUPPORTED",
	16: "CUBLAS_STATUS_LICENSE_ERROR",
}

func cublasStatusName(status int) string {
	if n, ok := cublasStatusNames[status]; ok {
		return n
	}
	return "CUBLAS_STATUS_UNKNOWN"
}
