//go:build stheno_cuda

package backend

// The CUDA driver API through cgo. This file links libcuda only (its
// soname, libcuda.so.1, is the same on every driver version); it does not
// import gorgonia.org/cu, whose package init exits the process when there
// is no GPU and whose launcher copies each kernel argument as an 8-byte
// word, which cannot pass a params struct by value.
//
// A CUDA context is current per OS thread, and a goroutine may move to
// another thread between any two Go statements, so no Go code here sets the
// context and then calls the driver. Each C helper below makes the context
// current and makes its driver call inside one C function, that is, inside
// one cgo call, during which the goroutine cannot leave its thread.
// cuCtxSetCurrent is a thread-local store, cheap next to any call it guards.

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>
#include <stdint.h>
#include <stdlib.h>

static CUresult sth_stream_create(CUcontext ctx, CUstream* s) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuStreamCreate(s, CU_STREAM_NON_BLOCKING);
}

static CUresult sth_stream_destroy(CUcontext ctx, CUstream s) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuStreamDestroy(s);
}

static CUresult sth_sync(CUcontext ctx, CUstream s) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuStreamSynchronize(s);
}

static CUresult sth_mem_alloc(CUcontext ctx, CUdeviceptr* p, size_t n) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuMemAlloc(p, n);
}

static CUresult sth_mem_free(CUcontext ctx, CUdeviceptr p) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuMemFree(p);
}

static CUresult sth_mem_info(CUcontext ctx, size_t* free, size_t* total) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuMemGetInfo(free, total);
}

// From pageable (Go) memory the driver stages the bytes before returning,
// so src is not read after the call: cgo's rule for Go pointers holds.
static CUresult sth_htod(CUcontext ctx, CUstream s, CUdeviceptr dst, const void* src, size_t n) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuMemcpyHtoDAsync(dst, src, n, s);
}

// Waits in the same call, so dst is not written after it returns.
// *synced tells which of the two driver calls failed.
static CUresult sth_dtoh(CUcontext ctx, CUstream s, void* dst, CUdeviceptr src, size_t n, int* synced) {
	*synced = 0;
	CUresult r = cuCtxSetCurrent(ctx);
	if (r == CUDA_SUCCESS) r = cuMemcpyDtoHAsync(dst, src, n, s);
	if (r != CUDA_SUCCESS) return r;
	*synced = 1;
	return cuStreamSynchronize(s);
}

static CUresult sth_dtod(CUcontext ctx, CUstream s, CUdeviceptr dst, CUdeviceptr src, size_t n) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuMemcpyDtoDAsync(dst, src, n, s);
}

static CUresult sth_memset(CUcontext ctx, CUstream s, CUdeviceptr dst, int width, unsigned int v, size_t n) {
	CUresult r = cuCtxSetCurrent(ctx);
	if (r != CUDA_SUCCESS) return r;
	switch (width) {
	case 1: return cuMemsetD8Async(dst, (unsigned char)v, n, s);
	case 2: return cuMemsetD16Async(dst, (unsigned short)v, n, s);
	case 4: return cuMemsetD32Async(dst, v, n, s);
	}
	return CUDA_ERROR_INVALID_VALUE;
}

// The JIT's error log explains a module that fails to load (PTX for a GPU
// without matching SASS, say).
static CUresult sth_module_load(CUcontext ctx, CUmodule* m, const void* image, char* log, size_t logsize) {
	CUresult r = cuCtxSetCurrent(ctx);
	if (r != CUDA_SUCCESS) return r;
	CUjit_option opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
	void* vals[2] = {log, (void*)(uintptr_t)logsize};
	return cuModuleLoadDataEx(m, image, 2, opts, vals);
}

static CUresult sth_module_unload(CUcontext ctx, CUmodule m) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuModuleUnload(m);
}

static CUresult sth_function(CUcontext ctx, CUfunction* f, CUmodule m, const char* name) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuModuleGetFunction(f, m, name);
}

static CUresult sth_func_max_shared(CUcontext ctx, CUfunction f, int bytes) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes);
}

// The kernel takes one argument, the params struct: kernelParams[0] points
// at its bytes, which the driver copies before returning. The pointer array
// lives here, in C, because cgo forbids passing Go memory that holds a Go
// pointer.
static CUresult sth_launch(CUcontext ctx, CUstream s, CUfunction f,
		unsigned int gx, unsigned int gy, unsigned int gz,
		unsigned int bx, unsigned int by, unsigned int bz,
		unsigned int shared, void* params) {
	CUresult r = cuCtxSetCurrent(ctx);
	if (r != CUDA_SUCCESS) return r;
	void* args[1] = {params};
	return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, s, args, NULL);
}
// CUDA graphs (graphs.go). Capture is relaxed: another goroutine may
// allocate (cuMemAlloc) while this one captures.
static CUresult sth_capture_begin(CUcontext ctx, CUstream s) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED);
}

// The node the last captured call added: after a kernel launch, the
// stream's one dependency.
static CUresult sth_capture_node(CUcontext ctx, CUstream s, CUgraphNode* node) {
	CUresult r = cuCtxSetCurrent(ctx);
	if (r != CUDA_SUCCESS) return r;
	CUstreamCaptureStatus st;
	cuuint64_t id;
	CUgraph g;
	const CUgraphNode* deps = NULL;
	size_t n = 0;
	r = cuStreamGetCaptureInfo_v2(s, &st, &id, &g, &deps, &n);
	if (r != CUDA_SUCCESS) return r;
	if (st != CU_STREAM_CAPTURE_STATUS_ACTIVE || n != 1) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	*node = deps[0];
	return CUDA_SUCCESS;
}

static CUresult sth_capture_end(CUcontext ctx, CUstream s, CUgraph* g) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuStreamEndCapture(s, g);
}

static CUresult sth_graph_instantiate(CUcontext ctx, CUgraphExec* e, CUgraph g) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuGraphInstantiateWithFlags(e, g, 0);
}

static CUresult sth_graph_launch(CUcontext ctx, CUstream s, CUgraphExec e) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuGraphLaunch(e, s);
}

// As sth_launch, the params struct is the kernel's one argument; the
// driver copies it before returning.
static CUresult sth_graph_kernel_params(CUcontext ctx, CUgraphExec e, CUgraphNode node, CUfunction f,
		unsigned int gx, unsigned int gy, unsigned int gz,
		unsigned int bx, unsigned int by, unsigned int bz,
		unsigned int shared, void* params) {
	CUresult r = cuCtxSetCurrent(ctx);
	if (r != CUDA_SUCCESS) return r;
	void* args[1] = {params};
	CUDA_KERNEL_NODE_PARAMS p = {0};
	p.func = f;
	p.gridDimX = gx; p.gridDimY = gy; p.gridDimZ = gz;
	p.blockDimX = bx; p.blockDimY = by; p.blockDimZ = bz;
	p.sharedMemBytes = shared;
	p.kernelParams = args;
	return cuGraphExecKernelNodeSetParams(e, node, &p);
}

static CUresult sth_graph_destroy(CUcontext ctx, CUgraph g, CUgraphExec e) {
	CUresult r = cuCtxSetCurrent(ctx);
	if (r != CUDA_SUCCESS) return r;
	CUresult r1 = e == NULL ? CUDA_SUCCESS : cuGraphExecDestroy(e);
	CUresult r2 = cuGraphDestroy(g);
	return r1 != CUDA_SUCCESS ? r1 : r2;
}

static CUresult sth_event_record(CUcontext ctx, CUstream s, CUevent* e) {
	CUresult r = cuCtxSetCurrent(ctx);
	if (r == CUDA_SUCCESS) r = cuEventCreate(e, CU_EVENT_DEFAULT);
	if (r != CUDA_SUCCESS) return r;
	r = cuEventRecord(*e, s);
	if (r != CUDA_SUCCESS) cuEventDestroy(*e);
	return r;
}
static CUresult sth_event_elapsed(CUcontext ctx, CUevent start, CUevent end, float* ms) {
	CUresult r = cuCtxSetCurrent(ctx);
	if (r == CUDA_SUCCESS) r = cuEventSynchronize(end);
	return r != CUDA_SUCCESS ? r : cuEventElapsedTime(ms, start, end);
}
static CUresult sth_event_destroy(CUcontext ctx, CUevent e) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuEventDestroy(e);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"unsafe"

	"github.com/stheno-ml/stheno/kernels"
)

const builtWithCUDA = true

type cudaDriver struct {
	dev    C.CUdevice
	ctx    C.CUcontext
	stream C.CUstream
	inf    deviceInfo
}

// check turns a CUresult into a *DriverError, or nil for success.
func check(call string, r C.CUresult) error {
	if r == C.CUDA_SUCCESS {
		return nil
	}
	e := &DriverError{Call: call, Code: int(r), Name: "CUDA_ERROR_UNKNOWN_CODE", Desc: "code unknown to this driver"}
	var s *C.char
	if C.cuGetErrorName(r, &s) == C.CUDA_SUCCESS && s != nil {
		e.Name = C.GoString(s)
	}
	if C.cuGetErrorString(r, &s) == C.CUDA_SUCCESS && s != nil {
		e.Desc = C.GoString(s)
	}
	return e
}

func initDriver() error {
	if err := check("cuInit", C.cuInit(0)); err != nil {
		return fmt.Errorf("backend: initialising the CUDA driver: %w", err)
	}
	return nil
}

func deviceCount() (int, error) {
	if err := initDriver(); err != nil {
		return 0, err
	}
	var n C.int
	if err := check("cuDeviceGetCount", C.cuDeviceGetCount(&n)); err != nil {
		return 0, fmt.Errorf("backend: counting GPUs: %w", err)
	}
	return int(n), nil
}

func openDriver(ordinal int) (driver, func(string) ([]byte, error), error) {
	n, err := deviceCount()
	if err != nil {
		return nil, nil, err
	}
	if n == 0 {
		return nil, nil, fmt.Errorf("backend: GPU %d: the driver reports no GPU: %w", ordinal, ErrNoDevice)
	}
	if ordinal < 0 || ordinal >= n {
		return nil, nil, fmt.Errorf("backend: GPU %d does not exist: the driver reports GPUs 0 to %d", ordinal, n-1)
	}
	d := &cudaDriver{}
	if err := d.query(ordinal); err != nil {
		return nil, nil, fmt.Errorf("backend: GPU %d: %w", ordinal, err)
	}
	// The primary context is the one the CUDA runtime and libraries built on
	// it use, so memory and modules here are shared with them.
	if err := check("cuDevicePrimaryCtxRetain", C.cuDevicePrimaryCtxRetain(&d.ctx, d.dev)); err != nil {
		return nil, nil, fmt.Errorf("backend: GPU %d (%s): %w", ordinal, d.inf.name, err)
	}
	if err := check("cuStreamCreate", C.sth_stream_create(d.ctx, &d.stream)); err != nil {
		C.cuDevicePrimaryCtxRelease(d.dev)
		return nil, nil, fmt.Errorf("backend: GPU %d (%s): %w", ordinal, d.inf.name, err)
	}
	return d, moduleImage, nil
}

// query fills in the device and what Device reports about it.
func (d *cudaDriver) query(ordinal int) error {
	if err := check("cuDeviceGet", C.cuDeviceGet(&d.dev, C.int(ordinal))); err != nil {
		return err
	}
	var name [256]C.char
	if err := check("cuDeviceGetName", C.cuDeviceGetName(&name[0], C.int(len(name)), d.dev)); err != nil {
		return err
	}
	var total C.size_t
	if err := check("cuDeviceTotalMem", C.cuDeviceTotalMem(&total, d.dev)); err != nil {
		return err
	}
	d.inf = deviceInfo{ordinal: ordinal, name: C.GoString(&name[0]), totalMem: int64(total)}
	attrs := []struct {
		attr C.CUdevice_attribute
		dst  *int
	}{
		{C.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &d.inf.major},
		{C.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &d.inf.minor},
		{C.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, &d.inf.sms},
		{C.CU_DEVICE_ATTRIBUTE_CLOCK_RATE, &d.inf.clockKHz},
		{C.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, &d.inf.maxThreadsPerBlock},
		{C.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, &d.inf.maxSharedPerBlock},
		{C.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, &d.inf.maxSharedOptIn},
	}
	for _, a := range attrs {
		var v C.int
		if err := check("cuDeviceGetAttribute", C.cuDeviceGetAttribute(&v, a.attr, d.dev)); err != nil {
			return err
		}
		*a.dst = int(v)
	}
	return nil
}

// moduleImage returns the embedded fatbin of module (kernels/<module>.cu).
func moduleImage(module string) ([]byte, error) {
	image, err := kernels.Modules.ReadFile(path.Join("build", module+".fatbin"))
	if err == nil {
		return image, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	// PTX, which the driver compiles on loading, must end in a NUL.
	if ptx, err := kernels.Modules.ReadFile(path.Join("build", module+".ptx")); err == nil {
		return append(append(make([]byte, 0, len(ptx)+1), ptx...), 0), nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	names, _ := fs.Glob(kernels.Modules, "build/*.fatbin")
	ptxs, _ := fs.Glob(kernels.Modules, "build/*.ptx")
	names = append(names, ptxs...)
	for i, n := range names {
		names[i] = strings.TrimSuffix(strings.TrimSuffix(path.Base(n), ".fatbin"), ".ptx")
	}
	return nil, fmt.Errorf("no module %q among the embedded ones (%s): is there a kernels/%s.cu, and did `make kernels` run before the build?",
		module, strings.Join(names, ", "), module)
}

func (d *cudaDriver) info() deviceInfo { return d.inf }

func (d *cudaDriver) memAlloc(bytes uint64) (uint64, error) {
	var p C.CUdeviceptr
	if err := check("cuMemAlloc", C.sth_mem_alloc(d.ctx, &p, C.size_t(bytes))); err != nil {
		return 0, err
	}
	return uint64(p), nil
}

func (d *cudaDriver) memFree(ptr uint64) error {
	return check("cuMemFree", C.sth_mem_free(d.ctx, C.CUdeviceptr(ptr)))
}

func (d *cudaDriver) memInfo() (free, total uint64, err error) {
	var f, t C.size_t
	err = check("cuMemGetInfo", C.sth_mem_info(d.ctx, &f, &t))
	return uint64(f), uint64(t), err
}

func (d *cudaDriver) copyHtoD(dst uint64, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return check("cuMemcpyHtoDAsync", C.sth_htod(d.ctx, d.stream, C.CUdeviceptr(dst), unsafe.Pointer(&src[0]), C.size_t(len(src))))
}

func (d *cudaDriver) copyDtoH(dst []byte, src uint64) error {
	if len(dst) == 0 {
		return d.synchronize()
	}
	var synced C.int
	r := C.sth_dtoh(d.ctx, d.stream, unsafe.Pointer(&dst[0]), C.CUdeviceptr(src), C.size_t(len(dst)), &synced)
	if synced != 0 {
		return check("cuStreamSynchronize", r)
	}
	return check("cuMemcpyDtoHAsync", r)
}

func (d *cudaDriver) copyDtoD(dst, src, bytes uint64) error {
	return check("cuMemcpyDtoDAsync", C.sth_dtod(d.ctx, d.stream, C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(bytes)))
}

func (d *cudaDriver) memset(dst uint64, elemSize int, value uint32, n uint64) error {
	call := fmt.Sprintf("cuMemsetD%dAsync", 8*elemSize)
	return check(call, C.sth_memset(d.ctx, d.stream, C.CUdeviceptr(dst), C.int(elemSize), C.uint(value), C.size_t(n)))
}

func (d *cudaDriver) loadModule(name string, image []byte) (any, error) {
	if len(image) == 0 {
		return nil, fmt.Errorf("module %s: empty image", name)
	}
	// A C copy of the image: the driver may keep parsing it for as long as
	// the call runs, and wants it aligned, which Go's []byte does not
	// promise.
	cimage := C.CBytes(image)
	defer C.free(cimage)
	const logSize = 16 << 10
	log := (*C.char)(C.calloc(logSize, 1))
	defer C.free(unsafe.Pointer(log))
	var m C.CUmodule
	if err := check("cuModuleLoadDataEx", C.sth_module_load(d.ctx, &m, cimage, log, logSize)); err != nil {
		var de *DriverError
		if errors.As(err, &de) {
			de.Log = strings.TrimSpace(C.GoString(log))
		}
		return nil, err
	}
	return m, nil
}

func (d *cudaDriver) unloadModule(mod any) error {
	return check("cuModuleUnload", C.sth_module_unload(d.ctx, mod.(C.CUmodule)))
}

func (d *cudaDriver) function(mod any, name string) (any, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var f C.CUfunction
	if err := check("cuModuleGetFunction", C.sth_function(d.ctx, &f, mod.(C.CUmodule), cname)); err != nil {
		return nil, err
	}
	return f, nil
}

func (d *cudaDriver) setMaxDynamicShared(fn any, bytes int) error {
	return check("cuFuncSetAttribute", C.sth_func_max_shared(d.ctx, fn.(C.CUfunction), C.int(bytes)))
}

func (d *cudaDriver) launch(fn any, cfg LaunchConfig, params unsafe.Pointer, size uintptr) error {
	g, b := cfg.Grid, cfg.Block
	return check("cuLaunchKernel", C.sth_launch(d.ctx, d.stream, fn.(C.CUfunction),
		C.uint(g.X), C.uint(g.Y), C.uint(g.Z), C.uint(b.X), C.uint(b.Y), C.uint(b.Z),
		C.uint(cfg.SharedMem), params))
}

func (d *cudaDriver) beginCapture() error {
	return check("cuStreamBeginCapture", C.sth_capture_begin(d.ctx, d.stream))
}

func (d *cudaDriver) capturedNode() (any, error) {
	var n C.CUgraphNode
	if err := check("cuStreamGetCaptureInfo", C.sth_capture_node(d.ctx, d.stream, &n)); err != nil {
		return nil, err
	}
	return n, nil
}

func (d *cudaDriver) endCapture() (any, error) {
	var g C.CUgraph
	err := check("cuStreamEndCapture", C.sth_capture_end(d.ctx, d.stream, &g))
	if g == nil {
		return nil, err
	}
	return g, err
}

func (d *cudaDriver) instantiate(graph any) (any, error) {
	var e C.CUgraphExec
	if err := check("cuGraphInstantiateWithFlags", C.sth_graph_instantiate(d.ctx, &e, graph.(C.CUgraph))); err != nil {
		return nil, err
	}
	return e, nil
}

func (d *cudaDriver) launchGraph(exec any) error {
	return check("cuGraphLaunch", C.sth_graph_launch(d.ctx, d.stream, exec.(C.CUgraphExec)))
}

func (d *cudaDriver) setKernelParams(exec, node, fn any, cfg LaunchConfig, params unsafe.Pointer) error {
	g, b := cfg.Grid, cfg.Block
	return check("cuGraphExecKernelNodeSetParams", C.sth_graph_kernel_params(d.ctx, exec.(C.CUgraphExec),
		node.(C.CUgraphNode), fn.(C.CUfunction),
		C.uint(g.X), C.uint(g.Y), C.uint(g.Z), C.uint(b.X), C.uint(b.Y), C.uint(b.Z),
		C.uint(cfg.SharedMem), params))
}

func (d *cudaDriver) destroyGraph(graph, exec any) error {
	var e C.CUgraphExec
	if exec != nil {
		e = exec.(C.CUgraphExec)
	}
	return check("cuGraphDestroy", C.sth_graph_destroy(d.ctx, graph.(C.CUgraph), e))
}

func (d *cudaDriver) eventRecord() (any, error) {
	var e C.CUevent
	if err := check("cuEventRecord", C.sth_event_record(d.ctx, d.stream, &e)); err != nil {
		return nil, err
	}
	return e, nil
}

func (d *cudaDriver) eventElapsed(start, end any) (float32, error) {
	var ms C.float
	err := check("cuEventElapsedTime", C.sth_event_elapsed(d.ctx, start.(C.CUevent), end.(C.CUevent), &ms))
	return float32(ms), err
}

func (d *cudaDriver) eventDestroy(e any) error {
	return check("cuEventDestroy", C.sth_event_destroy(d.ctx, e.(C.CUevent)))
}

func (d *cudaDriver) synchronize() error {
	return check("cuStreamSynchronize", C.sth_sync(d.ctx, d.stream))
}

func (d *cudaDriver) close() error {
	err := check("cuStreamDestroy", C.sth_stream_destroy(d.ctx, d.stream))
	// Releasing the last reference destroys the primary context and with it
	// anything this process still had on the GPU.
	return errors.Join(err, check("cuDevicePrimaryCtxRelease", C.cuDevicePrimaryCtxRelease(d.dev)))
}
