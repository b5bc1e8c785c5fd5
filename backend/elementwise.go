package backend

import (
	"fmt"
	"reflect"
	"unsafe"

	"gorgonia.org/tensor"
)

// Params structs of kernels/elementwise.cu, field for field (the .cu file
// pins their sizes with static_asserts; TestElementwiseParamsLayout pins
// these).
type (
	fillParams struct {
		Out   DevicePtr
		N     int64
		Value uint64
	}
	addParams struct {
		Out, A, B  DevicePtr
		N, BStride int64
		Scalar     float64
	}
	axpyParams struct {
		Y, X  DevicePtr
		N     int64
		Alpha float64
	}
)

const (
	elementwiseModule = "elementwise"
	// elementwiseBlock: memory-bound loops want full occupancy and little
	// else; 256 threads gets it on every GPU since sm_50.
	elementwiseBlock = 256
)

// launchElementwise launches one of elementwise.cu's grid-stride kernels
// over n elements; the Device is entered.
func launchElementwise[P any](d *Device, name string, n int64, p P) error {
	k, err := d.kernel(elementwiseModule, name)
	if err != nil {
		return err
	}
	size, err := checkParams(reflect.TypeFor[P]())
	if err != nil {
		return d.errorf("kernel %v: %w", k, err)
	}
	return d.launch(k, d.GridStride(n, elementwiseBlock), unsafe.Pointer(&p), size)
}

// fill64 queues n 8-byte copies of value at addr: the driver's memsets
// stop at 32-bit elements.
func (d *Device) fill64(addr uint64, n int64, value uint64) error {
	return launchElementwise(d, "fill_u64", n, fillParams{Out: DevicePtr(addr), N: n, Value: value})
}

// floatSuffix names the kernel variant of a float dtype.
func floatSuffix(dt tensor.Dtype) (string, error) {
	switch dt {
	case tensor.Float32:
		return "f32", nil
	case tensor.Float64:
		return "f64", nil
	}
	return "", fmt.Errorf("dtype %v: device kernels take float32 or float64", dt)
}

// add queues out = [out +] a + b (see AddParams in elementwise.cu).
func (d *Device) add(dt tensor.Dtype, accumulate bool, p addParams) error {
	sfx, err := floatSuffix(dt)
	if err != nil {
		return d.errorf("Add: %w", err)
	}
	name := "add_" + sfx
	if accumulate {
		name = "add_acc_" + sfx
	}
	return launchElementwise(d, name, p.N, p)
}

// Axpy queues y += alpha*x for device tensors x and y of one float dtype
// and size (an SGD step is Axpy(-lr, grad, weight)).
func (d *Device) Axpy(alpha float64, x, y *tensor.Dense) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	xs, err := d.operand("Axpy", "x", x)
	if err != nil {
		return err
	}
	ys, err := d.operand("Axpy", "y", y)
	if err != nil {
		return err
	}
	if x.Dtype() != y.Dtype() || xs.n != ys.n {
		return d.errorf("Axpy: x is %v %v, y is %v %v", x.Dtype(), x.Shape(), y.Dtype(), y.Shape())
	}
	sfx, err := floatSuffix(x.Dtype())
	if err != nil {
		return d.errorf("Axpy: %w", err)
	}
	return launchElementwise(d, "axpy_"+sfx, xs.n, axpyParams{Y: ys.ptr, X: xs.ptr, N: xs.n, Alpha: alpha})
}

// Zero queues the clearing of device tensor t (Memclr with an error).
func (d *Device) Zero(t *tensor.Dense) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	o, err := d.operand("Zero", "t", t)
	if err != nil || o.bytes == 0 {
		return err
	}
	if err := d.drv.memset(uint64(o.ptr), 1, 0, uint64(o.bytes)); err != nil {
		return d.errorf("Zero: %w", err)
	}
	return nil
}

// devOperand is a contiguous device tensor as a kernel sees it.
type devOperand struct {
	ptr      DevicePtr
	n, bytes int64
}

// operand checks that t is a contiguous tensor of d, for op's argument arg.
func (d *Device) operand(op, arg string, t tensor.Tensor) (devOperand, error) {
	if isNil(t) {
		return devOperand{}, d.errorf("%s: %s is nil", op, arg)
	}
	on, err := d.where(t)
	if err != nil {
		return devOperand{}, fmt.Errorf("%s: %s: %w", op, arg, err)
	}
	if !on {
		return devOperand{}, d.errorf("%s: %s is a host tensor; move it with ToDevice", op, arg)
	}
	dense := t.(*tensor.Dense) // where admits only *tensor.Dense on the device
	if !contiguous(dense) {
		return devOperand{}, d.errorf("%s: %s (%v) is not contiguous", op, arg, t.Shape())
	}
	bytes := int64(len(dense.Raw))
	return devOperand{ptr: DevicePtr(rawAddr(dense.Raw)), n: bytes / int64(dense.Dtype().Size()), bytes: bytes}, nil
}
