package ops

import (
	"fmt"
	"math"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// Ops run where their inputs live: when every input is a device tensor
// (package backend) they launch the CUDA kernels and return device outputs
// with no host round trip; when every input is a host tensor they run the
// CPU twins. In the default build no device tensor can exist, so only the
// CPU path is ever taken.

// inputsDevice returns the Device that holds an op's inputs, or nil when all
// of them are host values. names[i] names in[i] in errors. Inputs split
// between the host and a device (or between devices) are an error: moving
// them silently would hide a copy on every step.
//
// A device input's Device is its engine's: the caller takes every device
// input's address with deviceTensor (Device.Ptr), which finds its memory
// live on that Device, so looking the memory up here too would only cost
// every node a second lookup per input.
func inputsDevice(op string, names []string, in []G.Value) (*backend.Device, error) {
	var dev *backend.Device
	var onDev, onHost string
	for i, v := range in {
		if !backend.IsDevice(v) {
			onHost = names[i]
			continue
		}
		e, ok := v.(tensor.Tensor).Engine().(*backend.Engine)
		if !ok {
			// DeviceOf explains the engine a device value should have.
			_, err := backend.DeviceOf(v)
			return nil, fmt.Errorf("ops: %s: %s: %w", op, names[i], err)
		}
		d := e.Device()
		if dev != nil && d != dev {
			return nil, fmt.Errorf("ops: %s: %s is on %v but %s is on %v", op, names[i], d, onDev, dev)
		}
		dev, onDev = d, names[i]
	}
	if dev != nil && onHost != "" {
		return nil, fmt.Errorf("ops: %s: %s is on %v but %s is in host memory; move it with ops.ToDevice", op, onDev, dev, onHost)
	}
	return dev, nil
}

// deviceArg checks a device input's dtype and shape and returns its address.
func deviceArg(op, arg string, dev *backend.Device, v G.Value, dt tensor.Dtype, want tensor.Shape) (backend.DevicePtr, error) {
	_, p, err := deviceTensor(op, arg, dev, v, dt, want)
	return p, err
}

// deviceTensor checks a device input's dtype and shape and returns it with
// its address.
func deviceTensor(op, arg string, dev *backend.Device, v G.Value, dt tensor.Dtype, want tensor.Shape) (*tensor.Dense, backend.DevicePtr, error) {
	d, err := tensorArg(op, arg, v, dt, want)
	if err != nil {
		return nil, 0, err
	}
	p, err := dev.Ptr(d)
	if err != nil {
		return nil, 0, fmt.Errorf("ops: %s: %s: %w", op, arg, err)
	}
	return d, p, nil
}

// deviceOutput returns prealloc when it is a device tensor of dev with the
// right dtype and shape, and a new device tensor otherwise, with its address.
// Its contents are undefined: kernels overwrite every element, or the op
// clears it first.
func deviceOutput(op string, dev *backend.Device, prealloc G.Value, dt tensor.Dtype, shape tensor.Shape) (*tensor.Dense, backend.DevicePtr, error) {
	if d, ok := prealloc.(*tensor.Dense); ok && d.Dtype() == dt && d.Shape().Eq(shape) && !d.IsView() && dev.Owns(d) {
		if p, err := dev.Ptr(d); err == nil {
			return d, p, nil
		}
	}
	out, err := dev.NewDense(dt, shape...)
	if err != nil {
		return nil, 0, fmt.Errorf("ops: %s: output: %w", op, err)
	}
	p, err := dev.Ptr(out)
	if err != nil {
		return nil, 0, fmt.Errorf("ops: %s: output: %w", op, err)
	}
	return out, p, nil
}

// namedSize is a size fitsInt32 checks, with its name for the error.
type namedSize struct {
	name string
	v    int
}

// fitsInt32 checks the sizes a kernel's params struct carries as C ints.
func fitsInt32(op string, sizes ...namedSize) error {
	for _, s := range sizes {
		if s.v > math.MaxInt32 {
			return fmt.Errorf("ops: %s: %s = %d does not fit the CUDA kernel's 32-bit int", op, s.name, s.v)
		}
	}
	return nil
}

// boolInt32 is b as the C int a kernel's params struct carries.
func boolInt32(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// ceilDiv is a/b rounded up, for positive b: tiles, blocks and slices.
func ceilDiv(a, b int) int { return (a + b - 1) / b }

// sharedPerBlock is the dynamic shared memory every GPU the kernels run on
// (sm_80 and later) gives a block without opting in. Only the conv GEMMs
// ask for more, opting in where the GPU allows it (convGPU.fits); every
// other launch stays within this on every GPU, so none needs to ask the
// device: bn_*'s and relu_mask_sum*'s fixed scratch, and softmax's, at
// most one value per thread of a block of SoftmaxMaxThreads, its kernels'
// __launch_bounds__ (TestSoftmaxPlanSharedMemory checks the plan). A
// negative constant below would not compile.
const sharedPerBlock = 48 << 10

const (
	_ uint = sharedPerBlock - cuda.BNScratchBytes
	_ uint = sharedPerBlock - cuda.MaskSumScratchBytes
	_ uint = sharedPerBlock - cuda.SoftmaxMaxThreads*8
)

// sm90aModule keys, on a Device (backend.Device.Value), what sm90aError
// found for one of the *_sm90a.cu modules there.
type sm90aModule string

// sm90aError is why dev does not run the kernels of module, one of
// kernels/*_sm90a.cu (PTX for sm_90a that the driver compiles when the
// module loads), or nil when it does: they need compute capability 9.0
// (sm_90a code runs on no other) and a driver that reads their PTX. The
// first call per device and module loads the module by asking for kernel;
// the answer is kept on the device, and ops then use the kernels that run
// everywhere.
func sm90aError(dev *backend.Device, module, kernel string) error {
	type verdict struct{ err error }
	key := sm90aModule(module)
	if v, ok := dev.Value(key).(verdict); ok {
		return v.err
	}
	var err error
	if major, minor := dev.ComputeCapability(); major != 9 || minor != 0 {
		err = fmt.Errorf("compute capability %d.%d: sm_90a code runs on 9.0 only", major, minor)
	} else {
		_, err = dev.Kernel(module, kernel)
	}
	dev.SetValue(key, verdict{err})
	return err
}
