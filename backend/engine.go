package backend

import (
	"fmt"
	"math"
	"reflect"
	"unsafe"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Engine is a Device's tensor.Engine and tensor.Adder. Build a TapeMachine
// with G.WithEngine(dev.Engine()) to run a graph whose values live on the
// device.
//
// The TapeMachine sets its engine on every value it produces, host values
// included, so Engine serves both. Each call looks at where its operands'
// memory is (the Device's allocator knows its blocks): device operands take
// the device path, host operands go to gorgonia's StandardEngine, which
// Engine embeds, exactly as in a TapeMachine without WithEngine. Mixing host
// and device operands in one call is an error, never a silent copy.
//
// Embedding also means tensor allocates memory for any tensor that has this
// engine on the host, like StandardEngine (tensor asks the engine's
// unexported makeArray, which Engine inherits, before Alloc). That keeps
// host values host values: device memory comes only from this package's
// explicit calls.
//
// Everything else Engine inherits from StandardEngine (the arithmetic,
// reductions, linear algebra, softmax, concatenation... that gorgonia's CPU
// ops reach through tensor's API) refuses device tensors with an error
// (guards_gen.go): some of StandardEngine's own methods would read the
// device memory on the host.
type Engine struct {
	G.StandardEngine
	dev *Device
}

//go:generate go run gen_guards.go

// hostOnly returns an error naming op if any of ts is a device tensor (or
// otherwise unreadable from the host).
func (e *Engine) hostOnly(op string, ts ...tensor.Tensor) error {
	for _, t := range ts {
		if IsDevice(t) {
			return e.dev.errorf("%s: a %v %v operand is a device tensor; gorgonia's CPU engine cannot run on it "+
				"(only Add runs on the device: use an op of package ops, or ToHost)", op, t.Dtype(), t.Shape())
		}
	}
	return nil
}

func (e *Engine) hostOnlyDense(op string, ts ...tensor.DenseTensor) error {
	for _, t := range ts {
		if err := e.hostOnly(op, t); err != nil {
			return err
		}
	}
	return nil
}

// hostOnlyAny checks an operand that may be a scalar or a tensor.
func (e *Engine) hostOnlyAny(op string, v any) error {
	if t, ok := v.(tensor.Tensor); ok {
		return e.hostOnly(op, t)
	}
	return nil
}

// hostOnlyOpts checks the reuse or incr tensor of opts.
func (e *Engine) hostOnlyOpts(op string, opts []tensor.FuncOpt) error {
	if len(opts) == 0 {
		return nil
	}
	reuse, _ := tensor.ParseFuncOpts(opts...).IncrReuse()
	return e.hostOnly(op, reuse)
}

// Device returns the Device the engine belongs to.
func (e *Engine) Device() *Device { return e.dev }

// Memory is a block of device memory as a tensor.Memory.
type Memory struct {
	Ptr  DevicePtr
	Size int64
}

// Uintptr returns the device address.
func (m Memory) Uintptr() uintptr { return uintptr(m.Ptr) }

// MemSize returns the size in bytes.
func (m Memory) MemSize() uintptr { return uintptr(m.Size) }

// AllocAccessible reports true. tensor marks every tensor whose engine says
// false as unreadable from the host, and the TapeMachine gives this engine
// to host values too; device tensors are marked when they are made.
func (e *Engine) AllocAccessible() bool { return true }

// Alloc returns size bytes of device memory (a Memory) from the Device's
// caching allocator.
func (e *Engine) Alloc(size int64) (tensor.Memory, error) {
	d := e.dev
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.exit()
	p, err := d.alloc(size)
	if err != nil {
		return nil, err
	}
	return Memory{DevicePtr(p), size}, nil
}

// Free gives device memory from Alloc back to the cache; for host memory
// it does what StandardEngine does (nothing: Go's collector frees it).
func (e *Engine) Free(mem tensor.Memory, size int64) error {
	d := e.dev
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	r, err := d.locate(mem)
	if err != nil || !r.onDevice {
		return err
	}
	if err := d.mem.free(r.addr); err != nil {
		return d.errorf("Free: %w", err)
	}
	return nil
}

// region is where a tensor.Memory is.
type region struct {
	addr, size uint64
	onDevice   bool
}

// locate finds mem: on the device (inside a live block), on the host, or
// an error for freed device memory. Memory of size 0 is reported on the
// host with address 0: there is nothing to touch, and tensor's Uintptr
// panics on an empty array.
func (d *Device) locate(mem tensor.Memory) (region, error) {
	r := region{size: uint64(mem.MemSize())}
	switch m := mem.(type) {
	case Memory:
		r.addr = uint64(m.Ptr)
	case *tensor.Dense:
		r.addr = rawAddr(m.Raw)
		if !m.IsNativelyAccessible() && r.size == 0 {
			// An empty device tensor: its block has room for nothing.
			on, err := d.where(m)
			r.onDevice = on
			return r, err
		}
	default:
		if r.size == 0 {
			return r, nil
		}
		r.addr = uint64(mem.Uintptr())
	}
	if r.size == 0 {
		return r, nil
	}
	b, live, ok := d.mem.lookup(r.addr)
	switch {
	case !ok:
		return r, nil
	case !live:
		return r, d.errorf("memory at %#x was freed", r.addr)
	case r.addr+r.size > b.base+b.size:
		return r, d.errorf("%d bytes at %#x overrun the block at %#x of %d bytes", r.size, r.addr, b.base, b.size)
	}
	r.onDevice = true
	return r, nil
}

// hostBytes returns the first n bytes of host memory mem as a []byte. The
// caller (a Dense, or the array inside one that tensor passes to Memcpy)
// keeps the memory alive for the call. The address is reinterpreted through
// a variable, not converted from the uintptr, because it is known to point
// into live Go memory while vet's unsafeptr check cannot know that.
func hostBytes(mem tensor.Memory, n uint64) []byte {
	if d, ok := mem.(*tensor.Dense); ok {
		return d.Raw[:n]
	}
	addr := mem.Uintptr()
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), n)
}

// Memcpy copies min(dst, src) bytes, like Go's copy and StandardEngine:
// host to host through StandardEngine, otherwise with the driver on the
// stream. A copy to the host waits for it to finish.
func (e *Engine) Memcpy(dst, src tensor.Memory) error {
	d := e.dev
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	dr, err := d.locate(dst)
	if err != nil {
		return err
	}
	sr, err := d.locate(src)
	if err != nil {
		return err
	}
	n := min(dr.size, sr.size)
	switch {
	case n == 0:
		return nil
	case !dr.onDevice && !sr.onDevice:
		return e.StandardEngine.Memcpy(dst, src)
	case dr.onDevice && sr.onDevice:
		err = d.drv.copyDtoD(dr.addr, sr.addr, n)
	case dr.onDevice:
		err = d.drvCopyHtoD(dr.addr, hostBytes(src, n))
	default:
		return d.asyncError("copying to the host", d.drvCopyDtoH(hostBytes(dst, n), sr.addr))
	}
	if err != nil {
		return d.errorf("copying %d bytes: %w", n, err)
	}
	return nil
}

// Memset sets every element of mem to val. On the device, mem must be
// contiguous, and val's type decides the element size; for a tensor it
// must be the tensor's dtype.
func (e *Engine) Memset(mem tensor.Memory, val interface{}) error {
	d := e.dev
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	r, err := d.locate(mem)
	if err != nil {
		return err
	}
	if !r.onDevice {
		if r.size == 0 {
			return nil
		}
		return e.StandardEngine.Memset(mem, val)
	}
	if t, ok := mem.(*tensor.Dense); ok {
		if !contiguous(t) {
			return d.errorf("Memset: %v view is not contiguous", t.Shape())
		}
		if reflect.TypeOf(val) != t.Dtype().Type {
			return d.errorf("Memset: value %v of type %T for a tensor of %v", val, val, t.Dtype())
		}
	}
	return d.memset(r.addr, r.size, val)
}

// memset fills size bytes at addr with copies of val.
func (d *Device) memset(addr, size uint64, val any) error {
	bits, width, err := scalarBits(val)
	if err != nil {
		return d.errorf("Memset: %w", err)
	}
	if size%uint64(width) != 0 {
		return d.errorf("Memset: %d bytes do not hold a whole number of %T", size, val)
	}
	n := size / uint64(width)
	if width == 8 {
		return d.fill64(addr, int64(n), bits)
	}
	if err := d.drv.memset(addr, width, uint32(bits), n); err != nil {
		return d.errorf("Memset: %w", err)
	}
	return nil
}

// scalarBits returns the bit pattern and width in bytes of a number, the
// element the device memory is filled with.
func scalarBits(val any) (bits uint64, width int, err error) {
	switch v := val.(type) {
	case float32:
		return uint64(math.Float32bits(v)), 4, nil
	case float64:
		return math.Float64bits(v), 8, nil
	case bool:
		if v {
			return 1, 1, nil
		}
		return 0, 1, nil
	case complex64:
		return uint64(math.Float32bits(real(v))) | uint64(math.Float32bits(imag(v)))<<32, 8, nil
	}
	rv := reflect.ValueOf(val)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		bits = uint64(rv.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		bits = rv.Uint()
	default:
		return 0, 0, fmt.Errorf("cannot fill device memory with %v of type %T", val, val)
	}
	// Two's complement: the low bytes of the 64-bit value are the value's
	// own little-endian bytes.
	width = int(rv.Type().Size())
	if width < 8 {
		bits &= 1<<(8*width) - 1
	}
	return bits, width, nil
}

// Memclr zeroes mem. tensor.Engine gives Memclr no error result: an error
// on the device is returned by the next Synchronize or ToHost instead.
func (e *Engine) Memclr(mem tensor.Memory) {
	d := e.dev
	if err := d.enter(); err != nil {
		d.deferError(err)
		return
	}
	defer d.exit()
	r, err := d.locate(mem)
	switch {
	case err != nil:
		d.deferError(err)
	case !r.onDevice:
		if r.size > 0 {
			e.StandardEngine.Memclr(mem)
		}
	case r.size > 0:
		if t, ok := mem.(*tensor.Dense); ok && !contiguous(t) {
			d.deferError(d.errorf("Memclr: %v view is not contiguous", t.Shape()))
			return
		}
		if err := d.drv.memset(r.addr, 1, 0, r.size); err != nil {
			d.deferError(d.errorf("Memclr: %w", err))
		}
	}
}

// Accessible returns host memory as it is and refuses device memory: read
// device tensors with ToHost.
func (e *Engine) Accessible(mem tensor.Memory) (tensor.Memory, error) {
	d := e.dev
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.exit()
	r, err := d.locate(mem)
	if err != nil {
		return nil, err
	}
	if r.onDevice {
		return nil, d.errorf("device memory at %#x cannot be read from Go: copy it with ToHost", r.addr)
	}
	return mem, nil
}

// WorksWith answers as StandardEngine does (every order): tensor asks it
// to choose how its host loops walk memory. Device code checks layouts
// itself: kernels take contiguous row-major tensors only.
func (e *Engine) WorksWith(order tensor.DataOrder) bool { return e.StandardEngine.WorksWith(order) }
