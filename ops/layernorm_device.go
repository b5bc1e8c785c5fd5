// The device side of LayerNorm: kernels/layernorm.cu.

package ops

import (
	"fmt"
	"math"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// The CPU twins add in the kernels' order only if both sides agree on the
// geometry.
var (
	_ = [1]struct{}{}[kernels.LayerNormWarps-cuda.LayerNormWarps]
	_ = [1]struct{}{}[kernels.LayerNormWarpRowBytes-cuda.LayerNormWarpRowBytes]
	_ = [1]struct{}{}[kernels.ColSumWarps-cuda.ColSumWarps]
)

// layerNormPass is one of the row kernels' three passes.
type layerNormPass int

const (
	lnForward layerNormPass = iota
	lnBackwardDX
	lnBackwardParams
)

// layerNormKernels are each pass's kernels by design, picked by dtype.
var layerNormKernels = [...]struct {
	row1k, row4k, blockV16b, block func(tensor.Dtype) (cuda.Kernel[cuda.LayerNormParams], error)
}{
	lnForward:        {cuda.LayerNormFwdWarpRow1k, cuda.LayerNormFwdWarpRow4k, cuda.LayerNormFwdBlockV16b, cuda.LayerNormFwdBlock},
	lnBackwardDX:     {cuda.LayerNormBwdDXWarpRow1k, cuda.LayerNormBwdDXWarpRow4k, cuda.LayerNormBwdDXBlockV16b, cuda.LayerNormBwdDXBlock},
	lnBackwardParams: {cuda.LayerNormBwdParamsWarpRow1k, cuda.LayerNormBwdParamsWarpRow4k, cuda.LayerNormBwdParamsBlockV16b, cuda.LayerNormBwdParamsBlock},
}

// layerNormLaunch returns pass's kernel for p and its launch: a warp per
// row (row1k for rows of up to 1 KiB, whose registers leave room for more
// warps, else row4k) when p.Warp, else a block of p.Threads per row (v16b
// when the row is whole 16-byte chunks). The params pass runs p.Blocks
// blocks, which fix its partial sums; the others take a block per 8 rows
// (warp) or per row, the grid-stride loops doing the rest past 2^31-1.
func (s layerNormShape) layerNormLaunch(pass layerNormPass, p kernels.LayerNormParams) (cuda.Kernel[cuda.LayerNormParams], backend.LaunchConfig, error) {
	ks := layerNormKernels[pass]
	pick := ks.block
	threads, grid := p.Threads, p.Rows
	switch {
	case p.Warp && p.C*int(s.dt.Size()) <= cuda.LayerNormRow1kBytes:
		pick = ks.row1k
	case p.Warp:
		pick = ks.row4k
	case p.Vec > 1:
		pick = ks.blockV16b
	}
	if p.Warp {
		threads, grid = 32*cuda.LayerNormWarps, ceilDiv(p.Rows, cuda.LayerNormWarps)
	}
	if pass == lnBackwardParams {
		grid = p.Blocks
	}
	k, err := pick(s.dt)
	cfg := backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(min(grid, math.MaxInt32)), Y: 1, Z: 1},
		Block: backend.Dim3{X: uint32(threads), Y: 1, Z: 1},
	}
	return k, cfg, err
}

// kernelArgs is the row kernels' params but for the tensors.
func (s layerNormShape) kernelArgs(p kernels.LayerNormParams) cuda.LayerNormParams {
	return cuda.LayerNormParams{Rows: int64(p.Rows), Eps: p.Eps, C: int32(p.C)}
}

// checkDevice checks what the kernels carry as C ints.
func (s layerNormShape) checkDevice(op string) error {
	return fitsInt32(op, namedSize{"C (x's last dimension)", s.c}, namedSize{"C times the column sums", s.sums() * s.c})
}

func (s layerNormShape) launchRows(op string, dev *backend.Device, pass layerNormPass, p kernels.LayerNormParams, args cuda.LayerNormParams) error {
	k, cfg, err := s.layerNormLaunch(pass, p)
	if err == nil {
		err = k.Launch(dev, cfg, args)
	}
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	return nil
}

// forwardDevice is layerNormOp's device launcher.
func (s layerNormShape) forwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "LayerNorm"
	if err := s.checkDevice(name); err != nil {
		return nil, err
	}
	p := s.params()
	args := s.kernelArgs(p)
	args.X = a.ptr[0]
	i := 1
	if s.gamma {
		args.Gamma, i = a.ptr[i], i+1
	}
	if s.beta {
		args.Beta = a.ptr[i]
	}
	y, yPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	args.Out = yPtr
	if err := s.launchRows(name, a.dev, lnForward, p, args); err != nil {
		return nil, err
	}
	return y, nil
}

// gradXDevice is layerNormGradXOp's device launcher.
func (s layerNormShape) gradXDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "LayerNorm backward"
	if err := s.checkDevice(name); err != nil {
		return nil, err
	}
	p := s.params()
	args := s.kernelArgs(p)
	args.X, args.DY = a.ptr[0], a.ptr[len(a.ptr)-1]
	if s.gamma {
		args.Gamma = a.ptr[1]
	}
	dx, dxPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	args.Out = dxPtr
	if err := s.launchRows(name, a.dev, lnBackwardDX, p, args); err != nil {
		return nil, err
	}
	return dx, nil
}

// gradParamsDevice is layerNormGradParamsOp's device launcher: the partial
// sums of p.Blocks blocks into scratch memory, then colsum into the output.
func (s layerNormShape) gradParamsDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "LayerNorm backward"
	if err := s.checkDevice(name); err != nil {
		return nil, err
	}
	dev := a.dev
	p := s.params()
	args := s.kernelArgs(p)
	args.DY = a.ptr[len(a.ptr)-1]
	if s.gamma {
		args.X = a.ptr[0]
	}
	args.Dgamma, args.Dbeta = boolInt32(s.gamma), boolInt32(s.beta)
	n := s.sums() * s.c
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	partial, err := dev.NewDense(s.dt, p.Blocks*n)
	if err != nil {
		return nil, fmt.Errorf("ops: %s: partial sums: %w", name, err)
	}
	// Freeing once the launches that use it are queued is safe: the
	// Device's work runs in order on its one stream.
	defer dev.FreeDense(partial)
	if args.Out, err = dev.Ptr(partial); err != nil {
		return nil, fmt.Errorf("ops: %s: partial sums: %w", name, err)
	}
	if err := s.launchRows(name, dev, lnBackwardParams, p, args); err != nil {
		return nil, err
	}
	k, err := cuda.LayerNormColSum(s.dt)
	if err == nil {
		err = k.Launch(dev, backend.LaunchConfig{
			Grid:  backend.Dim3{X: uint32(ceilDiv(n, 32)), Y: 1, Z: 1},
			Block: backend.Dim3{X: 32 * cuda.ColSumWarps, Y: 1, Z: 1},
		}, cuda.ColSumParams{In: args.Out, Out: outPtr, Rows: int64(p.Blocks), Cols: int32(n)})
	}
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", name, err)
	}
	return out, nil
}
