// The device side of UpsampleNearest: kernels/upsample.cu.

package ops

import (
	"fmt"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// upsampleMaxBlocks bounds the grid of the upsampling kernels; their
// grid-stride loops cover any size, and every element's result is its
// own, so the grid changes no result.
const upsampleMaxBlocks = 1 << 20

// launch queues the forward (x -> out = y) or the backward (in = dy -> out
// = dx) kernel of s: the _x2_vec2 kernels for factor 2 where both tensors
// start aligned for their 2-element vectors, else the generic ones.
func (s upsampleShape) launch(op string, dev *backend.Device, backward bool, in, out backend.DevicePtr) error {
	p := s.params()
	if err := fitsInt32(op, namedSize{"W", p.W}, namedSize{"factor", p.Factor}); err != nil {
		return err
	}
	vec := backend.DevicePtr(2 * s.dt.Size())
	x2 := p.Factor == 2 && in%vec == 0 && out%vec == 0
	get := cuda.UpsampleNearestFwd
	switch {
	case backward && x2:
		get = cuda.UpsampleNearestBwdX2Vec2
	case backward:
		get = cuda.UpsampleNearestBwd
	case x2:
		get = cuda.UpsampleNearestFwdX2Vec2
	}
	k, err := get(s.dt)
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	cfg := backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(min(ceilDiv(p.Rows*p.W, cuda.UpsampleThreads), upsampleMaxBlocks)), Y: 1, Z: 1},
		Block: backend.Dim3{X: cuda.UpsampleThreads, Y: 1, Z: 1},
	}
	args := cuda.UpsampleParams{In: in, Out: out, Rows: int64(p.Rows), W: int32(p.W), Factor: int32(p.Factor)}
	if err := k.Launch(dev, cfg, args); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	return nil
}

// forwardDevice is upsampleOp's device launcher.
func (s upsampleShape) forwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	y, yPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	if err := s.launch("UpsampleNearest", a.dev, false, a.ptr[0], yPtr); err != nil {
		return nil, err
	}
	return y, nil
}

// backwardDevice is upsampleGradOp's device launcher.
func (s upsampleShape) backwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	dx, dxPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	if err := s.launch("UpsampleNearest backward", a.dev, true, a.ptr[0], dxPtr); err != nil {
		return nil, err
	}
	return dx, nil
}
