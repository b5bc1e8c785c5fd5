package autograd

import (
	"fmt"

	"gorgonia.org/tensor"
)

// copyRange copies dst.Size() elements of src, starting at element offset,
// into dst. Both live in host memory.
func copyRange(dst, src *tensor.Dense, offset int) error {
	n := dst.Shape().TotalSize()
	switch s := src.Data().(type) {
	case []float32:
		copy(dst.Data().([]float32), s[offset:offset+n])
	case []float64:
		copy(dst.Data().([]float64), s[offset:offset+n])
	default:
		return fmt.Errorf("unsupported dtype %v", src.Dtype())
	}
	return nil
}
