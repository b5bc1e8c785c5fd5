package ops

import (
	"fmt"
	"math"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// The GPU path of ConvBN's BatchNorm op, its backward op and the ReLU mask
// of the residual: kernels/conv_bn.cu.
//
// Batch statistics. In training, the convolution of a ConvBN layer reduces
// each channel's count, sum and M2 over every output tile in its epilogue,
// into the tail of its output [z | statistics] (convStatsOf), which the
// layer's bnCoefOp takes as its input: the statistics flow through the
// graph, and the forward pass reads z once, to normalise it. A bnCoefOp
// given a plain z (no convStats) reduces it itself, one extra read. The
// backward ops take the forward's constants (mean, istd and the ReLU's mask
// from them) and read z and dy, not y.
//
// Running statistics. bn.RunningMean and bn.RunningVar may live in host
// memory (NewBatchNorm makes them there) or on the GPU that runs the layer
// (BatchNorm.RunningStatsToDevice moves them there). On the GPU, training
// updates them in place in bn_finalize, from the batch statistics the
// convolution's epilogue reduced, and no step waits for them; in host
// memory, each training step copies the batch mean and variance (2*C
// numbers) back, which waits for the GPU, and updates them on the host with
// the CPU twin's expressions, and inference uploads them for the kernels.
// Keep them on the GPU when training there, and read them with
// BatchNorm.CopyRunningStats (a checkpoint) when needed.

// RunningStatsToDevice moves the layer's running statistics to dev, the
// GPU that runs it: training there then updates them in place, and a
// training step waits for them no more (in host memory every step copies
// the batch's statistics back, a wait per layer). The device copies outlive
// the steps: a Scope open on dev keeps them, so this may be called inside
// a step. Statistics already on dev stay as they are. The host tensors are
// left as they were, no longer the layer's: read the statistics with
// CopyRunningStats, and move them back with RunningStatsToHost.
func (bn *BatchNorm) RunningStatsToDevice(dev *backend.Device) error {
	const op = "BatchNorm.RunningStatsToDevice"
	if dev == nil {
		return fmt.Errorf("ops: %s: dev is nil", op)
	}
	if err := bn.checkRunningStats(op); err != nil {
		return err
	}
	stats := [2]*tensor.Dense{bn.RunningMean, bn.RunningVar}
	var moved [2]*tensor.Dense
	fail := func(err error) error {
		for i, m := range moved {
			if m != nil && m != stats[i] {
				_ = dev.FreeDense(m)
			}
		}
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	for i, t := range stats {
		if backend.IsDevice(t) {
			d, err := backend.DeviceOf(t)
			if err != nil {
				return fail(err)
			}
			if d != dev {
				return fail(fmt.Errorf("bn.%s is on %v, not %v: move it to the host first (RunningStatsToHost)", runningStatNames[i], d, dev))
			}
			moved[i] = t
			continue
		}
		m, err := dev.ToDevice(t)
		if err != nil {
			return fail(err)
		}
		moved[i] = m
		if s := dev.OpenScope(); s != nil {
			if err := s.Keep(m); err != nil {
				return fail(err)
			}
		}
	}
	bn.RunningMean, bn.RunningVar = moved[0], moved[1]
	return nil
}

// RunningStatsToHost moves the layer's running statistics back to host
// memory from the GPU and frees the device copies; statistics in host
// memory stay as they are. It waits for the GPU (the last step's update
// included).
func (bn *BatchNorm) RunningStatsToHost() error {
	const op = "BatchNorm.RunningStatsToHost"
	mean, variance, err := bn.CopyRunningStats()
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	stats := [2]**tensor.Dense{&bn.RunningMean, &bn.RunningVar}
	for i, host := range []*tensor.Dense{mean, variance} {
		t := *stats[i]
		if !backend.IsDevice(t) {
			continue
		}
		d, err := backend.DeviceOf(t)
		if err == nil {
			err = d.FreeDense(t)
		}
		if err != nil {
			return fmt.Errorf("ops: %s: bn.%s: %w", op, runningStatNames[i], err)
		}
		*stats[i] = host
	}
	return nil
}

// CopyRunningStats returns host copies of the layer's running mean and
// variance, wherever they live: what a checkpoint saves. Copying them from
// a GPU waits for the work queued there, the last step's update included.
func (bn *BatchNorm) CopyRunningStats() (mean, variance *tensor.Dense, err error) {
	const op = "BatchNorm.CopyRunningStats"
	if err := bn.checkRunningStats(op); err != nil {
		return nil, nil, err
	}
	var out [2]*tensor.Dense
	for i, t := range []*tensor.Dense{bn.RunningMean, bn.RunningVar} {
		if !backend.IsDevice(t) {
			out[i] = t.Clone().(*tensor.Dense)
			continue
		}
		d, err := backend.DeviceOf(t)
		if err == nil {
			out[i], err = d.ToHost(t)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("ops: %s: bn.%s: %w", op, runningStatNames[i], err)
		}
	}
	return out[0], out[1], nil
}

var runningStatNames = [2]string{"RunningMean", "RunningVar"}

// checkRunningStats checks that the layer has both running statistics,
// [C] tensors of one dtype, contiguous.
func (bn *BatchNorm) checkRunningStats(op string) error {
	if bn == nil {
		return fmt.Errorf("ops: %s: bn is nil", op)
	}
	for i, t := range []*tensor.Dense{bn.RunningMean, bn.RunningVar} {
		switch {
		case t == nil:
			return fmt.Errorf("ops: %s: bn.%s is nil", op, runningStatNames[i])
		case t.Dims() != 1:
			return fmt.Errorf("ops: %s: bn.%s must have shape [C], got %v", op, runningStatNames[i], t.Shape())
		case t.IsView() || !t.DataOrder().IsRowMajor():
			return fmt.Errorf("ops: %s: bn.%s must be a contiguous tensor, not a view", op, runningStatNames[i])
		}
	}
	if !bn.RunningMean.Shape().Eq(bn.RunningVar.Shape()) || bn.RunningMean.Dtype() != bn.RunningVar.Dtype() {
		return fmt.Errorf("ops: %s: bn.RunningMean (%v %v) and bn.RunningVar (%v %v) differ", op,
			bn.RunningMean.Shape(), bn.RunningMean.Dtype(), bn.RunningVar.Shape(), bn.RunningVar.Dtype())
	}
	return nil
}

const (
	bnRecForward  = cuda.BNStatsRecord // float64s per statistics record: count, sum, M2
	bnRecBackward = cuda.BNGradRecord  // per gradient record: sum g, sum g*(z - mean)
	bnThreads     = 256
	bnChunk       = 4096 // elements of a plane per bn_reduce block
)

// The CPU twin and the kernels lay out the per-channel constants alike.
var _ = [1]struct{}{}[kernels.BNCoefStride-cuda.BNCoefStride]

// bnHandOffKey keys, on a Device, how many times BatchNorm constants were
// worked out there from their convolution's statistics (an int), for the
// tests: in training every ConvBN layer's must be, with no read of z of
// their own.
type bnHandOffKey struct{}

func countHandOff(dev *backend.Device) {
	n, _ := dev.Value(bnHandOffKey{}).(int)
	dev.SetValue(bnHandOffKey{}, n+1)
}

// bnHandOffs is what countHandOff counted on dev.
func bnHandOffs(dev *backend.Device) int {
	n, _ := dev.Value(bnHandOffKey{}).(int)
	return n
}

func (s bnShape) bnArgs(training bool) cuda.BNParams {
	return cuda.BNParams{
		Eps: s.eps, Momentum: s.momentum,
		N: int32(s.n), C: int32(s.c), HW: int32(s.h * s.w),
		Training: boolInt32(training), ReLU: boolInt32(s.act == ActReLU),
	}
}

// checkDeviceSizes checks the grids of the BatchNorm kernels: (chunks, N,
// C) for bn_reduce, (N*C, blocks) for the apply kernels.
func (s bnShape) checkDeviceSizes(op string) error {
	switch {
	case s.n > 65535 || s.c > 65535:
		return fmt.Errorf("ops: %s: N = %d and C = %d must be at most 65535 for the CUDA kernels", op, s.n, s.c)
	case s.h*s.w > math.MaxInt32-bnChunk:
		return fmt.Errorf("ops: %s: OutH*OutW = %d is too large for the CUDA kernels", op, s.h*s.w)
	}
	return nil
}

// bnRunning is where the kernels find the running statistics.
type bnRunning struct {
	mean, variance backend.DevicePtr
	onDevice       bool            // the BatchNorm's own tensors are on the device
	uploaded       []*tensor.Dense // copies of host tensors, freed by free
	dev            *backend.Device
}

func (r *bnRunning) free() {
	for _, t := range r.uploaded {
		_ = r.dev.FreeDense(t)
	}
}

// deviceRunning locates the running statistics rm and rv for the kernels on
// dev: they are used in place when they live on dev, and uploaded when they
// live on the host and upload is set (inference reads them).
func (s bnShape) deviceRunning(op string, dev *backend.Device, rm, rv *tensor.Dense, upload bool) (*bnRunning, error) {
	r := &bnRunning{dev: dev}
	mOn, vOn := backend.IsDevice(rm), backend.IsDevice(rv)
	if mOn != vOn {
		return nil, fmt.Errorf("ops: %s: bn.RunningMean and bn.RunningVar must both be on the GPU or both in host memory", op)
	}
	ptrs := []*backend.DevicePtr{&r.mean, &r.variance}
	for i, t := range []*tensor.Dense{rm, rv} {
		name := [...]string{"bn.RunningMean", "bn.RunningVar"}[i]
		if mOn {
			d, err := backend.DeviceOf(t)
			if err != nil {
				return nil, fmt.Errorf("ops: %s: %s: %w", op, name, err)
			}
			if d != dev {
				return nil, fmt.Errorf("ops: %s: %s is on %v but the layer runs on %v", op, name, d, dev)
			}
		} else if upload {
			u, err := dev.ToDevice(t)
			if err != nil {
				r.free()
				return nil, fmt.Errorf("ops: %s: %s: %w", op, name, err)
			}
			r.uploaded = append(r.uploaded, u)
			t = u
		} else {
			continue
		}
		p, err := dev.Ptr(t)
		if err != nil {
			r.free()
			return nil, fmt.Errorf("ops: %s: %s: %w", op, name, err)
		}
		*ptrs[i] = p
	}
	r.onDevice = mOn
	return r, nil
}

// reduce queues kernel (bn_reduce or bn_grad_reduce, picked by dtype) over
// the planes into new records of rec float64s, which the caller frees, and
// returns them with their number of slots.
func (s bnShape) reduce(op string, dev *backend.Device, kernel func(tensor.Dtype) (cuda.Kernel[cuda.BNParams], error),
	args cuda.BNParams, rec int) (*tensor.Dense, int, error) {
	k, err := kernel(s.dt)
	if err != nil {
		return nil, 0, fmt.Errorf("ops: %s: %w", op, err)
	}
	hw := s.h * s.w
	chunk := min(hw, bnChunk)
	chunks := ceilDiv(hw, chunk)
	slots := s.n * chunks
	partial, err := dev.NewDense(tensor.Float64, slots*s.c*rec)
	if err != nil {
		return nil, 0, fmt.Errorf("ops: %s: statistics: %w", op, err)
	}
	if args.Partial, err = dev.Ptr(partial); err != nil {
		_ = dev.FreeDense(partial)
		return nil, 0, fmt.Errorf("ops: %s: statistics: %w", op, err)
	}
	args.Rec, args.Chunk = int32(rec), int32(chunk)
	cfg := backend.LaunchConfig{
		Grid:      backend.Dim3{X: uint32(chunks), Y: uint32(s.n), Z: uint32(s.c)},
		Block:     backend.Dim3{X: bnThreads, Y: 1, Z: 1},
		SharedMem: cuda.BNScratchBytes,
	}
	if err := launchBN(op, dev, k, cfg, args); err != nil {
		_ = dev.FreeDense(partial)
		return nil, 0, err
	}
	return partial, slots, nil
}

func launchBN(op string, dev *backend.Device, k cuda.Kernel[cuda.BNParams], cfg backend.LaunchConfig, args cuda.BNParams) error {
	if err := k.Launch(dev, cfg, args); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	return nil
}

// finalize queues bn_finalize, one block per channel, into args.Coef (and,
// backward, args.Dgamma and args.Dbeta).
func (s bnShape) finalize(op string, dev *backend.Device, args cuda.BNParams) error {
	cfg := backend.LaunchConfig{
		Grid:      backend.Dim3{X: uint32(s.c), Y: 1, Z: 1},
		Block:     backend.Dim3{X: bnThreads, Y: 1, Z: 1},
		SharedMem: cuda.BNScratchBytes,
	}
	k, err := cuda.BNFinalize(s.dt)
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	return launchBN(op, dev, k, cfg, args)
}

// apply queues the forward or backward apply kernel over the planes, four
// elements at a time in float32 when the planes allow (the backward one
// rounding dz to TF32 with gemmDz where the convolution's GEMMs multiply in
// TF32, convTF32).
func (s bnShape) apply(op string, dev *backend.Device, args cuda.BNParams, backward bool) error {
	hw := s.h * s.w
	// Planes of whole float4s: every plane starts 16-byte aligned when the
	// tensors do (a view may not).
	vec4 := s.dt == tensor.Float32 && hw%4 == 0 && (args.Z|args.DY|args.Residual|args.Out)%16 == 0
	tf32 := backward && s.gemmDz && convTF32(dev, s.dt)
	var k cuda.Kernel[cuda.BNParams]
	var err error
	switch {
	case tf32 && vec4:
		k = cuda.BNBackwardApplyTF32Vec4F32
	case tf32:
		k = cuda.BNBackwardApplyTF32F32
	case backward && vec4:
		k = cuda.BNBackwardApplyVec4F32
	case backward:
		k, err = cuda.BNBackwardApply(s.dt)
	case vec4:
		k = cuda.BNApplyVec4F32
	default:
		k, err = cuda.BNApply(s.dt)
	}
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	units := hw
	if vec4 {
		units = hw / 4
	}
	cfg := backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(s.n * s.c), Y: uint32(min(max(ceilDiv(units, bnThreads*4), 1), 65535)), Z: 1},
		Block: backend.Dim3{X: bnThreads, Y: 1, Z: 1},
	}
	return launchBN(op, dev, k, cfg, args)
}

// coefDevice is bnCoefOp's device launcher.
func (s bnShape) coefDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "ConvBN"
	training, rm, rv, err := s.mode()
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", name, err)
	}
	if err := s.checkDeviceSizes(name); err != nil {
		return nil, err
	}
	dev := a.dev
	args := s.bnArgs(training)
	args.Z, args.Gamma, args.Beta = a.ptr[0], a.ptr[1], a.ptr[2]
	coef, coefPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	args.Coef = coefPtr
	run, err := s.deviceRunning(name, dev, rm, rv, !training)
	if err != nil {
		return nil, err
	}
	defer run.free()
	args.RunMean, args.RunVar = run.mean, run.variance
	var batch *tensor.Dense
	if training {
		if s.convStats {
			// The convolution's epilogue reduced them into its output.
			st := s.stats()
			args.Partial = a.ptr[0] + backend.DevicePtr(st.off*int(s.dt.Size()))
			args.Slots = int32(st.slots)
			countHandOff(dev)
		} else {
			partial, slots, err := s.reduce(name, dev, cuda.BNReduce, args, bnRecForward)
			if err != nil {
				return nil, err
			}
			defer dev.FreeDense(partial)
			if args.Partial, err = dev.Ptr(partial); err != nil {
				return nil, fmt.Errorf("ops: %s: statistics: %w", name, err)
			}
			args.Slots = int32(slots)
		}
		args.Rec = bnRecForward
		if !run.onDevice {
			if batch, err = dev.NewDense(s.dt, 2*s.c); err != nil {
				return nil, fmt.Errorf("ops: %s: %w", name, err)
			}
			defer dev.FreeDense(batch)
			if args.BatchStats, err = dev.Ptr(batch); err != nil {
				return nil, fmt.Errorf("ops: %s: %w", name, err)
			}
		}
	}
	if err := s.finalize(name, dev, args); err != nil {
		return nil, err
	}
	if batch != nil {
		// Host running statistics: wait for the batch's and update them
		// as the CPU twin does.
		host, err := dev.ToHost(batch)
		if err != nil {
			return nil, fmt.Errorf("ops: %s: batch statistics: %w", name, err)
		}
		m := s.n * s.h * s.w
		switch s.dt {
		case tensor.Float32:
			updateRunning(rm.Float32s(), rv.Float32s(), host.Float32s(), s.momentum, m)
		default:
			updateRunning(rm.Float64s(), rv.Float64s(), host.Float64s(), s.momentum, m)
		}
	}
	return coef, nil
}

// applyDevice is bnOp's device launcher.
func (s bnShape) applyDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "ConvBN"
	if err := s.checkDeviceSizes(name); err != nil {
		return nil, err
	}
	args := s.bnArgs(s.bn.Training)
	args.Z, args.Coef = a.ptr[0], a.ptr[3]
	if s.residual {
		args.Residual = a.ptr[4]
	}
	y, yPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	args.Out = yPtr
	if err := s.apply(name, a.dev, args, false); err != nil {
		return nil, err
	}
	return y, nil
}

// updateRunning moves host running statistics toward the batch's mean and
// biased variance (batch = [mean | variance]) with BatchNormForward's
// expressions: the unbiased variance, over m values, for the running one.
func updateRunning[T kernels.Float](rm, rv, batch []T, momentum float64, m int) {
	c := len(rm)
	mom, mt := T(momentum), T(m)
	for i := range c {
		rm[i] = (1-mom)*rm[i] + mom*batch[i]
		rv[i] = (1-mom)*rv[i] + mom*batch[c+i]*mt/(mt-1)
	}
}

// gradArgs returns the launch arguments of the backward ops that point at
// the inputs they share, z, the forward's constants, dy and the residual
// (when the layer has one), at the positions given. The residual is read,
// for the ReLU's mask, only by a layer with a ReLU.
func (s bnShape) gradArgs(a *deviceArgs, z, coef, dy, res int) cuda.BNParams {
	args := s.bnArgs(s.bn.Training)
	args.Z, args.Fcoef, args.DY = a.ptr[z], a.ptr[coef], a.ptr[dy]
	if s.residual && s.act == ActReLU {
		args.Residual = a.ptr[res]
	}
	return args
}

// gradStatsDevice is bnGradStatsOp's device launcher.
func (s bnShape) gradStatsDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "ConvBN backward"
	if err := s.checkDeviceSizes(name); err != nil {
		return nil, err
	}
	dev := a.dev
	args := s.gradArgs(a, 0, 2, 3, 4)
	args.Gamma = a.ptr[1]
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	elem := backend.DevicePtr(s.dt.Size())
	args.Dgamma = outPtr
	args.Dbeta = outPtr + backend.DevicePtr(s.c)*elem
	args.Coef = outPtr + 2*backend.DevicePtr(s.c)*elem
	partial, slots, err := s.reduce(name, dev, cuda.BNGradReduce, args, bnRecBackward)
	if err != nil {
		return nil, err
	}
	defer dev.FreeDense(partial)
	if args.Partial, err = dev.Ptr(partial); err != nil {
		return nil, fmt.Errorf("ops: %s: statistics: %w", name, err)
	}
	args.Slots, args.Rec = int32(slots), bnRecBackward
	if err := s.finalize(name, dev, args); err != nil {
		return nil, err
	}
	return out, nil
}

// gradApplyDevice is bnGradApplyOp's device launcher.
func (s bnShape) gradApplyDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "ConvBN backward"
	if err := s.checkDeviceSizes(name); err != nil {
		return nil, err
	}
	args := s.gradArgs(a, 0, 1, 2, 4)
	elem := backend.DevicePtr(s.dt.Size())
	args.Coef = a.ptr[3] + 2*backend.DevicePtr(s.c)*elem
	dz, dzPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	args.Out = dzPtr
	if err := s.apply(name, a.dev, args, true); err != nil {
		return nil, err
	}
	if s.convStats {
		// The gradient of the convolution's statistics, not read.
		nz := backend.DevicePtr(s.n * s.c * s.h * s.w)
		tail := backend.Memory{Ptr: dzPtr + nz*elem, Size: int64(s.stats().size-int(nz)) * int64(elem)}
		if err := a.dev.Engine().Memset(tail, uint32(0)); err != nil {
			return nil, fmt.Errorf("ops: %s: %w", name, err)
		}
	}
	return dz, nil
}

// reluMaskDevice is reluMaskOp's device launcher.
func reluMaskDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "ReLU backward"
	dx, dxPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	k, err := cuda.ReLUMask(a.spec.dtype)
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", name, err)
	}
	n := int64(a.spec.out.TotalSize())
	if err := k.Launch(a.dev, a.dev.GridStride(n, bnThreads), cuda.MaskParams{Y: a.ptr[0], DY: a.ptr[1], DX: dxPtr, N: n}); err != nil {
		return nil, fmt.Errorf("ops: %s: %w", name, err)
	}
	return dx, nil
}
