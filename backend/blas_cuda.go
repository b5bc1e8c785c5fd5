//go:build stheno_cuda

package backend

// cuBLAS, opened at run time (dlopen.go says why), for Device.Gemm
// (blas.go). Nothing here includes cuBLAS's headers or links the library:
// the few types and functions used are declared below, with the ABI of
// cublas_api.h from CUDA 11 to 13 (enums are C ints, the handle and
// cudaStream_t are pointers; the values passed are blas.go's constants),
// and called through pointers that dlsym finds. The CUDA runtime's
// cudaStream_t and the driver's CUstream are the same handle, so cuBLAS
// queues on the Device's stream; it works in the Device's primary context,
// which each helper makes current first, in the same cgo call (see
// driver_cuda.go).

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

typedef int sth_blas_status; // cublasStatus_t; 0 is CUBLAS_STATUS_SUCCESS
typedef void* sth_blas_handle; // cublasHandle_t (struct cublasContext*)

typedef sth_blas_status (*sth_blas_create_fn)(sth_blas_handle*);
typedef sth_blas_status (*sth_blas_destroy_fn)(sth_blas_handle);
typedef sth_blas_status (*sth_blas_set_stream_fn)(sth_blas_handle, CUstream);
typedef sth_blas_status (*sth_blas_set_math_fn)(sth_blas_handle, int);
typedef sth_blas_status (*sth_blas_set_workspace_fn)(sth_blas_handle, void*, size_t);
typedef sth_blas_status (*sth_blas_gemm_fn)(sth_blas_handle, int transa, int transb,
	int m, int n, int k, const void* alpha,
	const void* a, int atype, int lda,
	const void* b, int btype, int ldb, const void* beta,
	void* c, int ctype, int ldc, int compute, int algo);
typedef sth_blas_status (*sth_blas_gemm_batched_fn)(sth_blas_handle, int transa, int transb,
	int m, int n, int k, const void* alpha,
	const void* a, int atype, int lda, long long stride_a,
	const void* b, int btype, int ldb, long long stride_b, const void* beta,
	void* c, int ctype, int ldc, long long stride_c,
	int batch, int compute, int algo);
typedef const char* (*sth_blas_status_string_fn)(sth_blas_status);
typedef sth_blas_status (*sth_blas_get_property_fn)(int, int*);

// The functions found with dlsym; the optional ones are NULL where the
// library lacks them.
struct sth_blas {
	void* create;         // cublasCreate_v2
	void* destroy;        // cublasDestroy_v2
	void* set_stream;     // cublasSetStream_v2
	void* set_math;       // cublasSetMathMode
	void* gemm;           // cublasGemmEx
	void* gemm_batched;   // cublasGemmStridedBatchedEx
	void* set_workspace;  // cublasSetWorkspace_v2 (optional)
	void* status_string;  // cublasGetStatusString (optional)
	void* get_property;   // cublasGetProperty (optional)
};

// Each helper returns the cuBLAS status, or -1 when making the context
// current failed, with the CUresult in *cr.

static int sth_blas_create(const struct sth_blas* t, CUcontext ctx, CUstream s, int math,
		sth_blas_handle* h, CUresult* cr, const char** step) {
	*step = "cuCtxSetCurrent";
	*cr = cuCtxSetCurrent(ctx);
	if (*cr != CUDA_SUCCESS) return -1;
	*step = "cublasCreate_v2";
	sth_blas_status st = ((sth_blas_create_fn)t->create)(h);
	if (st != 0) return st;
	*step = "cublasSetStream_v2";
	st = ((sth_blas_set_stream_fn)t->set_stream)(*h, s);
	if (st == 0) {
		*step = "cublasSetMathMode";
		st = ((sth_blas_set_math_fn)t->set_math)(*h, math);
	}
	if (st != 0) ((sth_blas_destroy_fn)t->destroy)(*h);
	return st;
}

static int sth_blas_destroy(const struct sth_blas* t, CUcontext ctx, sth_blas_handle h, CUresult* cr) {
	*cr = cuCtxSetCurrent(ctx);
	if (*cr != CUDA_SUCCESS) return -1;
	return ((sth_blas_destroy_fn)t->destroy)(h);
}

// cublasSetStream resets the workspace to the library's own, so this
// comes after it.
static int sth_blas_set_workspace(const struct sth_blas* t, CUcontext ctx, sth_blas_handle h,
		CUdeviceptr ws, size_t bytes, CUresult* cr) {
	*cr = cuCtxSetCurrent(ctx);
	if (*cr != CUDA_SUCCESS) return -1;
	return ((sth_blas_set_workspace_fn)t->set_workspace)(h, (void*)(uintptr_t)ws, bytes);
}

// alpha and beta are host scalars (cuBLAS's default pointer mode), read
// before the call returns, so they may live on this stack.
static int sth_blas_gemm(const struct sth_blas* t, CUcontext ctx, sth_blas_handle h, CUresult* cr,
		int transa, int transb, int m, int n, int k, double alpha,
		CUdeviceptr a, int lda, long long sa, CUdeviceptr b, int ldb, long long sb, double beta,
		CUdeviceptr c, int ldc, long long sc, int batch,
		int dtype, int single, int compute, int algo) {
	*cr = cuCtxSetCurrent(ctx);
	if (*cr != CUDA_SUCCESS) return -1;
	float alpha32 = (float)alpha, beta32 = (float)beta;
	const void* pa = single ? (const void*)&alpha32 : (const void*)&alpha;
	const void* pb = single ? (const void*)&beta32 : (const void*)&beta;
	if (batch <= 1)
		return ((sth_blas_gemm_fn)t->gemm)(h, transa, transb, m, n, k, pa,
			(const void*)(uintptr_t)a, dtype, lda, (const void*)(uintptr_t)b, dtype, ldb, pb,
			(void*)(uintptr_t)c, dtype, ldc, compute, algo);
	return ((sth_blas_gemm_batched_fn)t->gemm_batched)(h, transa, transb, m, n, k, pa,
		(const void*)(uintptr_t)a, dtype, lda, sa, (const void*)(uintptr_t)b, dtype, ldb, sb, pb,
		(void*)(uintptr_t)c, dtype, ldc, sc, batch, compute, algo);
}

static const char* sth_blas_status_string(const struct sth_blas* t, int st) {
	return t->status_string == NULL ? NULL : ((sth_blas_status_string_fn)t->status_string)(st);
}

static int sth_blas_property(const struct sth_blas* t, int prop, int* v) {
	return t->get_property == NULL ? -1 : ((sth_blas_get_property_fn)t->get_property)(prop, v);
}

static int sth_driver_version(void) {
	int v = 0;
	return cuDriverGetVersion(&v) == CUDA_SUCCESS ? v : 0;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"gorgonia.org/tensor"
)

// cublasAPI is a loaded cuBLAS: its functions and what it is.
type cublasAPI struct {
	fns  *C.struct_sth_blas // C memory, kept for the life of the process
	desc string             // "libcublas.so.13 (cuBLAS 13.0.2)"
}

// processCUBLAS is the cuBLAS of this process: loaded by the first Gemm of
// any Device, kept (or its error) for the rest of the process, since a
// library cannot safely be unloaded and the search's answer does not
// change.
var processCUBLAS struct {
	once sync.Once
	api  *cublasAPI
	err  error
}

func cublas() (*cublasAPI, error) {
	processCUBLAS.once.Do(func() {
		processCUBLAS.api, processCUBLAS.err = loadCUBLAS(hostLibEnv(driverCUDAVersion()))
	})
	return processCUBLAS.api, processCUBLAS.err
}

// driverCUDAVersion is the newest CUDA the driver supports (13000 for
// 13.0), or 0 if it cannot say.
func driverCUDAVersion() int { return int(C.sth_driver_version()) }

// loadCUBLAS opens the first library of cublasLib's search that has every
// function this package needs.
func loadCUBLAS(env libEnv) (*cublasAPI, error) {
	api, _, err := openFirst(cublasLib, env, bindCUBLAS)
	return api, err
}

// bindCUBLAS opens name and finds the functions in it. A library without
// one of the required functions counts as not loaded, so the search goes
// on; the optional ones (missing from some CUDA 11 releases) stay NULL.
func bindCUBLAS(name string) (*cublasAPI, error) {
	lib, err := dlopen(name)
	if err != nil {
		return nil, err
	}
	fns := (*C.struct_sth_blas)(C.calloc(1, C.sizeof_struct_sth_blas))
	for _, f := range []struct {
		name     string
		dst      *unsafe.Pointer
		optional bool
	}{
		{"cublasCreate_v2", &fns.create, false},
		{"cublasDestroy_v2", &fns.destroy, false},
		{"cublasSetStream_v2", &fns.set_stream, false},
		{"cublasSetMathMode", &fns.set_math, false},
		{"cublasGemmEx", &fns.gemm, false},
		{"cublasGemmStridedBatchedEx", &fns.gemm_batched, false},
		{"cublasSetWorkspace_v2", &fns.set_workspace, true},
		{"cublasGetStatusString", &fns.status_string, true},
		{"cublasGetProperty", &fns.get_property, true},
	} {
		p, err := lib.sym(f.name)
		if err != nil && !f.optional {
			C.free(unsafe.Pointer(fns))
			return nil, errors.Join(fmt.Errorf("not a usable cuBLAS: %w", err), lib.close())
		}
		*f.dst = p
	}
	api := &cublasAPI{fns: fns, desc: name}
	var v [3]C.int
	ok := true
	for i, prop := range []int{libMajorVersion, libMinorVersion, libPatchLevel} {
		ok = ok && C.sth_blas_property(fns, C.int(prop), &v[i]) == 0
	}
	if ok {
		api.desc += fmt.Sprintf(" (cuBLAS %d.%d.%d)", v[0], v[1], v[2])
	}
	return api, nil
}

// statusError turns a cuBLAS status into a *BLASError, or a CUresult into
// a *DriverError when making the context current failed (-1).
func (api *cublasAPI) statusError(call string, st C.int, cr C.CUresult) error {
	switch st {
	case 0:
		return nil
	case -1:
		return check("cuCtxSetCurrent", cr)
	}
	e := &BLASError{Call: call, Status: int(st), Name: cublasStatusName(int(st))}
	if s := C.sth_blas_status_string(api.fns, st); s != nil {
		e.Desc = C.GoString(s)
	}
	return e
}

// cublasHandle is a Device's cuBLAS handle, on its stream. Device.blasMu
// serialises its calls.
type cublasHandle struct {
	api *cublasAPI
	d   *cudaDriver
	h   C.sth_blas_handle
}

// pinnedContexts are the GPUs whose primary context this process keeps
// for good once cuBLAS has worked in it: the CUDA runtime inside cuBLAS
// keeps per-device state for the context it first finds current, which
// must not be destroyed under it when the last Device on that GPU closes
// (releasing the last reference to a primary context destroys it). Close
// still frees all of a Device's memory; only the context itself stays.
var pinnedContexts struct {
	sync.Mutex
	devs map[C.CUdevice]bool
}

func (d *cudaDriver) pinContext() error {
	pinnedContexts.Lock()
	defer pinnedContexts.Unlock()
	if pinnedContexts.devs[d.dev] {
		return nil
	}
	var ctx C.CUcontext
	if err := check("cuDevicePrimaryCtxRetain", C.cuDevicePrimaryCtxRetain(&ctx, d.dev)); err != nil {
		return err
	}
	if pinnedContexts.devs == nil {
		pinnedContexts.devs = map[C.CUdevice]bool{}
	}
	pinnedContexts.devs[d.dev] = true
	return nil
}

func (d *cudaDriver) openBLAS() (blasDriver, error) {
	api, err := cublas()
	if err != nil {
		return nil, err
	}
	if err := d.pinContext(); err != nil {
		return nil, fmt.Errorf("keeping the primary context for cuBLAS: %w", err)
	}
	var h C.sth_blas_handle
	var cr C.CUresult
	var step *C.char
	st := C.sth_blas_create(api.fns, d.ctx, d.stream, cublasDefaultMath, &h, &cr, &step)
	if err := api.statusError(C.GoString(step), st, cr); err != nil {
		return nil, fmt.Errorf("%s: %w", api.desc, err)
	}
	return &cublasHandle{api: api, d: d, h: h}, nil
}

func (b *cublasHandle) library() string { return b.api.desc }

func (b *cublasHandle) canSetWorkspace() bool { return b.api.fns.set_workspace != nil }

func (b *cublasHandle) setWorkspace(ptr, bytes uint64) error {
	var cr C.CUresult
	st := C.sth_blas_set_workspace(b.api.fns, b.d.ctx, b.h, C.CUdeviceptr(ptr), C.size_t(bytes), &cr)
	return b.api.statusError("cublasSetWorkspace_v2", st, cr)
}

func (b *cublasHandle) gemm(c gemmCall) error {
	op := func(t bool) C.int {
		if t {
			return cublasOpT
		}
		return cublasOpN
	}
	dtype, compute, single := C.int(cudaR64F), C.int(cublasCompute64F), C.int(0)
	if c.dtype == tensor.Float32 {
		dtype, compute, single = cudaR32F, cublasCompute32F, 1
		if c.tf32 {
			compute = cublasCompute32FFastTF32
		}
	}
	call := "cublasGemmEx"
	if c.batch > 1 {
		call = "cublasGemmStridedBatchedEx"
	}
	var cr C.CUresult
	st := C.sth_blas_gemm(b.api.fns, b.d.ctx, b.h, &cr,
		op(c.transA), op(c.transB), C.int(c.m), C.int(c.n), C.int(c.k), C.double(c.alpha),
		C.CUdeviceptr(c.a), C.int(c.lda), C.longlong(c.strideA),
		C.CUdeviceptr(c.b), C.int(c.ldb), C.longlong(c.strideB), C.double(c.beta),
		C.CUdeviceptr(c.c), C.int(c.ldc), C.longlong(c.strideC), C.int(c.batch),
		dtype, single, compute, cublasGemmDefault)
	return b.api.statusError(call, st, cr)
}

func (b *cublasHandle) close() error {
	var cr C.CUresult
	st := C.sth_blas_destroy(b.api.fns, b.d.ctx, b.h, &cr)
	return b.api.statusError("cublasDestroy_v2", st, cr)
}
