package backend

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"gorgonia.org/tensor"
)

// SyncEnv names the debugging switch: with STHENO_CUDA_SYNC=1 in the
// environment when a Device is opened, every kernel launch waits for the
// kernel to finish and returns its error, naming the kernel.
const SyncEnv = "STHENO_CUDA_SYNC"

// Device is one GPU opened for this process: the GPU's primary CUDA
// context, one stream on which all of the Device's work runs in order, the
// kernel modules loaded from the embedded fatbins, a caching allocator and
// the tensor engine (Engine) that makes device memory usable in Gorgonia
// graphs.
//
// A Device is safe for concurrent use by many goroutines. No goroutine needs
// to be locked to an OS thread: every call into the driver makes the
// Device's context current on the very thread that makes the call, inside
// the same C function (see driver_cuda.go), so the Go scheduler cannot move
// the goroutine between the two.
type Device struct {
	drv          driver
	info         deviceInfo
	images       func(module string) ([]byte, error)
	syncLaunches bool
	mem          *cache
	engine       *Engine

	// mu is held shared by every call that reaches the driver and
	// exclusively by Close, so Close never pulls the context from under a
	// call. Exported methods take it once; unexported ones assume it held.
	mu     sync.RWMutex
	closed bool

	kmu     sync.Mutex
	modules map[string]any // module name -> driver handle
	// kernels is replaced, never changed, under kmu, so that the lookup
	// every launch makes takes no lock.
	kernels atomic.Pointer[map[kernelKey]*Kernel]

	vmu    sync.Mutex
	values map[any]any // see SetValue

	hmu     sync.Mutex
	headers map[headerKey]*tensor.Dense // see wrap

	// smu orders BeginScope and End; scope is read without it on every
	// tensor's making (track) and every op's release (OpenScope).
	smu       sync.Mutex
	scope     atomic.Pointer[Scope] // the open Scope, if any
	nextScope uint64

	// deferred holds the first error of a call that cannot return one
	// (Engine.Memclr); the next Synchronize or ToHost returns it.
	errMu    sync.Mutex
	deferred error

	// The status word (status.go) and the explanations waiting for it.
	statusMu sync.Mutex
	status   uint64
	watchers []func(code int32) error

	// cuBLAS (blas.go): the handle, made by the first Gemm, and how
	// float32 Gemms multiply. blasMu also serialises the calls on it.
	blasMu   sync.Mutex
	blas     blasDriver
	gemmMath gemmMathSetting

	counts counters // Counters
}

// Open opens GPU ordinal (0 is the first) and creates the Device's stream.
// Kernel modules are loaded when a kernel of theirs is first asked for.
// Open reads SyncEnv and GraphsEnv. Without a GPU, or in a build without the stheno_cuda
// tag, it returns an error wrapping ErrNoDevice.
func Open(ordinal int) (*Device, error) {
	syncLaunches, err := syncFromEnv()
	if err != nil {
		return nil, err
	}
	graphs, err := graphsFromEnv()
	if err != nil {
		return nil, err
	}
	drv, images, err := openDriver(ordinal)
	if err != nil {
		return nil, err
	}
	return newDevice(withGraphs(drv, graphs, syncLaunches), images, syncLaunches), nil
}

// BuiltWithCUDA reports whether this program was built with the
// stheno_cuda tag, without which Open never finds a GPU.
func BuiltWithCUDA() bool { return builtWithCUDA }

// DeviceCount returns how many GPUs the driver reports, or an error
// wrapping ErrNoDevice when there is no usable driver.
func DeviceCount() (int, error) { return deviceCount() }

func syncFromEnv() (bool, error) {
	v := os.Getenv(SyncEnv)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("backend: %s=%q: want 1 or 0", SyncEnv, v)
	}
	return b, nil
}

func newDevice(drv driver, images func(string) ([]byte, error), syncLaunches bool) *Device {
	d := &Device{
		drv:          drv,
		info:         drv.info(),
		images:       images,
		syncLaunches: syncLaunches,
		modules:      map[string]any{},
	}
	d.mem = newCache(drv)
	d.engine = &Engine{dev: d}
	return d
}

// Ordinal returns the GPU's index, as passed to Open.
func (d *Device) Ordinal() int { return d.info.ordinal }

// Name returns the GPU's name, e.g. "NVIDIA H100 80GB HBM3".
func (d *Device) Name() string { return d.info.name }

// ComputeCapability returns the GPU's compute capability, e.g. 9, 0.
func (d *Device) ComputeCapability() (major, minor int) { return d.info.major, d.info.minor }

// SMCount returns the number of streaming multiprocessors.
func (d *Device) SMCount() int { return d.info.sms }

// ClockKHz returns the SMs' peak clock in kHz, as the driver reports it.
func (d *Device) ClockKHz() int { return d.info.clockKHz }

// MaxSharedMemory returns the shared memory a block may use: by default,
// and after Kernel.SetMaxDynamicSharedMemory (the opt-in limit).
func (d *Device) MaxSharedMemory() (byDefault, optIn int) {
	return d.info.maxSharedPerBlock, d.info.maxSharedOptIn
}

// TotalMemory returns the GPU's memory in bytes.
func (d *Device) TotalMemory() int64 { return d.info.totalMem }

// SyncLaunches reports whether every launch waits for its kernel (SyncEnv).
func (d *Device) SyncLaunches() bool { return d.syncLaunches }

// Engine returns the Device's tensor engine. Build TapeMachines that run on
// device values with G.WithEngine(d.Engine()).
func (d *Device) Engine() *Engine { return d.engine }

// String describes the GPU: "GPU 0 (NVIDIA H100 80GB HBM3, sm_90, 132 SMs)".
func (d *Device) String() string {
	return fmt.Sprintf("GPU %d (%s, sm_%d%d, %d SMs)", d.info.ordinal, d.info.name, d.info.major, d.info.minor, d.info.sms)
}

// errorf returns an error that names the package and the GPU.
func (d *Device) errorf(format string, args ...any) error {
	return fmt.Errorf("backend: GPU %d (%s): "+format, append([]any{d.info.ordinal, d.info.name}, args...)...)
}

func (d *Device) enter() error {
	d.mu.RLock()
	if d.closed {
		d.mu.RUnlock()
		return d.errorf("%w", ErrClosed)
	}
	return nil
}

func (d *Device) exit() { d.mu.RUnlock() }

// Synchronize waits until all work queued on the Device's stream is done.
// It returns the error of any earlier asynchronous work that failed.
func (d *Device) Synchronize() error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	return d.sync("synchronizing")
}

func (d *Device) sync(what string) error {
	return d.asyncError(what, d.drvSynchronize())
}

// asyncError turns the result of a call that waited for the stream into
// this package's error, adding any deferred error and, for errors of kernels
// that ran earlier, how to find which kernel failed.
func (d *Device) asyncError(what string, err error) error {
	if err == nil {
		// The stream is done: the status word is final.
		err = d.checkStatus()
	}
	d.errMu.Lock()
	deferred := d.deferred
	d.deferred = nil
	d.errMu.Unlock()
	if err == nil && deferred == nil {
		return nil
	}
	err = errors.Join(deferred, err)
	var de *DriverError
	if !d.syncLaunches && errors.As(err, &de) && de.Code >= 700 && de.Code < 800 {
		return d.errorf("%s: %w (a kernel launched earlier failed; run with %s=1 to find which)", what, err, SyncEnv)
	}
	return d.errorf("%s: %w", what, err)
}

// deferError keeps err for the next call that waits for the stream.
func (d *Device) deferError(err error) {
	d.errMu.Lock()
	defer d.errMu.Unlock()
	if d.deferred == nil {
		d.deferred = err
	}
}

// MemStats returns the allocator's statistics.
func (d *Device) MemStats() MemStats { return d.mem.snapshot() }

// ResetPeakMemory starts MemStats.PeakInUse and PeakReserved over from the
// memory in use and reserved now, as torch.cuda.reset_peak_memory_stats
// does: the peak of one step is then PeakInUse after it.
func (d *Device) ResetPeakMemory() { d.mem.resetPeak() }

// MemInfo returns the free and total memory of the GPU, as the driver
// sees it: memory cached by this Device's allocator counts as used.
func (d *Device) MemInfo() (free, total int64, err error) {
	if err := d.enter(); err != nil {
		return 0, 0, err
	}
	defer d.exit()
	f, t, err := d.drv.memInfo()
	if err != nil {
		return 0, 0, d.errorf("querying memory: %w", err)
	}
	return int64(f), int64(t), nil
}

// DevicePtr is a device address, as kernels' params structs carry it
// (CUdeviceptr; a C++ pointer in the kernel's struct).
type DevicePtr uint64

// Alloc returns a block of at least bytes bytes of device memory from the
// Device's caching allocator. Free gives it back. Tensors have their own
// calls (NewDense, FreeDense); Alloc is for scratch memory of kernels.
func (d *Device) Alloc(bytes int64) (DevicePtr, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.exit()
	p, err := d.alloc(bytes)
	return DevicePtr(p), err
}

// Free puts a block from Alloc back into the cache. Work queued on the
// stream before Free may still use the block; that is safe because
// whoever gets the block next queues its work after it.
func (d *Device) Free(p DevicePtr) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	if err := d.mem.free(uint64(p)); err != nil {
		return d.errorf("%w", err)
	}
	return nil
}

func (d *Device) alloc(bytes int64) (uint64, error) {
	if bytes < 0 {
		return 0, d.errorf("allocating %d bytes", bytes)
	}
	base, err := d.mem.alloc(uint64(bytes))
	if err != nil && isOutOfMemory(err) {
		// The cache may hold what is missing: give it back and try once
		// more. Queued kernels may still use cached blocks, so wait first.
		if serr := d.drvSynchronize(); serr != nil {
			return 0, d.asyncError("allocating", errors.Join(err, serr))
		}
		if rerr := d.mem.releaseCached(); rerr != nil {
			return 0, d.errorf("%w", errors.Join(err, rerr))
		}
		base, err = d.mem.alloc(uint64(bytes))
	}
	if err != nil {
		return 0, d.errorf("%w", err)
	}
	return base, nil
}

// ReleaseCached gives every cached free block back to the driver, after
// waiting for the stream. Blocks in use stay.
func (d *Device) ReleaseCached() error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	if err := d.sync("releasing cached memory"); err != nil {
		return err
	}
	if err := d.mem.releaseCached(); err != nil {
		return d.errorf("releasing cached memory: %w", err)
	}
	return nil
}

// Close waits for the stream, destroys the cuBLAS handle if a Gemm made
// one, gives all device memory back to the driver (also blocks still in
// use: tensors on this Device must not be used after Close), unloads the
// modules, destroys the stream and releases the context. (Once cuBLAS has
// run on a GPU, the process keeps that GPU's primary context, without
// memory of any Device, until it exits: see blas_cuda.go.) It returns
// every error it met; calling it twice returns an error wrapping ErrClosed.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return d.errorf("closing: %w", ErrClosed)
	}
	d.closed = true
	var errs []error
	if err := d.drvSynchronize(); err != nil {
		errs = append(errs, err)
	}
	// cuBLAS's handle goes before the memory: its workspace is among it.
	if err := d.closeBLAS(); err != nil {
		errs = append(errs, err)
	}
	if _, err := d.mem.releaseAll(); err != nil {
		errs = append(errs, err)
	}
	d.kmu.Lock()
	for name, m := range d.modules {
		if err := d.drv.unloadModule(m); err != nil {
			errs = append(errs, fmt.Errorf("unloading module %s: %w", name, err))
		}
	}
	clear(d.modules)
	d.kernels.Store(nil)
	d.kmu.Unlock()
	d.vmu.Lock()
	clear(d.values)
	d.vmu.Unlock()
	if err := d.drv.close(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return d.errorf("closing: %w", errors.Join(errs...))
	}
	return nil
}
