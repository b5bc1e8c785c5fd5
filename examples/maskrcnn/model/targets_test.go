package model

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/kernels"
)

func TestRPNLabels(t *testing.T) {
	anchors := []Box{
		{0, 0, 10, 10},   // IoU 1 with gt 0: positive
		{0, 0, 10, 5},    // IoU 0.5: ignored
		{20, 20, 30, 30}, // IoU 81/119 = 0.68 with gt 1: ignored, but gt 1's best
		{2, 0, 12, 10},   // IoU 0.67 with gt 0: ignored
		{40, 40, 50, 50}, // IoU 0: negative
		{0, 0, 20, 20},   // IoU 0.25 with gt 0: negative
	}
	gt := []Box{{0, 0, 10, 10}, {21, 21, 31, 31}}
	labels, matched := rpnLabels(anchors, gt, 0.7, 0.3)
	if want := []int8{1, -1, 1, -1, 0, 0}; !slices.Equal(labels, want) {
		t.Errorf("labels %v, want %v", labels, want)
	}
	if want := []int{0, 0, 1, 0}; !slices.Equal(matched[:4], want) {
		t.Errorf("matches %v, want %v first", matched, want)
	}
	// Without ground truth every anchor is negative.
	labels, _ = rpnLabels(anchors, nil, 0.7, 0.3)
	if want := []int8{0, 0, 0, 0, 0, 0}; !slices.Equal(labels, want) {
		t.Errorf("no ground truth: labels %v", labels)
	}
}

func TestSample(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	labels := []int8{1, 0, -1, 1, 0, 0, 1, 0, 1, 0, 1, 0, 0, -1}
	for _, c := range []struct {
		want     int
		fraction float64
		pos, neg int
	}{
		{4, 0.5, 2, 2},
		{20, 0.5, 5, 7}, // all there are
		{8, 0.25, 2, 6},
		{1, 0.5, 0, 1},
	} {
		pos, neg := sample(rng, labels, c.want, c.fraction)
		if len(pos) != c.pos || len(neg) != c.neg {
			t.Errorf("want %d at %v: %d positives and %d negatives, want %d and %d", c.want, c.fraction, len(pos), len(neg), c.pos, c.neg)
		}
		for _, i := range pos {
			if labels[i] != 1 {
				t.Errorf("sampled %d as positive, its label is %d", i, labels[i])
			}
		}
		for _, i := range neg {
			if labels[i] != 0 {
				t.Errorf("sampled %d as negative, its label is %d", i, labels[i])
			}
		}
	}
}

// The RPN targets land in the layout of the RPN's outputs, with weights
// that sum to 1 over the batch.
func TestAssignRPN(t *testing.T) {
	cfg := DefaultConfig(3, 32)
	cfg.RPNBatch = 16
	anchors := Anchors(cfg)
	// Image 1's only box is exactly level 1's anchor a=2 (ratio 2: 24/sqrt2
	// wide, 24*sqrt2 high) at cell (x=1, y=2) of the 4x4 grid.
	a := anchors[1][(2*4+2)*4+1]
	shifted := Box{a[0] + 1, a[1], a[2] + 1, a[3]}
	targets := []Target{{}, {Boxes: []Box{shifted}, Classes: []int{0}}}
	rt := AssignRPN(cfg, anchors, targets, rand.New(rand.NewPCG(3, 4)))
	var wsum float64
	positives := 0
	for l := range anchors {
		size := len(anchors[l])
		for i, w := range rt.ObjW[l] {
			wsum += float64(w)
			if rt.Obj[l][i] == 1 {
				positives++
				if i/size != 1 {
					t.Errorf("level %d: positive anchor in image 0", l)
				}
			}
		}
	}
	if math.Abs(wsum-1) > 1e-5 {
		t.Errorf("objectness weights sum to %v, want 1", wsum)
	}
	if positives == 0 {
		t.Fatal("no positive anchor")
	}
	// The shifted box's best anchor is a itself (IoU 0.94): positive, with
	// deltas (1/w, 0, 0, 0) at channels 8..11 of [12, 4, 4], pixel (1, 2).
	size := len(anchors[1])
	if rt.Obj[1][size+(2*4+2)*4+1] != 1 {
		t.Error("the matching anchor is not positive")
	}
	w := float32(1.0 / 32) // 16 anchors sampled per image
	want := [4]float32{float32(1 / (a[2] - a[0])), 0, 0, 0}
	for k := range 4 {
		o := 4*size + (2*4+k)*16 + 2*4 + 1
		if math.Abs(float64(rt.Delta[1][o]-want[k])) > 1e-6 || rt.DeltaW[1][o] != w {
			t.Errorf("delta %d: %v (weight %v), want %v", k, rt.Delta[1][o], rt.DeltaW[1][o], want[k])
		}
	}
	// Deltas are weighted only at positive anchors.
	for l := range anchors {
		size := len(anchors[l])
		hw := size / 3
		for o, dw := range rt.DeltaW[l] {
			img, rest := o/(4*size), o%(4*size)
			ch, p := rest/hw, rest%hw
			j := img*size + (ch/4)*hw + p
			if (dw != 0) != (rt.Obj[l][j] == 1) {
				t.Fatalf("level %d: delta weight %v at %d, anchor label %v", l, dw, o, rt.Obj[l][j])
			}
		}
	}
}

func TestSampleRoIs(t *testing.T) {
	cfg := DefaultConfig(3, 64)
	cfg.RoIsPerImage, cfg.RoIPositiveFraction = 4, 0.5
	tg := Target{Boxes: []Box{{10, 10, 30, 30}, {40, 40, 60, 60}}, Classes: []int{2, 0}}
	props := []Box{
		{11, 11, 31, 31}, // IoU 0.82 with box 0: class 2
		{0, 0, 8, 8},     // background
		{50, 50, 64, 64}, // IoU 0.18 with box 1: background
	}
	rois := sampleRoIs(cfg, props, tg, rand.New(rand.NewPCG(5, 6)))
	if len(rois) != 4 {
		t.Fatalf("%d RoIs, want 4", len(rois))
	}
	// Positives are the proposal and the two ground-truth boxes (2 kept),
	// first; then the two background proposals.
	for i, r := range rois {
		if i < 2 {
			if r.label == 0 || r.label != tg.Classes[r.matched]+1 || IoU(r.box, tg.Boxes[r.matched]) < 0.5 {
				t.Errorf("RoI %d: %+v is not a correct foreground RoI", i, r)
			}
		} else if r.label != 0 || (r.box != props[1] && r.box != props[2]) {
			t.Errorf("RoI %d: %+v, want a background proposal", i, r)
		}
	}
}

func TestMaskTarget(t *testing.T) {
	m := data.NewMask(8, 8)
	for y := range 8 {
		for x := range 4 {
			m.Bits[y*8+x] = true // left half
		}
	}
	for _, c := range []struct {
		box  Box
		size int
		want []float32
	}{
		{Box{0, 0, 8, 8}, 4, []float32{1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0}},
		// Bins [2,4) and [4,6) sample pixels 2, 3 and 4, 5.
		{Box{2, 0, 6, 8}, 2, []float32{1, 0, 1, 0}},
		// A box over the border: samples past it read 0.
		{Box{-8, 0, 8, 8}, 2, []float32{0, 1, 0, 1}},
	} {
		got, err := MaskTarget(m, c.box, c.size)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("MaskTarget(%v, %d) = %v, want %v", c.box, c.size, got, c.want)
		}
	}
}

// maskTargets weighs of its scratch image only what it writes: with the
// scratch full of ones or of the mask's complement, it gives what RoIAlign
// over the whole mask as floats gives, for boxes inside, across and
// outside the border, inverted, tiny and with NaN corners.
func TestMaskTargetsScratch(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	const w, h, m = 40, 30, 7
	for trial := range 100 {
		mask := data.NewMask(w, h)
		full := make([]float32, w*h)
		for i := range mask.Bits {
			if mask.Bits[i] = rng.IntN(3) > 0; mask.Bits[i] {
				full[i] = 1
			}
		}
		boxes := make([]Box, 1+rng.IntN(4))
		for i := range boxes {
			x, y := rng.Float64()*60-10, rng.Float64()*50-10
			boxes[i] = Box{x, y, x + rng.Float64()*20 - 2, y + rng.Float64()*20 - 2}
			if rng.IntN(20) == 0 {
				boxes[i][rng.IntN(4)] = math.NaN()
			}
		}
		p := kernels.RoIAlignParams{N: 1, C: 1, H: h, W: w, K: len(boxes), PooledH: m, PooledW: m,
			SpatialScale: 1, SamplingRatio: 2, Aligned: true}
		var rois []float32
		for _, b := range boxes {
			rois = append(rois, 0, float32(b[0]), float32(b[1]), float32(b[2]), float32(b[3]))
		}
		want := make([]float32, len(boxes)*m*m)
		if err := kernels.RoIAlignForward(p, full, rois, want); err != nil {
			t.Fatal(err)
		}
		for i, v := range want {
			want[i] = map[bool]float32{true: 1, false: 0}[v >= 0.5]
		}
		for _, fill := range []string{"ones", "complement"} {
			img := make([]float32, w*h)
			for i := range img {
				img[i] = 1
				if fill == "complement" {
					img[i] = 1 - full[i]
				}
			}
			got := make([]float32, len(want))
			if err := maskTargets(mask, boxes, m, img, got); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("trial %d, boxes %v, scratch of %s: %v, want %v", trial, boxes, fill, got, want)
			}
		}
	}
}

func TestPasteMask(t *testing.T) {
	// Left column set: pixels whose centre maps left of the middle are in.
	got := PasteMask([]float32{1, 0, 1, 0}, 2, Box{0, 0, 8, 8}, 10, 9)
	for y := range 9 {
		for x := range 10 {
			want := y < 8 && x < 4
			if got.At(x, y) != want {
				t.Fatalf("pixel (%d,%d) = %t, want %t", x, y, got.At(x, y), want)
			}
		}
	}
	// MaskTarget then PasteMask gives a disc back, up to its rim.
	disc := data.NewMask(32, 32)
	for y := range 32 {
		for x := range 32 {
			dx, dy := float64(x)+0.5-16, float64(y)+0.5-14
			disc.Bits[y*32+x] = dx*dx+dy*dy < 64
		}
	}
	box := Box{6, 4, 26, 24}
	target, err := MaskTarget(disc, box, 28)
	if err != nil {
		t.Fatal(err)
	}
	back := PasteMask(target, 28, box, 32, 32)
	diff := 0
	for i := range disc.Bits {
		if disc.Bits[i] != back.Bits[i] {
			diff++
		}
	}
	if diff > 8 {
		t.Errorf("%d of the disc's %d pixels changed in the round trip", diff, disc.Area())
	}
	if a := PasteMask([]float32{1}, 1, Box{3, 3, 3, 9}, 8, 8).Area(); a != 0 {
		t.Errorf("an empty box pasted %d pixels", a)
	}
}

func TestDetect(t *testing.T) {
	cfg := DefaultConfig(2, 64)
	props := []Box{{10, 10, 20, 20}, {11, 10, 21, 20}, {40, 40, 50, 60}, {0, 0, 5, 5}}
	logits := [][]float32{
		{0, 0, 3},  // class 1 (0-based), p = e^3/(2+e^3)
		{0, -5, 2}, // class 1 again, overlapping: suppressed
		{0, 2, -5}, // class 0
		{9, 0, 0},  // background
	}
	// Proposal 2's class-0 deltas move it right by 2 pixels (dx = 10*2/10).
	deltas := [][]float32{make([]float32, 8), make([]float32, 8), {2, 0, 0, 0, 0, 0, 0, 0}, make([]float32, 8)}
	dets := detect(cfg, props, func(k int) []float32 { return logits[k] }, func(k int) []float32 { return deltas[k] })
	e3, e2 := math.Exp(3), math.Exp(2)
	want := []Detection{
		{Class: 1, Score: e3 / (2 + e3), Box: props[0]},
		{Class: 0, Score: e2 / (1 + e2 + math.Exp(-5)), Box: Box{42, 40, 52, 60}},
	}
	if len(dets) != len(want) {
		t.Fatalf("got %d detections %v, want %v", len(dets), dets, want)
	}
	for i := range want {
		if dets[i].Class != want[i].Class || !near(dets[i].Score, want[i].Score) || !nearBox(dets[i].Box, want[i].Box) {
			t.Errorf("detection %d: %+v, want %+v", i, dets[i], want[i])
		}
	}
	// Lower-scored classes of one proposal are detections too, above the
	// threshold: class 0 of proposal 0 scores 1/(2+e^3) = 0.045 < 0.05.
	cfg.ScoreThresh = 0.01
	if got := detect(cfg, props[:1], func(int) []float32 { return logits[0] }, func(int) []float32 { return deltas[0] }); len(got) != 2 {
		t.Errorf("with a low threshold: %d detections, want 2", len(got))
	}
}

// The best anchor, decoded with zero deltas, is the first proposal; NMS
// removes its twins.
func TestProposals(t *testing.T) {
	cfg := DefaultConfig(3, 32)
	anchors := Anchors(cfg)
	out := rpnOutputs{}
	for l := range anchors {
		obj := make([]float32, 2*len(anchors[l]))
		for i := range obj {
			obj[i] = -5
		}
		out.obj = append(out.obj, obj)
		out.delta = append(out.delta, make([]float32, 8*len(anchors[l])))
	}
	best := (1*8+3)*8 + 4 // level 0, ratio 1, cell (4, 3)
	out.obj[0][len(anchors[0])+best] = 5
	props := proposals(cfg, anchors, out, 1, 1000, 10, 0.7)
	if len(props) != 10 {
		t.Fatalf("%d proposals, want 10", len(props))
	}
	if props[0] != Clip(anchors[0][best], 32) {
		t.Errorf("first proposal %v, want the anchor %v", props[0], anchors[0][best])
	}
	for i := range props {
		for j := range i {
			if IoU(props[i], props[j]) > 0.7 {
				t.Fatalf("proposals %d and %d overlap by %v after NMS", j, i, IoU(props[i], props[j]))
			}
		}
	}
}

// mergeProposals is the first post of a stable sort of the levels'
// candidates by descending score, on levels with tied scores and NaNs.
func TestMergeProposals(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for trial := range 200 {
		levels := make([][]proposal, 1+rng.IntN(5))
		var all []proposal
		for l := range levels {
			for i := range rng.IntN(30) {
				s := float64(rng.IntN(8))
				if rng.IntN(20) == 0 {
					s = math.NaN()
				}
				levels[l] = append(levels[l], proposal{box: Box{float64(l), float64(i), 0, 0}, score: s})
			}
			// Best first, as levelProposals gives them.
			slices.SortStableFunc(levels[l], func(x, y proposal) int { return cmp.Compare(y.score, x.score) })
			all = append(all, levels[l]...)
		}
		slices.SortStableFunc(all, func(x, y proposal) int { return cmp.Compare(y.score, x.score) })
		for _, post := range []int{0, 1, len(all) / 2, len(all), len(all) + 3} {
			want := make([]Box, min(post, len(all)))
			for i := range want {
				want[i] = all[i].box
			}
			if got := mergeProposals(levels, post); !slices.Equal(got, want) {
				t.Fatalf("trial %d, post %d: %v, want %v", trial, post, got, want)
			}
		}
	}
}
