// The device side of GroupNorm: kernels/groupnorm.cu.

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
	_ = [1]struct{}{}[kernels.GroupNormThreads-cuda.GroupNormThreads]
	_ = [1]struct{}{}[kernels.GroupNormTile-cuda.GroupNormTile]
	_ = [1]struct{}{}[kernels.GroupNormRowStats-cuda.GroupNormRowStats]
	_ = [1]struct{}{}[kernels.GroupNormInlineRowPartials-cuda.GroupNormInlineRowPartials]
)

// groupNormTilePass is one of the tile kernels' passes.
type groupNormTilePass int

const (
	gnStats groupNormTilePass = iota
	gnForward
	gnBackwardReduce
	gnBackwardDX
)

// groupNormKernels are each tile pass's kernels, v16b for planes of whole
// 16-byte chunks (p.Vec > 1), else scalar; picked by dtype.
var groupNormKernels = [...]struct {
	v16b, scalar func(tensor.Dtype) (cuda.Kernel[cuda.GroupNormParams], error)
}{
	gnStats:          {cuda.GroupNormStatsV16b, cuda.GroupNormStatsScalar},
	gnForward:        {cuda.GroupNormFwdV16b, cuda.GroupNormFwdScalar},
	gnBackwardReduce: {cuda.GroupNormBwdReduceV16b, cuda.GroupNormBwdReduceScalar},
	gnBackwardDX:     {cuda.GroupNormBwdDXV16b, cuda.GroupNormBwdDXScalar},
}

// groupNormLaunch returns pass's kernel for p and its launch: a block of
// GroupNormThreads threads per tile, the grid-stride loops taking the
// tiles past 2^31-1 blocks.
func (s groupNormShape) groupNormLaunch(pass groupNormTilePass, p kernels.GroupNormParams) (cuda.Kernel[cuda.GroupNormParams], backend.LaunchConfig, error) {
	pick := groupNormKernels[pass].scalar
	if p.Vec > 1 {
		pick = groupNormKernels[pass].v16b
	}
	k, err := pick(s.dt)
	cfg := backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(min(p.N*p.C*p.Tiles, math.MaxInt32)), Y: 1, Z: 1},
		Block: backend.Dim3{X: cuda.GroupNormThreads, Y: 1, Z: 1},
	}
	return k, cfg, err
}

// kernelArgs is the kernels' params but for the tensors.
func (s groupNormShape) kernelArgs(p kernels.GroupNormParams) cuda.GroupNormParams {
	return cuda.GroupNormParams{
		HW: int64(p.HW), Eps: p.Eps, N: int32(p.N), C: int32(p.C), Groups: int32(p.Groups), Tiles: int32(p.Tiles),
	}
}

// checkDevice checks what the kernels carry as C ints.
func (s groupNormShape) checkDevice(op string) error {
	return fitsInt32(op, namedSize{"N (x's dimension 0)", s.n}, namedSize{"C times the channel sums", max(s.sums(), 1) * s.c})
}

func (s groupNormShape) launchTiles(op string, dev *backend.Device, pass groupNormTilePass, p kernels.GroupNormParams, args cuda.GroupNormParams) error {
	k, cfg, err := s.groupNormLaunch(pass, p)
	if err == nil {
		err = k.Launch(dev, cfg, args)
	}
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	return nil
}

// partials allocates the tile sums, stride float64 a tile, and sets
// args.Partial; the caller frees them with dev.FreeDense once its launches
// are queued (the Device's work runs in order on its one stream).
func (s groupNormShape) partials(op string, dev *backend.Device, p kernels.GroupNormParams, stride int, args *cuda.GroupNormParams) (*tensor.Dense, error) {
	t, err := dev.NewDense(tensor.Float64, p.N*p.C*p.Tiles*stride)
	if err != nil {
		return nil, fmt.Errorf("ops: %s: tile sums: %w", op, err)
	}
	if args.Partial, err = dev.Ptr(t); err != nil {
		dev.FreeDense(t)
		return nil, fmt.Errorf("ops: %s: tile sums: %w", op, err)
	}
	return t, nil
}

// forwardDevice is groupNormOp's device launcher: stats into the tile
// sums, then fwd; between them, for rows of more tile sums than fwd's
// blocks should each add, stats_rows, a warp per row.
func (s groupNormShape) forwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "GroupNorm"
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
	partial, err := s.partials(name, a.dev, p, 2, &args)
	if err != nil {
		return nil, err
	}
	defer a.dev.FreeDense(partial)
	if err := s.launchTiles(name, a.dev, gnStats, p, args); err != nil {
		return nil, err
	}
	if p.RowPartials() > cuda.GroupNormInlineRowPartials {
		rows, err := a.dev.NewDense(tensor.Float64, p.Rows()*2)
		if err != nil {
			return nil, fmt.Errorf("ops: %s: row statistics: %w", name, err)
		}
		defer a.dev.FreeDense(rows)
		if args.Sums, err = a.dev.Ptr(rows); err != nil {
			return nil, fmt.Errorf("ops: %s: row statistics: %w", name, err)
		}
		if err := s.launchRows(name, a.dev, cuda.GroupNormStatsRows, p, args); err != nil {
			return nil, err
		}
	}
	if err := s.launchTiles(name, a.dev, gnForward, p, args); err != nil {
		return nil, err
	}
	return y, nil
}

// gradSumsDevice is groupNormGradSumsOp's device launcher: bwd_reduce into
// the tile sums, then bwd_finalize, a warp per row, into the output.
func (s groupNormShape) gradSumsDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "GroupNorm backward"
	if err := s.checkDevice(name); err != nil {
		return nil, err
	}
	p := s.params()
	args := s.kernelArgs(p)
	args.X, args.DY = a.ptr[0], a.ptr[len(a.ptr)-1]
	if s.gamma {
		args.Gamma = a.ptr[1]
	}
	sums, sumsPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	args.Sums = sumsPtr
	partial, err := s.partials(name, a.dev, p, 4, &args)
	if err != nil {
		return nil, err
	}
	defer a.dev.FreeDense(partial)
	if err := s.launchTiles(name, a.dev, gnBackwardReduce, p, args); err != nil {
		return nil, err
	}
	if err := s.launchRows(name, a.dev, cuda.GroupNormBwdFinalize, p, args); err != nil {
		return nil, err
	}
	return sums, nil
}

// launchRows launches a kernel of a warp per row (stats_rows,
// bwd_finalize), the grid-stride loop taking the rows past 2^31-1.
func (s groupNormShape) launchRows(op string, dev *backend.Device, kernel func(tensor.Dtype) (cuda.Kernel[cuda.GroupNormParams], error), p kernels.GroupNormParams, args cuda.GroupNormParams) error {
	k, err := kernel(s.dt)
	if err == nil {
		err = k.Launch(dev, backend.LaunchConfig{
			Grid:  backend.Dim3{X: uint32(min(p.Rows(), math.MaxInt32)), Y: 1, Z: 1},
			Block: backend.Dim3{X: 32, Y: 1, Z: 1},
		}, args)
	}
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	return nil
}

// gradXDevice is groupNormGradXOp's device launcher.
func (s groupNormShape) gradXDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "GroupNorm backward"
	if err := s.checkDevice(name); err != nil {
		return nil, err
	}
	p := s.params()
	args := s.kernelArgs(p)
	args.X, args.DY, args.Sums = a.ptr[0], a.ptr[len(a.ptr)-2], a.ptr[len(a.ptr)-1]
	if s.gamma {
		args.Gamma = a.ptr[1]
	}
	dx, dxPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	args.Out = dxPtr
	if err := s.launchTiles(name, a.dev, gnBackwardDX, p, args); err != nil {
		return nil, err
	}
	return dx, nil
}

// gradParamsDevice is groupNormGradParamsOp's device launcher: a thread
// per channel.
func (s groupNormShape) gradParamsDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "GroupNorm backward"
	if err := s.checkDevice(name); err != nil {
		return nil, err
	}
	p := s.params()
	args := s.kernelArgs(p)
	args.Sums = a.ptr[0]
	args.Dgamma, args.Dbeta = boolInt32(s.gamma), boolInt32(s.beta)
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	args.Out = outPtr
	k, err := cuda.GroupNormBwdParams(s.dt)
	if err == nil {
		err = k.Launch(a.dev, backend.LaunchConfig{
			Grid:  backend.Dim3{X: uint32(ceilDiv(s.c, cuda.GroupNormThreads)), Y: 1, Z: 1},
			Block: backend.Dim3{X: cuda.GroupNormThreads, Y: 1, Z: 1},
		}, args)
	}
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", name, err)
	}
	return out, nil
}
