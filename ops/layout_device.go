// The device side of Permute, Concat, Slice, Reshape, Detach and
// GatherRows: kernels/layout.cu.

package ops

import (
	"fmt"
	"math"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// layoutUnit is the widest unit of 16, 8 or elem bytes that divides every
// byte count and address in vals: the copies move units, whatever the
// dtype.
func layoutUnit(elem int, vals ...int64) int {
	for _, u := range []int64{16, 8} {
		if u <= int64(elem) {
			break
		}
		ok := true
		for _, v := range vals {
			ok = ok && v%u == 0
		}
		if ok {
			return int(u)
		}
	}
	return elem
}

// permutePlan is a permutation's kernel, params and launch.
type permutePlan struct {
	k    cuda.Kernel[cuda.PermuteParams]
	args cuda.PermuteParams
	cfg  backend.LaunchConfig
}

// permuteCopyKernels are permute_copy's kernels by unit (4, 8, 16 bytes),
// with 64-bit and 32-bit index arithmetic.
var permuteCopyKernels = map[int][2]cuda.Kernel[cuda.PermuteParams]{
	4:  {cuda.LayoutPermuteCopyB4, cuda.LayoutPermuteCopyB4I32},
	8:  {cuda.LayoutPermuteCopyB8, cuda.LayoutPermuteCopyB8I32},
	16: {cuda.LayoutPermuteCopyB16, cuda.LayoutPermuteCopyB16I32},
}

// permuteMaxBlocks caps permute_copy's grid; its threads stride over the
// rest.
const permuteMaxBlocks = 1 << 16

// permutePlanFor picks permute_copy when the innermost axis stays (units as
// wide as the innermost run's bytes and the addresses allow: every input
// stride is a multiple of that run) and permute_tile when it moves.
func permutePlanFor(p kernels.PermuteParams, elem int, in, out backend.DevicePtr) (permutePlan, error) {
	var a cuda.PermuteParams
	a.In, a.Out = in, out
	a.Rank = int32(len(p.Dims))
	total := 1
	for k, d := range p.Dims {
		a.Dims[k], a.InStrides[k], a.OutStrides[k] = int64(d), int64(p.InStrides[k]), int64(p.OutStrides[k])
		total *= d
	}
	last := len(p.Dims) - 1
	if p.TileAxis < 0 {
		u := layoutUnit(elem, int64(p.Dims[last]*elem), int64(in), int64(out))
		f := int64(u / elem)
		a.Dims[last] /= f
		for k := range last {
			a.InStrides[k] /= f
		}
		a.Total = int64(total) / f
		blocks := min(ceilDiv(int(a.Total), cuda.LayoutThreads), permuteMaxBlocks)
		wide := 0
		if a.Total+int64(blocks*cuda.LayoutThreads) > math.MaxInt32 {
			wide = 1
		}
		pick := permuteCopyKernels[u]
		return permutePlan{k: pick[1-wide], args: a, cfg: backend.LaunchConfig{
			Grid:  backend.Dim3{X: uint32(blocks), Y: 1, Z: 1},
			Block: backend.Dim3{X: cuda.LayoutThreads, Y: 1, Z: 1},
		}}, nil
	}
	a.TileAxis = int32(p.TileAxis)
	a.Total = int64(total)
	a.Batch = int64(total / (p.Dims[p.TileAxis] * p.Dims[last]))
	k := cuda.LayoutPermuteTileB4
	if elem == 8 {
		k = cuda.LayoutPermuteTileB8
	}
	gy := ceilDiv(p.Dims[p.TileAxis], cuda.LayoutTile)
	if gy > 65535 {
		return permutePlan{}, fmt.Errorf("axis of %d elements needs %d tiles, more than a CUDA grid's 65535", p.Dims[p.TileAxis], gy)
	}
	return permutePlan{k: k, args: a, cfg: backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(ceilDiv(p.Dims[last], cuda.LayoutTile)), Y: uint32(gy), Z: uint32(min(int(a.Batch), 65535))},
		Block: backend.Dim3{X: cuda.LayoutTile, Y: cuda.LayoutTileRowsPerPass, Z: 1},
	}}, nil
}

// device is permuteOp's device launcher.
func (s permuteShape) device(a *deviceArgs) (*tensor.Dense, error) {
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	pl, err := permutePlanFor(s.params(), int(s.dt.Size()), a.ptr[0], outPtr)
	if err == nil {
		err = pl.k.Launch(a.dev, pl.cfg, pl.args)
	}
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", s.op, err)
	}
	return out, nil
}

// copyRowsPlan is copy_rows' kernel and launch for rows x cols elements of
// elem bytes between src and dst (row strides in elements).
func copyRowsPlan(elem, rows, cols, srcStride, dstStride int, src, dst backend.DevicePtr) (cuda.Kernel[cuda.CopyRowsParams], cuda.CopyRowsParams, backend.LaunchConfig) {
	vals := []int64{int64(cols * elem), int64(src), int64(dst)}
	if rows > 1 {
		vals = append(vals, int64(srcStride*elem), int64(dstStride*elem))
	}
	u := layoutUnit(elem, vals...)
	f := u / elem
	args := cuda.CopyRowsParams{
		Src: src, Dst: dst, Rows: int64(rows), Cols: int64(cols / f),
		SrcStride: int64(srcStride / f), DstStride: int64(dstStride / f),
	}
	k := map[int]cuda.Kernel[cuda.CopyRowsParams]{4: cuda.LayoutCopyRowsB4, 8: cuda.LayoutCopyRowsB8, 16: cuda.LayoutCopyRowsB16}[u]
	return k, args, rowsLaunch(cols/f, rows)
}

// rowsLaunch is the launch of copy_rows and the gather kernels over rows of
// cols units: blocks of by rows by bx columns (bx a power of two from 32
// covering the row, up to LayoutThreads), grid y striding over the rows.
func rowsLaunch(cols, rows int) backend.LaunchConfig {
	bx := min(cuda.LayoutThreads, max(32, nextPow2(cols)))
	by := cuda.LayoutThreads / bx
	return backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(ceilDiv(cols, bx)), Y: uint32(min(ceilDiv(rows, by), 65535)), Z: 1},
		Block: backend.Dim3{X: uint32(bx), Y: uint32(by), Z: 1},
	}
}

// copyRows queues copy_rows.
func copyRows(op string, dev *backend.Device, dt tensor.Dtype, rows, cols, srcStride, dstStride int, src, dst backend.DevicePtr) error {
	k, args, cfg := copyRowsPlan(int(dt.Size()), rows, cols, srcStride, dstStride, src, dst)
	if err := k.Launch(dev, cfg, args); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	return nil
}

// copyDevice is Reshape's and Detach's device launcher: a copy of the
// input.
func copyDevice(op string, a *deviceArgs) (*tensor.Dense, error) {
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	n := a.spec.out.TotalSize()
	if err := copyRows(op, a.dev, a.spec.dtype, 1, n, n, n, a.ptr[0], outPtr); err != nil {
		return nil, err
	}
	return out, nil
}

// device is concatOp's device launcher: a copy_rows per input into its
// columns of the output's rows.
func (s concatShape) device(a *deviceArgs) (*tensor.Dense, error) {
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	outer, cols, total := s.rows()
	elem := int(s.dt.Size())
	off := 0
	for i, c := range cols {
		dst := outPtr + backend.DevicePtr(off*elem)
		if err := copyRows("Concat", a.dev, s.dt, outer, c, c, total, a.ptr[i], dst); err != nil {
			return nil, err
		}
		off += c
	}
	return out, nil
}

// device is sliceOp's device launcher.
func (s sliceShape) device(a *deviceArgs) (*tensor.Dense, error) {
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	outer, xCols, cols, first := s.rows()
	src := a.ptr[0] + backend.DevicePtr(first*int(s.dt.Size()))
	if err := copyRows("Slice", a.dev, s.dt, outer, cols, xCols, cols, src, outPtr); err != nil {
		return nil, err
	}
	return out, nil
}

// backwardDevice is sliceGradOp's device launcher: zeros, then the
// gradient's rows into their place.
func (s sliceShape) backwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	const op = "Slice backward"
	dx, dxPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	if err := a.dev.Zero(dx); err != nil {
		return nil, fmt.Errorf("ops: %s: %w", op, err)
	}
	outer, xCols, cols, first := s.rows()
	dst := dxPtr + backend.DevicePtr(first*int(s.dt.Size()))
	if err := copyRows(op, a.dev, s.dt, outer, cols, cols, xCols, a.ptr[0], dst); err != nil {
		return nil, err
	}
	return dx, nil
}
