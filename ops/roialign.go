package ops

import (
	"fmt"
	"math"

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
// Without Aligned, an empty or inverted box pools a 1x1 region, as
// torchvision's; a box with a NaN coordinate pools zeros, on the CPU and
// the GPU alike (torchvision's CUDA kernel would pool a 1-pixel strip for
// a NaN x2 or y2).
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
	s := roiAlignShape{cfg: cfg, n: xs[0], c: xs[1], h: xs[2], w: xs[3], k: rois.Shape()[0], dt: dt}
	return G.ApplyOp(roiAlignOp(s), x, rois)
}

// roiAlignShape is what both RoIAlign ops know at graph-build time.
type roiAlignShape struct {
	cfg        RoIAlignConfig
	n, c, h, w int
	k          int
	dt         tensor.Dtype
	// level, when set, restricts the kernels to one level's RoIs (one
	// level of a MultiLevelRoIAlign, named by op in errors).
	level *kernels.RoILevel
	op    string
}

// opName names the forward (or backward) op in errors.
func (s roiAlignShape) opName(backward bool) string {
	name := "RoIAlign"
	if s.op != "" {
		name = s.op
	}
	if backward {
		name += " backward"
	}
	return name
}

func (s roiAlignShape) params() kernels.RoIAlignParams {
	return kernels.RoIAlignParams{
		N: s.n, C: s.c, H: s.h, W: s.w, K: s.k,
		PooledH: s.cfg.PooledH, PooledW: s.cfg.PooledW,
		SpatialScale:  s.cfg.SpatialScale,
		SamplingRatio: s.cfg.SamplingRatio,
		Aligned:       s.cfg.Aligned,
		Level:         s.level,
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
func roiAlignOp(s roiAlignShape) *specOp {
	return newOp(&opSpec{
		name: "RoIAlign", config: s.String(),
		inputs: []argSpec{{name: "x", shape: s.xShape()}, {name: "rois", shape: s.roiShape()}},
		out:    s.outShape(), dtype: s.dt,
		cpu:     floatTwin(s.params(), roiAlignForward[float32], roiAlignForward[float64]),
		device:  s.forwardDevice,
		diffWRT: []bool{true, false},
		grad: func(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			dx, err := G.ApplyOp(roiAlignGradOp(s), in[1], grad)
			if err != nil {
				return nil, fmt.Errorf("ops: RoIAlign backward: %w", err)
			}
			return G.Nodes{dx, nil}, nil
		},
	})
}

// roiAlignGradOp is the backward op: (rois, gradOut) -> gradX. It zeroes
// gradX itself and scatters into it (atomicAdd on the GPU). RoIAlign is
// linear in x, so this op is its adjoint, and its own gradient with respect to
// gradOut is RoIAlign again: second derivatives work too.
func roiAlignGradOp(s roiAlignShape) *specOp {
	return newOp(&opSpec{
		name: "RoIAlign backward", config: s.String(),
		inputs: []argSpec{{name: "rois", shape: s.roiShape()}, {name: "grad", shape: s.outShape()}},
		out:    s.xShape(), dtype: s.dt,
		cpu:     floatTwin(s.params(), roiAlignBackward[float32], roiAlignBackward[float64]),
		device:  s.backwardDevice,
		diffWRT: []bool{false, true},
		grad: func(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			dgy, err := G.ApplyOp(roiAlignOp(s), grad, in[0])
			if err != nil {
				return nil, fmt.Errorf("ops: RoIAlign second derivative: %w", err)
			}
			return G.Nodes{nil, dgy}, nil
		},
	})
}

func roiAlignForward[T kernels.Float](p kernels.RoIAlignParams, in [][]T, out []T) error {
	return kernels.RoIAlignForward(p, in[0], in[1], out)
}

func roiAlignBackward[T kernels.Float](p kernels.RoIAlignParams, in [][]T, out []T) error {
	return kernels.RoIAlignBackward(p, in[0], in[1], out)
}
