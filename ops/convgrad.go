package ops

import (
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/kernels"
)

// convGradOp is the one elementwise pass of a Conv layer's backward when the
// layer ends in a ReLU: (y, dy) -> g = dy masked by y > 0, or the packed
// vector [g | dbias] when the layer has a bias (dbias: the per-channel sums
// of g, from the same read).
//
// g is the operand of the layer's two backward GEMMs, which read it where it
// lies, packed or not (convShape.gradReady, gradPacked): no copy, no pass of
// their own. On a GPU whose float32 convolutions multiply in TF32
// (convTF32), g is stored rounded to TF32, the precision the tensor cores
// read: the GEMMs round their operands as they load them anyway (rounding
// twice gives what rounding once does), and the Hopper wgrad reads it from
// shared memory as it is, where nothing could round it. The bias gradient
// is summed from the unrounded values. Elsewhere (float64, a device in
// GemmExact, the CPU) g is exact, as the GEMMs that read it are.
//
// Its DiffWRT claims dy so that a second derivative reaches SymDiff and its
// error, as the GEMM ops after it do.
func convGradOp(s convShape) *specOp {
	return newOp(&opSpec{
		name: "Conv backward", kind: "ConvGrad", config: s.String(),
		inputs: []argSpec{{name: "y", shape: s.yShape()}, {name: "grad", shape: s.yShape()}},
		out:    s.preparedShape(), dtype: s.dt,
		cpu:     floatTwin(s, prepareGrad[float32], prepareGrad[float64]),
		device:  s.gradDevice,
		diffWRT: []bool{false, true},
		grad:    noSecondDerivative("Conv"),
	})
}

// preparedShape is convGradOp's output, which the GEMM ops take as their
// gradient: g, or [g | dbias] with a bias.
func (s convShape) preparedShape() tensor.Shape {
	s.gradPacked = s.bias
	return s.gradShape()
}

// prepareGrad is convGradOp on the CPU: out = g (exact), followed by the
// bias gradient when the layer has a bias.
func prepareGrad[T kernels.Float](s convShape, in [][]T, out []T) error {
	y, dy := in[0], in[1]
	if !s.p.ReLU {
		y = nil
	}
	var db []T
	if s.bias {
		db = out[len(dy):]
	}
	kernels.MaskReLUSums(s.p.N, s.p.Cout, s.p.OutH*s.p.OutW, y, dy, out[:len(dy)], db)
	return nil
}
