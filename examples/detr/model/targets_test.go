package model

import (
	"math"
	"slices"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/ops"
)

func near(got, want []float64, tol autograd.Tolerance) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if !(math.Abs(got[i]-want[i]) <= tol.Abs+tol.Rel*math.Abs(want[i])) {
			return false
		}
	}
	return true
}

// matchConfig is 2 classes and 2 queries, the reference's costs and
// weights.
func matchConfig() Config {
	c := DefaultConfig(2)
	c.Queries = 2
	return c
}

// TestBuildTargetsHandValues: one image, one object of class 1 at
// (0.5, 0.5, 0.2, 0.2), two queries.
func TestBuildTargetsHandValues(t *testing.T) {
	cfg := matchConfig()
	target := []Target{{Labels: []int{1}, Boxes: []Box{{0.5, 0.5, 0.2, 0.2}}}}
	for _, c := range []struct {
		name   string
		logits []float64 // [Q, C]
		boxes  []float64 // [Q, 4]
		want   int       // the matched query
	}{
		// Equal scores: the query on the object's box (L1 cost 0, GIoU 1)
		// wins over one beside it.
		{"box decides", []float64{0, 0, 0, 0}, []float64{0.5, 0.5, 0.2, 0.2, 0.2, 0.2, 0.1, 0.1}, 0},
		// Equal boxes: the query sure of class 1 wins (its focal cost
		// pos - neg is the lower).
		{"class decides", []float64{0, -3, 0, 3}, []float64{0.5, 0.5, 0.2, 0.2, 0.5, 0.5, 0.2, 0.2}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			lt, err := buildTargets(cfg, [][]float64{c.logits}, [][]float64{c.boxes}, nil, nil, target, nil)
			if err != nil {
				t.Fatal(err)
			}
			// num_boxes is 1: every focal element weighs WeightClass = 2.
			if !slices.Equal(lt.focalW, []float64{2, 2, 2, 2}) {
				t.Errorf("focal weights %v, want all 2", lt.focalW)
			}
			l := lt.layers[0]
			q, o := c.want, 1-c.want
			wantOnehot := make([]float64, 4)
			wantOnehot[2*q+1] = 1
			wantBoxT, wantL1W, wantGIoUT, wantGIoUW := make([]float64, 8), make([]float64, 8), make([]float64, 8), make([]float64, 2)
			copy(wantBoxT[4*q:], []float64{0.5, 0.5, 0.2, 0.2})
			copy(wantL1W[4*q:], []float64{5, 5, 5, 5})
			copy(wantGIoUT[4*q:], []float64{0.4, 0.4, 0.6, 0.6})
			copy(wantGIoUT[4*o:], []float64{0, 0, 1, 1}) // unmatched: a unit box of weight 0
			wantGIoUW[q] = 2
			for _, x := range []struct {
				name      string
				got, want []float64
			}{
				{"onehot", l.onehot, wantOnehot}, {"box targets", l.boxT, wantBoxT}, {"L1 weights", l.l1W, wantL1W},
				{"GIoU targets", l.giouT, wantGIoUT}, {"GIoU weights", l.giouW, wantGIoUW},
			} {
				if !near(x.got, x.want, autograd.TolForward64) {
					t.Errorf("%s: got %v, want %v", x.name, x.got, x.want)
				}
			}
		})
	}
}

// TestBuildTargetsNormalisation: num_boxes counts the batch's objects (3
// here), each layer is matched on its own, and an image with no objects
// has no positives.
func TestBuildTargetsNormalisation(t *testing.T) {
	cfg := matchConfig()
	targets := []Target{
		{Labels: []int{0, 1}, Boxes: []Box{{0.25, 0.25, 0.2, 0.2}, {0.75, 0.75, 0.2, 0.2}}},
		{},
		{Labels: []int{1}, Boxes: []Box{{0.5, 0.5, 0.5, 0.5}}},
	}
	logits := make([]float64, 3*2*2)
	// Layer 0 puts query 0 on the first object, layer 1 on the second.
	boxesA := []float64{0.25, 0.25, 0.2, 0.2, 0.75, 0.75, 0.2, 0.2, 0.5, 0.5, 0.1, 0.1, 0.5, 0.5, 0.1, 0.1, 0.5, 0.5, 0.5, 0.5, 0.1, 0.1, 0.1, 0.1}
	boxesB := slices.Clone(boxesA)
	copy(boxesB[0:8], []float64{0.75, 0.75, 0.2, 0.2, 0.25, 0.25, 0.2, 0.2})
	lt, err := buildTargets(cfg, [][]float64{logits, logits}, [][]float64{boxesA, boxesB}, nil, nil, targets, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range lt.focalW {
		if math.Abs(w-2.0/3) > 1e-15 {
			t.Fatalf("focal weight %d is %v, want 2/3", i, w)
		}
	}
	wantW := []float64{2.0 / 3, 2.0 / 3, 0, 0, 2.0 / 3, 0}
	for l, wantOnehot := range [][]float64{
		{1, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0},
		{0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0},
	} {
		if !slices.Equal(lt.layers[l].onehot, wantOnehot) {
			t.Errorf("layer %d: onehot %v, want %v", l, lt.layers[l].onehot, wantOnehot)
		}
		if !near(lt.layers[l].giouW, wantW, autograd.TolForward64) {
			t.Errorf("layer %d: GIoU weights %v, want %v", l, lt.layers[l].giouW, wantW)
		}
	}
}

// TestRefineBoxHandValues: sigmoid(delta + inverse_sigmoid(reference)),
// the size untouched by a point reference.
func TestRefineBoxHandValues(t *testing.T) {
	for _, c := range []struct {
		delta Box
		ref   []float64
		want  Box
	}{
		{Box{0, 0, 0, 0}, []float64{0.3, 0.6}, Box{0.3, 0.6, 0.5, 0.5}},
		{Box{0, 0, -2, 2}, []float64{0.3, 0.6}, Box{0.3, 0.6, 1 / (1 + math.Exp(2)), 1 / (1 + math.Exp(-2))}},
		{Box{0, 0, 0, 0}, []float64{0.1, 0.2, 0.3, 0.4}, Box{0.1, 0.2, 0.3, 0.4}},
		{Box{math.Log(3), 0, 0, -math.Log(3)}, []float64{0.5, 0.5, 0.5, 0.5}, Box{0.75, 0.5, 0.5, 0.25}},
	} {
		got := RefineBox(c.delta, c.ref)
		if !near(got[:], c.want[:], autograd.TolForward64) {
			t.Errorf("RefineBox(%v, %v) = %v, want %v", c.delta, c.ref, got, c.want)
		}
	}
}

// TestRefineGraphMatchesHost: the graph's refinement (builder.refine)
// against RefineBox, for point and box references.
func TestRefineGraphMatchesHost(t *testing.T) {
	delta := []float64{0.3, -1, 0.5, -2, 1.5, 0.2, -0.7, 0.1}
	for _, ref := range [][]float64{
		{0.2, 0.7, 0.95, 0.01},
		{0.2, 0.7, 0.1, 0.3, 0.95, 0.01, 0.5, 0.6},
	} {
		k := len(ref) / 2
		g := G.NewGraph()
		params := mustParams(t, 1, tensor.Float64)
		b := &builder{cfg: tinyConfig(), batch: 1, dt: tensor.Float64, g: g, params: params, reads: map[string]*G.Node{}}
		out := b.refine(b.constant("delta", delta, 1, 2, 4), b.constant("ref", ref, 1, 2, k))
		if b.err != nil {
			t.Fatal(b.err)
		}
		m, err := ops.NewTapeMachine(g)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.RunAll(); err != nil {
			t.Fatal(err)
		}
		got, err := valueFloats(out.Value())
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		var want []float64
		for q := range 2 {
			r := RefineBox(Box(delta[4*q:4*q+4]), ref[k*q:k*q+k])
			want = append(want, r[:]...)
		}
		if !near(got, want, autograd.TolForward64) {
			t.Errorf("reference of %d: graph %v, host %v", k, got, want)
		}
	}
}

// TestEncoderReferencePoints: pixel centres over the valid part of each
// level, times each level's valid ratio.
func TestEncoderReferencePoints(t *testing.T) {
	levels := []ops.Level{{H: 2, W: 2}, {H: 1, W: 1}}
	got := EncoderReferencePoints(levels, [][][2]float64{{{1, 1}, {1, 1}}})
	want := []float64{
		0.25, 0.25, 0.25, 0.25, // level 0 (0, 0), on both levels
		0.75, 0.25, 0.75, 0.25,
		0.25, 0.75, 0.25, 0.75,
		0.75, 0.75, 0.75, 0.75,
		0.5, 0.5, 0.5, 0.5, // level 1
	}
	if !near(got, want, autograd.TolForward64) {
		t.Errorf("valid ratios 1: got %v, want %v", got, want)
	}
	// Half of level 0's width is valid, all of level 1's.
	got = EncoderReferencePoints(levels, [][][2]float64{{{0.5, 1}, {1, 1}}})
	want = []float64{
		0.5 * 0.5, 0.25, 0.5, 0.25, // x = 0.5/(0.5*2) = 0.5; times 0.5 on level 0
		1.5 * 0.5, 0.25, 1.5, 0.25,
		0.5 * 0.5, 0.75, 0.5, 0.75,
		1.5 * 0.5, 0.75, 1.5, 0.75,
		0.25, 0.5, 0.5, 0.5,
	}
	if !near(got, want, autograd.TolForward64) {
		t.Errorf("valid ratios 0.5: got %v, want %v", got, want)
	}
}

// TestSamplingOffsetBias: four heads point right, down, left and up; point
// p is p+1 steps out; every level alike.
func TestSamplingOffsetBias(t *testing.T) {
	got := samplingOffsetBias(4, 2, 2)
	var want []float64
	for _, d := range [][2]float64{{1, 0}, {0, 1}, {-1, 0}, {0, -1}} {
		for range 2 {
			want = append(want, d[0], d[1], 2*d[0], 2*d[1])
		}
	}
	if !near(got, want, autograd.Tolerance{Abs: 1e-15}) {
		t.Errorf("got %v, want %v", got, want)
	}
	// Eight heads: the diagonals are scaled to a larger coordinate of 1.
	got = samplingOffsetBias(8, 1, 1)
	if !near(got[2:4], []float64{1, 1}, autograd.TolForward64) {
		t.Errorf("head 1 of 8: %v, want (1, 1)", got[2:4])
	}
}

// TestPostProcess: the best (query, class) pairs by score, boxes in pixels.
func TestPostProcess(t *testing.T) {
	logits := []float64{0, 2, -1, 3, 1, 2} // Q=3, C=2
	boxes := []float64{0.5, 0.5, 0.2, 0.4, 0.25, 0.25, 0.5, 0.5, 0.1, 0.9, 0.2, 0.2}
	got := PostProcess(logits, boxes, 3, 2, 3, 100, 50)
	want := []Detection{
		{Box{0, 0, 50, 25}, 1 / (1 + math.Exp(-3)), 1},   // query 1, class 1
		{Box{40, 15, 60, 35}, 1 / (1 + math.Exp(-2)), 1}, // query 0, class 1 (a tie, the lower index first)
		{Box{0, 40, 20, 50}, 1 / (1 + math.Exp(-2)), 1},  // query 2, class 1
	}
	for i := range want {
		if !near(got[i].Box[:], want[i].Box[:], autograd.TolForward64) || math.Abs(got[i].Score-want[i].Score) > 1e-15 || got[i].Class != want[i].Class {
			t.Errorf("detection %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestConfigValidate: the presets are valid; each bad field is named.
func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{DefaultConfig(3), GPUConfig(91, 512), tinyConfig()} {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
	for _, c := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.TwoStage, c.BoxRefine = true, false }, "TwoStage needs BoxRefine"},
		{func(c *Config) { c.TwoStage, c.Queries = true, 341 }, "Queries (341) must not exceed the encoder's 340 tokens"},
		{func(c *Config) { c.NumClasses = 0 }, "NumClasses"},
		{func(c *Config) { c.ImageSize = 48 }, "ImageSize must be a positive multiple of 2^(Stages+2) = 32"},
		{func(c *Config) { c.Stages = 2 }, "Stages must be 3 to 6"},
		{func(c *Config) { c.DModel = 30 }, "DModel"},
		{func(c *Config) { c.Heads = 5 }, "Heads must be positive and divide DModel"},
		{func(c *Config) { c.NormGroups = 48 }, "NormGroups"},
		{func(c *Config) { c.Dropout = 1 }, "Dropout must be in [0, 1)"},
		{func(c *Config) { c.DecLayers = 0 }, "EncLayers and DecLayers"},
		{func(c *Config) { c.Queries = 0 }, "Queries"},
		{func(c *Config) { c.FocalAlpha = math.NaN() }, "FocalAlpha"},
		{func(c *Config) { c.CostGIoU = -1 }, "CostGIoU must be finite and non-negative"},
		{func(c *Config) { c.WeightBox = math.Inf(1) }, "WeightBox"},
	} {
		cfg := DefaultConfig(3)
		c.edit(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "model: ") {
			t.Errorf("want an error with %q, got %v", c.want, err)
		}
		if _, err := Build(cfg, mustParams(t, 1, tensor.Float32), Train, 1); err == nil {
			t.Errorf("Build took a config Validate refuses (%q)", c.want)
		}
	}
}

// TestTrainStepBadTargets: targets the matching cannot take are refused
// before the run.
func TestTrainStepBadTargets(t *testing.T) {
	cfg := tinyConfig()
	n, err := Build(cfg, mustParams(t, 1, tensor.Float32), Train, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if err := n.NewOptimizer(ReferenceOptimizer()); err != nil {
		t.Fatal(err)
	}
	pix, good := tinyBatch(cfg.ImageSize)
	for _, c := range []struct {
		targets []Target
		want    string
	}{
		{good[:1], "got 1 targets for a batch of 2"},
		{[]Target{good[0], {Labels: []int{3}, Boxes: []Box{{0.5, 0.5, 0.1, 0.1}}}}, "label 3 is not in [0, 3)"},
		{[]Target{good[0], {Labels: []int{1}, Boxes: []Box{{0.5, 0.5, 0, 0.1}}}}, "w, h > 0"},
		{[]Target{good[0], {Labels: []int{1}}}, "1 labels and 0 boxes"},
	} {
		if _, err := n.TrainStep(pix, c.targets, 0, 1e-4); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error with %q, got %v", c.want, err)
		}
	}
}
