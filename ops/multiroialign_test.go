package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
)

// Three levels of strides 4, 8 and 16; a 32-pixel RoI belongs on the
// middle one.
var pyramidCfg = MultiLevelRoIAlignConfig{
	PooledH: 2, PooledW: 2, SamplingRatio: 2, Aligned: true,
	Scales: []float64{1.0 / 4, 1.0 / 8, 1.0 / 16}, CanonicalSize: 32, CanonicalLevel: 1,
}

func TestMultiLevelRoIAlignLevel(t *testing.T) {
	nan := math.NaN()
	for _, c := range []struct {
		box  [4]float64
		want int
	}{
		{[4]float64{0, 0, 32, 32}, 1},
		{[4]float64{10, 10, 42, 42}, 1},
		{[4]float64{0, 0, 31.9, 32}, 0}, // just under the canonical size
		{[4]float64{0, 0, 16, 16}, 0},
		{[4]float64{0, 0, 64, 16}, 1}, // sqrt(64*16) = 32
		{[4]float64{0, 0, 64, 64}, 2},
		{[4]float64{0, 0, 1000, 1000}, 2}, // clamped to the coarsest
		{[4]float64{0, 0, 2, 2}, 0},       // clamped to the finest
		{[4]float64{5, 5, 5, 9}, 0},       // empty
		{[4]float64{9, 9, 5, 5}, 0},       // inverted
		{[4]float64{0, 0, nan, 30}, 0},
	} {
		if got := pyramidCfg.Level(c.box[0], c.box[1], c.box[2], c.box[3]); got != c.want {
			t.Errorf("Level(%v) = %d, want %d", c.box, got, c.want)
		}
	}
}

// Level against FPN's formula as torchvision writes it, floor(k0 +
// log2(sqrt(wh)/s0) + 1e-6) clamped, on boxes of sizes from 1/100 to 100
// times the canonical size and on exact powers of two of it; and each
// level's range of sizes, which the kernels test, holds exactly the RoIs
// Level gives it. The two forms of the rule round differently only within
// about an ulp of a level's start, which the random boxes avoid (the
// difference is reported with its margin).
func TestMultiLevelRoIAlignLevelRule(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, 20))
	for _, cfg := range []MultiLevelRoIAlignConfig{
		pyramidCfg,
		{Scales: []float64{1, 1, 1, 1, 1}, CanonicalSize: 224, CanonicalLevel: 4},
		{Scales: []float64{1, 1, 1, 1}, CanonicalSize: 3.7, CanonicalLevel: 0},
		{Scales: []float64{1}, CanonicalSize: 56, CanonicalLevel: 0},
	} {
		formula := func(w, h float64) int {
			if !(w > 0 && h > 0) {
				return 0
			}
			l := math.Floor(float64(cfg.CanonicalLevel) + math.Log2(math.Sqrt(w*h)/cfg.CanonicalSize) + 1e-6)
			return int(max(0, min(l, float64(len(cfg.Scales)-1))))
		}
		check := func(x1, y1, w, h float64, exact bool) {
			t.Helper()
			got, want := cfg.Level(x1, y1, x1+w, y1+h), formula(w, h)
			if got != want {
				margin := math.Abs(math.Log2(math.Sqrt(w*h)/cfg.CanonicalSize) + 1e-6 - math.Round(math.Log2(math.Sqrt(w*h)/cfg.CanonicalSize)+1e-6))
				if exact || margin > 1e-12 {
					t.Errorf("%v: Level of %gx%g at (%g, %g) = %d, the formula says %d (%.3g from a level's start)", cfg.Scales, w, h, x1, y1, got, want, margin)
				}
			}
			held := 0
			for l := range cfg.Scales {
				if cfg.level(l).Holds(x1, y1, x1+w, y1+h) {
					held++
					if l != got {
						t.Errorf("%gx%g: level %d's range holds the RoI of level %d", w, h, l, got)
					}
				}
			}
			if held != 1 {
				t.Errorf("%gx%g: %d levels' ranges hold it, want 1", w, h, held)
			}
		}
		for range 20000 {
			s := cfg.CanonicalSize * math.Exp(rng.Float64()*2*math.Log(100)-math.Log(100))
			a := math.Exp(rng.Float64()*2 - 1)
			check(rng.Float64()*100-50, rng.Float64()*100-50, s*a, s/a, false)
		}
		for e := -8; e <= 8; e++ {
			s := cfg.CanonicalSize * math.Exp2(float64(e))
			check(0, 0, s, s, true)
			check(3, 5, 4*s, s/4, true)
		}
		for _, b := range [][2]float64{{0, 5}, {-3, 5}, {math.NaN(), 5}, {math.Inf(1), 5}, {1e300, 1e300}} {
			check(0, 0, b[0], b[1], false)
		}
	}
}

// pyramid returns one [1,1,64/stride,64/stride] map per level holding the
// x coordinate of each feature pixel plus 100 times the level: bilinear
// sampling reproduces the sample's x exactly, so every bin's average is the
// x of its centre, and the hundreds tell the level.
func pyramid() []*tensor.Dense {
	var maps []*tensor.Dense
	for l, s := range pyramidCfg.Scales {
		n := int(64 * s)
		v := make([]float64, n*n)
		for i := range v {
			v[i] = float64(i%n) + 100*float64(l)
		}
		maps = append(maps, tensor.New(tensor.WithShape(1, 1, n, n), tensor.WithBacking(v)))
	}
	return maps
}

func multiRoIWith(cfg MultiLevelRoIAlignConfig) func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
	return func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
		return MultiLevelRoIAlign(in[:len(in)-1], in[len(in)-1], cfg)
	}
}

func TestMultiLevelRoIAlignHandValues(t *testing.T) {
	rois := tensor.New(tensor.WithShape(3, 5), tensor.WithBacking([]float64{
		0, 8, 8, 24, 24, // 16 px: level 0, scale 1/4: x from 1.5, bins 2 wide
		0, 16, 0, 48, 32, // 32 px: level 1, scale 1/8: x from 1.5, bins 2 wide
		0, 0, 0, 64, 64, // 64 px: level 2, scale 1/16: x from -0.5, bins 2 wide
	}))
	want := []float64{
		2.5, 4.5, 2.5, 4.5,
		102.5, 104.5, 102.5, 104.5,
		// From -0.5 to 3.5 in two bins of two samples: x = 0, 1 and 2, 3.
		200.5, 202.5, 200.5, 202.5,
	}
	in := append(pyramid(), rois)
	got, shape, err := runGraph(t, in, multiRoIWith(pyramidCfg))
	if err != nil {
		t.Fatal(err)
	}
	if !shape.Eq(tensor.Shape{3, 1, 2, 2}) {
		t.Fatalf("shape %v, want (3, 1, 2, 2)", shape)
	}
	if err := autograd.TolForward64.Compare(got, want); err != nil {
		t.Errorf("rows: %v\ngot  %v\nwant %v", err, got, want)
	}
	cols := pyramidCfg
	cols.Columns = true
	gotT, shapeT, err := runGraph(t, in, multiRoIWith(cols))
	if err != nil {
		t.Fatal(err)
	}
	if !shapeT.Eq(tensor.Shape{4, 3}) {
		t.Fatalf("columns: shape %v, want (4, 3)", shapeT)
	}
	for k := range 3 {
		for r := range 4 {
			if gotT[r*3+k] != got[k*4+r] {
				t.Fatalf("columns: element (%d, %d) = %v, want %v", r, k, gotT[r*3+k], got[k*4+r])
			}
		}
	}
}

// randomPyramidRoIs draws k RoIs over images of side 64 with sides from 4
// to 100 pixels (some reach past the image), so that every level gets some.
func randomPyramidRoIs(rng *rand.Rand, n, k int) *tensor.Dense {
	v := make([]float64, 0, 5*k)
	for range k {
		w, h := 4+96*rng.Float64(), 4+96*rng.Float64()
		x, y := (64-w)*rng.Float64(), (64-h)*rng.Float64()
		v = append(v, float64(rng.IntN(n)), x, y, x+w, y+h)
	}
	return tensor.New(tensor.WithShape(k, 5), tensor.WithBacking(v))
}

// Each RoI's output is RoIAlign's on the level Level picks, in both dtypes
// and layouts.
func TestMultiLevelRoIAlignMatchesRoIAlign(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const n, c, k = 2, 3, 40
	cfg := pyramidCfg
	cfg.PooledH, cfg.PooledW, cfg.SamplingRatio = 3, 2, 0 // adaptive sampling too
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		var maps []*tensor.Dense
		for _, s := range cfg.Scales {
			side := int(64 * s)
			maps = append(maps, randTensor(rng, dt, -1, 1, n, c, side, side))
		}
		rois := cast(t, randomPyramidRoIs(rng, n, k), dt)
		got, _, err := runGraph(t, append(maps, rois), multiRoIWith(cfg))
		if err != nil {
			t.Fatal(err)
		}
		cols := cfg
		cols.Columns = true
		gotT, _, err := runGraph(t, append(maps, rois), multiRoIWith(cols))
		if err != nil {
			t.Fatal(err)
		}
		d := c * cfg.PooledH * cfg.PooledW
		levels := map[int]int{}
		rv := toFloat64s(t, rois)
		for l, s := range cfg.Scales {
			ref, _, err := runGraph(t, []*tensor.Dense{maps[l], rois}, func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
				return RoIAlign(in[0], in[1], RoIAlignConfig{PooledH: cfg.PooledH, PooledW: cfg.PooledW,
					SpatialScale: s, SamplingRatio: cfg.SamplingRatio, Aligned: cfg.Aligned})
			})
			if err != nil {
				t.Fatal(err)
			}
			for i := range k {
				r := rv[i*5 : i*5+5]
				if cfg.Level(r[1], r[2], r[3], r[4]) != l {
					continue
				}
				levels[l]++
				for j := range d {
					if got[i*d+j] != ref[i*d+j] || gotT[j*k+i] != ref[i*d+j] {
						t.Fatalf("%v: roi %d (level %d) element %d: got %v and %v (columns), want %v",
							dt, i, l, j, got[i*d+j], gotT[j*k+i], ref[i*d+j])
					}
				}
			}
		}
		if len(levels) != 3 {
			t.Errorf("the RoIs covered levels %v, want all three", levels)
		}
	}
}

func TestMultiLevelRoIAlignGradCheck(t *testing.T) {
	for _, columns := range []bool{false, true} {
		for seed := uint64(1); seed <= 2; seed++ {
			rng := rand.New(rand.NewPCG(seed, 3))
			cfg := pyramidCfg
			cfg.Columns = columns
			var inputs []autograd.Input
			for l, s := range cfg.Scales {
				side := int(64 * s)
				inputs = append(inputs, autograd.Input{Name: fmt.Sprintf("features[%d]", l),
					Value: randTensor(rng, tensor.Float64, -1, 1, 2, 2, side, side)})
			}
			// Level 2 gets no RoI: its gradient must be zero, not garbage.
			rois := tensor.New(tensor.WithShape(4, 5), tensor.WithBacking([]float64{
				0, 3.3, 5.1, 17.2, 20.9,
				1, 30.5, 12.25, 40, 30,
				1, 10, 10, 50, 46, // 40x36: level 1
				0, -4, 50, 20, 70, // partly outside the image
			}))
			inputs = append(inputs, autograd.Input{Name: "rois", Value: rois, NoGrad: true})
			results, err := autograd.CheckGrad(multiRoIWith(cfg), inputs, seed)
			if err != nil {
				t.Fatalf("columns=%t seed %d: %v", columns, seed, err)
			}
			for _, r := range results {
				if (r.Scale == 0) != (r.Name == "features[2]") {
					t.Errorf("columns=%t: %s: gradient scale %v", columns, r.Name, r.Scale)
				}
			}
		}
	}
}

func TestMultiLevelRoIAlignBadInput(t *testing.T) {
	g := G.NewGraph()
	f0 := G.NewTensor(g, tensor.Float32, 4, G.WithShape(2, 4, 16, 16), G.WithName("f0"))
	f1 := G.NewTensor(g, tensor.Float32, 4, G.WithShape(2, 4, 8, 8), G.WithName("f1"))
	f2 := G.NewTensor(g, tensor.Float32, 4, G.WithShape(2, 4, 4, 4), G.WithName("f2"))
	fC := G.NewTensor(g, tensor.Float32, 4, G.WithShape(2, 5, 8, 8), G.WithName("fC"))
	f64 := G.NewTensor(g, tensor.Float64, 4, G.WithShape(2, 4, 8, 8), G.WithName("f64"))
	rois := G.NewMatrix(g, tensor.Float32, G.WithShape(6, 5), G.WithName("rois"))
	rois4 := G.NewMatrix(g, tensor.Float32, G.WithShape(6, 4), G.WithName("rois4"))
	ok := pyramidCfg
	bad := func(f func(c *MultiLevelRoIAlignConfig)) MultiLevelRoIAlignConfig {
		c := pyramidCfg
		c.Scales = append([]float64(nil), c.Scales...)
		f(&c)
		return c
	}
	for _, c := range []struct {
		name  string
		feats []*G.Node
		rois  *G.Node
		cfg   MultiLevelRoIAlignConfig
		want  string
	}{
		{"count", []*G.Node{f0, f1}, rois, ok, "got 2 feature maps for 3 Scales"},
		{"channels", []*G.Node{f0, fC, f2}, rois, ok, "features[1] must have shape [2 4 H W]"},
		{"dtype", []*G.Node{f0, f64, f2}, rois, ok, "features[1] has dtype float64"},
		{"rois", []*G.Node{f0, f1, f2}, rois4, ok, "rois must have shape [K 5]"},
		{"pooled", []*G.Node{f0, f1, f2}, rois, bad(func(c *MultiLevelRoIAlignConfig) { c.PooledW = 0 }), "pooled size must be positive"},
		{"scale", []*G.Node{f0, f1, f2}, rois, bad(func(c *MultiLevelRoIAlignConfig) { c.Scales[1] = math.NaN() }), "Scales[1] must be positive"},
		{"canonical size", []*G.Node{f0, f1, f2}, rois, bad(func(c *MultiLevelRoIAlignConfig) { c.CanonicalSize = 0 }), "CanonicalSize must be positive"},
		{"canonical level", []*G.Node{f0, f1, f2}, rois, bad(func(c *MultiLevelRoIAlignConfig) { c.CanonicalLevel = 3 }), "CanonicalLevel must index Scales"},
		{"no levels", nil, rois, bad(func(c *MultiLevelRoIAlignConfig) { c.Scales = nil }), "at least one level"},
	} {
		_, err := MultiLevelRoIAlign(c.feats, c.rois, c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got error %v, want one containing %q", c.name, err, c.want)
		}
	}
}

// A bad batch index fails the run and names the RoI's row in rois.
func TestMultiLevelRoIAlignBadBatchIndex(t *testing.T) {
	for _, b := range []float64{2, -1, math.NaN()} {
		rois := tensor.New(tensor.WithShape(2, 5), tensor.WithBacking([]float64{0, 0, 0, 8, 8, b, 0, 0, 60, 60}))
		_, _, err := runGraph(t, append(pyramid(), rois), multiRoIWith(pyramidCfg))
		if err == nil || !strings.Contains(err.Error(), "roi 1 has batch index") {
			t.Errorf("batch index %v: got error %v", b, err)
		}
	}
}

// No RoIs: an empty output, and zero gradients (gorgonia's own ops cannot
// reduce an empty tensor, so the backward pass is called directly).
func TestMultiLevelRoIAlignZeroRoIs(t *testing.T) {
	rois := tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(0, 5))
	_, shape, err := runGraph(t, append(pyramid(), rois), multiRoIWith(pyramidCfg))
	if err != nil || !shape.Eq(tensor.Shape{0, 1, 2, 2}) {
		t.Fatalf("forward: shape %v, error %v", shape, err)
	}
	s := &multiRoIShape{cfg: pyramidCfg, n: 1, c: 1, hw: [][2]int{{16, 16}, {8, 8}, {1, 3}}, dt: tensor.Float64}
	gx := []float64{1, 2, 3}
	if err := multiRoILevelBackward(multiRoILevel{s, 2}, [][]float64{nil, nil}, gx); err != nil {
		t.Fatal(err)
	}
	if !equalFloats(gx, []float64{0, 0, 0}) {
		t.Errorf("gradient %v, want zeros", gx)
	}
}
