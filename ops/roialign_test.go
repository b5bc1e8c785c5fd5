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
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// rampImages returns x [2,1,4,4] with x[n,0,y,x] = 100n + 4y + x. Bilinear
// interpolation of a linear function is exact, so the expected outputs below
// can be worked out by hand.
func rampImages(dt tensor.Dtype) *tensor.Dense {
	v := make([]float64, 32)
	for i := range v {
		n, y, x := i/16, i/4%4, i%4
		v[i] = float64(100*n + 4*y + x)
	}
	return fromFloat64s(dt, v, 2, 1, 4, 4)
}

func roiAlign(cfg RoIAlignConfig) func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
	return func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) { return RoIAlign(in[0], in[1], cfg) }
}

func TestRoIAlignHandValues(t *testing.T) {
	nan := math.NaN()
	cases := []struct {
		name string
		roi  [5]float64
		cfg  RoIAlignConfig
		want []float64
	}{
		// Samples at (0.5|1.5, 0.5|1.5): values 2.5, 3.5, 6.5, 7.5.
		{"aligned 2x2 samples", [5]float64{0, 0.5, 0.5, 2.5, 2.5}, RoIAlignConfig{1, 1, 1, 2, true}, []float64{5}},
		{"aligned 2x2 bins", [5]float64{0, 0.5, 0.5, 2.5, 2.5}, RoIAlignConfig{2, 2, 1, 1, true}, []float64{2.5, 3.5, 6.5, 7.5}},
		{"second image", [5]float64{1, 0.5, 0.5, 2.5, 2.5}, RoIAlignConfig{1, 1, 1, 2, true}, []float64{105}},
		{"spatial scale", [5]float64{0, 1, 1, 5, 5}, RoIAlignConfig{1, 1, 0.5, 2, true}, []float64{5}},
		// One sample at (4,4): inside the one-pixel band, clamped to (3,3).
		{"clamped to border", [5]float64{0, 3, 3, 5, 5}, RoIAlignConfig{1, 1, 1, 1, false}, []float64{15}},
		{"outside", [5]float64{0, 10, 10, 12, 12}, RoIAlignConfig{1, 1, 1, 1, false}, []float64{0}},
		// Samples at (3|5, 3|5): only (3,3) is inside; the others count as 0.
		{"crossing border", [5]float64{0, 2, 2, 6, 6}, RoIAlignConfig{1, 1, 1, 2, false}, []float64{15.0 / 4}},
		// Adaptive: a 3-pixel bin gets 3x3 samples at 0.5, 1.5, 2.5.
		{"adaptive", [5]float64{0, 0.5, 0.5, 3.5, 3.5}, RoIAlignConfig{1, 1, 1, 0, true}, []float64{7.5}},
		// Legacy mode stretches a 0.2-pixel box to 1 pixel: samples at 1.45, 1.95.
		{"sub-pixel legacy", [5]float64{0, 1.2, 1.2, 1.4, 1.4}, RoIAlignConfig{1, 1, 1, 2, false}, []float64{8.5}},
		// x = -1 is in the band and clamps to 0; x = -2 is outside.
		{"left band", [5]float64{0, -1.5, 0, -0.5, 1}, RoIAlignConfig{1, 1, 1, 1, false}, []float64{2}},
		{"left outside", [5]float64{0, -2.5, 0, -1.5, 1}, RoIAlignConfig{1, 1, 1, 1, false}, []float64{0}},
		// Aligned boxes of negative size get no samples in adaptive mode.
		{"negative size adaptive", [5]float64{0, 2.5, 2.5, 0.5, 0.5}, RoIAlignConfig{1, 1, 1, 0, true}, []float64{0}},
		{"NaN box", [5]float64{0, nan, 0, 1, 1}, RoIAlignConfig{1, 1, 1, 2, false}, []float64{0}},
		{"NaN box adaptive", [5]float64{0, 1, 1, nan, 2}, RoIAlignConfig{1, 1, 1, 0, true}, []float64{0}},
		// Legacy mode keeps a NaN height or width NaN (Go's max, as
		// torchvision's CPU std::max), not 1x1: the samples are NaN,
		// outside the map.
		{"NaN height legacy", [5]float64{0, 1, 1, 2, nan}, RoIAlignConfig{1, 1, 1, 1, false}, []float64{0}},
		{"NaN width legacy adaptive", [5]float64{0, 1, 1, nan, 2}, RoIAlignConfig{1, 1, 1, 0, false}, []float64{0}},
		{"infinite box", [5]float64{0, 0, 0, math.Inf(1), 2}, RoIAlignConfig{1, 1, 1, 0, true}, []float64{0}},
	}
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		for _, c := range cases {
			t.Run(fmt.Sprintf("%v/%s", dt, c.name), func(t *testing.T) {
				rois := fromFloat64s(dt, c.roi[:], 1, 5)
				got, shape, err := runGraph(t, []*tensor.Dense{rampImages(dt), rois}, roiAlign(c.cfg))
				if err != nil {
					t.Fatal(err)
				}
				if want := (tensor.Shape{1, 1, c.cfg.PooledH, c.cfg.PooledW}); !shape.Eq(want) {
					t.Fatalf("shape %v, want %v", shape, want)
				}
				tol := autograd.TolForward64
				if dt == tensor.Float32 {
					tol = autograd.TolForward32
				}
				if err := tol.Compare(got, c.want); err != nil {
					t.Errorf("got %v, want %v: %v", got, c.want, err)
				}
			})
		}
	}
}

// The gradient of one 2x2-sample bin over pixels 0..2 spreads weight 1/16 per
// sample and corner: (1,1) is a corner of all four samples.
func TestRoIAlignBackwardHandValues(t *testing.T) {
	g := G.NewGraph()
	x := G.NodeFromAny(g, rampImages(tensor.Float64), G.WithName("x"))
	rois := G.NodeFromAny(g, fromFloat64s(tensor.Float64, []float64{0, 0.5, 0.5, 2.5, 2.5}, 1, 5), G.WithName("rois"))
	y, err := RoIAlign(x, rois, RoIAlignConfig{1, 1, 1, 2, true})
	if err != nil {
		t.Fatal(err)
	}
	loss, _ := G.Sum(y)
	grads, err := G.Grad(loss, x)
	if err != nil {
		t.Fatal(err)
	}
	var gv G.Value
	G.Read(grads[0], &gv)
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		t.Fatal(err)
	}
	want := make([]float64, 32)
	for i, w := range []float64{1, 2, 1, 0, 2, 4, 2, 0, 1, 2, 1, 0} {
		want[i] = w / 16
	}
	if err := autograd.TolForward64.Compare(toFloat64s(t, gv), want); err != nil {
		t.Error(err)
	}
}

// randomRoIs draws k boxes on an image of size (imgH, imgW) that cover the
// cases RoIAlign must get right: inside, crossing the border, entirely
// outside, smaller than a feature pixel, and of negative size.
func randomRoIs(rng *rand.Rand, dt tensor.Dtype, k, n int, imgH, imgW float64) *tensor.Dense {
	v := make([]float64, 0, 5*k)
	for i := range k {
		cx := rng.Float64()*imgW*1.6 - 0.3*imgW
		cy := rng.Float64()*imgH*1.6 - 0.3*imgH
		w := rng.Float64() * imgW * 0.8
		h := rng.Float64() * imgH * 0.8
		switch i % 5 {
		case 1: // smaller than a pixel of a feature map at scale 1/2
			w, h = rng.Float64()*1.5, rng.Float64()*1.5
		case 2: // entirely outside
			cx = imgW*1.5 + w
		case 3: // negative size
			w = -w / 4
		}
		v = append(v, float64(rng.IntN(n)), cx-w/2, cy-h/2, cx+w/2, cy+h/2)
	}
	return fromFloat64s(dt, v, k, 5)
}

func TestRoIAlignGradCheck(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		for _, aligned := range []bool{false, true} {
			for _, sampling := range []int{0, 2} {
				cfg := RoIAlignConfig{PooledH: 2, PooledW: 3, SpatialScale: 0.5, SamplingRatio: sampling, Aligned: aligned}
				t.Run(fmt.Sprintf("seed=%d/aligned=%t/sampling=%d", seed, aligned, sampling), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(seed, 11))
					inputs := []autograd.Input{
						{Name: "x", Value: randTensor(rng, tensor.Float64, -1, 1, 2, 3, 6, 7)},
						{Name: "rois", Value: randomRoIs(rng, tensor.Float64, 6, 2, 12, 14), NoGrad: true},
					}
					results, err := autograd.CheckGrad(func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
						return RoIAlign(in[0], in[1], cfg)
					}, inputs, seed)
					if err != nil {
						t.Fatal(err)
					}
					if results[0].Scale == 0 {
						t.Fatal("all gradients are zero: the check proves nothing")
					}
				})
			}
		}
	}
}

// float32 and float64 runs of the same inputs agree to float32 rounding.
func TestRoIAlignFloat32MatchesFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	x := randTensor(rng, tensor.Float32, -1, 1, 2, 4, 10, 12)
	rois := randomRoIs(rng, tensor.Float32, 20, 2, 40, 48)
	cfg := RoIAlignConfig{PooledH: 3, PooledW: 3, SpatialScale: 0.25, SamplingRatio: 0, Aligned: true}
	got, _, err := runGraph(t, []*tensor.Dense{x, rois}, roiAlign(cfg))
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := runGraph(t, []*tensor.Dense{cast(t, x, tensor.Float64), cast(t, rois, tensor.Float64)}, roiAlign(cfg))
	if err != nil {
		t.Fatal(err)
	}
	if err := autograd.TolForward32.Compare(got, want); err != nil {
		t.Error(err)
	}
}

func TestRoIAlignZeroRoIs(t *testing.T) {
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		s := roiAlignShape{cfg: RoIAlignConfig{2, 2, 1, 2, true}, n: 1, c: 3, h: 4, w: 4, k: 0, dt: dt}
		x := randTensor(rand.New(rand.NewPCG(1, 1)), dt, -1, 1, 1, 3, 4, 4)
		rois := tensor.New(tensor.Of(dt), tensor.WithShape(0, 5))
		out, err := roiAlignOp(s).Do(x, rois)
		if err != nil {
			t.Fatal(err)
		}
		if !out.Shape().Eq(tensor.Shape{0, 3, 2, 2}) {
			t.Errorf("%v: output shape %v, want (0, 3, 2, 2)", dt, out.Shape())
		}
		gy := tensor.New(tensor.Of(dt), tensor.WithShape(0, 3, 2, 2))
		// A stale buffer handed in for reuse must come back zeroed.
		stale := randTensor(rand.New(rand.NewPCG(2, 2)), dt, 1, 2, 1, 3, 4, 4)
		gx, err := roiAlignGradOp(s).UsePreallocDo(stale, rois, gy)
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range toFloat64s(t, gx) {
			if v != 0 {
				t.Fatalf("%v: grad[%d] = %v with no RoIs, want 0", dt, i, v)
			}
		}
	}
}

func TestRoIAlignBadInput(t *testing.T) {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float32, 4, G.WithShape(2, 3, 8, 8), G.WithName("x"))
	x3 := G.NewTensor(g, tensor.Float32, 3, G.WithShape(3, 8, 8), G.WithName("x3"))
	xi := G.NewTensor(g, tensor.Int, 4, G.WithShape(2, 3, 8, 8), G.WithName("xi"))
	rois := G.NewMatrix(g, tensor.Float32, G.WithShape(4, 5), G.WithName("rois"))
	rois4 := G.NewMatrix(g, tensor.Float32, G.WithShape(4, 4), G.WithName("rois4"))
	rois64 := G.NewMatrix(g, tensor.Float64, G.WithShape(4, 5), G.WithName("rois64"))
	roisVec := G.NewVector(g, tensor.Float32, G.WithShape(5), G.WithName("roisVec"))
	ok := RoIAlignConfig{PooledH: 7, PooledW: 7, SpatialScale: 0.25, SamplingRatio: 2, Aligned: true}
	with := func(f func(*RoIAlignConfig)) RoIAlignConfig { c := ok; f(&c); return c }
	cases := []struct {
		name    string
		x, rois *G.Node
		cfg     RoIAlignConfig
		want    string
	}{
		{"x rank", x3, rois, ok, "x must have shape [N C H W], got (3, 8, 8)"},
		{"rois rank", x, roisVec, ok, "rois must have shape [K 5], got (5)"},
		{"rois columns", x, rois4, ok, "rois must have shape [K 5], got (4, 4)"},
		{"dtype mismatch", x, rois64, ok, "rois has dtype float64, want float32"},
		{"int input", xi, rois, ok, "x must be float32 or float64, got int"},
		{"nil x", nil, rois, ok, "x is nil"},
		{"pooled zero", x, rois, with(func(c *RoIAlignConfig) { c.PooledH = 0 }), "pooled size must be positive, got 0x7"},
		{"pooled negative", x, rois, with(func(c *RoIAlignConfig) { c.PooledW = -1 }), "pooled size must be positive"},
		{"scale zero", x, rois, with(func(c *RoIAlignConfig) { c.SpatialScale = 0 }), "SpatialScale must be positive and finite, got 0"},
		{"scale NaN", x, rois, with(func(c *RoIAlignConfig) { c.SpatialScale = math.NaN() }), "SpatialScale must be positive and finite, got NaN"},
		{"scale Inf", x, rois, with(func(c *RoIAlignConfig) { c.SpatialScale = math.Inf(1) }), "SpatialScale must be positive and finite"},
	}
	for _, c := range cases {
		_, err := RoIAlign(c.x, c.rois, c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "ops: RoIAlign: ") {
			t.Errorf("%s: got error %v, want one containing %q", c.name, err, c.want)
		}
	}
}

// Problems that depend on the data are reported when the graph runs.
func TestRoIAlignRunTimeErrors(t *testing.T) {
	cases := []struct {
		name string
		roi  []float64
		cfg  RoIAlignConfig
		want string
	}{
		{"batch index too large", []float64{2, 0, 0, 1, 1}, RoIAlignConfig{1, 1, 1, 2, true}, "roi 0 has batch index 2, want a value in [0, 2)"},
		{"batch index negative", []float64{-1, 0, 0, 1, 1}, RoIAlignConfig{1, 1, 1, 2, true}, "roi 0 has batch index -1"},
		{"batch index NaN", []float64{math.NaN(), 0, 0, 1, 1}, RoIAlignConfig{1, 1, 1, 2, true}, "roi 0 has batch index NaN"},
		{"adaptive grid too large", []float64{0, 0, 0, 1e7, 1}, RoIAlignConfig{1, 1, 1, 0, true}, "use a fixed SamplingRatio"},
	}
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for _, c := range cases {
			rois := fromFloat64s(dt, c.roi, 1, 5)
			_, _, err := runGraph(t, []*tensor.Dense{rampImages(dt), rois}, roiAlign(c.cfg))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v %s: forward error %v, want one containing %q", dt, c.name, err, c.want)
			}
			s := roiAlignShape{cfg: c.cfg, n: 2, c: 1, h: 4, w: 4, k: 1, dt: dt}
			gy := tensor.New(tensor.Of(dt), tensor.WithShape(1, 1, 1, 1))
			if _, err := roiAlignGradOp(s).Do(rois, gy); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v %s: backward error %v, want one containing %q", dt, c.name, err, c.want)
			}
		}
	}
}

// Nodes of RoIAlign with different configs must not be merged by gorgonia.
func TestRoIAlignHashDistinguishesConfigs(t *testing.T) {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float64, 4, G.WithShape(1, 1, 4, 4), G.WithName("x"))
	rois := G.NewMatrix(g, tensor.Float64, G.WithShape(1, 5), G.WithName("rois"))
	base := RoIAlignConfig{PooledH: 2, PooledW: 2, SpatialScale: 1, SamplingRatio: 2, Aligned: true}
	variants := []RoIAlignConfig{base}
	for _, f := range []func(*RoIAlignConfig){
		func(c *RoIAlignConfig) { c.Aligned = false },
		func(c *RoIAlignConfig) { c.SamplingRatio = 0 },
		func(c *RoIAlignConfig) { c.SpatialScale = 0.5 },
		func(c *RoIAlignConfig) { c.PooledH = 3 },
		func(c *RoIAlignConfig) { c.PooledW = 3 },
	} {
		c := base
		f(&c)
		variants = append(variants, c)
	}
	seen := map[*G.Node]bool{}
	for _, c := range variants {
		n, err := RoIAlign(x, rois, c)
		if err != nil {
			t.Fatal(err)
		}
		if seen[n] {
			t.Errorf("config %+v merged with an earlier node", c)
		}
		seen[n] = true
	}
}

// The kernel choice: roialign_sm90a.cu's vector-reduction backward (the
// separable one, with any sampling ratio) only for float32 and C % 4 == 0,
// on a GPU that runs it; and never a variant (the shipped modules leave
// those out).
func TestRoIAlignKernelFor(t *testing.T) {
	shape := func(dt tensor.Dtype, c, sampling int) roiAlignShape {
		return roiAlignShape{cfg: RoIAlignConfig{7, 7, 0.25, sampling, true}, n: 1, c: c, h: 8, w: 8, k: 1, dt: dt}
	}
	cases := []struct {
		backward bool
		s        roiAlignShape
		quad     bool
		want     string
	}{
		{true, shape(tensor.Float32, 256, 2), true, "roialign_bwd_nhwc_sep_red4_f32"},
		{true, shape(tensor.Float32, 256, 0), true, "roialign_bwd_nhwc_sep_red4_f32"},
		{true, shape(tensor.Float32, 256, 2), false, "roialign_bwd_nhwc_taps_atomic_f32"},
		{true, shape(tensor.Float32, 70, 2), true, "roialign_bwd_nhwc_taps_atomic_f32"},
		{true, shape(tensor.Float32, 70, 0), true, "roialign_bwd_nhwc_sep_atomic_f32"},
		{true, shape(tensor.Float32, 256, 0), false, "roialign_bwd_nhwc_sep_atomic_f32"},
		{true, shape(tensor.Float64, 256, 2), true, "roialign_bwd_nhwc_taps_atomic_f64"},
		// Fixed ratio: lanes on sample columns where a bin row's samples
		// fit a warp (float32), in slices of at most
		// roiAlignColsSliceBytes and for at least roiAlignColsBlocks
		// blocks, a slice at least a warp's channels; else NCHW, 4
		// channels a thread.
		{false, shape(tensor.Float32, 256, 2), true, "roialign_fwd_nchw_cols_s2_f32_slices128"},
		{false, shape(tensor.Float32, 256, 3), false, "roialign_fwd_nchw_cols_s3_f32_slices256"},
		{false, shape(tensor.Float64, 256, 2), false, "roialign_fwd_nchw_bin_c4_f64"},
		{false, roiAlignShape{cfg: RoIAlignConfig{14, 14, 0.25, 4, true}, n: 1, c: 8, h: 8, w: 8, k: 1, dt: tensor.Float32},
			false, "roialign_fwd_nchw_bin_c4_occ4_f32"},
		{false, roiAlignShape{cfg: RoIAlignConfig{7, 7, 0.25, 2, true}, n: 1, c: 8, h: 1, w: 8, k: 1, dt: tensor.Float32},
			false, "roialign_fwd_nchw_bin_c4_occ4_f32"},
		// TARGETS.md's box_head_P2 (137 MB of maps: channel-major, slices
		// of 112 items: 8), mask_head_P2 (the same maps, 14 bin rows of one
		// channel a warp: 32) and infer_1000_P3 (17 MB, 1000 RoIs:
		// row-major, 4 slices). A channel-major kernel with few RoIs still
		// gets roiAlignColsBlocks blocks.
		{false, roiAlignShape{cfg: RoIAlignConfig{7, 7, 0.25, 2, true}, n: 2, c: 256, h: 200, w: 336, k: 1024, dt: tensor.Float32},
			false, "roialign_fwd_nchw_cols_s2_cmajor_f32_slices8"},
		{false, roiAlignShape{cfg: RoIAlignConfig{14, 14, 0.25, 2, true}, n: 2, c: 256, h: 200, w: 336, k: 256, dt: tensor.Float32},
			false, "roialign_fwd_nchw_cols_s2_cmajor_f32_slices32"},
		{false, roiAlignShape{cfg: RoIAlignConfig{7, 7, 0.25, 2, true}, n: 2, c: 256, h: 200, w: 336, k: 64, dt: tensor.Float32},
			false, "roialign_fwd_nchw_cols_s2_cmajor_f32_slices48"},
		{false, roiAlignShape{cfg: RoIAlignConfig{7, 7, 0.125, 2, true}, n: 1, c: 256, h: 100, w: 168, k: 1000, dt: tensor.Float32},
			false, "roialign_fwd_nchw_cols_s2_f32_slices4"},
		// Adaptive forward: 16-byte loads for float32 with C % 4 == 0, in
		// one channel slice and chunks of a tile for a small map.
		{false, shape(tensor.Float32, 256, 0), false, "roialign_fwd_nhwc_sep_vec4_occ4_f32_chunk32_slices1"},
		{false, shape(tensor.Float32, 36, 0), false, "roialign_fwd_nhwc_sep_vec4_occ4_f32_chunk49_slices1"},
		{false, shape(tensor.Float32, 70, 0), false, "roialign_fwd_nhwc_sep_f32"},
		{false, shape(tensor.Float64, 256, 0), false, "roialign_fwd_nhwc_sep_f64"},
		// TARGETS.md's box_head_P2_adaptive: 32-channel slices of 17 MB,
		// a block a RoI.
		{false, roiAlignShape{cfg: RoIAlignConfig{7, 7, 0.25, 0, true}, n: 2, c: 256, h: 200, w: 336, k: 1, dt: tensor.Float32},
			false, "roialign_fwd_nhwc_sep_vec4_occ4_f32_chunk49_slices8"},
	}
	for _, c := range cases {
		k := roiAlignKernelFor(c.backward, c.s, c.quad)
		if k.String() != c.want {
			t.Errorf("roiAlignKernelFor(backward %v, %v C %d sampling %d, quad %v) = %s, want %s",
				c.backward, c.s.dt, c.s.c, c.s.cfg.SamplingRatio, c.quad, k, c.want)
		}
		if info, ok := cuda.Lookup(string(k.k)); !ok || info.Variant {
			t.Errorf("roiAlignKernelFor(backward %v, %v C %d sampling %d, quad %v) = %s: in kernels/cuda's table: %v, a variant: %v",
				c.backward, c.s.dt, c.s.c, c.s.cfg.SamplingRatio, c.quad, k, ok, info.Variant)
		}
	}
	for _, kv := range roiAlignRed4Backwards {
		if m := kv.k.Module(); m != "roialign_sm90a" {
			t.Errorf("module of %s = %s, want roialign_sm90a", kv, m)
		}
	}
}

// The channel slices of the backward scatter: a slice of the channels-last
// gradient at most roiAlignSliceBytes, never more slices than groups of 32
// channels.
func TestRoIAlignSlices(t *testing.T) {
	for _, c := range []struct {
		n, c, h, w int
		want       int
	}{
		{2, 256, 200, 336, 2}, // TARGETS' box_head_P2: 137 MB
		{1, 256, 100, 168, 1}, // infer_1000_P3: 17 MB
		{8, 256, 200, 336, 6}, // 550 MB
		{8, 64, 400, 400, 2},  // 328 MB but 2 groups of 32 channels
		{1, 3, 9, 11, 1},
	} {
		s := roiAlignShape{cfg: RoIAlignConfig{7, 7, 0.25, 2, true}, n: c.n, c: c.c, h: c.h, w: c.w, k: 1, dt: tensor.Float32}
		if got := s.slices(); got != c.want {
			t.Errorf("slices of [%d,%d,%d,%d] float32 = %d, want %d", c.n, c.c, c.h, c.w, got, c.want)
		}
	}
}
