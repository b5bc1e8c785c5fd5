package backend

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Kernel is a __global__ function of a loaded module. Kernels are looked up
// once per Device and cached; a *Kernel stays valid until its Device closes.
type Kernel struct {
	dev    *Device
	module string
	name   string
	fn     any
	// maxShared is the dynamic shared memory a block of k may ask for:
	// the GPU's default until SetMaxDynamicSharedMemory sets it.
	maxShared atomic.Int64
}

// String returns "module.function".
func (k *Kernel) String() string { return k.module + "." + k.name }

// Device returns the Device the kernel is loaded on.
func (k *Kernel) Device() *Device { return k.dev }

// Kernel returns the kernel name (an extern "C" __global__ function) of
// module, the kernels/<module>.cu file. The module is loaded from the
// embedded fatbins the first time one of its kernels is asked for.
func (d *Device) Kernel(module, name string) (*Kernel, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.exit()
	return d.kernel(module, name)
}

// kernelKey finds a loaded kernel by its module and function: a pair
// rather than "module.function", whose concatenation every launch would
// pay for.
type kernelKey struct{ module, name string }

func (d *Device) kernel(module, name string) (*Kernel, error) {
	if m := d.kernels.Load(); m != nil {
		if k, ok := (*m)[kernelKey{module, name}]; ok {
			return k, nil
		}
	}
	d.kmu.Lock()
	defer d.kmu.Unlock()
	old := d.kernels.Load()
	if old != nil {
		if k, ok := (*old)[kernelKey{module, name}]; ok {
			return k, nil
		}
	}
	key := module + "." + name
	mod, ok := d.modules[module]
	if !ok {
		image, err := d.images(module)
		if err != nil {
			return nil, d.errorf("kernel %s: %w", key, err)
		}
		if mod, err = d.drv.loadModule(module, image); err != nil {
			return nil, d.errorf("kernel %s: loading module %s (kernels/%s.cu) for sm_%d%d: %w",
				key, module, module, d.info.major, d.info.minor, err)
		}
		d.modules[module] = mod
	}
	fn, err := d.drv.function(mod, name)
	if err != nil {
		var de *DriverError
		if errors.As(err, &de) && de.Code == codeNotFound {
			return nil, d.errorf("kernel %s: module %s has no kernel %q (is it declared extern \"C\"?): %w", key, module, name, err)
		}
		return nil, d.errorf("kernel %s: %w", key, err)
	}
	k := &Kernel{dev: d, module: module, name: name, fn: fn}
	k.maxShared.Store(int64(d.info.maxSharedPerBlock))
	m := map[kernelKey]*Kernel{}
	if old != nil {
		maps.Copy(m, *old)
	}
	m[kernelKey{module, name}] = k
	d.kernels.Store(&m)
	return k, nil
}

// SetMaxDynamicSharedMemory lets k's launches ask for up to bytes of
// dynamic shared memory per block. Without it the limit is the default of
// Device.MaxSharedMemory (48 KiB); with it, up to the opt-in limit (227 KiB
// on Hopper), as CUDA requires for kernels with large tiles.
func (k *Kernel) SetMaxDynamicSharedMemory(bytes int) error {
	d := k.dev
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	if bytes < 0 || bytes > d.info.maxSharedOptIn {
		return d.errorf("kernel %v: %d bytes of shared memory; this GPU allows up to %d per block", k, bytes, d.info.maxSharedOptIn)
	}
	if err := d.drv.setMaxDynamicShared(k.fn, bytes); err != nil {
		return d.errorf("kernel %v: allowing %d bytes of dynamic shared memory: %w", k, bytes, err)
	}
	k.maxShared.Store(int64(bytes))
	return nil
}

// Dim3 is a CUDA grid or block shape.
type Dim3 struct{ X, Y, Z uint32 }

// LaunchConfig is how a kernel is launched: grid and block shapes and the
// bytes of dynamic shared memory per block.
type LaunchConfig struct {
	Grid, Block Dim3
	SharedMem   uint32
}

func (c LaunchConfig) String() string {
	return fmt.Sprintf("grid (%d,%d,%d) block (%d,%d,%d) shared %d B",
		c.Grid.X, c.Grid.Y, c.Grid.Z, c.Block.X, c.Block.Y, c.Block.Z, c.SharedMem)
}

// gridStrideBlocksPerSM caps GridStride's grids: enough resident blocks to
// fill every SM for any block size from 64 threads up, few enough that
// each thread runs several iterations of its loop.
const gridStrideBlocksPerSM = 32

// GridStride returns a one-dimensional configuration for a kernel that
// walks n items with a grid-stride loop, block threads per block: one
// thread per item for small n, at most gridStrideBlocksPerSM blocks per SM
// for large n. For n <= 0 the grid is empty and Launch does nothing.
func (d *Device) GridStride(n int64, block uint32) LaunchConfig {
	cfg := LaunchConfig{Block: Dim3{block, 1, 1}, Grid: Dim3{0, 1, 1}}
	if n <= 0 || block == 0 {
		return cfg
	}
	blocks := (n-1)/int64(block) + 1
	blocks = min(blocks, int64(max(d.info.sms, 1))*gridStrideBlocksPerSM)
	cfg.Grid.X = uint32(blocks)
	return cfg
}

// Launch queues kernel k on its Device's stream with cfg and params, a
// struct passed to the kernel by value; it returns before the kernel runs.
// The struct must mirror the kernel's C++ params struct field for field and
// hold only fixed-size numbers: int32 for a C int, int64 for 64-bit indices,
// float32/float64, bool, DevicePtr (or uint64) for device pointers, and
// arrays and structs of these. Launch checks this (once per type) so that
// no Go pointer can reach C; the driver copies the struct before Launch
// returns. An empty grid (a zero dimension) launches nothing.
//
// Errors in the launch itself (a bad configuration, say) are returned
// here; a block that asks for more dynamic shared memory than k may have
// (48 KiB, or what SetMaxDynamicSharedMemory allowed) is refused before
// the driver sees it, with the bytes and the limit. Errors while the
// kernel runs surface at the next call that waits for the stream, unless
// the Device was opened with STHENO_CUDA_SYNC=1: then Launch waits for the
// kernel and returns its error, naming it.
func Launch[P any](k *Kernel, cfg LaunchConfig, params P) error {
	size, err := checkParams(reflect.TypeFor[P]())
	if err != nil {
		return k.dev.errorf("kernel %v: %w", k, err)
	}
	d := k.dev
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	return d.launch(k, cfg, unsafe.Pointer(&params), size)
}

func (d *Device) launch(k *Kernel, cfg LaunchConfig, params unsafe.Pointer, size uintptr) error {
	g, b := cfg.Grid, cfg.Block
	if g.X == 0 || g.Y == 0 || g.Z == 0 {
		return nil
	}
	if threads := uint64(b.X) * uint64(b.Y) * uint64(b.Z); threads == 0 || threads > uint64(d.info.maxThreadsPerBlock) {
		return d.errorf("kernel %v: %v has %d threads per block; this GPU allows 1 to %d",
			k, cfg, threads, d.info.maxThreadsPerBlock)
	}
	// The driver would answer only CUDA_ERROR_INVALID_VALUE. (Static
	// shared memory counts against the same limit; kernels/cuda's tests
	// check the modules' own.)
	if limit := k.maxShared.Load(); int64(cfg.SharedMem) > limit {
		return d.errorf("kernel %v: %v asks for %d bytes of dynamic shared memory per block; it may have %d (Kernel.SetMaxDynamicSharedMemory raises that up to %d)",
			k, cfg, cfg.SharedMem, limit, d.info.maxSharedOptIn)
	}
	d.counts.launches.Add(1)
	if err := d.drv.launch(k.fn, cfg, params, size); err != nil {
		return d.errorf("launching kernel %v with %v: %w", k, cfg, err)
	}
	if d.syncLaunches {
		if err := d.drvSynchronize(); err != nil {
			return d.errorf("kernel %v (%v) failed: %w", k, cfg, err)
		}
		if err := d.checkStatus(); err != nil {
			return err
		}
	}
	return nil
}

// maxParamBytes is the kernel parameter space every CUDA driver supports.
const maxParamBytes = 4096

type paramsCheck struct {
	size uintptr
	err  error
}

// paramsChecked memoises checkParams per type: a pure function of the
// type, so sharing it between Devices hides no state.
var paramsChecked sync.Map // reflect.Type -> paramsCheck

// checkParams returns the size of params struct type t, or why t cannot be
// passed to a kernel.
func checkParams(t reflect.Type) (uintptr, error) {
	if v, ok := paramsChecked.Load(t); ok {
		c := v.(paramsCheck)
		return c.size, c.err
	}
	c := paramsCheck{size: t.Size()}
	switch {
	case t.Kind() != reflect.Struct:
		c.err = fmt.Errorf("params must be a struct mirroring the kernel's, got %v", t)
	case t.Size() > maxParamBytes:
		c.err = fmt.Errorf("params %v has %d bytes; kernels take at most %d", t, t.Size(), maxParamBytes)
	default:
		c.err = checkPlain(t.String(), t)
	}
	paramsChecked.Store(t, c)
	return c.size, c.err
}

// checkPlain checks that t, reached through path, is a fixed-size number or
// an array or struct of them.
func checkPlain(path string, t reflect.Type) error {
	switch t.Kind() {
	case reflect.Bool, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return nil
	case reflect.Array:
		return checkPlain(path+"[]", t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if err := checkPlain(path+"."+f.Name, f.Type); err != nil {
				return err
			}
		}
		return nil
	case reflect.Int, reflect.Uint, reflect.Uintptr:
		return fmt.Errorf("%s is %v, whose size is Go's choice: use int32 for a C int, int64 for a 64-bit index, DevicePtr for a pointer", path, t)
	default:
		return fmt.Errorf("%s is %v: params hold only fixed-size numbers (DevicePtr for device pointers); Go pointers, slices, strings, maps and interfaces cannot be passed to a kernel", path, t)
	}
}
