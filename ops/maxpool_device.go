// The device side of MaxPool2d: kernels/maxpool.cu.

package ops

import (
	"fmt"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// maxPoolMaxBlocks bounds the grid of the max-pooling kernels; their
// grid-stride loops cover any size, and every element's result is its own,
// so the grid changes no result.
const maxPoolMaxBlocks = 1 << 20

// tiled says whether the backward takes maxpool_bwd_tiled: windows of more
// than one pixel (a window of one is found at once), and a tile of
// MaxPool2dTileH x MaxPool2dTileW input pixels whose windows and the
// pixels they read fit its shared memory (the ResNet stem's 17 x 17
// windows on 35 x 35 pixels do). The per-pixel kernel takes the others.
func (s maxPoolShape) tiled() bool {
	p := s.p
	rows := (cuda.MaxPool2dTileH+p.KH-2)/p.StrideH + 1
	cols := (cuda.MaxPool2dTileW+p.KW-2)/p.StrideW + 1
	pixels := ((rows-1)*p.StrideH + p.KH) * ((cols-1)*p.StrideW + p.KW)
	return p.KH*p.KW > 1 && rows*cols <= cuda.MaxPool2dTileWindows && pixels <= cuda.MaxPool2dTileRegion
}

// launch queues the forward (dy == 0: x -> out = y) or the backward (x, dy
// -> out = dx) kernel of s.
func (s maxPoolShape) launch(op string, dev *backend.Device, backward bool, x, dy, out backend.DevicePtr) error {
	p := s.p
	if err := fitsInt32(op, namedSize{"H*W", p.H * p.W}, namedSize{"OutH*OutW", p.OutH * p.OutW}); err != nil {
		return err
	}
	get, blocks := cuda.MaxPoolFwd, ceilDiv(p.Planes*p.OutH*p.OutW, cuda.MaxPool2dThreads)
	switch {
	case backward && s.tiled():
		get = cuda.MaxPoolBwdTiled
		if p.KH == 3 && p.KW == 3 {
			get = cuda.MaxPoolBwdTiledK3
		}
		blocks = p.Planes * ceilDiv(p.H, cuda.MaxPool2dTileH) * ceilDiv(p.W, cuda.MaxPool2dTileW)
	case backward:
		get, blocks = cuda.MaxPoolBwd, ceilDiv(p.Planes*p.H*p.W, cuda.MaxPool2dThreads)
	}
	k, err := get(s.dt)
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	cfg := backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(min(blocks, maxPoolMaxBlocks)), Y: 1, Z: 1},
		Block: backend.Dim3{X: cuda.MaxPool2dThreads, Y: 1, Z: 1},
	}
	args := cuda.MaxPool2dParams{
		X: x, DY: dy, Out: out, Planes: int64(p.Planes),
		H: int32(p.H), W: int32(p.W), OutH: int32(p.OutH), OutW: int32(p.OutW),
		KH: int32(p.KH), KW: int32(p.KW), StrideH: int32(p.StrideH), StrideW: int32(p.StrideW),
		PadH: int32(p.PadH), PadW: int32(p.PadW),
	}
	if err := k.Launch(dev, cfg, args); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	return nil
}

// forwardDevice is maxPoolOp's device launcher.
func (s maxPoolShape) forwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	y, yPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	if err := s.launch("MaxPool2d", a.dev, false, a.ptr[0], 0, yPtr); err != nil {
		return nil, err
	}
	return y, nil
}

// backwardDevice is maxPoolGradOp's device launcher.
func (s maxPoolShape) backwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	dx, dxPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	if err := s.launch("MaxPool2d backward", a.dev, true, a.ptr[0], a.ptr[1], dxPtr); err != nil {
		return nil, err
	}
	return dx, nil
}
