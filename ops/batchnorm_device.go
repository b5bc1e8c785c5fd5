package ops

import (
	"fmt"
	"math"
	"sync"
	"unsafe"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
)

// The GPU path of ConvBN's BatchNorm op, its backward op and the ReLU mask
// of the residual: kernels/conv_bn.cu.
//
// Batch statistics. In training, the convolution of a ConvBN layer reduces
// each channel's count, sum and M2 over every output tile in its epilogue
// and hands the records to the layer's bnCoefOp (bnStatsLink), so the
// forward pass reads the convolution's output once, to normalise it; for an
// input that did not come from the layer's convolution (a direct Do, a
// graph that rearranged the nodes) the op reduces it itself, one extra
// read. The backward ops take the forward's constants (mean, istd and the
// ReLU's mask from them) and read z and dy, not y.
//
// Running statistics. bn.RunningMean and bn.RunningVar may live in host
// memory (NewBatchNorm makes them there) or on the GPU that runs the layer
// (move them there with dev.ToDevice and store the device tensors back in
// the BatchNorm). On the GPU, training updates them in place in a kernel
// and nothing waits; in host memory, each training step copies the batch
// mean and variance (2*C numbers) back, which waits for the GPU, and
// updates them on the host with the CPU twin's expressions, and inference
// uploads them for the kernels. Keep them on the GPU when training there.

// bnArgs mirrors BNParams in kernels/conv.cuh field for field.
type bnArgs struct {
	Z, DY, FCoef, Residual, Out, Partial backend.DevicePtr
	Gamma, Beta, RunMean, RunVar         backend.DevicePtr
	BatchStats, Coef, DGamma, DBeta      backend.DevicePtr
	Eps, Momentum                        float64
	N, C, HW                             int32
	Slots, Rec, Chunk                    int32
	Training, ReLU                       int32
}

// maskArgs mirrors MaskParams in kernels/conv_bn.cu.
type maskArgs struct {
	Y, DY, DX backend.DevicePtr
	N         int64
}

var (
	_ [160]byte = [unsafe.Sizeof(bnArgs{})]byte{}
	_ [32]byte  = [unsafe.Sizeof(maskArgs{})]byte{}
)

const (
	bnRecForward  = 3 // float64s per statistics record: count, sum, M2
	bnRecBackward = 2 // per gradient record: sum g, sum g*(z - mean)
	bnThreads     = 256
	bnChunk       = 4096       // elements of a plane per bn_reduce block
	bnCoefStride  = 8          // kCoefStride in conv.cuh
	bnScratch     = 32 * 4 * 8 // shared memory of bn_reduce and bn_finalize
)

// bnStatsLink carries the batch statistics of a ConvBN layer from its
// convolution, which reduces them in its epilogue, to its BatchNorm op.
// The records are handed over only for the very tensor the convolution
// wrote, at the same address, and only once; anything else makes the
// BatchNorm op reduce its input itself.
type bnStatsLink struct {
	bn *BatchNorm

	mu      sync.Mutex
	dev     *backend.Device
	z       *tensor.Dense // the convolution's output the records describe
	zPtr    backend.DevicePtr
	partial *tensor.Dense // float64 records [slots][C][bnRecForward]
	slots   int
	taken   int // records handed over so far, for tests
}

// wanted reports whether the convolution should reduce the statistics:
// the layer is in training now.
func (l *bnStatsLink) wanted() bool { return l != nil && l.bn != nil && l.bn.Training }

func (l *bnStatsLink) put(dev *backend.Device, z *tensor.Dense, zPtr backend.DevicePtr, partial *tensor.Dense, slots int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dropLocked()
	l.dev, l.z, l.zPtr, l.partial, l.slots = dev, z, zPtr, partial, slots
}

// take returns the records for z at zPtr on dev, which the caller frees,
// or false when there are none for it.
func (l *bnStatsLink) take(dev *backend.Device, z G.Value, zPtr backend.DevicePtr) (*tensor.Dense, int, bool) {
	if l == nil {
		return nil, 0, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.partial == nil {
		return nil, 0, false
	}
	// Owns fails once a Scope has freed the records (with the step that
	// made them).
	if l.dev != dev || l.zPtr != zPtr || G.Value(l.z) != z || !dev.Owns(l.partial) {
		l.dropLocked()
		return nil, 0, false
	}
	p, s := l.partial, l.slots
	l.dev, l.z, l.zPtr, l.partial, l.slots = nil, nil, 0, nil, 0
	l.taken++
	return p, s, true
}

func (l *bnStatsLink) dropLocked() {
	if l.partial != nil {
		// An error means a Scope freed the records already.
		_ = l.dev.FreeDense(l.partial)
	}
	l.dev, l.z, l.zPtr, l.partial, l.slots = nil, nil, 0, nil, 0
}

func (s bnShape) bnArgs(training bool) bnArgs {
	return bnArgs{
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

// reduce queues kernel (bn_reduce or bn_grad_reduce) over the planes into
// new records of rec float64s, which the caller frees, and returns them with
// their number of slots.
func (s bnShape) reduce(op string, dev *backend.Device, kernel string, args bnArgs, rec int) (*tensor.Dense, int, error) {
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
		SharedMem: bnScratch,
	}
	if err := launchBN(op, dev, kernel+"_"+dtypeSuffix(s.dt), cfg, args); err != nil {
		_ = dev.FreeDense(partial)
		return nil, 0, err
	}
	return partial, slots, nil
}

func launchBN(op string, dev *backend.Device, kernel string, cfg backend.LaunchConfig, args bnArgs) error {
	k, err := dev.Kernel("conv_bn", kernel)
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	if err := backend.Launch(k, cfg, args); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	return nil
}

// finalize queues bn_finalize, one block per channel, into args.Coef (and,
// backward, args.DGamma and args.DBeta).
func (s bnShape) finalize(op string, dev *backend.Device, args bnArgs) error {
	cfg := backend.LaunchConfig{
		Grid:      backend.Dim3{X: uint32(s.c), Y: 1, Z: 1},
		Block:     backend.Dim3{X: bnThreads, Y: 1, Z: 1},
		SharedMem: bnScratch,
	}
	return launchBN(op, dev, "bn_finalize_"+dtypeSuffix(s.dt), cfg, args)
}

// apply queues the forward or backward apply kernel over the planes, four
// elements at a time in float32 when the planes allow (the backward one
// rounding dz to TF32 with gemmDz).
func (s bnShape) apply(op string, dev *backend.Device, args bnArgs, backward bool) error {
	hw := s.h * s.w
	// Planes of whole float4s: every plane starts 16-byte aligned when the
	// tensors do (a view may not).
	x4 := s.dt == tensor.Float32 && hw%4 == 0 && (args.Z|args.DY|args.Residual|args.Out)%16 == 0
	kernel := "bn_apply_"
	if backward {
		kernel = "bn_backward_apply_"
		if s.gemmDz && s.dt == tensor.Float32 {
			kernel += "tf32_"
		}
	}
	kernel += dtypeSuffix(s.dt)
	units := hw
	if x4 {
		kernel, units = kernel+"x4", hw/4
	}
	cfg := backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(s.n * s.c), Y: uint32(min(max(ceilDiv(units, bnThreads*4), 1), 65535)), Z: 1},
		Block: backend.Dim3{X: bnThreads, Y: 1, Z: 1},
	}
	return launchBN(op, dev, kernel, cfg, args)
}

func (op *bnCoefOp) doDevice(dev *backend.Device, prealloc G.Value, in []G.Value, training bool, rm, rv *tensor.Dense) (G.Value, error) {
	const name = "ConvBN"
	if err := op.checkDeviceSizes(name); err != nil {
		return nil, err
	}
	args := op.bnArgs(training)
	var err error
	if args.Z, err = deviceArg(name, "conv output", dev, in[0], op.dt, op.zShape()); err != nil {
		return nil, err
	}
	if args.Gamma, err = deviceArg(name, "bn.Gamma", dev, in[1], op.dt, op.cShape()); err != nil {
		return nil, err
	}
	if args.Beta, err = deviceArg(name, "bn.Beta", dev, in[2], op.dt, op.cShape()); err != nil {
		return nil, err
	}
	coef, coefPtr, err := deviceOutput(name, dev, prealloc, op.dt, op.coefShape())
	if err != nil {
		return nil, err
	}
	args.Coef = coefPtr
	run, err := op.deviceRunning(name, dev, rm, rv, !training)
	if err != nil {
		return nil, err
	}
	defer run.free()
	args.RunMean, args.RunVar = run.mean, run.variance
	var batch *tensor.Dense
	if training {
		partial, slots, ok := op.stats.take(dev, in[0], args.Z)
		if !ok {
			if partial, slots, err = op.reduce(name, dev, "bn_reduce", args, bnRecForward); err != nil {
				return nil, err
			}
		}
		defer dev.FreeDense(partial)
		if args.Partial, err = dev.Ptr(partial); err != nil {
			return nil, fmt.Errorf("ops: %s: statistics: %w", name, err)
		}
		args.Slots, args.Rec = int32(slots), bnRecForward
		if !run.onDevice {
			if batch, err = dev.NewDense(op.dt, 2*op.c); err != nil {
				return nil, fmt.Errorf("ops: %s: %w", name, err)
			}
			defer dev.FreeDense(batch)
			if args.BatchStats, err = dev.Ptr(batch); err != nil {
				return nil, fmt.Errorf("ops: %s: %w", name, err)
			}
		}
	}
	if err := op.finalize(name, dev, args); err != nil {
		return nil, err
	}
	if batch != nil {
		// Host running statistics: wait for the batch's and update them
		// as the CPU twin does.
		host, err := dev.ToHost(batch)
		if err != nil {
			return nil, fmt.Errorf("ops: %s: batch statistics: %w", name, err)
		}
		m := op.n * op.h * op.w
		switch op.dt {
		case tensor.Float32:
			updateRunning(rm.Float32s(), rv.Float32s(), host.Float32s(), op.momentum, m)
		default:
			updateRunning(rm.Float64s(), rv.Float64s(), host.Float64s(), op.momentum, m)
		}
	}
	return coef, nil
}

func (op *bnOp) doDevice(dev *backend.Device, prealloc G.Value, in []G.Value) (G.Value, error) {
	const name = "ConvBN"
	if err := op.checkDeviceSizes(name); err != nil {
		return nil, err
	}
	args := op.bnArgs(op.bn.Training)
	var err error
	if args.Z, err = deviceArg(name, "conv output", dev, in[0], op.dt, op.zShape()); err != nil {
		return nil, err
	}
	for i := 1; i <= 2; i++ {
		if _, err = deviceArg(name, bnInputNames[i], dev, in[i], op.dt, op.cShape()); err != nil {
			return nil, err
		}
	}
	if args.Coef, err = deviceArg(name, "BatchNorm constants", dev, in[3], op.dt, op.coefShape()); err != nil {
		return nil, err
	}
	if op.residual {
		if args.Residual, err = deviceArg(name, "residual", dev, in[4], op.dt, op.zShape()); err != nil {
			return nil, err
		}
	}
	y, yPtr, err := deviceOutput(name, dev, prealloc, op.dt, op.zShape())
	if err != nil {
		return nil, err
	}
	args.Out = yPtr
	if err := op.apply(name, dev, args, false); err != nil {
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

// gradArgs checks the inputs the backward ops share, z, the forward's
// constants, dy and the residual (when the layer has one), at the positions
// given, and returns the launch arguments that point at them. The residual
// is read, for the ReLU's mask, only by a layer with a ReLU.
func (s bnShape) gradArgs(name string, dev *backend.Device, in []G.Value, names []string, z, coef, dy, res int) (bnArgs, error) {
	args := s.bnArgs(s.bn.Training)
	var err error
	if args.Z, err = deviceArg(name, names[z], dev, in[z], s.dt, s.zShape()); err != nil {
		return args, err
	}
	if args.FCoef, err = deviceArg(name, names[coef], dev, in[coef], s.dt, s.coefShape()); err != nil {
		return args, err
	}
	if args.DY, err = deviceArg(name, names[dy], dev, in[dy], s.dt, s.zShape()); err != nil {
		return args, err
	}
	if s.residual {
		r, err := deviceArg(name, names[res], dev, in[res], s.dt, s.zShape())
		if err != nil {
			return args, err
		}
		if s.act == ActReLU {
			args.Residual = r
		}
	}
	return args, nil
}

func (op *bnGradStatsOp) doDevice(dev *backend.Device, prealloc G.Value, in []G.Value) (G.Value, error) {
	const name = "ConvBN backward"
	if err := op.checkDeviceSizes(name); err != nil {
		return nil, err
	}
	args, err := op.gradArgs(name, dev, in, bnGradStatsNames, 0, 2, 3, 4)
	if err != nil {
		return nil, err
	}
	if args.Gamma, err = deviceArg(name, "bn.Gamma", dev, in[1], op.dt, op.cShape()); err != nil {
		return nil, err
	}
	out, outPtr, err := deviceOutput(name, dev, prealloc, op.dt, op.statsShape())
	if err != nil {
		return nil, err
	}
	elem := backend.DevicePtr(op.dt.Size())
	args.DGamma = outPtr
	args.DBeta = outPtr + backend.DevicePtr(op.c)*elem
	args.Coef = outPtr + 2*backend.DevicePtr(op.c)*elem
	partial, slots, err := op.reduce(name, dev, "bn_grad_reduce", args, bnRecBackward)
	if err != nil {
		return nil, err
	}
	defer dev.FreeDense(partial)
	if args.Partial, err = dev.Ptr(partial); err != nil {
		return nil, fmt.Errorf("ops: %s: statistics: %w", name, err)
	}
	args.Slots, args.Rec = int32(slots), bnRecBackward
	if err := op.finalize(name, dev, args); err != nil {
		return nil, err
	}
	return out, nil
}

func (op *bnGradApplyOp) doDevice(dev *backend.Device, prealloc G.Value, in []G.Value) (G.Value, error) {
	const name = "ConvBN backward"
	if err := op.checkDeviceSizes(name); err != nil {
		return nil, err
	}
	args, err := op.gradArgs(name, dev, in, bnGradApplyNames, 0, 1, 2, 4)
	if err != nil {
		return nil, err
	}
	stats, err := deviceArg(name, "statistics", dev, in[3], op.dt, op.statsShape())
	if err != nil {
		return nil, err
	}
	args.Coef = stats + 2*backend.DevicePtr(op.c)*backend.DevicePtr(op.dt.Size())
	dz, dzPtr, err := deviceOutput(name, dev, prealloc, op.dt, op.zShape())
	if err != nil {
		return nil, err
	}
	args.Out = dzPtr
	if err := op.apply(name, dev, args, true); err != nil {
		return nil, err
	}
	return dz, nil
}

// hostRunning refuses running statistics on a GPU for a layer whose inputs
// are in host memory: the CPU twin would read device memory.
func hostRunning(op string, rm, rv *tensor.Dense) error {
	if backend.IsDevice(rm) || backend.IsDevice(rv) {
		return fmt.Errorf("ops: %s: bn.RunningMean and bn.RunningVar are on a GPU but the layer's inputs are in host memory", op)
	}
	return nil
}

func (op *reluMaskOp) doDevice(dev *backend.Device, prealloc G.Value, in []G.Value) (G.Value, error) {
	const name = "ReLU backward"
	y, err := deviceArg(name, "y", dev, in[0], op.dt, op.shape)
	if err != nil {
		return nil, err
	}
	dy, err := deviceArg(name, "grad", dev, in[1], op.dt, op.shape)
	if err != nil {
		return nil, err
	}
	dx, dxPtr, err := deviceOutput(name, dev, prealloc, op.dt, op.shape)
	if err != nil {
		return nil, err
	}
	k, err := dev.Kernel("conv_bn", "relu_mask_"+dtypeSuffix(op.dt))
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", name, err)
	}
	n := int64(op.shape.TotalSize())
	if err := backend.Launch(k, dev.GridStride(n, bnThreads), maskArgs{Y: y, DY: dy, DX: dxPtr, N: n}); err != nil {
		return nil, fmt.Errorf("ops: %s: %w", name, err)
	}
	return dx, nil
}
