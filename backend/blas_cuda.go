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

// cuBLASLt, loaded from the cuBLAS release's own libcublasLt: one plan per
// shape of product (a matmul descriptor, the three matrix layouts and the
// algorithm its heuristic chose) is made once, and every later product of
// that shape is one cublasLtMatmul with the plan: cublasGemmEx would look
// the algorithm up again on every call, which costs the host more than
// queuing the product does. Types as cublasLt.h declares them.
typedef void* sth_lt_handle;  // cublasLtHandle_t
typedef void* sth_lt_desc;    // cublasLtMatmulDesc_t
typedef void* sth_lt_layout;  // cublasLtMatrixLayout_t
typedef void* sth_lt_pref;    // cublasLtMatmulPreference_t
typedef struct { uint64_t data[8]; } sth_lt_algo;  // cublasLtMatmulAlgo_t
typedef struct {                                   // cublasLtMatmulHeuristicResult_t
	sth_lt_algo algo;
	size_t workspace_size;
	sth_blas_status state;
	float waves_count;
	int reserved[4];
} sth_lt_heuristic;
_Static_assert(sizeof(sth_lt_algo) == 64, "cublasLtMatmulAlgo_t is 64 bytes");
_Static_assert(sizeof(sth_lt_heuristic) == 96, "cublasLtMatmulHeuristicResult_t is 96 bytes");

typedef sth_blas_status (*sth_lt_create_fn)(sth_lt_handle*);
typedef sth_blas_status (*sth_lt_destroy_fn)(sth_lt_handle);
typedef sth_blas_status (*sth_lt_desc_create_fn)(sth_lt_desc*, int compute, int scale_type);
typedef sth_blas_status (*sth_lt_desc_destroy_fn)(sth_lt_desc);
typedef sth_blas_status (*sth_lt_desc_set_fn)(sth_lt_desc, int attr, const void*, size_t);
typedef sth_blas_status (*sth_lt_layout_create_fn)(sth_lt_layout*, int type, uint64_t rows, uint64_t cols, int64_t ld);
typedef sth_blas_status (*sth_lt_layout_destroy_fn)(sth_lt_layout);
typedef sth_blas_status (*sth_lt_layout_set_fn)(sth_lt_layout, int attr, const void*, size_t);
typedef sth_blas_status (*sth_lt_pref_create_fn)(sth_lt_pref*);
typedef sth_blas_status (*sth_lt_pref_destroy_fn)(sth_lt_pref);
typedef sth_blas_status (*sth_lt_pref_set_fn)(sth_lt_pref, int attr, const void*, size_t);
typedef sth_blas_status (*sth_lt_heuristic_fn)(sth_lt_handle, sth_lt_desc, sth_lt_layout, sth_lt_layout,
	sth_lt_layout, sth_lt_layout, sth_lt_pref, int requested, sth_lt_heuristic*, int* returned);
typedef sth_blas_status (*sth_lt_matmul_fn)(sth_lt_handle, sth_lt_desc, const void* alpha,
	const void* a, sth_lt_layout, const void* b, sth_lt_layout, const void* beta,
	const void* c, sth_lt_layout, void* d, sth_lt_layout, const sth_lt_algo*,
	void* workspace, size_t workspace_bytes, CUstream);

struct sth_lt {
	void* create;          // cublasLtCreate
	void* destroy;         // cublasLtDestroy
	void* desc_create;     // cublasLtMatmulDescCreate
	void* desc_destroy;    // cublasLtMatmulDescDestroy
	void* desc_set;        // cublasLtMatmulDescSetAttribute
	void* layout_create;   // cublasLtMatrixLayoutCreate
	void* layout_destroy;  // cublasLtMatrixLayoutDestroy
	void* layout_set;      // cublasLtMatrixLayoutSetAttribute
	void* pref_create;     // cublasLtMatmulPreferenceCreate
	void* pref_destroy;    // cublasLtMatmulPreferenceDestroy
	void* pref_set;        // cublasLtMatmulPreferenceSetAttribute
	void* heuristic;       // cublasLtMatmulAlgoGetHeuristic
	void* matmul;          // cublasLtMatmul
};

// The attributes this package sets (cublasLt.h's values; TestCUBLASABI
// compares them with the installed headers).
enum {
	sth_lt_desc_transa = 3,         // CUBLASLT_MATMUL_DESC_TRANSA
	sth_lt_desc_transb = 4,         // CUBLASLT_MATMUL_DESC_TRANSB
	sth_lt_layout_batch = 5,        // CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT
	sth_lt_layout_stride = 6,       // CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET
	sth_lt_pref_workspace = 1,      // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
	sth_lt_pref_align_a = 5,        // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES (B, C, D follow)
	sth_lt_not_supported = 15,      // CUBLAS_STATUS_NOT_SUPPORTED
};

// A plan: the product's descriptors and algorithm.
struct sth_lt_plan {
	sth_lt_desc desc;
	sth_lt_layout a, b, c;
	sth_lt_algo algo;
	size_t workspace;
};

static int sth_lt_create(const struct sth_lt* t, CUcontext ctx, sth_lt_handle* h, CUresult* cr) {
	*cr = cuCtxSetCurrent(ctx);
	if (*cr != CUDA_SUCCESS) return -1;
	return ((sth_lt_create_fn)t->create)(h);
}

static int sth_lt_destroy(const struct sth_lt* t, CUcontext ctx, sth_lt_handle h, CUresult* cr) {
	*cr = cuCtxSetCurrent(ctx);
	if (*cr != CUDA_SUCCESS) return -1;
	return ((sth_lt_destroy_fn)t->destroy)(h);
}

static void sth_lt_plan_free(const struct sth_lt* t, struct sth_lt_plan* p) {
	if (p->a) ((sth_lt_layout_destroy_fn)t->layout_destroy)(p->a);
	if (p->b) ((sth_lt_layout_destroy_fn)t->layout_destroy)(p->b);
	if (p->c) ((sth_lt_layout_destroy_fn)t->layout_destroy)(p->c);
	if (p->desc) ((sth_lt_desc_destroy_fn)t->desc_destroy)(p->desc);
	p->a = p->b = p->c = p->desc = NULL;
}

// sth_lt_layout_make makes the layout of a column-major rows x cols matrix
// with leading dimension ld, batch of them stride elements apart.
static sth_blas_status sth_lt_layout_make(const struct sth_lt* t, sth_lt_layout* l, int type,
		uint64_t rows, uint64_t cols, int64_t ld, int32_t batch, int64_t stride) {
	sth_blas_status st = ((sth_lt_layout_create_fn)t->layout_create)(l, type, rows, cols, ld);
	if (st == 0 && batch > 1) {
		st = ((sth_lt_layout_set_fn)t->layout_set)(*l, sth_lt_layout_batch, &batch, sizeof batch);
		if (st == 0) st = ((sth_lt_layout_set_fn)t->layout_set)(*l, sth_lt_layout_stride, &stride, sizeof stride);
	}
	return st;
}

// sth_lt_plan_make makes the plan of a product as cublasGemmStridedBatchedEx
// takes it, for a workspace of up to ws bytes; *step names the call that
// failed. CUBLAS_STATUS_NOT_SUPPORTED: no algorithm.
static int sth_lt_plan_make(const struct sth_lt* t, CUcontext ctx, sth_lt_handle h, CUresult* cr,
		int transa, int transb, int m, int n, int k, int lda, long long sa, int ldb, long long sb,
		int ldc, long long sc, int batch, int dtype, int compute, size_t ws,
		uint32_t align_a, uint32_t align_b, uint32_t align_c,
		struct sth_lt_plan* p, const char** step) {
	*cr = cuCtxSetCurrent(ctx);
	if (*cr != CUDA_SUCCESS) return -1;
	*step = "cublasLtMatmulDescCreate";
	// The scale type is the data's: float alpha and beta for float32
	// (TF32 included), double for float64.
	sth_blas_status st = ((sth_lt_desc_create_fn)t->desc_create)(&p->desc, compute, dtype);
	int32_t ta = transa, tb = transb;
	if (st == 0) {
		*step = "cublasLtMatmulDescSetAttribute";
		st = ((sth_lt_desc_set_fn)t->desc_set)(p->desc, sth_lt_desc_transa, &ta, sizeof ta);
	}
	if (st == 0) st = ((sth_lt_desc_set_fn)t->desc_set)(p->desc, sth_lt_desc_transb, &tb, sizeof tb);
	if (st == 0) {
		*step = "cublasLtMatrixLayoutCreate";
		st = sth_lt_layout_make(t, &p->a, dtype, transa ? k : m, transa ? m : k, lda, batch, sa);
	}
	if (st == 0) st = sth_lt_layout_make(t, &p->b, dtype, transb ? n : k, transb ? k : n, ldb, batch, sb);
	if (st == 0) st = sth_lt_layout_make(t, &p->c, dtype, m, n, ldc, batch, sc);
	sth_lt_pref pref = NULL;
	if (st == 0) {
		*step = "cublasLtMatmulPreferenceCreate";
		st = ((sth_lt_pref_create_fn)t->pref_create)(&pref);
	}
	uint64_t wsbytes = ws;
	if (st == 0) st = ((sth_lt_pref_set_fn)t->pref_set)(pref, sth_lt_pref_workspace, &wsbytes, sizeof wsbytes);
	// An algorithm may need its operands more aligned than the 16 bytes
	// the product's own pointers guarantee: ask for one that takes them.
	uint32_t align[4] = {align_a, align_b, align_c, align_c};
	for (int i = 0; i < 4 && st == 0; i++)
		st = ((sth_lt_pref_set_fn)t->pref_set)(pref, sth_lt_pref_align_a + i, &align[i], sizeof align[i]);
	sth_lt_heuristic res;
	int count = 0;
	if (st == 0) {
		*step = "cublasLtMatmulAlgoGetHeuristic";
		st = ((sth_lt_heuristic_fn)t->heuristic)(h, p->desc, p->a, p->b, p->c, p->c, pref, 1, &res, &count);
	}
	if (pref) ((sth_lt_pref_destroy_fn)t->pref_destroy)(pref);
	if (st == 0 && (count < 1 || res.state != 0)) st = sth_lt_not_supported;
	if (st != 0) {
		sth_lt_plan_free(t, p);
		return st;
	}
	p->algo = res.algo;
	p->workspace = res.workspace_size;
	return 0;
}

static int sth_lt_matmul(const struct sth_lt* t, CUcontext ctx, sth_lt_handle h, CUresult* cr,
		const struct sth_lt_plan* p, double alpha, double beta, int single,
		CUdeviceptr a, CUdeviceptr b, CUdeviceptr c, CUdeviceptr ws, CUstream s) {
	*cr = cuCtxSetCurrent(ctx);
	if (*cr != CUDA_SUCCESS) return -1;
	float alpha32 = (float)alpha, beta32 = (float)beta;
	const void* pa = single ? (const void*)&alpha32 : (const void*)&alpha;
	const void* pb = single ? (const void*)&beta32 : (const void*)&beta;
	return ((sth_lt_matmul_fn)t->matmul)(h, p->desc, pa,
		(const void*)(uintptr_t)a, p->a, (const void*)(uintptr_t)b, p->b, pb,
		(const void*)(uintptr_t)c, p->c, (void*)(uintptr_t)c, p->c, &p->algo,
		p->workspace ? (void*)(uintptr_t)ws : NULL, p->workspace, s);
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
	"path/filepath"
	"strings"
	"sync"
	"unsafe"

	"gorgonia.org/tensor"
)

// cublasAPI is a loaded cuBLAS: its functions and what it is.
type cublasAPI struct {
	fns  *C.struct_sth_blas // C memory, kept for the life of the process
	desc string             // "libcublas.so.13 (cuBLAS 13.0.2)"
	// lt is the release's cuBLASLt, which runs the products when it
	// loaded (nil: cublasGemmEx runs them).
	lt *C.struct_sth_lt
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
	api, name, err := openFirst(cublasLib, env, bindCUBLAS)
	if err != nil {
		return nil, err
	}
	api.bindLt(name, env)
	return api, nil
}

// CUBLASLtEnv names the environment variable that turns cuBLASLt off:
// with STHENO_CUBLASLT=0 every product goes through cublasGemmEx, which
// looks its algorithm up on every call (to compare the two).
const CUBLASLtEnv = "STHENO_CUBLASLT"

// bindLt loads the cuBLASLt of the cuBLAS opened as name: the file of the
// same directory and version (libcublasLt.so.13 beside libcublas.so.13).
// Without it, or without one of its functions, products go through
// cublasGemmEx; the library's description says which.
func (api *cublasAPI) bindLt(name string, env libEnv) {
	if v := env.getenv(CUBLASLtEnv); v == "0" {
		api.desc += ", cuBLASLt off (" + CUBLASLtEnv + "=0)"
		return
	}
	dir, base := filepath.Split(name)
	rest, ok := strings.CutPrefix(base, "libcublas.")
	if !ok {
		api.desc += ", no cuBLASLt (" + base + " is not named libcublas.*)"
		return
	}
	ltName := dir + "libcublasLt." + rest
	lib, err := dlopen(ltName)
	if err != nil {
		api.desc += fmt.Sprintf(", no cuBLASLt (%v)", err)
		return
	}
	fns := (*C.struct_sth_lt)(C.calloc(1, C.sizeof_struct_sth_lt))
	for _, f := range []struct {
		name string
		dst  *unsafe.Pointer
	}{
		{"cublasLtCreate", &fns.create},
		{"cublasLtDestroy", &fns.destroy},
		{"cublasLtMatmulDescCreate", &fns.desc_create},
		{"cublasLtMatmulDescDestroy", &fns.desc_destroy},
		{"cublasLtMatmulDescSetAttribute", &fns.desc_set},
		{"cublasLtMatrixLayoutCreate", &fns.layout_create},
		{"cublasLtMatrixLayoutDestroy", &fns.layout_destroy},
		{"cublasLtMatrixLayoutSetAttribute", &fns.layout_set},
		{"cublasLtMatmulPreferenceCreate", &fns.pref_create},
		{"cublasLtMatmulPreferenceDestroy", &fns.pref_destroy},
		{"cublasLtMatmulPreferenceSetAttribute", &fns.pref_set},
		{"cublasLtMatmulAlgoGetHeuristic", &fns.heuristic},
		{"cublasLtMatmul", &fns.matmul},
	} {
		p, err := lib.sym(f.name)
		if err != nil {
			C.free(unsafe.Pointer(fns))
			api.desc += fmt.Sprintf(", no cuBLASLt (%v)", errors.Join(err, lib.close()))
			return
		}
		*f.dst = p
	}
	api.lt = fns
	api.desc += ", with " + ltName
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
	// The cuBLASLt handle (nil: none), its plans by product (a gemmCall
	// without its pointers and scalars, with its operands' alignment),
	// nil where no algorithm takes the product, and the workspace.
	lt          C.sth_lt_handle
	plans       map[ltKey]*C.struct_sth_lt_plan
	ws, wsBytes uint64
}

// ltKey is what a cuBLASLt plan depends on: the product's shape and
// dtype, and how aligned its operands are.
type ltKey struct {
	call           gemmCall
	alignA, alignB uint32
	alignC         uint32
}

// ltAlignment is the alignment cuBLASLt is told a pointer has: the
// largest power of two dividing it, up to the 256 bytes its algorithms
// ask for at most.
func ltAlignment(p DevicePtr) uint32 {
	a := uint32(256)
	for a > 1 && uint64(p)%uint64(a) != 0 {
		a /= 2
	}
	return a
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
	b := &cublasHandle{api: api, d: d, h: h}
	if api.lt != nil {
		if st := C.sth_lt_create(api.lt, d.ctx, &b.lt, &cr); st != 0 {
			// Products go through cublasGemmEx; the handle works.
			b.lt = nil
		} else {
			b.plans = map[ltKey]*C.struct_sth_lt_plan{}
		}
	}
	return b, nil
}

func (b *cublasHandle) library() string { return b.api.desc }

func (b *cublasHandle) canSetWorkspace() bool { return b.api.fns.set_workspace != nil }

func (b *cublasHandle) setWorkspace(ptr, bytes uint64) error {
	var cr C.CUresult
	st := C.sth_blas_set_workspace(b.api.fns, b.d.ctx, b.h, C.CUdeviceptr(ptr), C.size_t(bytes), &cr)
	if err := b.api.statusError("cublasSetWorkspace_v2", st, cr); err != nil {
		return err
	}
	// cuBLASLt's products share it: they run on the same stream, in
	// turn with cuBLAS's own.
	b.ws, b.wsBytes = ptr, bytes
	return nil
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
	var cr C.CUresult
	if b.lt != nil {
		key := ltKey{call: c, alignA: ltAlignment(c.a), alignB: ltAlignment(c.b), alignC: ltAlignment(c.c)}
		key.call.a, key.call.b, key.call.c, key.call.alpha, key.call.beta = 0, 0, 0, 0, 0
		p, ok := b.plans[key]
		if !ok {
			p = new(C.struct_sth_lt_plan)
			var step *C.char
			st := C.sth_lt_plan_make(b.api.lt, b.d.ctx, b.lt, &cr,
				op(c.transA), op(c.transB), C.int(c.m), C.int(c.n), C.int(c.k),
				C.int(c.lda), C.longlong(c.strideA), C.int(c.ldb), C.longlong(c.strideB),
				C.int(c.ldc), C.longlong(c.strideC), C.int(c.batch), dtype, compute, C.size_t(b.wsBytes),
				C.uint32_t(key.alignA), C.uint32_t(key.alignB), C.uint32_t(key.alignC), p, &step)
			switch {
			case st == C.sth_lt_not_supported:
				p = nil // no algorithm: cublasGemmEx runs this product
			case st != 0:
				return b.api.statusError(C.GoString(step), st, cr)
			}
			b.plans[key] = p
		}
		if p != nil {
			st := C.sth_lt_matmul(b.api.lt, b.d.ctx, b.lt, &cr, p, C.double(c.alpha), C.double(c.beta), single,
				C.CUdeviceptr(c.a), C.CUdeviceptr(c.b), C.CUdeviceptr(c.c), C.CUdeviceptr(b.ws), b.d.stream)
			return b.api.statusError("cublasLtMatmul", st, cr)
		}
	}
	call := "cublasGemmEx"
	if c.batch > 1 {
		call = "cublasGemmStridedBatchedEx"
	}
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
	var errs []error
	if b.lt != nil {
		for _, p := range b.plans {
			if p != nil {
				C.sth_lt_plan_free(b.api.lt, p)
			}
		}
		clear(b.plans)
		st := C.sth_lt_destroy(b.api.lt, b.d.ctx, b.lt, &cr)
		errs = append(errs, b.api.statusError("cublasLtDestroy", st, cr))
		b.lt = nil
	}
	st := C.sth_blas_destroy(b.api.fns, b.d.ctx, b.h, &cr)
	return errors.Join(append(errs, b.api.statusError("cublasDestroy_v2", st, cr))...)
}
