package ops

import (
	"fmt"
	"math"
	"strings"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/kernels"
)

// MultiLevelRoIAlignConfig configures MultiLevelRoIAlign. PooledH, PooledW,
// SamplingRatio and Aligned mean what they mean for RoIAlign.
type MultiLevelRoIAlignConfig struct {
	PooledH, PooledW int
	SamplingRatio    int
	Aligned          bool
	// Scales[l] is the spatial scale of level l's feature map (1/stride),
	// finest level first.
	Scales []float64
	// A RoI whose sqrt(width*height) is CanonicalSize (in image pixels) is
	// pooled from level CanonicalLevel (an index into Scales); every
	// doubling of its size moves it one level coarser, every halving one
	// level finer, clamped to the levels there are. This is the FPN paper's
	// k = floor(k0 + log2(sqrt(wh)/224)) with k0 = CanonicalLevel and 224 =
	// CanonicalSize.
	CanonicalSize  float64
	CanonicalLevel int
	// Columns lays the output out as [C*PooledH*PooledW, K], one column per
	// RoI, instead of [K, C, PooledH, PooledW]. A fully connected layer over
	// the pooled features is then one GEMM with the RoIs as its pixels: a
	// 1x1 convolution (ops.Conv) of the output reshaped to
	// [1, C*PooledH*PooledW, K, 1]. The op pools into rows and transposes
	// them (ops.Transpose), on the GPU too.
	Columns bool
}

// Level returns the level a RoI with corners (x1, y1) and (x2, y2) is
// pooled from. Empty, inverted and NaN boxes go to the finest level.
//
// The rule is FPN's k = floor(k0 + log2(s/CanonicalSize) + 1e-6) with s =
// sqrt(w*h) (kernels.RoILevelSize), clamped to the levels there are, in
// the form in which the GPU kernels apply it too: s compared with each
// level's start, CanonicalSize * 2^(l - k0 - 1e-6), worked out once here,
// so that a RoI gets the same level on the GPU as on the CPU, bit for bit,
// which two log2 implementations would not promise. The epsilon keeps
// exact powers of two on their own level despite rounding, as
// torchvision's LevelMapper's does.
func (c MultiLevelRoIAlignConfig) Level(x1, y1, x2, y2 float64) int {
	s := kernels.RoILevelSize(x1, y1, x2, y2)
	l := 0
	for l+1 < len(c.Scales) && s >= c.levelStart(l+1) {
		l++
	}
	return l
}

// levelStart is the smallest size (kernels.RoILevelSize) of level l > 0's
// RoIs: where k0 + log2(s/CanonicalSize) + 1e-6 reaches l. The starts
// increase with l, so the levels' ranges partition the sizes.
func (c MultiLevelRoIAlignConfig) levelStart(l int) float64 {
	return c.CanonicalSize * math.Exp2(float64(l-c.CanonicalLevel)-1e-6)
}

// level is level l's range of sizes, [its start, the next level's start),
// from -Inf for the finest level and to +Inf for the coarsest: the RoIs
// for which Level returns l.
func (c MultiLevelRoIAlignConfig) level(l int) *kernels.RoILevel {
	r := &kernels.RoILevel{Lo: math.Inf(-1), Hi: math.Inf(1)}
	if l > 0 {
		r.Lo = c.levelStart(l)
	}
	if l+1 < len(c.Scales) {
		r.Hi = c.levelStart(l + 1)
	}
	return r
}

func (c MultiLevelRoIAlignConfig) validate() error {
	if c.PooledH <= 0 || c.PooledW <= 0 {
		return fmt.Errorf("ops: MultiLevelRoIAlign: pooled size must be positive, got %dx%d", c.PooledH, c.PooledW)
	}
	if len(c.Scales) == 0 {
		return fmt.Errorf("ops: MultiLevelRoIAlign: Scales must name at least one level")
	}
	for l, s := range c.Scales {
		if !(s > 0) || math.IsInf(s, 0) {
			return fmt.Errorf("ops: MultiLevelRoIAlign: Scales[%d] must be positive and finite, got %v", l, s)
		}
	}
	if !(c.CanonicalSize > 0) || math.IsInf(c.CanonicalSize, 0) {
		return fmt.Errorf("ops: MultiLevelRoIAlign: CanonicalSize must be positive and finite, got %v", c.CanonicalSize)
	}
	if c.CanonicalLevel < 0 || c.CanonicalLevel >= len(c.Scales) {
		return fmt.Errorf("ops: MultiLevelRoIAlign: CanonicalLevel must index Scales [0, %d), got %d", len(c.Scales), c.CanonicalLevel)
	}
	return nil
}

// MultiLevelRoIAlign pools each RoI from the one level of a feature pyramid
// that suits its size (see MultiLevelRoIAlignConfig.Level), as
// torchvision's MultiScaleRoIAlign: RoIAlign of that level with its scale.
//
// features: one [N,C,H_l,W_l] map per level, all with the same N, C and
// dtype; rois: [K,5] rows (batch_index, x1, y1, x2, y2) in image
// coordinates. Returns [K,C,PooledH,PooledW] (or [C*PooledH*PooledW, K]
// with Columns). Differentiable with respect to every level's features
// (rois are not); a level that no RoI is assigned to gets a zero gradient.
// A RoI whose batch index is outside [0,N) makes the graph's run fail.
//
// On the GPU the level assignment costs nothing of its own: RoIAlign's
// kernels run once per level over all K RoIs, and a RoI of another level
// leaves its block at once (kernels/roialign.cu), so each RoI is pooled
// into its row of the output, and its gradient scattered into its level's,
// with no count of each level's RoIs on the host, no wait for the GPU and
// no gather or scatter of RoIs. The CPU twins do the same, loop for loop.
func MultiLevelRoIAlign(features []*G.Node, rois *G.Node, cfg MultiLevelRoIAlignConfig) (*G.Node, error) {
	const op = "MultiLevelRoIAlign"
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if len(features) != len(cfg.Scales) {
		return nil, fmt.Errorf("ops: %s: got %d feature maps for %d Scales", op, len(features), len(cfg.Scales))
	}
	if err := checkRank(op, "rois", rois, 2, "[K 5]"); err != nil {
		return nil, err
	}
	if s := rois.Shape(); s[1] != 5 {
		return nil, fmt.Errorf("ops: %s: rois must have shape [K 5], got %v", op, s)
	}
	s := multiRoIShape{cfg: cfg, k: rois.Shape()[0]}
	s.cfg.Scales = append([]float64(nil), cfg.Scales...)
	var err error
	for l, f := range features {
		arg := fmt.Sprintf("features[%d]", l)
		if err := checkRank(op, arg, f, 4, "[N C H W]"); err != nil {
			return nil, err
		}
		fs := f.Shape()
		for i, d := range fs {
			if d <= 0 {
				return nil, fmt.Errorf("ops: %s: %s must have positive sizes, got %v (dimension %d)", op, arg, fs, i)
			}
		}
		if l == 0 {
			if s.dt, err = floatDtype(op, arg, f); err != nil {
				return nil, err
			}
			s.n, s.c = fs[0], fs[1]
		} else if fs[0] != s.n || fs[1] != s.c {
			return nil, fmt.Errorf("ops: %s: %s must have shape [%d %d H W] like features[0], got %v", op, arg, s.n, s.c, fs)
		}
		if err := sameDtype(op, s.dt, map[string]*G.Node{arg: f}); err != nil {
			return nil, err
		}
		s.hw = append(s.hw, [2]int{fs[2], fs[3]})
	}
	if err := sameDtype(op, s.dt, map[string]*G.Node{"rois": rois}); err != nil {
		return nil, err
	}
	inputs := append(append(G.Nodes{}, features...), rois)
	y, err := G.ApplyOp(multiRoIOp(&s), inputs...)
	if err != nil || !cfg.Columns {
		return y, err
	}
	// Columns: the pooled rows [K, D] transposed, on the device too; the
	// gradient comes back through the transpose as rows.
	return Transpose(y, 0, 1)
}

// multiRoIShape is what the multi-level RoIAlign ops know at graph-build
// time.
type multiRoIShape struct {
	cfg  MultiLevelRoIAlignConfig
	n, c int
	hw   [][2]int // per level
	k    int
	dt   tensor.Dtype
}

func (s multiRoIShape) levels() int { return len(s.hw) }

func (s multiRoIShape) featShape(l int) tensor.Shape {
	return tensor.Shape{s.n, s.c, s.hw[l][0], s.hw[l][1]}
}

func (s multiRoIShape) roiShape() tensor.Shape { return tensor.Shape{s.k, 5} }

// rowsShape is the shape of the ops' pooled rows (and their gradient):
// [K, C, PooledH, PooledW], or [K, C*PooledH*PooledW] with Columns, which
// MultiLevelRoIAlign then transposes.
func (s multiRoIShape) rowsShape() tensor.Shape {
	c := s.cfg
	if c.Columns {
		return tensor.Shape{s.k, s.c * c.PooledH * c.PooledW}
	}
	return tensor.Shape{s.k, s.c, c.PooledH, c.PooledW}
}

// roiAlign is RoIAlign's view of level l: its map and scale, all K RoIs,
// and the range of sizes of the level's RoIs, to which the kernels keep.
func (s multiRoIShape) roiAlign(l int) roiAlignShape {
	return roiAlignShape{
		cfg: RoIAlignConfig{
			PooledH: s.cfg.PooledH, PooledW: s.cfg.PooledW, SpatialScale: s.cfg.Scales[l],
			SamplingRatio: s.cfg.SamplingRatio, Aligned: s.cfg.Aligned,
		},
		n: s.n, c: s.c, h: s.hw[l][0], w: s.hw[l][1], k: s.k, dt: s.dt,
		level: s.cfg.level(l), op: "MultiLevelRoIAlign",
	}
}

func (s multiRoIShape) String() string {
	c := s.cfg
	var maps []string
	for l := range s.hw {
		maps = append(maps, fmt.Sprintf("%v@%v", s.featShape(l), c.Scales[l]))
	}
	return fmt.Sprintf("features=[%s],rois=%d,%v,pooled=%dx%d,sampling=%d,aligned=%t,canonical=%v@%d,columns=%t",
		strings.Join(maps, " "), s.k, s.dt, c.PooledH, c.PooledW, c.SamplingRatio, c.Aligned,
		c.CanonicalSize, c.CanonicalLevel, c.Columns)
}

// multiRoIForward pools every level's RoIs with the RoIAlign kernel
// straight into their rows of out, one call per level over all the RoIs
// (each RoI is of one level), as the device launcher does. in holds each
// level's features, then the RoIs.
func multiRoIForward[T kernels.Float](s *multiRoIShape, in [][]T, out []T) error {
	feats, rois := in[:s.levels()], in[s.levels()]
	for l := range s.levels() {
		if err := kernels.RoIAlignForward(s.roiAlign(l).params(), feats[l], rois, out); err != nil {
			return fmt.Errorf("level %d: %w", l, err)
		}
	}
	return nil
}

// multiRoILevel is the backward op's parameter: the shapes and its level.
type multiRoILevel struct {
	*multiRoIShape
	level int
}

// multiRoILevelBackward computes the gradient of level l's features from
// (rois, gradient of the rows) = in: the RoIAlign backward kernel over all
// the RoIs, the level's scattering (it zeroes gradX first).
func multiRoILevelBackward[T kernels.Float](p multiRoILevel, in [][]T, gradX []T) error {
	if err := kernels.RoIAlignBackward(p.roiAlign(p.level).params(), in[0], in[1], gradX); err != nil {
		return fmt.Errorf("level %d: %w", p.level, err)
	}
	return nil
}

// multiRoIOp is the forward op: (features..., rois) -> pooled rows.
func multiRoIOp(s *multiRoIShape) *specOp {
	inputs := make([]argSpec, 0, s.levels()+1)
	diffWRT := make([]bool, 0, s.levels()+1)
	for l := range s.levels() {
		inputs = append(inputs, argSpec{name: fmt.Sprintf("features[%d]", l), shape: s.featShape(l)})
		diffWRT = append(diffWRT, true)
	}
	inputs = append(inputs, argSpec{name: "rois", shape: s.roiShape()})
	diffWRT = append(diffWRT, false)
	return newOp(&opSpec{
		name: "MultiLevelRoIAlign", config: s.String(),
		inputs: inputs, out: s.rowsShape(), dtype: s.dt,
		cpu:     floatTwin(s, multiRoIForward[float32], multiRoIForward[float64]),
		device:  s.forwardDevice,
		diffWRT: diffWRT,
		grad: func(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			rois := in[s.levels()]
			grads := make(G.Nodes, len(in))
			for l := range s.levels() {
				d, err := G.ApplyOp(multiRoIGradOp(s, l), rois, grad)
				if err != nil {
					return nil, fmt.Errorf("ops: MultiLevelRoIAlign backward: %w", err)
				}
				grads[l] = d
			}
			return grads, nil
		},
	})
}

// multiRoIGradOp is the backward op of one level: (rois, gradient of the
// rows) -> gradient of that level's features. One op per level keeps each
// gradient a plain tensor; each scatters only its own level's RoIs.
func multiRoIGradOp(s *multiRoIShape, level int) *specOp {
	p := multiRoILevel{s, level}
	return newOp(&opSpec{
		name: "MultiLevelRoIAlign backward", config: fmt.Sprintf("level=%d,%v", level, s),
		inputs: []argSpec{{name: "rois", shape: s.roiShape()}, {name: "grad", shape: s.rowsShape()}},
		out:    s.featShape(level), dtype: s.dt,
		cpu:     floatTwin(p, multiRoILevelBackward[float32], multiRoILevelBackward[float64]),
		device:  p.backwardDevice,
		diffWRT: []bool{false, true},
		grad: func(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
			return nil, errNoSecondDerivative("MultiLevelRoIAlign")
		},
	})
}

// forwardDevice is multiRoIOp's device launcher: RoIAlign's forward once
// per level, each writing its own RoIs' rows of the one output.
func (s *multiRoIShape) forwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	rois := a.ptr[s.levels()]
	for l := range s.levels() {
		if err := s.roiAlign(l).forwardInto(a.dev, a.ptr[l], rois, outPtr); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// backwardDevice is multiRoIGradOp's device launcher: RoIAlign's backward
// over the level's RoIs.
func (p multiRoILevel) backwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	gx, gxPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	if err := p.roiAlign(p.level).backwardInto(a.dev, a.ptr[0], a.ptr[1], gx, gxPtr); err != nil {
		return nil, err
	}
	return gx, nil
}
