// The device side of Dropout: kernels/dropout.cu.

package ops

import (
	"fmt"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// dropoutMaxBlocks bounds the dropout kernel's grid; its grid-stride loop
// covers any size, and the mask depends on the element's index alone, so
// the grid changes no result.
const dropoutMaxBlocks = 1 << 20

// device returns the device launcher of the op named op: y = x * mask *
// scale (forward) or dx = dy * mask * scale (backward), the mask of the
// step current when it runs.
func (s dropoutShape) device(op string) func(a *deviceArgs) (*tensor.Dense, error) {
	return func(a *deviceArgs) (*tensor.Dense, error) {
		y, yPtr, err := a.output()
		if err != nil {
			return nil, err
		}
		p := s.params()
		get := cuda.Dropout
		if (a.ptr[0]|yPtr)%16 == 0 {
			get = cuda.DropoutV16b
		}
		k, err := get(s.dt)
		if err != nil {
			return nil, fmt.Errorf("ops: %s: %w", op, err)
		}
		groups := ceilDiv(p.N, 4)
		cfg := backend.LaunchConfig{
			Grid:  backend.Dim3{X: uint32(min(ceilDiv(groups, cuda.DropoutThreads), dropoutMaxBlocks)), Y: 1, Z: 1},
			Block: backend.Dim3{X: cuda.DropoutThreads, Y: 1, Z: 1},
		}
		args := cuda.DropoutParams{
			X: a.ptr[0], Out: yPtr, N: int64(p.N),
			Seed: int64(p.Seed), Step: int64(p.Step), Keep: int64(p.Keep), Scale: p.Scale, Stream: p.Stream,
		}
		if err := k.Launch(a.dev, cfg, args); err != nil {
			return nil, fmt.Errorf("ops: %s: %w", op, err)
		}
		return y, nil
	}
}
