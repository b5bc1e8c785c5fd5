package backend

import (
	"errors"
	"fmt"
	"unsafe"
)

// driver is what a Device needs from the CUDA driver API: one device, one
// context, one stream. driver_cuda.go implements it with cgo. Tests also
// run the whole package against a fake (fake_test.go) whose device memory
// is address space the host cannot read, so that any host dereference of a
// device pointer faults on a machine without a GPU.
//
// Calls that take a stream use the device's one stream and return before
// the work is done, except copyDtoH, which returns once the bytes have
// arrived. Handles (modules, functions) are opaque to the Device.
type driver interface {
	info() deviceInfo
	memAlloc(bytes uint64) (uint64, error)
	memFree(ptr uint64) error
	memInfo() (free, total uint64, err error)
	copyHtoD(dst uint64, src []byte) error
	copyDtoH(dst []byte, src uint64) error
	copyDtoD(dst, src, bytes uint64) error
	// memset sets n elements of elemSize (1, 2 or 4) bytes to the low
	// elemSize bytes of value.
	memset(dst uint64, elemSize int, value uint32, n uint64) error
	loadModule(name string, image []byte) (any, error)
	unloadModule(mod any) error
	function(mod any, name string) (any, error)
	// setMaxDynamicShared lets fn use up to bytes of dynamic shared memory
	// (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES).
	setMaxDynamicShared(fn any, bytes int) error
	// launch launches fn with the params struct of size bytes at params,
	// which holds no Go pointers; the driver copies it before returning.
	launch(fn any, cfg LaunchConfig, params unsafe.Pointer, size uintptr) error
	// eventRecord records a new event on the stream; eventElapsed waits for
	// end and returns the milliseconds from start to end; eventDestroy
	// frees an event.
	eventRecord() (any, error)
	eventElapsed(start, end any) (float32, error)
	eventDestroy(e any) error
	synchronize() error
	// openBLAS loads cuBLAS (once per process) and makes a handle that
	// queues on the stream (blas.go); Close closes it before close.
	openBLAS() (blasDriver, error)
	// close destroys the stream and gives the context back.
	close() error
}

// deviceInfo is what Open learns about a GPU once.
type deviceInfo struct {
	ordinal            int
	name               string
	major, minor       int // compute capability
	sms                int
	clockKHz           int // the SMs' peak clock
	totalMem           int64
	maxThreadsPerBlock int
	maxSharedPerBlock  int // without opting in to more
	maxSharedOptIn     int // with Kernel.SetMaxDynamicSharedMemory
}

// ErrNoDevice is returned (wrapped) by Open and DeviceCount when the
// machine has no usable CUDA device: no GPU, no driver, or a binary built
// without the stheno_cuda tag. Tests skip on it and fail on any other error.
var ErrNoDevice = errors.New("backend: no CUDA device")

// ErrClosed is returned (wrapped) by calls on a Device after Close.
var ErrClosed = errors.New("backend: device is closed")

// DriverError is an error returned by a CUDA driver API call. Errors from
// this package wrap it with what was being done, on which GPU, and for
// kernels, which kernel in which module; errors.As recovers it.
type DriverError struct {
	Call string // the driver function, e.g. "cuLaunchKernel"
	Code int    // the CUresult
	Name string // e.g. "CUDA_ERROR_ILLEGAL_ADDRESS"
	Desc string // the driver's description of Code
	// Log is the JIT compiler's error log when a module failed to load.
	Log string
}

func (e *DriverError) Error() string {
	s := fmt.Sprintf("%s: %s (%d): %s", e.Call, e.Name, e.Code, e.Desc)
	if e.Log != "" {
		s += "\n" + e.Log
	}
	return s
}

// CUresult values this package and its tests look at (cuda.h).
const (
	codeInvalidValue   = 1
	codeOutOfMemory    = 2
	codeStubLibrary    = 34
	codeNoDevice       = 100
	codeInvalidHandle  = 400
	codeNotFound       = 500
	codeIllegalAddress = 700
)

// Is makes errors.Is(err, ErrNoDevice) hold for the driver's "there is no
// GPU here" answers: no device, or only the toolkit's stub libcuda.
func (e *DriverError) Is(target error) bool {
	return target == ErrNoDevice && (e.Code == codeNoDevice || e.Code == codeStubLibrary)
}

// OutOfMemory reports whether the driver ran out of device memory.
func (e *DriverError) OutOfMemory() bool { return e.Code == codeOutOfMemory }

// isOutOfMemory reports whether err wraps a driver out-of-memory error.
func isOutOfMemory(err error) bool {
	var de *DriverError
	return errors.As(err, &de) && de.OutOfMemory()
}
