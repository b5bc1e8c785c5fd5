package ops

import (
	"fmt"
	"hash"
	"math"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/kernels"
)

// RoIAlignConfig configures RoIAlign. The fields mean what torchvision's
// roi_align arguments of the same names mean.
type RoIAlignConfig struct {
	PooledH, PooledW int
	SpatialScale     float64
	SamplingRatio    int  // <= 0: adaptive, ceil(roi_size/pooled_size) samples per bin side
	Aligned          bool // true: pixel-centre alignment (-0.5 offset), as torchvision
}

func (c RoIAlignConfig) validate() error {
	if c.PooledH <= 0 || c.PooledW <= 0 {
		return fmt.Errorf("ops: RoIAlign: pooled size must be positive, got %dx%d", c.PooledH, c.PooledW)
	}
	if !(c.SpatialScale > 0) || math.IsInf(c.SpatialScale, 0) {
		return fmt.Errorf("ops: RoIAlign: SpatialScale must be positive and finite, got %v", c.SpatialScale)
	}
	return nil
}

// RoIAlign pools each region of interest of x into a PooledH x PooledW grid
// of bilinearly interpolated averages, as torchvision.ops.roi_align.
//
// x: [N,C,H,W]; rois: [K,5] rows (batch_index, x1, y1, x2, y2) in
// input-image coordinates, scaled by SpatialScale onto x. Returns
// [K,C,PooledH,PooledW]. Differentiable w.r.t. x (rois are not). A RoI whose
// batch index is outside [0,N) makes the graph's run fail with an error.
func RoIAlign(x, rois *G.Node, cfg RoIAlignConfig) (*G.Node, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := checkRank("RoIAlign", "x", x, 4, "[N C H W]"); err != nil {
		return nil, err
	}
	if err := checkRank("RoIAlign", "rois", rois, 2, "[K 5]"); err != nil {
		return nil, err
	}
	if s := rois.Shape(); s[1] != 5 {
		return nil, fmt.Errorf("ops: RoIAlign: rois must have shape [K 5], got %v", s)
	}
	dt, err := floatDtype("RoIAlign", "x", x)
	if err != nil {
		return nil, err
	}
	if err := sameDtype("RoIAlign", dt, map[string]*G.Node{"rois": rois}); err != nil {
		return nil, err
	}
	xs := x.Shape()
	for i, d := range xs {
		if d <= 0 {
			return nil, fmt.Errorf("ops: RoIAlign: x must have positive sizes, got %v (dimension %d)", xs, i)
		}
	}
	op := &roiAlignOp{roiAlignShape{
		cfg: cfg, n: xs[0], c: xs[1], h: xs[2], w: xs[3], k: rois.Shape()[0], dt: dt,
	}}
	return G.ApplyOp(op, x, rois)
}

// roiAlignShape is what both RoIAlign ops know at graph-build time.
type roiAlignShape struct {
	cfg        RoIAlignConfig
	n, c, h, w int
	k          int
	dt         tensor.Dtype
}

func (s roiAlignShape) params() kernels.RoIAlignParams {
	return kernels.RoIAlignParams{
		N: s.n, C: s.c, H: s.h, W: s.w, K: s.k,
		PooledH: s.cfg.PooledH, PooledW: s.cfg.PooledW,
		SpatialScale:  s.cfg.SpatialScale,
		SamplingRatio: s.cfg.SamplingRatio,
		Aligned:       s.cfg.Aligned,
	}
}

func (s roiAlignShape) xShape() tensor.Shape   { return tensor.Shape{s.n, s.c, s.h, s.w} }
func (s roiAlignShape) roiShape() tensor.Shape { return tensor.Shape{s.k, 5} }
func (s roiAlignShape) outShape() tensor.Shape {
	return tensor.Shape{s.k, s.c, s.cfg.PooledH, s.cfg.PooledW}
}

func (s roiAlignShape) String() string {
	c := s.cfg
	return fmt.Sprintf("x=%v,rois=%v,%v,pooled=%dx%d,scale=%v,sampling=%d,aligned=%t",
		s.xShape(), s.k, s.dt, c.PooledH, c.PooledW, c.SpatialScale, c.SamplingRatio, c.Aligned)
}

// roiAlignOp is the forward op: (x, rois) -> pooled.
type roiAlignOp struct{ roiAlignShape }

func (op *roiAlignOp) Arity() int       { return 2 }
func (op *roiAlignOp) Type() hm.Type    { return fnType(4, 2, 4) }
func (op *roiAlignOp) ReturnsPtr() bool { return false }
func (op *roiAlignOp) CallsExtern() bool {
	return false
}
func (op *roiAlignOp) OverwritesInput() int  { return -1 }
func (op *roiAlignOp) String() string        { return "RoIAlign(" + op.roiAlignShape.String() + ")" }
func (op *roiAlignOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *roiAlignOp) Hashcode() uint32      { return hashOf(op) }

func (op *roiAlignOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.outShape(), nil }

func (op *roiAlignOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

func (op *roiAlignOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("ops: %v: want 2 inputs, got %d", op, len(in))
	}
	dev, err := inputsDevice("RoIAlign", []string{"x", "rois"}, in)
	if err != nil {
		return nil, err
	}
	if dev != nil {
		return op.doDevice(dev, prealloc, in)
	}
	x, err := dense("RoIAlign", "x", in[0], op.dt, op.xShape())
	if err != nil {
		return nil, err
	}
	rois, err := dense("RoIAlign", "rois", in[1], op.dt, op.roiShape())
	if err != nil {
		return nil, err
	}
	out := output(prealloc, op.dt, op.outShape())
	p := op.params()
	switch op.dt {
	case tensor.Float32:
		err = kernels.RoIAlignForward(p, x.Float32s(), rois.Float32s(), out.Float32s())
	default:
		err = kernels.RoIAlignForward(p, x.Float64s(), rois.Float64s(), out.Float64s())
	}
	if err != nil {
		return nil, fmt.Errorf("ops: RoIAlign: %w", err)
	}
	return out, nil
}

func (op *roiAlignOp) DiffWRT(inputs int) []bool { return []bool{true, false} }

func (op *roiAlignOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if len(inputs) != 2 {
		return nil, fmt.Errorf("ops: %v: want 2 inputs, got %d", op, len(inputs))
	}
	dx, err := G.ApplyOp(&roiAlignGradOp{op.roiAlignShape}, inputs[1], grad)
	if err != nil {
		return nil, fmt.Errorf("ops: RoIAlign backward: %w", err)
	}
	return G.Nodes{dx, nil}, nil
}

// roiAlignGradOp is the backward op: (rois, gradOut) -> gradX. It zeroes
// gradX itself and scatters into it (atomicAdd on the GPU). RoIAlign is
// linear in x, so this op is its adjoint, and its own gradient with respect to
// gradOut is RoIAlign again: second derivatives work too.
type roiAlignGradOp struct{ roiAlignShape }

func (op *roiAlignGradOp) Arity() int            { return 2 }
func (op *roiAlignGradOp) Type() hm.Type         { return fnType(2, 4, 4) }
func (op *roiAlignGradOp) ReturnsPtr() bool      { return false }
func (op *roiAlignGradOp) CallsExtern() bool     { return false }
func (op *roiAlignGradOp) OverwritesInput() int  { return -1 }
func (op *roiAlignGradOp) String() string        { return "RoIAlignGrad(" + op.roiAlignShape.String() + ")" }
func (op *roiAlignGradOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *roiAlignGradOp) Hashcode() uint32      { return hashOf(op) }

func (op *roiAlignGradOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.xShape(), nil }

func (op *roiAlignGradOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

func (op *roiAlignGradOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("ops: %v: want 2 inputs, got %d", op, len(in))
	}
	dev, err := inputsDevice("RoIAlign backward", []string{"rois", "grad"}, in)
	if err != nil {
		return nil, err
	}
	if dev != nil {
		return op.doDevice(dev, prealloc, in)
	}
	rois, err := dense("RoIAlign backward", "rois", in[0], op.dt, op.roiShape())
	if err != nil {
		return nil, err
	}
	gy, err := dense("RoIAlign backward", "grad", in[1], op.dt, op.outShape())
	if err != nil {
		return nil, err
	}
	gx := output(prealloc, op.dt, op.xShape())
	p := op.params()
	switch op.dt {
	case tensor.Float32:
		err = kernels.RoIAlignBackward(p, rois.Float32s(), gy.Float32s(), gx.Float32s())
	default:
		err = kernels.RoIAlignBackward(p, rois.Float64s(), gy.Float64s(), gx.Float64s())
	}
	if err != nil {
		return nil, fmt.Errorf("ops: RoIAlign backward: %w", err)
	}
	return gx, nil
}

func (op *roiAlignGradOp) DiffWRT(inputs int) []bool { return []bool{false, true} }

func (op *roiAlignGradOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if len(inputs) != 2 {
		return nil, fmt.Errorf("ops: %v: want 2 inputs, got %d", op, len(inputs))
	}
	dgy, err := G.ApplyOp(&roiAlignOp{op.roiAlignShape}, grad, inputs[0])
	if err != nil {
		return nil, fmt.Errorf("ops: RoIAlign second derivative: %w", err)
	}
	return G.Nodes{nil, dgy}, nil
}
