// The device side of Softmax and LogSoftmax: kernels/softmax.cu.

package ops

import (
	"fmt"
	"math"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// softmaxDesign is one of softmax.cu's kernel designs (its header
// describes them).
type softmaxDesign int

const (
	softmaxWarp  softmaxDesign = iota // a lane group per row, the row in registers
	softmaxBlock                      // a block per row, three passes
	softmaxInner                      // a thread per line of stride inner > 1
	softmaxLane                       // warp's kernels with one vector per lane, for rows of up to 32 vectors
)

func (d softmaxDesign) String() string {
	return [...]string{"warp", "block", "inner", "lane"}[d]
}

// softmaxPlan is a softmax kernel's design and launch.
type softmaxPlan struct {
	design softmaxDesign
	vec    bool // 16-byte vector loads and stores
	lanes  int  // warp: lanes per row
	cfg    backend.LaunchConfig
}

// softmaxInnerThreads is the number of threads the inner kernels aim for
// (threadIdx.y splits each line's axis until the grid has this many): a
// couple of thousand per SM of a GPU of 128 SMs. A constant, not the
// device's SM count, so that a shape sums in the same order on every GPU.
const softmaxInnerThreads = 1 << 18

// softmaxPlanFor picks the kernel for x seen as p ([outer, n, inner]) of
// elements of elem bytes; aligned says that the tensors' addresses are
// 16-byte aligned. inner == 1: rows of up to 32*SoftmaxLaneBytes bytes take
// the warp kernels, with as many lanes per row as cover its vectors (up to
// a warp; the lane kernels, of fewer registers, when that is one vector a
// lane); longer rows a block each, of a thread per 4 vectors (128 to
// SoftmaxMaxThreads). Both use 16-byte vectors when every row starts
// aligned. inner > 1: the inner kernels, threadIdx.y splitting each line's
// axis (up to 16 ways) while the grid has fewer than softmaxInnerThreads
// threads, threadIdx.x on 256/blockDim.y consecutive lines (at least 32).
// The launch depends only on the shape and the alignment, never on the
// GPU, and so does the order of every sum. kernels/emu/softmax_emu_test.cpp
// launches the kernels alike.
func softmaxPlanFor(p kernels.SoftmaxParams, elem int, aligned bool) softmaxPlan {
	if p.Inner == 1 {
		vec := aligned && p.N*elem%16 == 0
		nv := p.N
		if vec {
			nv = p.N * elem / 16
		}
		if p.N*elem <= 32*cuda.SoftmaxLaneBytes {
			lanes := min(32, nextPow2(nv))
			perBlock := cuda.SoftmaxWarpThreads / 32 * (32 / lanes)
			design := softmaxWarp
			if nv <= 32 {
				design = softmaxLane
			}
			return softmaxPlan{design: design, vec: vec, lanes: lanes, cfg: backend.LaunchConfig{
				Grid:  backend.Dim3{X: uint32(ceilDiv(p.Outer, perBlock)), Y: 1, Z: 1},
				Block: backend.Dim3{X: cuda.SoftmaxWarpThreads, Y: 1, Z: 1},
			}}
		}
		threads := min(cuda.SoftmaxMaxThreads, max(128, nextPow2(ceilDiv(nv, 4))))
		return softmaxPlan{design: softmaxBlock, vec: vec, cfg: backend.LaunchConfig{
			Grid:      backend.Dim3{X: uint32(p.Outer), Y: 1, Z: 1},
			Block:     backend.Dim3{X: uint32(threads), Y: 1, Z: 1},
			SharedMem: uint32(32 * elem),
		}}
	}
	lines := p.Outer * p.Inner
	by := 1
	for by < 16 && 2*by <= p.N && lines*by < softmaxInnerThreads {
		by *= 2
	}
	bx := min(max(32, 256/by), max(32, nextPow2(lines)))
	return softmaxPlan{design: softmaxInner, cfg: backend.LaunchConfig{
		Grid:      backend.Dim3{X: uint32(ceilDiv(lines, bx)), Y: 1, Z: 1},
		Block:     backend.Dim3{X: uint32(bx), Y: uint32(by), Z: 1},
		SharedMem: uint32(bx * by * elem),
	}}
}

// nextPow2 is the least power of two at or above n (1 for n <= 1).
func nextPow2(n int) int {
	p := 1
	for p < n {
		p *= 2
	}
	return p
}

// softmaxKernels are the kernels of each design, forward and backward
// ([0] and [1]), element by element and with vectors ([.][.][0] and [1]).
var softmaxKernels = [2][4][2]func(tensor.Dtype) (cuda.Kernel[cuda.SoftmaxParams], error){
	{
		{cuda.SoftmaxFwdWarp, cuda.SoftmaxFwdWarpV16b},
		{cuda.SoftmaxFwdBlock, cuda.SoftmaxFwdBlockV16b},
		{cuda.SoftmaxFwdInner, cuda.SoftmaxFwdInner},
		{cuda.SoftmaxFwdLane, cuda.SoftmaxFwdLaneV16b},
	},
	{
		{cuda.SoftmaxBwdWarp, cuda.SoftmaxBwdWarpV16b},
		{cuda.SoftmaxBwdBlock, cuda.SoftmaxBwdBlockV16b},
		{cuda.SoftmaxBwdInner, cuda.SoftmaxBwdInner},
		{cuda.SoftmaxBwdLane, cuda.SoftmaxBwdLaneV16b},
	},
}

// kernel returns the plan's kernel for dtype dt, forward or backward.
func (pl softmaxPlan) kernel(dt tensor.Dtype, backward bool) (cuda.Kernel[cuda.SoftmaxParams], error) {
	b, v := 0, 0
	if backward {
		b = 1
	}
	if pl.vec {
		v = 1
	}
	return softmaxKernels[b][pl.design][v](dt)
}

// checkDeviceSizes checks what the kernels carry in 32 bits: the axis's
// length, and the grid (one block per row for the block kernels).
func (s softmaxShape) checkDeviceSizes(op string, pl softmaxPlan) error {
	p := s.params()
	if p.N > math.MaxInt32 {
		return fmt.Errorf("ops: %s: the axis's length %d does not fit the CUDA kernels' 32-bit int", op, p.N)
	}
	var blocks int
	switch pl.design {
	case softmaxWarp, softmaxLane:
		blocks = ceilDiv(p.Outer, cuda.SoftmaxWarpThreads/32*(32/pl.lanes))
	case softmaxBlock:
		blocks = p.Outer
	default:
		blocks = ceilDiv(p.Outer*p.Inner, int(pl.cfg.Block.X))
	}
	if blocks > math.MaxInt32 {
		return fmt.Errorf("ops: %s: x %v needs %d blocks, more than a CUDA grid holds", op, s.x, blocks)
	}
	return nil
}

// launch queues the forward (dy == 0) or the backward kernel of s: x is x
// forward and y backward, out is y forward and dx backward.
func (s softmaxShape) launch(op string, dev *backend.Device, backward bool, x, dy, out backend.DevicePtr) error {
	p := s.params()
	pl := softmaxPlanFor(p, int(s.dt.Size()), (x|dy|out)%16 == 0)
	if err := s.checkDeviceSizes(op, pl); err != nil {
		return err
	}
	k, err := pl.kernel(s.dt, backward)
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	args := cuda.SoftmaxParams{
		X: x, DY: dy, Out: out,
		Rows: int64(p.Outer), Inner: int64(p.Inner), N: int32(p.N),
		Log: boolInt32(p.Log), Lanes: int32(pl.lanes),
	}
	if err := k.Launch(dev, pl.cfg, args); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	return nil
}

// forwardDevice is softmaxOp's device launcher.
func (s softmaxShape) forwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	y, yPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	if err := s.launch(s.op, a.dev, false, a.ptr[0], 0, yPtr); err != nil {
		return nil, err
	}
	return y, nil
}

// backwardDevice is softmaxGradOp's device launcher.
func (s softmaxShape) backwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	dx, dxPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	if err := s.launch(s.op+" backward", a.dev, true, a.ptr[0], a.ptr[1], dxPtr); err != nil {
		return nil, err
	}
	return dx, nil
}
