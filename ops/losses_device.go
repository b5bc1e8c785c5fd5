// The device side of the losses and box conversions: kernels/losses.cu.

package ops

import (
	"fmt"
	"math"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// lossKernels are each loss's forward and backward kernels ([0] and [1]),
// by kind.
var lossKernels = map[lossKind][2]func(tensor.Dtype) (cuda.Kernel[cuda.LossParams], error){
	lossSigmoidBCE:   {cuda.LossFwdBCE, cuda.LossBwdBCE},
	lossSmoothL1:     {cuda.LossFwdSmoothL1, cuda.LossBwdSmoothL1},
	lossL1:           {cuda.LossFwdL1, cuda.LossBwdL1},
	lossSigmoidFocal: {cuda.LossFwdFocal, cuda.LossBwdFocal},
	lossSoftmaxCE:    {cuda.LossFwdCE, cuda.LossBwdCE},
	lossGIoU:         {cuda.LossFwdGIoU, cuda.LossBwdGIoU},
}

// lossForwardBlocks is the grid of a loss's forward kernel over n items:
// a thread per item up to cuda.LossBlocks blocks, and at least one (whose
// partial sum is 0 when there are no items). It depends on n alone, and so
// does the order of the sum (losses.cu's header).
func lossForwardBlocks(n int) int {
	return max(1, min(ceilDiv(n, cuda.LossThreads), cuda.LossBlocks))
}

// elementwiseBlocks is the grid of a grid-stride kernel over n items: a
// thread per item, the grid capped where each thread takes a few.
func elementwiseBlocks(n int) int {
	return max(1, min(ceilDiv(n, cuda.LossThreads), 1<<16))
}

// kernelArgs are the loss's launch parameters on x, t and w.
func (s lossShape) kernelArgs(ptr []backend.DevicePtr) (cuda.LossParams, error) {
	p := s.params()
	if p.C > math.MaxInt32 {
		return cuda.LossParams{}, fmt.Errorf("ops: %s: %d classes do not fit the CUDA kernels' 32-bit int", lossName(s.kind), p.C)
	}
	return cuda.LossParams{
		X: ptr[0], T: ptr[1], W: ptr[2],
		N: int64(p.N), Beta: p.Beta, Alpha: p.Alpha, Gamma: p.Gamma, C: int32(p.C),
	}, nil
}

// forwardDevice is lossOp's device launcher: the per-block partial sums
// into scratch memory, then their sum into the scalar output.
func (s lossShape) forwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	name := lossName(s.kind)
	args, err := s.kernelArgs(a.ptr)
	if err != nil {
		return nil, err
	}
	dev := a.dev
	blocks := lossForwardBlocks(int(args.N))
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	partial, err := dev.NewDense(tensor.Float64, blocks)
	if err != nil {
		return nil, fmt.Errorf("ops: %s: partial sums: %w", name, err)
	}
	// Freeing once the launches that use it are queued is safe: the
	// Device's work runs in order on its one stream.
	defer dev.FreeDense(partial)
	if args.Out, err = dev.Ptr(partial); err != nil {
		return nil, fmt.Errorf("ops: %s: partial sums: %w", name, err)
	}
	k, err := lossKernels[s.kind][0](s.dt)
	if err == nil {
		err = k.Launch(dev, lossLaunch(blocks), args)
	}
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", name, err)
	}
	sum, err := cuda.LossSum(s.dt)
	if err == nil {
		err = sum.Launch(dev, lossLaunch(1), cuda.LossSumParams{Partial: args.Out, Out: outPtr, Blocks: int32(blocks)})
	}
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", name, err)
	}
	return out, nil
}

// backwardDevice is lossGradOp's device launcher. The loss's gradient is
// a host scalar (a.in[3]), whose value goes in the kernel's parameters,
// times the device scalar at dgrad unless that is 0.
func (s lossShape) backwardDevice(a *deviceArgs, dgrad backend.DevicePtr) (*tensor.Dense, error) {
	name := lossName(s.kind) + " backward"
	args, err := s.kernelArgs(a.ptr)
	if err != nil {
		return nil, err
	}
	args.Grad, args.Dgrad = hostScalarOf(a.in[3]), dgrad
	dx, dxPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	args.Out = dxPtr
	k, err := lossKernels[s.kind][1](s.dt)
	if err == nil {
		err = k.Launch(a.dev, lossLaunch(elementwiseBlocks(int(args.N))), args)
	}
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", name, err)
	}
	return dx, nil
}

// backwardDeviceGrad runs lossGradOp (whose spec is plain) with the loss's
// gradient on a device: one element of the op's dtype on x's device,
// which the kernel reads there (with a host 1 in its place for bind).
func (s lossShape) backwardDeviceGrad(plain *opSpec, in []G.Value, prealloc G.Value) (G.Value, error) {
	g, ok := in[3].(*tensor.Dense)
	if !ok || g.Shape().TotalSize() != 1 || g.Dtype() != s.dt {
		return nil, fmt.Errorf("ops: %s: grad on a device must be one element of %v, got %v of shape %v", plain.name, s.dt, in[3].Dtype(), in[3].Shape())
	}
	one := G.Value(G.NewF64(1))
	if s.dt == tensor.Float32 {
		one = G.NewF32(1)
	}
	args, _, err := plain.bind(append(in[:3:3], one))
	if err != nil {
		return nil, err
	}
	if args == nil {
		return nil, fmt.Errorf("ops: %s: grad is on a device but x is in host memory; move it with ops.ToHost", plain.name)
	}
	if !args.dev.Owns(g) {
		return nil, fmt.Errorf("ops: %s: grad is on another device than x", plain.name)
	}
	ptr, err := args.dev.Ptr(g)
	if err != nil {
		return nil, fmt.Errorf("ops: %s: grad: %w", plain.name, err)
	}
	args.prealloc = prealloc
	return s.backwardDevice(args, ptr)
}

// hostScalarOf is the value of a scalar input as bind hands it over: a
// host tensor of one float32 or float64.
func hostScalarOf(d *tensor.Dense) float64 {
	if d.Dtype() == tensor.Float32 {
		return float64(d.Float32s()[0])
	}
	return d.Float64s()[0]
}

func lossLaunch(blocks int) backend.LaunchConfig {
	return backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(blocks), Y: 1, Z: 1},
		Block: backend.Dim3{X: cuda.LossThreads, Y: 1, Z: 1},
	}
}

// addLossesDevice is addLosses on dev: one thread adds the two scalars.
func addLossesDevice(op string, dev *backend.Device, dt tensor.Dtype, a, b G.Value, prealloc G.Value) (G.Value, error) {
	scalar := tensor.ScalarShape()
	pa, err := deviceArg(op, "a", dev, a, dt, scalar)
	if err != nil {
		return nil, err
	}
	pb, err := deviceArg(op, "b", dev, b, dt, scalar)
	if err != nil {
		return nil, err
	}
	out, po, err := deviceOutput(op, dev, prealloc, dt, scalar)
	if err != nil {
		return nil, err
	}
	k, err := cuda.LossAdd(dt)
	if err == nil {
		err = k.Launch(dev, backend.LaunchConfig{
			Grid: backend.Dim3{X: 1, Y: 1, Z: 1}, Block: backend.Dim3{X: 32, Y: 1, Z: 1},
		}, cuda.LossAddParams{A: pa, B: pb, Out: po})
	}
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", op, err)
	}
	return out, nil
}

// boxKernels are losses.cu's box kernels, by kernels.BoxMode.
var boxKernels = [...]func(tensor.Dtype) (cuda.Kernel[cuda.BoxParams], error){
	kernels.BoxCxCyWHToXYXY:     cuda.BoxCxCyWHToXYXY,
	kernels.BoxCxCyWHToXYXYGrad: cuda.BoxCxCyWHToXYXYBwd,
	kernels.BoxXYXYToCxCyWH:     cuda.BoxXYXYToCxCyWH,
	kernels.BoxXYXYToCxCyWHGrad: cuda.BoxXYXYToCxCyWHBwd,
}

// device is boxOp's device launcher.
func (s boxShape) device(a *deviceArgs) (*tensor.Dense, error) {
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	n := s.shape.TotalSize() / 4
	k, err := boxKernels[s.mode](s.dt)
	if err == nil {
		err = k.Launch(a.dev, lossLaunch(elementwiseBlocks(n)), cuda.BoxParams{In: a.ptr[0], Out: outPtr, N: int64(n)})
	}
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", s.name(), err)
	}
	return out, nil
}
