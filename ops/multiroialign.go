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
	// [1, C*PooledH*PooledW, K, 1], with no transpose in between.
	Columns bool
}

// Level returns the level a RoI with corners (x1, y1) and (x2, y2) is
// pooled from. Empty, inverted and NaN boxes go to the finest level.
func (c MultiLevelRoIAlignConfig) Level(x1, y1, x2, y2 float64) int {
	w, h := x2-x1, y2-y1
	if !(w > 0 && h > 0) {
		return 0
	}
	// The epsilon keeps exact powers of two on their own level despite
	// rounding in log2, as torchvision's LevelMapper does.
	l := float64(c.CanonicalLevel) + math.Floor(math.Log2(math.Sqrt(w*h)/c.CanonicalSize)+1e-6)
	switch {
	case !(l >= 0):
		return 0
	case l > float64(len(c.Scales)-1):
		return len(c.Scales) - 1
	}
	return int(l)
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
	return G.ApplyOp(multiRoIOp(&s), inputs...)
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

func (s multiRoIShape) outShape() tensor.Shape {
	c := s.cfg
	if c.Columns {
		return tensor.Shape{s.c * c.PooledH * c.PooledW, s.k}
	}
	return tensor.Shape{s.k, s.c, c.PooledH, c.PooledW}
}

// params returns the kernels' description of level l for k RoIs.
func (s multiRoIShape) params(l, k int) kernels.RoIAlignParams {
	return kernels.RoIAlignParams{
		N: s.n, C: s.c, H: s.hw[l][0], W: s.hw[l][1], K: k,
		PooledH: s.cfg.PooledH, PooledW: s.cfg.PooledW,
		SpatialScale:  s.cfg.Scales[l],
		SamplingRatio: s.cfg.SamplingRatio,
		Aligned:       s.cfg.Aligned,
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

// assignLevels checks the RoIs' batch indices and returns, per level, the
// rows of the RoIs it pools. The check is made here, over all rows, so that
// errors name a RoI's row in rois rather than in its level's subset.
func assignLevels[T kernels.Float](s *multiRoIShape, rois []T) ([][]int, error) {
	rows := make([][]int, s.levels())
	for k := range s.k {
		r := rois[k*5 : k*5+5]
		if b := r[0]; !(b > -1 && b < T(s.n)) { // as kernels.RoIAlign*: NaN fails
			return nil, fmt.Errorf("roi %d has batch index %v, want a value in [0, %d)", k, b, s.n)
		}
		l := s.cfg.Level(float64(r[1]), float64(r[2]), float64(r[3]), float64(r[4]))
		rows[l] = append(rows[l], k)
	}
	return rows, nil
}

// gatherLevelRoIs copies the listed rows of rois into a [len(rows), 5] array.
func gatherLevelRoIs[T kernels.Float](rois []T, rows []int) []T {
	sub := make([]T, 5*len(rows))
	for i, k := range rows {
		copy(sub[i*5:i*5+5], rois[k*5:k*5+5])
	}
	return sub
}

// multiRoIForward pools every level's RoIs with the RoIAlign kernel into a
// compact buffer and scatters the results into out's rows (or columns).
// in holds each level's features, then the RoIs.
func multiRoIForward[T kernels.Float](s *multiRoIShape, in [][]T, out []T) error {
	feats, rois := in[:s.levels()], in[s.levels()]
	rows, err := assignLevels(s, rois)
	if err != nil {
		return err
	}
	d := s.c * s.cfg.PooledH * s.cfg.PooledW
	for l, rs := range rows {
		if len(rs) == 0 {
			continue
		}
		buf := make([]T, len(rs)*d)
		if err := kernels.RoIAlignForward(s.params(l, len(rs)), feats[l], gatherLevelRoIs(rois, rs), buf); err != nil {
			return fmt.Errorf("level %d: %w", l, err)
		}
		for i, k := range rs {
			src := buf[i*d : (i+1)*d]
			if !s.cfg.Columns {
				copy(out[k*d:(k+1)*d], src)
				continue
			}
			for r, v := range src {
				out[r*s.k+k] = v
			}
		}
	}
	return nil
}

// multiRoIBackward computes the gradient of level l's features: it gathers
// the output gradient of the level's RoIs and scatters it with the RoIAlign
// backward kernel (which zeroes gradX first).
func multiRoIBackward[T kernels.Float](s *multiRoIShape, l int, rois, gradOut, gradX []T) error {
	rows, err := assignLevels(s, rois)
	if err != nil {
		return err
	}
	rs := rows[l]
	d := s.c * s.cfg.PooledH * s.cfg.PooledW
	buf := make([]T, len(rs)*d)
	for i, k := range rs {
		dst := buf[i*d : (i+1)*d]
		if !s.cfg.Columns {
			copy(dst, gradOut[k*d:(k+1)*d])
			continue
		}
		for r := range dst {
			dst[r] = gradOut[r*s.k+k]
		}
	}
	if err := kernels.RoIAlignBackward(s.params(l, len(rs)), gatherLevelRoIs(rois, rs), buf, gradX); err != nil {
		return fmt.Errorf("level %d: %w", l, err)
	}
	return nil
}

// multiRoILevel is the backward op's parameter: the shapes and its level.
type multiRoILevel struct {
	*multiRoIShape
	level int
}

// multiRoILevelBackward is multiRoIBackward for (rois, gradOut) = in.
func multiRoILevelBackward[T kernels.Float](p multiRoILevel, in [][]T, gradX []T) error {
	return multiRoIBackward(p.multiRoIShape, p.level, in[0], in[1], gradX)
}

// multiRoIOp is the forward op: (features..., rois) -> pooled.
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
		inputs: inputs, out: s.outShape(), dtype: s.dt,
		cpu:     floatTwin(s, multiRoIForward[float32], multiRoIForward[float64]),
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

// multiRoIGradOp is the backward op of one level: (rois, gradOut) ->
// gradient of that level's features. One op per level keeps each gradient
// a plain tensor; each reads only the rows of its own RoIs.
func multiRoIGradOp(s *multiRoIShape, level int) *specOp {
	p := multiRoILevel{s, level}
	return newOp(&opSpec{
		name: "MultiLevelRoIAlign backward", config: fmt.Sprintf("level=%d,%v", level, s),
		inputs: []argSpec{{name: "rois", shape: s.roiShape()}, {name: "grad", shape: s.outShape()}},
		out:    s.featShape(level), dtype: s.dt,
		cpu:     floatTwin(p, multiRoILevelBackward[float32], multiRoILevelBackward[float64]),
		diffWRT: []bool{false, true},
		grad: func(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
			return nil, errNoSecondDerivative("MultiLevelRoIAlign")
		},
	})
}
