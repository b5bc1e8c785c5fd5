package ops

import (
	"fmt"
	"strings"

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
	const op = msDeformName
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
	return G.ApplyOp(msDeformAttnOp(sh), value, samplingLoc, attnWeight)
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

// The ops' names, in errors and in String.
const (
	msDeformName     = "MSDeformAttn"
	msDeformGradName = "MSDeformAttn backward"
)

// inputs are the three inputs both ops read, (value, samplingLoc,
// attnWeight).
func (s msDeformShape) inputs() []argSpec {
	return []argSpec{
		{name: "value", shape: s.valueShape()},
		{name: "samplingLoc", shape: s.locShape()},
		{name: "attnWeight", shape: s.weightShape()},
	}
}

// msDeformAttnOp is the forward op: (value, samplingLoc, attnWeight) -> out.
func msDeformAttnOp(s msDeformShape) *specOp {
	return newOp(&opSpec{
		name: msDeformName, config: s.String(),
		inputs: s.inputs(),
		out:    s.outShape(), dtype: s.dt,
		cpu:     floatTwin(s.params(), msDeformForward[float32], msDeformForward[float64]),
		device:  s.forwardDevice,
		diffWRT: []bool{true, true, true},
		grad: func(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			packed, err := G.ApplyOp(msDeformAttnGradOp(s), in[0], in[1], in[2], grad)
			if err != nil {
				return nil, fmt.Errorf("ops: %s: %w", msDeformGradName, err)
			}
			grads, err := autograd.Unpack(packed, s.valueShape(), s.locShape(), s.weightShape())
			if err != nil {
				return nil, fmt.Errorf("ops: %s: %w", msDeformGradName, err)
			}
			return grads, nil
		},
	})
}

// msDeformAttnGradOp is the backward op: (value, samplingLoc, attnWeight,
// gradOut) -> the gradients w.r.t. value, samplingLoc and attnWeight packed
// into one vector in that order (packedShape; autograd.Unpack carves it).
// One pass computes all three, reading every sample's corners once.
//
// Second derivatives are not implemented: the gradient w.r.t. samplingLoc is
// not even continuous where a point crosses a pixel boundary. DiffWRT says so
// (no diffWRT), and SymDiff returns an error rather than a wrong graph.
func msDeformAttnGradOp(s msDeformShape) *specOp {
	return newOp(&opSpec{
		name: msDeformGradName, config: s.String(),
		inputs: append(s.inputs(), argSpec{name: "grad", shape: s.outShape()}),
		out:    s.packedShape(), dtype: s.dt,
		cpu:    floatTwin(s.params(), msDeformBackward[float32], msDeformBackward[float64]),
		device: s.backwardDevice,
		grad: func(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
			return nil, fmt.Errorf("ops: %s: second derivatives of MSDeformAttn are not implemented", msDeformGradName)
		},
	})
}

func msDeformForward[T kernels.Float](p kernels.MSDeformAttnParams, in [][]T, out []T) error {
	kernels.MSDeformAttnForward(p, in[0], in[1], in[2], out)
	return nil
}

// msDeformBackward carves the packed output into the three gradients, which
// the kernel overwrites entirely.
func msDeformBackward[T kernels.Float](p kernels.MSDeformAttnParams, in [][]T, packed []T) error {
	nv := len(in[0]) // value, and so its gradient
	nl := len(in[1]) // samplingLoc
	kernels.MSDeformAttnBackward(p, in[0], in[1], in[2], in[3], packed[:nv], packed[nv:nv+nl], packed[nv+nl:])
	return nil
}
