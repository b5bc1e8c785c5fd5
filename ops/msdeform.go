package ops

import (
	"fmt"
	"hash"
	"strings"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/kernels"
)

// Level is the size of one feature map of a multi-scale value tensor.
type Level struct{ H, W int }

// MSDeformAttn is Deformable-DETR's multi-scale deformable attention: every
// query samples P points on each of L feature maps per attention head and
// returns their weighted sum.
//
// value: [N,S,M,D], M heads of D channels, with S = sum(H*W) over levels,
// level l starting at the sum of the earlier levels' H*W, pixels row-major;
// samplingLoc: [N,Lq,M,L,P,2] normalised (x,y), (0,0) the top-left corner of
// a map and (1,1) its bottom-right corner; attnWeight: [N,Lq,M,L,P]. Returns
// [N,Lq,M*D]: for head m, channel d,
//
//	out[n,q,m*D+d] = sum over l, p of attnWeight[n,q,m,l,p] * sample,
//
// where sample is grid_sample(bilinear, zero padding, align_corners=False) of
// level l at samplingLoc[n,q,m,l,p]. A point whose four corners all lie
// outside its map, or whose location is NaN or infinite, adds nothing.
// Differentiable w.r.t. value, samplingLoc and attnWeight.
func MSDeformAttn(value, samplingLoc, attnWeight *G.Node, levels []Level) (*G.Node, error) {
	const op = "MSDeformAttn"
	if err := checkRank(op, "value", value, 4, "[N S M D]"); err != nil {
		return nil, err
	}
	if err := checkRank(op, "samplingLoc", samplingLoc, 6, "[N Lq M L P 2]"); err != nil {
		return nil, err
	}
	if err := checkRank(op, "attnWeight", attnWeight, 5, "[N Lq M L P]"); err != nil {
		return nil, err
	}
	dt, err := floatDtype(op, "value", value)
	if err != nil {
		return nil, err
	}
	if err := sameDtype(op, dt, map[string]*G.Node{"samplingLoc": samplingLoc, "attnWeight": attnWeight}); err != nil {
		return nil, err
	}
	vs, ls, ws := value.Shape(), samplingLoc.Shape(), attnWeight.Shape()
	for _, a := range []struct {
		name  string
		shape tensor.Shape
	}{{"value", vs}, {"samplingLoc", ls}, {"attnWeight", ws}} {
		for i, d := range a.shape {
			if d <= 0 {
				return nil, fmt.Errorf("ops: %s: %s must have positive sizes, got %v (dimension %d)", op, a.name, a.shape, i)
			}
		}
	}
	if len(levels) == 0 {
		return nil, fmt.Errorf("ops: %s: levels must not be empty", op)
	}
	s := vs[1]
	total := 0
	for i, lv := range levels {
		if lv.H <= 0 || lv.W <= 0 {
			return nil, fmt.Errorf("ops: %s: levels[%d] must have positive size, got %dx%d", op, i, lv.H, lv.W)
		}
		// Level sizes must add up to S, so a level larger than S (checked
		// without overflowing) is already wrong.
		if lv.W > s/lv.H || total > s-lv.H*lv.W {
			total = -1
			break
		}
		total += lv.H * lv.W
	}
	if total != s {
		return nil, fmt.Errorf("ops: %s: value must have shape [N S M D] with S = %s, the sum of H*W over levels, got %v",
			op, levelSum(levels), vs)
	}
	sh := msDeformShape{
		n: vs[0], s: s, m: vs[2], d: vs[3],
		lq: ls[1], l: len(levels), p: ls[4],
		levels: append([]Level(nil), levels...), dt: dt,
	}
	if want := sh.locShape(); !ls.Eq(want) {
		return nil, fmt.Errorf("ops: %s: samplingLoc must have shape [N Lq M L P 2] = [%d Lq %d %d P 2] (N and M from value, L = len(levels)), got %v",
			op, sh.n, sh.m, sh.l, ls)
	}
	if want := sh.weightShape(); !ws.Eq(want) {
		return nil, fmt.Errorf("ops: %s: attnWeight must have shape [N Lq M L P] = %v (from value and samplingLoc), got %v",
			op, []int(want), ws)
	}
	return G.ApplyOp(&msDeformAttnOp{sh}, value, samplingLoc, attnWeight)
}

// levelSum spells out the expected S, e.g. "32*32+16*16 = 1280".
func levelSum(levels []Level) string {
	terms := make([]string, len(levels))
	total := 0
	for i, lv := range levels {
		terms[i] = fmt.Sprintf("%d*%d", lv.H, lv.W)
		total += lv.H * lv.W
	}
	return fmt.Sprintf("%s = %d", strings.Join(terms, "+"), total)
}

// msDeformShape is what both MSDeformAttn ops know at graph-build time.
type msDeformShape struct {
	n, s, m, d int
	lq, l, p   int
	levels     []Level
	dt         tensor.Dtype
}

func (s msDeformShape) params() kernels.MSDeformAttnParams {
	p := kernels.MSDeformAttnParams{
		N: s.n, S: s.s, M: s.m, D: s.d, Lq: s.lq, L: s.l, P: s.p,
		H: make([]int, s.l), W: make([]int, s.l), Start: make([]int, s.l),
	}
	start := 0
	for i, lv := range s.levels {
		p.H[i], p.W[i], p.Start[i] = lv.H, lv.W, start
		start += lv.H * lv.W
	}
	return p
}

func (s msDeformShape) valueShape() tensor.Shape  { return tensor.Shape{s.n, s.s, s.m, s.d} }
func (s msDeformShape) locShape() tensor.Shape    { return tensor.Shape{s.n, s.lq, s.m, s.l, s.p, 2} }
func (s msDeformShape) weightShape() tensor.Shape { return tensor.Shape{s.n, s.lq, s.m, s.l, s.p} }
func (s msDeformShape) outShape() tensor.Shape    { return tensor.Shape{s.n, s.lq, s.m * s.d} }

// packedShape is the backward op's output: the three gradients one after the
// other.
func (s msDeformShape) packedShape() tensor.Shape {
	return tensor.Shape{autograd.PackedSize(s.valueShape(), s.locShape(), s.weightShape())}
}

func (s msDeformShape) String() string {
	return fmt.Sprintf("value=%v,loc=%v,levels=%v,%v", s.valueShape(), s.locShape(), s.levels, s.dt)
}

// msDeformAttnOp is the forward op: (value, samplingLoc, attnWeight) -> out.
type msDeformAttnOp struct{ msDeformShape }

func (op *msDeformAttnOp) Arity() int            { return 3 }
func (op *msDeformAttnOp) Type() hm.Type         { return fnType(4, 6, 5, 3) }
func (op *msDeformAttnOp) ReturnsPtr() bool      { return false }
func (op *msDeformAttnOp) CallsExtern() bool     { return false }
func (op *msDeformAttnOp) OverwritesInput() int  { return -1 }
func (op *msDeformAttnOp) String() string        { return "MSDeformAttn(" + op.msDeformShape.String() + ")" }
func (op *msDeformAttnOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *msDeformAttnOp) Hashcode() uint32      { return hashOf(op) }

func (op *msDeformAttnOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.outShape(), nil }

func (op *msDeformAttnOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

func (op *msDeformAttnOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	if len(in) != 3 {
		return nil, fmt.Errorf("ops: %v: want 3 inputs, got %d", op, len(in))
	}
	dev, err := inputsDevice("MSDeformAttn", []string{"value", "samplingLoc", "attnWeight"}, in)
	if err != nil {
		return nil, err
	}
	if dev != nil {
		return op.doDevice(dev, prealloc, in)
	}
	value, loc, weight, err := op.inputs("MSDeformAttn", in)
	if err != nil {
		return nil, err
	}
	out := output(prealloc, op.dt, op.outShape())
	p := op.params()
	switch op.dt {
	case tensor.Float32:
		kernels.MSDeformAttnForward(p, value.Float32s(), loc.Float32s(), weight.Float32s(), out.Float32s())
	default:
		kernels.MSDeformAttnForward(p, value.Float64s(), loc.Float64s(), weight.Float64s(), out.Float64s())
	}
	return out, nil
}

// inputs checks the values both ops read, (value, samplingLoc, attnWeight).
func (s msDeformShape) inputs(op string, in []G.Value) (value, loc, weight *tensor.Dense, err error) {
	if value, err = dense(op, "value", in[0], s.dt, s.valueShape()); err != nil {
		return
	}
	if loc, err = dense(op, "samplingLoc", in[1], s.dt, s.locShape()); err != nil {
		return
	}
	weight, err = dense(op, "attnWeight", in[2], s.dt, s.weightShape())
	return
}

func (op *msDeformAttnOp) DiffWRT(inputs int) []bool { return []bool{true, true, true} }

func (op *msDeformAttnOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if len(inputs) != 3 {
		return nil, fmt.Errorf("ops: %v: want 3 inputs, got %d", op, len(inputs))
	}
	packed, err := G.ApplyOp(&msDeformAttnGradOp{op.msDeformShape}, inputs[0], inputs[1], inputs[2], grad)
	if err != nil {
		return nil, fmt.Errorf("ops: MSDeformAttn backward: %w", err)
	}
	grads, err := autograd.Unpack(packed, op.valueShape(), op.locShape(), op.weightShape())
	if err != nil {
		return nil, fmt.Errorf("ops: MSDeformAttn backward: %w", err)
	}
	return grads, nil
}

// msDeformAttnGradOp is the backward op: (value, samplingLoc, attnWeight,
// gradOut) -> the gradients w.r.t. value, samplingLoc and attnWeight packed
// into one vector in that order. One pass computes all three, reading every
// sample's corners once.
type msDeformAttnGradOp struct{ msDeformShape }

func (op *msDeformAttnGradOp) Arity() int           { return 4 }
func (op *msDeformAttnGradOp) Type() hm.Type        { return fnType(4, 6, 5, 3, 1) }
func (op *msDeformAttnGradOp) ReturnsPtr() bool     { return false }
func (op *msDeformAttnGradOp) CallsExtern() bool    { return false }
func (op *msDeformAttnGradOp) OverwritesInput() int { return -1 }
func (op *msDeformAttnGradOp) String() string {
	return "MSDeformAttnGrad(" + op.msDeformShape.String() + ")"
}
func (op *msDeformAttnGradOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *msDeformAttnGradOp) Hashcode() uint32      { return hashOf(op) }

func (op *msDeformAttnGradOp) InferShape(...G.DimSizer) (tensor.Shape, error) {
	return op.packedShape(), nil
}

func (op *msDeformAttnGradOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

func (op *msDeformAttnGradOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	const name = "MSDeformAttn backward"
	if len(in) != 4 {
		return nil, fmt.Errorf("ops: %v: want 4 inputs, got %d", op, len(in))
	}
	dev, err := inputsDevice(name, []string{"value", "samplingLoc", "attnWeight", "grad"}, in)
	if err != nil {
		return nil, err
	}
	if dev != nil {
		return op.doDevice(dev, prealloc, in)
	}
	value, loc, weight, err := op.inputs(name, in[:3])
	if err != nil {
		return nil, err
	}
	gy, err := dense(name, "grad", in[3], op.dt, op.outShape())
	if err != nil {
		return nil, err
	}
	packed := output(prealloc, op.dt, op.packedShape())
	nv, nl := op.valueShape().TotalSize(), op.locShape().TotalSize()
	p := op.params()
	switch op.dt {
	case tensor.Float32:
		g := packed.Float32s()
		kernels.MSDeformAttnBackward(p, value.Float32s(), loc.Float32s(), weight.Float32s(), gy.Float32s(),
			g[:nv], g[nv:nv+nl], g[nv+nl:])
	default:
		g := packed.Float64s()
		kernels.MSDeformAttnBackward(p, value.Float64s(), loc.Float64s(), weight.Float64s(), gy.Float64s(),
			g[:nv], g[nv:nv+nl], g[nv+nl:])
	}
	return packed, nil
}

// Second derivatives are not implemented: the gradient w.r.t. samplingLoc is
// not even continuous where a point crosses a pixel boundary. DiffWRT says so,
// and SymDiff returns an error rather than a wrong graph.
func (op *msDeformAttnGradOp) DiffWRT(inputs int) []bool { return make([]bool, inputs) }

func (op *msDeformAttnGradOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("ops: %v: second derivatives of MSDeformAttn are not implemented", op)
}
