package backend

import (
	"fmt"
	"math"
	"reflect"
	"runtime"
	"unsafe"

	"gorgonia.org/tensor"
)

// Device tensors are *tensor.Dense values whose backing slice (Dense.Raw)
// points at device memory and whose engine is the Device's Engine. They are
// made only by this package (NewDense, ToDevice, Engine.Add): tensor never
// asks the Engine for device memory by itself (see Engine).
//
// tensor.Dense does not know it holds device memory. What its methods do
// with a device tensor (TestDenseMethodsOnDevice pins this down, on memory
// that faults when the host touches it):
//
//   - Safe, metadata only: Shape, Strides, Dtype, Dims, Size, DataSize,
//     Engine, IsView, IsScalar, DataOrder, RequiresIterator, Uintptr,
//     MemSize, Reshape, T (it only records a pending transpose), Slice (a
//     view of the same device memory; kernels and copies take only views of
//     whole rows), ShallowClone, and String and Format, which print
//     "Inaccesible data" instead of values.
//   - Run on the device: Add (Dense.Add and tensor.Add, through
//     Engine.Add), and CopyTo into any tensor (it copies through the
//     source's engine).
//   - Refused with an error, as long as the tensor's engine is the
//     Device's Engine: all other arithmetic, comparisons, reductions,
//     linear algebra, Apply, Transpose, Memset, Concat, ...
//   - Copy to the host quietly: Clone returns a host copy that tensor still
//     marks inaccessible (DeviceOf reports it); Materialize of a view of
//     whole rows returns a host copy, of any other view host zeros.
//   - Unsafe, they read or write the memory from the host and crash the
//     process: Data, Float32s/Float64s and the other typed accessors, Get,
//     Set, At, SetAt, ScalarValue, Zero, Eq, the gob/npy/CSV encoders, and
//     CopyTo from a host tensor with tensor's standard engine into a device
//     tensor. Gorgonia calls some of them itself: its solvers call Zero on
//     gradients, and most of its CPU ops read Data. Only ops that dispatch
//     on IsDevice may see device values.
//
// Read a device tensor with ToHost; copy it on the device with ToDevice.

// hostInaccessible is passed to tensor.WithEngine once, while a device
// tensor is built, only for its side effect: tensor marks a Dense
// NativelyInaccessible when its engine's AllocAccessible is false, and
// nothing clears the mark. The Device's Engine is set right after.
type hostInaccessible struct{ tensor.StdEng }

func (hostInaccessible) AllocAccessible() bool { return false }

// HostData is t.Data() for a host tensor (or gorgonia Value), safe to call on a tensor that
// nothing uses afterwards. tensor's Dense.Data builds its result from the
// backing array's address held as a uintptr, which the collector does not
// see, and allocates while doing so: when t itself is no longer referenced,
// a collection at that moment frees the array, and the slice returned
// points at freed memory (other values appear in it, or the runtime stops
// with "found bad pointer in Go heap"). HostData keeps t alive until the
// slice exists. Typed accessors (Float32s, Float64s, Get) have no such
// window.
func HostData(t interface{ Data() any }) any {
	defer runtime.KeepAlive(t)
	return t.Data()
}

// rawAddr returns the address a Dense's backing slice starts at, also for
// an empty slice, for which Dense.Uintptr panics.
func rawAddr(raw []byte) uint64 {
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(raw))))
}

// checkDtype accepts the dtypes whose elements are plain bytes the device
// can hold: numbers and bools.
func checkDtype(dt tensor.Dtype) error {
	if dt.Type == nil {
		return fmt.Errorf("no dtype")
	}
	switch dt.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128:
		return nil
	}
	return fmt.Errorf("dtype %v cannot live in device memory", dt)
}

// numElements returns the number of elements of shape (1 for a scalar) and
// the bytes they take, checking for negative sizes and overflow.
func numElements(shape tensor.Shape, dt tensor.Dtype) (n, bytes int64, err error) {
	n = 1
	for _, s := range shape {
		if s < 0 {
			return 0, 0, fmt.Errorf("shape %v has a negative size", shape)
		}
		if s > 0 && n > math.MaxInt64/int64(s) {
			return 0, 0, fmt.Errorf("shape %v overflows int64", shape)
		}
		n *= int64(s)
	}
	size := int64(dt.Size())
	if n > maxAlloc/size {
		return 0, 0, fmt.Errorf("shape %v of %v takes more than %d bytes", shape, dt, int64(maxAlloc))
	}
	return n, n * size, nil
}

// NewDense returns a device tensor of dtype dt and the given shape (none
// for a scalar). Its contents are undefined: kernels that write every
// element need no clearing; Zero clears it otherwise.
func (d *Device) NewDense(dt tensor.Dtype, shape ...int) (*tensor.Dense, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.exit()
	return d.newDense(dt, shape)
}

func (d *Device) newDense(dt tensor.Dtype, shape tensor.Shape) (*tensor.Dense, error) {
	if err := checkDtype(dt); err != nil {
		return nil, d.errorf("new tensor: %w", err)
	}
	_, bytes, err := numElements(shape, dt)
	if err != nil {
		return nil, d.errorf("new tensor: %w", err)
	}
	// An empty tensor still gets a (minimal) block, so that it has an
	// address this Device recognises and stays a device value.
	base, err := d.alloc(bytes)
	if err != nil {
		return nil, err
	}
	t, err := d.wrap(base, bytes, dt, shape)
	if err != nil {
		_ = d.mem.free(base) // cannot fail: base was just handed out
		return nil, err
	}
	d.track(base, t)
	return t, nil
}

// headerKey is a device tensor's dtype and shape, by which wrap keeps the
// header it clones.
type headerKey struct {
	dt   tensor.Dtype
	rank int
	dims [maxHeaderRank]int
}

// maxHeaderRank bounds the ranks whose headers wrap keeps; tensors of
// higher rank are built afresh.
const maxHeaderRank = 8

// wrap builds the Dense around device memory. Every op's output on a
// device is one, so it is on the host's path of every node: the first
// Dense of a dtype and shape is built by tensor.New, and the Device keeps
// a copy of its header; later ones are shallow clones of that header
// pointed at their memory, which builds the same Dense in half the time
// and with fewer allocations.
func (d *Device) wrap(base uint64, bytes int64, dt tensor.Dtype, shape tensor.Shape) (*tensor.Dense, error) {
	if len(shape) > maxHeaderRank {
		return d.build(base, bytes, dt, shape)
	}
	k := headerKey{dt: dt, rank: len(shape)}
	copy(k.dims[:], shape)
	d.hmu.Lock()
	h := d.headers[k]
	d.hmu.Unlock()
	if h != nil {
		return cloneHeader(h, deviceBytes(base, bytes)), nil
	}
	t, err := d.build(base, bytes, dt, shape)
	if err != nil {
		return nil, err
	}
	h = t.ShallowClone()
	h.Raw = nil
	d.hmu.Lock()
	if d.headers == nil {
		d.headers = map[headerKey]*tensor.Dense{}
	}
	d.headers[k] = h
	d.hmu.Unlock()
	return t, nil
}

// cloneHeader returns a copy of header h over raw: h.ShallowClone, in two
// allocations instead of four (the Dense, and one array for its shape and
// strides, which no other tensor shares: a Reshape in place must not reach
// h).
func cloneHeader(h *tensor.Dense, raw []byte) *tensor.Dense {
	rank := h.Dims()
	if rank == 0 {
		t := h.ShallowClone()
		t.Raw = raw
		return t
	}
	t := new(tensor.Dense)
	*t = *h
	dims := make([]int, 2*rank)
	copy(dims, h.Shape())
	copy(dims[rank:], h.Strides())
	// Init marks the layout fixed, as a built Dense's is (Reshape unmarks
	// it while it works).
	t.AP.Init(dims[:rank:rank], dims[rank:])
	t.Raw = raw
	return t
}

// deviceBytes is the backing slice of a tensor at device address addr:
// what tensor.FromMemory makes, a slice the host must never touch. The
// address is reinterpreted through a variable, as in hostBytes, because
// vet's unsafeptr check cannot know that nothing dereferences it.
func deviceBytes(addr uint64, n int64) []byte {
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), n)
}

// build makes the Dense around device memory with tensor.New. tensor.New
// panics on what it cannot build; that becomes an error.
func (d *Device) build(base uint64, bytes int64, dt tensor.Dtype, shape tensor.Shape) (t *tensor.Dense, err error) {
	defer func() {
		if r := recover(); r != nil {
			t, err = nil, d.errorf("new tensor of %v %v: %v", dt, shape, r)
		}
	}()
	// The order matters: FromMemory needs the dtype set, and the
	// inaccessible mark must come before the real engine (see
	// hostInaccessible). fix(), run by New, sees the backing slice and
	// allocates nothing.
	return tensor.New(
		tensor.Of(dt),
		tensor.WithShape(shape...),
		tensor.WithEngine(hostInaccessible{}),
		tensor.FromMemory(uintptr(base), uintptr(bytes)),
		tensor.WithEngine(d.engine),
	), nil
}

// where tells where t's memory is: on d, on the host, or neither (an error:
// freed memory, a closed or other Device, or host memory that tensor marked
// inaccessible because it was cloned from a device tensor).
func (d *Device) where(t tensor.Tensor) (onDevice bool, err error) {
	if t.IsNativelyAccessible() {
		return false, nil
	}
	dense, ok := t.(*tensor.Dense)
	if !ok {
		return false, d.errorf("%T is marked inaccessible; only *tensor.Dense values live on a device", t)
	}
	addr, size := rawAddr(dense.Raw), uint64(len(dense.Raw))
	b, live, ok := d.mem.lookup(addr)
	switch {
	case !ok:
		return false, d.errorf("%v tensor at %#x is not host memory and not memory of this device "+
			"(freed, from a closed or another device, or a Clone/Materialize of a device tensor)", dense.Shape(), addr)
	case !live:
		return false, d.errorf("%v tensor at %#x uses device memory that was freed", dense.Shape(), addr)
	case addr+size > b.base+b.size:
		return false, d.errorf("%v tensor at %#x of %d bytes overruns its block at %#x of %d bytes",
			dense.Shape(), addr, size, b.base, b.size)
	}
	return true, nil
}

// Owns reports whether t is a live tensor in this Device's memory.
func (d *Device) Owns(t tensor.Tensor) bool {
	if t == nil {
		return false
	}
	on, err := d.where(t)
	return on && err == nil
}

// IsDevice reports whether v is a tensor whose memory the host cannot read:
// a device tensor (or a broken one, which DeviceOf explains). Ops dispatch
// on it: device inputs run the kernels, host inputs the CPU path, so that
// no CPU code ever touches device memory.
func IsDevice(v any) bool {
	t, ok := v.(tensor.Tensor)
	if !ok || isNil(t) {
		return false
	}
	return !t.IsNativelyAccessible()
}

// DeviceOf returns the Device that holds v, nil for host values, or an
// error for a device value whose Device cannot be found: freed, its Device
// closed, or its engine replaced by a TapeMachine built without
// G.WithEngine(dev.Engine()).
func DeviceOf(v any) (*Device, error) {
	if !IsDevice(v) {
		return nil, nil
	}
	t := v.(tensor.Tensor)
	e, ok := t.Engine().(*Engine)
	if !ok {
		return nil, fmt.Errorf("backend: %v device tensor has engine %T, not a *backend.Engine: "+
			"build the TapeMachine with G.WithEngine(dev.Engine())", t.Shape(), t.Engine())
	}
	if _, err := e.dev.where(t); err != nil {
		return nil, err
	}
	return e.dev, nil
}

// contiguous reports whether t's elements lie in its backing slice in
// row-major order, as kernels and copies need. RequiresIterator alone is
// not the test: tensor counts every empty tensor as masked and so as
// needing an iterator.
func contiguous(t tensor.Tensor) bool {
	return t.MemSize() == 0 || !t.RequiresIterator()
}

func isNil(t tensor.Tensor) bool {
	d, ok := t.(*tensor.Dense)
	return t == nil || ok && d == nil
}

// Ptr returns the device address of t's first element, for a kernel's
// params. t must be a contiguous tensor of this Device (a view of whole
// rows is fine).
func (d *Device) Ptr(t *tensor.Dense) (DevicePtr, error) {
	if t == nil {
		return 0, d.errorf("Ptr of a nil tensor")
	}
	on, err := d.where(t)
	if err != nil {
		return 0, err
	}
	if !on {
		return 0, d.errorf("Ptr: %v tensor is in host memory", t.Shape())
	}
	if !contiguous(t) {
		return 0, d.errorf("Ptr: %v tensor is not contiguous", t.Shape())
	}
	return DevicePtr(rawAddr(t.Raw)), nil
}

// ToDevice returns a new device tensor with t's shape, dtype and values.
// t may be a host tensor (a view or transposed tensor is materialised on
// the host first) or a tensor of this Device (copied on the device). The
// copy is queued on the stream; t may be changed as soon as ToDevice
// returns.
func (d *Device) ToDevice(t *tensor.Dense) (*tensor.Dense, error) {
	if t == nil {
		return nil, d.errorf("ToDevice of a nil tensor")
	}
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.exit()
	on, err := d.where(t)
	if err != nil {
		return nil, err
	}
	if on {
		return d.clone(t)
	}
	if len(t.Mask()) > 0 { // not IsMasked, which holds for every empty tensor
		return nil, d.errorf("ToDevice: %v tensor has a mask; masks do not go to the device", t.Shape())
	}
	src := t
	if t.IsMaterializable() {
		m, ok := t.Materialize().(*tensor.Dense)
		if !ok {
			return nil, d.errorf("ToDevice: could not make the %v view contiguous", t.Shape())
		}
		src = m
	}
	out, err := d.newDense(src.Dtype(), src.Shape())
	if err != nil {
		return nil, err
	}
	if len(src.Raw) != len(out.Raw) {
		d.freeDense(out)
		return nil, d.errorf("ToDevice: %v tensor of %v holds %d bytes, want %d", src.Shape(), src.Dtype(), len(src.Raw), len(out.Raw))
	}
	if len(src.Raw) > 0 {
		if err := d.drvCopyHtoD(rawAddr(out.Raw), src.Raw); err != nil {
			d.freeDense(out)
			return nil, d.errorf("copying %d bytes to the device: %w", len(src.Raw), err)
		}
	}
	return out, nil
}

// clone copies a contiguous device tensor on the device.
func (d *Device) clone(t *tensor.Dense) (*tensor.Dense, error) {
	if !contiguous(t) {
		return nil, d.errorf("copying a non-contiguous %v view on the device is not supported", t.Shape())
	}
	out, err := d.newDense(t.Dtype(), t.Shape())
	if err != nil {
		return nil, err
	}
	if n := len(t.Raw); n > 0 {
		if err := d.drv.copyDtoD(rawAddr(out.Raw), rawAddr(t.Raw), uint64(n)); err != nil {
			d.freeDense(out)
			return nil, d.errorf("copying %d bytes on the device: %w", n, err)
		}
	}
	return out, nil
}

// ToHost returns a new host tensor (tensor's standard engine) with the
// values of device tensor t. It waits for all work queued on the stream,
// so it also returns the error of any earlier kernel that failed.
func (d *Device) ToHost(t *tensor.Dense) (*tensor.Dense, error) {
	if t == nil {
		return nil, d.errorf("ToHost of a nil tensor")
	}
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.exit()
	on, err := d.where(t)
	if err != nil {
		return nil, err
	}
	if !on {
		return nil, d.errorf("ToHost: %v tensor is already in host memory", t.Shape())
	}
	if !contiguous(t) {
		return nil, d.errorf("ToHost: copying a non-contiguous %v view is not supported", t.Shape())
	}
	out := tensor.New(tensor.Of(t.Dtype()), tensor.WithShape(t.Shape().Clone()...))
	if len(out.Raw) != len(t.Raw) {
		return nil, d.errorf("ToHost: %v tensor holds %d bytes, want %d", t.Shape(), len(t.Raw), len(out.Raw))
	}
	if len(t.Raw) == 0 {
		return out, d.sync("copying to the host")
	}
	if err := d.asyncError("copying to the host", d.drvCopyDtoH(out.Raw, rawAddr(t.Raw))); err != nil {
		return nil, err
	}
	return out, nil
}

// FreeDense gives the memory of device tensor t back to the allocator's
// cache and empties t, so that a later use of t fails (index out of range)
// instead of reading memory that has been handed out again. t must own its
// memory: views and shallow clones share it and must not be used after.
// Gorgonia never frees values, so whoever makes a device tensor decides
// when it is dead.
func (d *Device) FreeDense(t *tensor.Dense) error {
	if t == nil {
		return nil
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	if t.IsView() {
		return d.errorf("FreeDense: %v tensor is a view; free the tensor that owns the memory", t.Shape())
	}
	if on, err := d.where(t); err != nil || !on {
		if err == nil {
			err = d.errorf("FreeDense: %v tensor is in host memory", t.Shape())
		}
		return err
	}
	if err := d.mem.free(rawAddr(t.Raw)); err != nil {
		return d.errorf("FreeDense: %w", err)
	}
	t.Raw = nil
	return nil
}

// freeDense frees a tensor made a moment ago by newDense.
func (d *Device) freeDense(t *tensor.Dense) {
	_ = d.mem.free(rawAddr(t.Raw)) // cannot fail: t's block is live
	t.Raw = nil
}
