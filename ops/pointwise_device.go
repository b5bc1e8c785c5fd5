// The device side of the elementwise ops and the sums: kernels/pointwise.cu.

package ops

import (
	"fmt"
	"math"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// The CPU twins and the kernels agree on the opcodes and the sums'
// geometry.
var (
	_ = [1]struct{}{}[int(kernels.PointwiseOps)-cuda.PointwiseOps]
	_ = [1]struct{}{}[int(kernels.PointwiseScale)-cuda.PointwiseScale]
	_ = [1]struct{}{}[int(kernels.PointwiseReLU)-cuda.PointwiseReLU]
	_ = [1]struct{}{}[int(kernels.PointwiseSigmoid)-cuda.PointwiseSigmoid]
	_ = [1]struct{}{}[int(kernels.PointwiseInverseSigmoid)-cuda.PointwiseInverseSigmoid]
	_ = [1]struct{}{}[int(kernels.PointwiseExp)-cuda.PointwiseExp]
	_ = [1]struct{}{}[int(kernels.PointwiseLog)-cuda.PointwiseLog]
	_ = [1]struct{}{}[int(kernels.PointwiseSqrt)-cuda.PointwiseSqrt]
	_ = [1]struct{}{}[int(kernels.PointwiseSquare)-cuda.PointwiseSquare]
	_ = [1]struct{}{}[int(kernels.PointwiseFill)-cuda.PointwiseFill]
	_ = [1]struct{}{}[int(kernels.PointwiseAdd)-cuda.PointwiseAdd]
	_ = [1]struct{}{}[int(kernels.PointwiseSub)-cuda.PointwiseSub]
	_ = [1]struct{}{}[int(kernels.PointwiseMul)-cuda.PointwiseMul]
	_ = [1]struct{}{}[int(kernels.PointwiseDiv)-cuda.PointwiseDiv]
	_ = [1]struct{}{}[int(kernels.PointwiseNegDiv)-cuda.PointwiseNegDiv]
	_ = [1]struct{}{}[int(kernels.PointwiseReLUGrad)-cuda.PointwiseReLUGrad]
	_ = [1]struct{}{}[int(kernels.PointwiseSigmoidGrad)-cuda.PointwiseSigmoidGrad]
	_ = [1]struct{}{}[int(kernels.PointwiseSqrtGrad)-cuda.PointwiseSqrtGrad]
	_ = [1]struct{}{}[int(kernels.PointwiseSquareGrad)-cuda.PointwiseSquareGrad]
	_ = [1]struct{}{}[int(kernels.PointwiseInverseSigmoidGrad)-cuda.PointwiseInverseSigmoidGrad]
	_ = [1]struct{}{}[kernels.PointwiseMaxDims-cuda.PointwiseMaxDims]
	_ = [1]struct{}{}[kernels.ReduceThreads-cuda.ReduceThreads]
	_ = [1]struct{}{}[kernels.ReduceWarpRow-cuda.ReduceWarpRow]
)

// pointwiseThreads is the elementwise kernels' block; pointwiseMaxBlocks
// caps their grid (the grid-stride loops do the rest).
const (
	pointwiseThreads   = 256
	pointwiseMaxBlocks = 1 << 20
)

// pointwiseLaunch returns the grid of an elementwise kernel doing work
// vectors (or elements): cuda.PointwiseUnroll per thread, capped.
func pointwiseLaunch(work int) backend.LaunchConfig {
	return backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(max(1, min(ceilDiv(work, pointwiseThreads*cuda.PointwiseUnroll), pointwiseMaxBlocks))), Y: 1, Z: 1},
		Block: backend.Dim3{X: pointwiseThreads, Y: 1, Z: 1},
	}
}

// vecElems is the elements of a 16-byte vector of dt.
func vecElems(dt tensor.Dtype) int { return 16 / int(dt.Size()) }

// launchMap queues the map kernel: out = op(a, b) over n elements of
// operands of out's shape (a and b 0 where op does not read them), with
// 16-byte vectors when every pointer op touches is aligned.
func launchMap(name string, dev *backend.Device, dt tensor.Dtype, op kernels.PointwiseOp, alpha float64, a, b, out backend.DevicePtr, n int) error {
	aligned := out%16 == 0 && (op.Arity() < 1 || a%16 == 0) && (op.Arity() < 2 || b%16 == 0)
	pick, work := cuda.PointwiseMap, n
	if aligned {
		pick, work = cuda.PointwiseMapV16b, n/vecElems(dt)
	}
	k, err := pick(dt)
	if err == nil {
		err = k.Launch(dev, pointwiseLaunch(work), cuda.PointwiseParams{A: a, B: b, Out: out, N: int64(n), Alpha: alpha, Op: int32(op), Rank: 1})
	}
	if err != nil {
		return fmt.Errorf("ops: %s: %w", name, err)
	}
	return nil
}

// launchBroadcast queues the bcast kernel for s, with vectors of V outputs
// where the collapsed shape allows them (kernels.BroadcastParams.VectorOK)
// and the pointers read as vectors are aligned.
func (s pointwiseShape) launchBroadcast(dev *backend.Device, a, b, out backend.DevicePtr) error {
	bp := s.bp
	v := vecElems(s.dt)
	readA, readB := s.op.Arity() >= 1, s.op.Arity() >= 2
	aligned := out%16 == 0 &&
		(!readA || bp.StrideA[bp.Rank-1] != 1 || a%16 == 0) &&
		(!readB || bp.StrideB[bp.Rank-1] != 1 || b%16 == 0)
	pick, work := cuda.PointwiseBcast, bp.N
	if aligned && bp.VectorOK(v, readA, readB) {
		pick, work = cuda.PointwiseBcastV16b, bp.N/v
	}
	args := cuda.PointwiseParams{A: a, B: b, Out: out, N: int64(bp.N), Alpha: s.alpha, Op: int32(s.op), Rank: int32(bp.Rank)}
	for d := range bp.Rank {
		args.Shape[d], args.StrideA[d], args.StrideB[d] = int64(bp.Shape[d]), int64(bp.StrideA[d]), int64(bp.StrideB[d])
	}
	k, err := pick(s.dt)
	if err == nil {
		err = k.Launch(dev, pointwiseLaunch(work), args)
	}
	if err != nil {
		return fmt.Errorf("ops: %s: %w", s.name, err)
	}
	return nil
}

// device is pointwiseOp's device launcher.
func (s pointwiseShape) device(a *deviceArgs) (*tensor.Dense, error) {
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	var pa, pb backend.DevicePtr
	if s.op.Arity() >= 1 {
		pa = a.ptr[0]
	}
	if s.op.Arity() >= 2 {
		pb = a.ptr[1]
	}
	if s.same {
		err = launchMap(s.name, a.dev, s.dt, s.op, s.alpha, pa, pb, outPtr, s.out.TotalSize())
	} else {
		err = s.launchBroadcast(a.dev, pa, pb, outPtr)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// reduceLaunch returns the kernel and launch of one pass of a sum whose
// input starts at in.
func reduceLaunch(dt tensor.Dtype, p kernels.ReducePass, in backend.DevicePtr) (cuda.Kernel[cuda.ReduceParams], backend.LaunchConfig, error) {
	var pick func(tensor.Dtype) (cuda.Kernel[cuda.ReduceParams], error)
	grid := backend.Dim3{Y: 1, Z: 1}
	var blocks int
	switch {
	case p.Cols:
		pick = cuda.ReduceCols
		blocks = p.Outer * ceilDiv(p.Inner, p.BX)
		grid.Y = uint32(p.Parts)
		if p.Parts > math.MaxUint16 {
			return "", backend.LaunchConfig{}, fmt.Errorf("%d parts do not fit a CUDA grid's y", p.Parts)
		}
	case p.Warp:
		pick = cuda.ReduceRowsWarp
		blocks = ceilDiv(p.Outer*p.Lanes, kernels.ReduceThreads)
	default:
		pick = cuda.ReduceRowsBlock
		v := vecElems(dt)
		if p.R%v == 0 && p.Chunk%v == 0 && in%16 == 0 {
			pick = cuda.ReduceRowsBlockV16b
		}
		blocks = p.Outer * p.Parts
	}
	if blocks > math.MaxInt32 {
		return "", backend.LaunchConfig{}, fmt.Errorf("%d blocks do not fit a CUDA grid", blocks)
	}
	grid.X = uint32(blocks)
	k, err := pick(dt)
	return k, backend.LaunchConfig{Grid: grid, Block: backend.Dim3{X: kernels.ReduceThreads, Y: 1, Z: 1}}, err
}

// device is reduceOp's device launcher: the plan's passes, the
// intermediate sums in scratch memory.
func (s reduceShape) device(a *deviceArgs) (*tensor.Dense, error) {
	dev := a.dev
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	if len(s.plan.Passes) == 0 {
		if err := launchMap(s.name, dev, s.dt, kernels.PointwiseScale, s.alpha, a.ptr[0], 0, outPtr, s.plan.Out); err != nil {
			return nil, err
		}
		return out, nil
	}
	src := a.ptr[0]
	for i, p := range s.plan.Passes {
		dst := outPtr
		if i < len(s.plan.Passes)-1 {
			// Scratch memory, not a tensor: nothing but the kernels
			// reads it.
			scratch, err := dev.Alloc(int64(p.Outputs()) * int64(s.dt.Size()))
			if err != nil {
				return nil, fmt.Errorf("ops: %s: partial sums: %w", s.name, err)
			}
			// Freeing once the launches that use it are queued is safe:
			// the Device's work runs in order on its one stream.
			defer dev.Free(scratch)
			dst = scratch
		}
		k, cfg, err := reduceLaunch(s.dt, p, src)
		if err == nil {
			err = k.Launch(dev, cfg, cuda.ReduceParams{
				In: src, Out: dst, Outer: int64(p.Outer), R: int64(p.R), Inner: int64(p.Inner),
				Chunk: int64(p.Chunk), Parts: int64(p.Parts), Alpha: p.Alpha, Lanes: int32(p.Lanes), BX: int32(p.BX),
			})
		}
		if err != nil {
			return nil, fmt.Errorf("ops: %s: %w", s.name, err)
		}
		src = dst
	}
	return out, nil
}
