// The GPU path of ConvTranspose: conv.cu's GEMMs (through convShape, for
// the convolution that ConvTranspose transposes, or a 1x1 one) and
// kernels/convtranspose.cu's bias and activation pass and bias gradient.
//
// Forward. A transposed convolution whose stride is its kernel, with no
// padding, dilation or output padding, gives each output pixel exactly one
// tap of one input pixel: y[n, co, i*KH + a, j*KW + b] = sum_ci x[n, ci, i,
// j] w[ci, co, a, b] + bias[co]. That is a 1x1 convolution of x to
// Cout*KH*KW channels with the weights w seen as [Cin, Cout*KH*KW] and
// transposed, whose output conv_transpose_epilogue moves depth to space as it adds
// the bias and applies the activation: the forward runs on the fast
// (cp.async, wgmma) kernels of an unstrided 1x1 convolution, where the
// strided data-gradient GEMM has only conv_gemm's (conv.cu: conv_pipe
// takes stride 1 only), and the pass that the bias needs anyway does the
// rearrangement. Other transposed convolutions run the strided
// data-gradient GEMM, then the pass in place (when there is a bias or a
// ReLU). (A judgment from the kernels' designs, not measured:
// BenchmarkGPUConvTranspose times both paths on the mask head's shape.)
//
// Backward. The input gradient is the transposed convolution's forward
// convolution (the fprop GEMM, strided), the weight gradient its wgrad GEMM
// with the roles of x and dy swapped, and the bias gradient the channel
// sums of dy (conv_transpose_bias_grad); the ReLU's mask is reluMaskOp's, before
// both.

package ops

import (
	"fmt"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// convTMaxBlocks bounds the grid of conv_transpose_epilogue; its grid-stride loop
// covers any size, and every element's result is its own.
const convTMaxBlocks = 1 << 20

// convTPathKey keys, on a Device, the forward path that tests and
// benchmarks force (a convTPath) instead of depthToSpace's choice.
type convTPathKey struct{}

// convTPath is a forward path of ConvTranspose on the GPU.
type convTPath int

const (
	convTPathAuto  convTPath = iota // depthToSpace decides
	convTPathD2S                    // a 1x1 convolution and a depth-to-space pass
	convTPathDgrad                  // the strided data-gradient GEMM and a pass in place
)

func (p convTPath) String() string {
	return [...]string{"auto", "d2s", "dgrad"}[p]
}

// depthToSpace reports whether s's forward is a 1x1 convolution and a
// depth-to-space pass: stride equal to the kernel, no padding, dilation 1,
// no output padding.
func (s convTShape) depthToSpace() bool {
	p := s.p
	return p.StrideH == p.KH && p.StrideW == p.KW && p.PadH == 0 && p.PadW == 0 &&
		p.DilationH == 1 && p.DilationW == 1 && s.outPad == [2]int{}
}

// forwardPath is the path s's forward takes on dev: the one forced there
// (which must fit s), else depthToSpace's.
func (s convTShape) forwardPath(dev *backend.Device) (convTPath, error) {
	forced, _ := dev.Value(convTPathKey{}).(convTPath)
	switch {
	case forced == convTPathD2S && !s.depthToSpace():
		return 0, fmt.Errorf("ops: ConvTranspose: the depth-to-space path needs a stride equal to the kernel, no padding, dilation 1 and no output padding")
	case forced != convTPathAuto:
		return forced, nil
	case s.depthToSpace():
		return convTPathD2S, nil
	}
	return convTPathDgrad, nil
}

// conv is the convolution that s transposes.
func (s convTShape) conv() convShape { return convShape{p: s.p, dt: s.dt} }

// pointwise is the 1x1 convolution of the depth-to-space path: x to
// Cout*KH*KW channels.
func (s convTShape) pointwise() convShape {
	p := s.p
	return convShape{dt: s.dt, p: kernels.ConvParams{
		N: p.N, Cin: p.Cout, H: p.OutH, W: p.OutW, Cout: p.Cin * p.KH * p.KW, KH: 1, KW: 1,
		StrideH: 1, StrideW: 1, DilationH: 1, DilationW: 1, OutH: p.OutH, OutW: p.OutW,
	}}
}

// forwardDevice is convTOp's device launcher.
func (s convTShape) forwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "ConvTranspose"
	path, err := s.forwardPath(a.dev)
	if err != nil {
		return nil, err
	}
	var bias backend.DevicePtr
	if s.bias {
		bias = a.ptr[2]
	}
	y, yPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	if path == convTPathD2S {
		err = s.forwardD2S(name, a.dev, a.ptr[0], a.ptr[1], bias, yPtr)
	} else {
		err = s.forwardDgrad(name, a.dev, a.ptr[0], a.ptr[1], bias, yPtr)
	}
	if err != nil {
		return nil, err
	}
	return y, nil
}

// forwardDgrad queues y = the strided data-gradient GEMM of w and x, then
// the bias and the activation in place.
func (s convTShape) forwardDgrad(op string, dev *backend.Device, x, w, bias, y backend.DevicePtr) error {
	cs := s.conv()
	if err := cs.checkDeviceSizes(op); err != nil {
		return err
	}
	if err := cs.dgrad(op, dev, w, 0, x, y); err != nil {
		return err
	}
	if !s.bias && s.act != ActReLU {
		return nil
	}
	return s.launchEpilogue(op, dev, y, bias, y, 1, 1)
}

// forwardD2S queues z = the 1x1 convolution of x by w transposed (in
// scratch memory, like the transposed weights), then y from z depth to
// space, with the bias and the activation.
func (s convTShape) forwardD2S(op string, dev *backend.Device, x, w, bias, y backend.DevicePtr) error {
	p := s.p
	cs := s.pointwise()
	if err := cs.checkDeviceSizes(op); err != nil {
		return err
	}
	elem := int64(s.dt.Size())
	kk := p.KH * p.KW
	// w [Cin, Cout*KH*KW] (Cin: ConvTranspose's, p.Cout) to the 1x1
	// convolution's weights [Cout*KH*KW, Cin]. The frees queue nothing: a
	// block is handed out again only to work queued after these launches.
	wt, err := dev.Alloc(int64(p.Cout) * int64(p.Cin*kk) * elem)
	if err != nil {
		return fmt.Errorf("ops: %s: transposed weights: %w", op, err)
	}
	defer dev.Free(wt)
	if err := transposeLaunch(op, dev, s.dt, w, wt, 1, p.Cout, p.Cin*kk); err != nil {
		return err
	}
	z, err := dev.Alloc(int64(p.N) * int64(p.Cin*kk) * int64(p.OutH) * int64(p.OutW) * elem)
	if err != nil {
		return fmt.Errorf("ops: %s: 1x1 convolution output: %w", op, err)
	}
	defer dev.Free(z)
	if err := cs.forward(op, dev, x, wt, 0, z, 0); err != nil {
		return err
	}
	return s.launchEpilogue(op, dev, z, bias, y, p.KH, p.KW)
}

// launchEpilogue queues conv_transpose_epilogue from z to y (which may be z when
// fh = fw = 1).
func (s convTShape) launchEpilogue(op string, dev *backend.Device, z, bias, y backend.DevicePtr, fh, fw int) error {
	e := s.epilogue(fh, fw)
	if err := fitsInt32(op, namedSize{"C", e.C}, namedSize{"H*W", e.H * e.W}, namedSize{"OutH*OutW", s.p.H * s.p.W}); err != nil {
		return err
	}
	k, err := cuda.ConvTransposeEpilogue(s.dt)
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	n := e.N * e.C * s.p.H * s.p.W
	cfg := backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(min(ceilDiv(n, cuda.ConvTransposeThreads), convTMaxBlocks)), Y: 1, Z: 1},
		Block: backend.Dim3{X: cuda.ConvTransposeThreads, Y: 1, Z: 1},
	}
	args := cuda.ConvTransposeEpilogueParams{
		Z: z, Y: y, Bias: bias, Planes: int64(e.N * e.C), C: int32(e.C),
		H: int32(e.H), W: int32(e.W), FactorH: int32(fh), FactorW: int32(fw), ReLU: boolInt32(e.ReLU),
	}
	if err := k.Launch(dev, cfg, args); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	return nil
}

// dgradDevice is convTDgradOp's device launcher: dx = the transposed
// convolution's forward convolution of dy by w.
func (s convTShape) dgradDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "ConvTranspose backward"
	cs := s.conv()
	if err := cs.checkDeviceSizes(name); err != nil {
		return nil, err
	}
	dx, dxPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	if err := cs.forward(name, a.dev, a.ptr[1], a.ptr[0], 0, dxPtr, 0); err != nil {
		return nil, err
	}
	return dx, nil
}

// wgradDevice is convTWgradOp's device launcher: dw = the wgrad GEMM of
// the transposed convolution with dy as its input and x as its output's
// gradient, and the bias gradient from dy.
func (s convTShape) wgradDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "ConvTranspose backward"
	cs := s.conv()
	if err := cs.checkDeviceSizes(name); err != nil {
		return nil, err
	}
	x, dy := a.ptr[0], a.ptr[1]
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	if err := cs.wgrad(name, a.dev, dy, 0, x, outPtr, 0); err != nil {
		return nil, err
	}
	if !s.bias {
		return out, nil
	}
	db := outPtr + backend.DevicePtr(s.wShape().TotalSize()*int(s.dt.Size()))
	if err := s.launchBiasGrad(name, a.dev, dy, db); err != nil {
		return nil, err
	}
	return out, nil
}

// launchBiasGrad queues conv_transpose_bias_grad: db = the channel sums of dy.
func (s convTShape) launchBiasGrad(op string, dev *backend.Device, dy, db backend.DevicePtr) error {
	p := s.p
	if err := fitsInt32(op, namedSize{"N", p.N}, namedSize{"Cout", p.Cin}); err != nil {
		return err
	}
	k, err := cuda.ConvTransposeBiasGrad(s.dt)
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	cfg := backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(p.Cin), Y: 1, Z: 1},
		Block: backend.Dim3{X: cuda.ConvTransposeThreads, Y: 1, Z: 1},
	}
	args := cuda.ConvTransposeBiasGradParams{DY: dy, BiasGrad: db, HW: int64(p.H) * int64(p.W), N: int32(p.N), C: int32(p.Cin)}
	if err := k.Launch(dev, cfg, args); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	return nil
}
