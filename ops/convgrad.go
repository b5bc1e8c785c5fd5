package ops

import (
	"fmt"
	"hash"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
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
// their own. On a GPU in float32, g is stored rounded to TF32, the precision
// the tensor cores read: the GEMMs round their operands as they load them
// anyway (rounding twice gives what rounding once does), and the Hopper
// wgrad reads it from shared memory as it is, where nothing could round it.
// The bias gradient is summed from the unrounded values. Elsewhere g is
// exact, as the CPU GEMMs are.
type convGradOp struct{ convShape }

func (op *convGradOp) Arity() int { return 2 }

func (op *convGradOp) Type() hm.Type { return fnType(4, 4, op.preparedShape().Dims()) }

func (op *convGradOp) ReturnsPtr() bool      { return false }
func (op *convGradOp) CallsExtern() bool     { return false }
func (op *convGradOp) OverwritesInput() int  { return -1 }
func (op *convGradOp) String() string        { return "ConvGrad(" + op.convShape.String() + ")" }
func (op *convGradOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *convGradOp) Hashcode() uint32      { return hashOf(op) }

// preparedShape is convGradOp's output, which the GEMM ops take as their
// gradient: g, or [g | dbias] with a bias.
func (s convShape) preparedShape() tensor.Shape {
	s.gradPacked = s.bias
	return s.gradShape()
}

func (op *convGradOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.preparedShape(), nil }

func (op *convGradOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

func (op *convGradOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	const name = "Conv backward"
	if len(in) != 2 {
		return nil, fmt.Errorf("ops: %v: want 2 inputs, got %d", op, len(in))
	}
	dev, err := inputsDevice(name, []string{"y", "grad"}, in)
	if err != nil {
		return nil, err
	}
	if dev != nil {
		return op.doDevice(dev, prealloc, in)
	}
	y, err := dense(name, "y", in[0], op.dt, op.yShape())
	if err != nil {
		return nil, err
	}
	dy, err := dense(name, "grad", in[1], op.dt, op.yShape())
	if err != nil {
		return nil, err
	}
	out := output(prealloc, op.dt, op.preparedShape())
	switch op.dt {
	case tensor.Float32:
		prepareGrad(op.convShape, y.Float32s(), dy.Float32s(), out.Float32s())
	default:
		prepareGrad(op.convShape, y.Float64s(), dy.Float64s(), out.Float64s())
	}
	return out, nil
}

// prepareGrad is convGradOp on the CPU: out = g (exact), followed by the
// bias gradient when the layer has a bias.
func prepareGrad[T kernels.Float](s convShape, y, dy, out []T) {
	if !s.p.ReLU {
		y = nil
	}
	var db []T
	if s.bias {
		db = out[len(dy):]
	}
	kernels.MaskReLUSums(s.p.N, s.p.Cout, s.p.OutH*s.p.OutW, y, dy, out[:len(dy)], db)
}

// DiffWRT claims dy so that a second derivative reaches SymDiff and its
// error, as the GEMM ops after it do.
func (op *convGradOp) DiffWRT(inputs int) []bool { return []bool{false, true} }

func (op *convGradOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, errNoSecondDerivative("Conv")
}
