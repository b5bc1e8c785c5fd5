package autograd

import (
	"fmt"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

// part returns elements [offset, offset+size of shape) of the contiguous
// vector src as a tensor of that shape, in the memory src lives in (host or
// device). prealloc is reused when it fits.
func part(prealloc any, src *tensor.Dense, offset int, shape tensor.Shape) (*tensor.Dense, error) {
	n := shape.TotalSize()
	if !backend.IsDevice(src) {
		dst, ok := prealloc.(*tensor.Dense)
		if !ok || dst.Dtype() != src.Dtype() || !dst.Shape().Eq(shape) || dst.IsView() || backend.IsDevice(dst) {
			dst = tensor.New(tensor.Of(src.Dtype()), tensor.WithShape(shape...))
		}
		switch src.Dtype() {
		case tensor.Float32:
			copy(dst.Float32s(), src.Float32s()[offset:offset+n])
		case tensor.Float64:
			copy(dst.Float64s(), src.Float64s()[offset:offset+n])
		default:
			return nil, fmt.Errorf("unsupported dtype %v", src.Dtype())
		}
		return dst, nil
	}
	dev, err := backend.DeviceOf(src)
	if err != nil {
		return nil, err
	}
	dst, ok := prealloc.(*tensor.Dense)
	if !ok || dst.Dtype() != src.Dtype() || !dst.Shape().Eq(shape) || dst.IsView() || !dev.Owns(dst) {
		if dst, err = dev.NewDense(src.Dtype(), shape...); err != nil {
			return nil, err
		}
	}
	base, err := dev.Ptr(src)
	if err != nil {
		return nil, err
	}
	size := int64(src.Dtype().Size())
	from := backend.Memory{Ptr: base + backend.DevicePtr(int64(offset)*size), Size: int64(n) * size}
	if err := dev.Engine().Memcpy(dst, from); err != nil {
		return nil, err
	}
	return dst, nil
}
