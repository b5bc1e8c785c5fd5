package eval

import (
	"fmt"
	"math"
	"testing"

	"github.com/stheno-ml/stheno/examples/internal/data"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

// boxMask is a w x h mask of the pixels inside box.
func boxMask(w, h int, b [4]float64) *data.Mask {
	m := data.NewMask(w, h)
	for y := range h {
		for x := range w {
			m.Bits[y*w+x] = float64(x) >= b[0] && float64(x) < b[2] && float64(y) >= b[1] && float64(y) < b[3]
		}
	}
	return m
}

func TestIoU(t *testing.T) {
	for _, tc := range []struct {
		a, b [4]float64
		want float64
	}{
		{[4]float64{0, 0, 2, 2}, [4]float64{0, 0, 2, 2}, 1},
		{[4]float64{0, 0, 2, 2}, [4]float64{1, 1, 3, 3}, 1.0 / 7}, // 1 / (4+4-1)
		{[4]float64{0, 0, 4, 4}, [4]float64{1, 1, 3, 3}, 4.0 / 16},
		{[4]float64{0, 0, 10, 10}, [4]float64{0, 0, 10, 6}, 0.6},
		{[4]float64{0, 0, 1, 1}, [4]float64{1, 0, 2, 1}, 0}, // edges touch
		{[4]float64{0, 0, 1, 1}, [4]float64{5, 5, 6, 6}, 0},
		{[4]float64{0, 0, 0, 0}, [4]float64{0, 0, 0, 0}, 0},      // empty union
		{[4]float64{2, 2, 0, 0}, [4]float64{0, 0, 2, 2}, 0},      // inverted box is empty
		{[4]float64{0, 0, 3, 1}, [4]float64{1, 0, 2, 1}, 1. / 3}, // inside
	} {
		if got := IoU(tc.a, tc.b); !near(got, tc.want) {
			t.Errorf("IoU(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
		if got := IoU(tc.b, tc.a); !near(got, tc.want) {
			t.Errorf("IoU(%v, %v) = %v, want %v (symmetry)", tc.b, tc.a, got, tc.want)
		}
	}
}

func maskFrom(rows ...string) *data.Mask {
	m := data.NewMask(len(rows[0]), len(rows))
	for y, r := range rows {
		for x, c := range r {
			m.Bits[y*m.W+x] = c == '#'
		}
	}
	return m
}

func TestMaskIoU(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b *data.Mask
		want float64
	}{
		{"same", maskFrom("##.", "#.."), maskFrom("##.", "#.."), 1},
		// a = {(0,0),(1,0),(0,1)}, b = {(1,0),(0,1),(1,1)}: 2 shared of 4.
		{"half", maskFrom("##.", "#.."), maskFrom(".#.", "##."), 0.5},
		{"disjoint", maskFrom("#..", "..."), maskFrom("...", "..#"), 0},
		{"both empty", maskFrom("..", ".."), maskFrom("..", ".."), 0},
		{"nil", nil, maskFrom("#.", ".."), 0},
		{"one inside the other", maskFrom("####", "####"), maskFrom("....", ".##."), 2.0 / 8},
		// Sizes differ: compared where both are defined, (1,0) is shared.
		{"different sizes", maskFrom("##", ".."), maskFrom(".#.", "...", "..#"), 1.0 / 3},
	} {
		if got := MaskIoU(tc.a, tc.b); !near(got, tc.want) {
			t.Errorf("%s: MaskIoU = %v, want %v", tc.name, got, tc.want)
		}
		if got := MaskIoU(tc.b, tc.a); !near(got, tc.want) {
			t.Errorf("%s: MaskIoU reversed = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestThresholds(t *testing.T) {
	// numpy's linspace(.5, .95, 10) lands on the same doubles as the
	// literals at 0.6, 0.75 and 0.95 (worked out by hand: step is the
	// double just below 0.05, and 2*step+0.5 rounds back to 0.6).
	if IoUThresholds[0] != 0.5 || IoUThresholds[2] != 0.6 || IoUThresholds[5] != 0.75 || IoUThresholds[9] != 0.95 || len(IoUThresholds) != 10 {
		t.Errorf("IoUThresholds = %v", IoUThresholds)
	}
	if len(recallLevels) != 101 || recallLevels[50] != 0.5 || recallLevels[100] != 1 {
		t.Errorf("recall levels: %d, [50] = %v", len(recallLevels), recallLevels[50])
	}
}

// obj is a ground truth object with a box-shaped mask in a 32x32 image.
func obj(class int, b [4]float64) data.Object {
	return data.Object{Class: class, Box: b, Mask: boxMask(32, 32, b)}
}

func det(img, class int, score float64, b [4]float64) Detection {
	return Detection{ImageID: img, Class: class, Score: score, Box: b, Mask: boxMask(32, 32, b)}
}

// dataset builds ground truth over classes a, b, c from the objects of each
// image (image ids 1, 2, ...).
func dataset(images ...[]data.Object) *data.Dataset {
	ds := &data.Dataset{Classes: []string{"a", "b", "c"}}
	for i, objs := range images {
		ds.Images = append(ds.Images, &data.Image{ID: i + 1, W: 32, H: 32, Objects: objs})
	}
	return ds
}

var (
	boxA = [4]float64{0, 0, 10, 10}
	boxB = [4]float64{12, 12, 20, 22}
	far  = [4]float64{25, 25, 31, 31}
)

func TestEvaluate(t *testing.T) {
	fps := func(n int) []Detection {
		var d []Detection
		for i := range n {
			d = append(d, det(1, 0, 0.9-float64(i)*1e-4, far))
		}
		return d
	}
	for _, tc := range []struct {
		name           string
		gt             *data.Dataset
		dets           []Detection
		ap, ap50, ap75 float64
		perClass       []float64
	}{
		{"perfect", dataset([]data.Object{obj(0, boxA), obj(1, boxB)}, []data.Object{obj(2, boxA)}),
			[]Detection{det(1, 0, 0.9, boxA), det(1, 1, 0.3, boxB), det(2, 2, 0.5, boxA)},
			1, 1, 1, []float64{1, 1, 1}},
		{"no detections", dataset([]data.Object{obj(0, boxA), obj(1, boxB)}), nil,
			0, 0, 0, []float64{0, 0, -1}},
		// Ranked FP, TP: recall [0 1], precision [0 .5], made monotone to
		// [.5 .5]; every recall level reads 0.5.
		{"false positive first", dataset([]data.Object{obj(0, boxA)}),
			[]Detection{det(1, 0, 0.9, far), det(1, 0, 0.8, boxA)},
			0.5, 0.5, 0.5, []float64{0.5, -1, -1}},
		// Ranked TP, FP: recall reaches 1 at precision 1 first.
		{"false positive last", dataset([]data.Object{obj(0, boxA)}),
			[]Detection{det(1, 0, 0.8, far), det(1, 0, 0.9, boxA)},
			1, 1, 1, []float64{1, -1, -1}},
		// Two GT; ranked TP(A), duplicate of A (FP), TP(B): recall
		// [.5 .5 1], precision [1 .5 2/3] -> monotone [1 2/3 2/3]. Levels
		// 0..0.50 (51 of them) read 1, levels 0.51..1 (50) read 2/3:
		// (51 + 50*2/3)/101 = 253/303.
		{"duplicate", dataset([]data.Object{obj(0, boxA), obj(0, boxB)}),
			[]Detection{det(1, 0, 0.9, boxA), det(1, 0, 0.8, boxA), det(1, 0, 0.7, boxB)},
			253.0 / 303, 253.0 / 303, 253.0 / 303, []float64{253.0 / 303, -1, -1}},
		// One of two objects found: levels up to 0.5 read 1, the rest 0.
		{"half recall", dataset([]data.Object{obj(1, boxA), obj(1, boxB)}),
			[]Detection{det(1, 1, 0.9, boxA)},
			51.0 / 101, 51.0 / 101, 51.0 / 101, []float64{-1, 51.0 / 101, -1}},
		// IoU 0.59 clears 0.50 and 0.55 only: AP = 2/10.
		{"IoU 0.59", dataset([]data.Object{obj(0, boxA)}),
			[]Detection{det(1, 0, 0.9, [4]float64{0, 0, 10, 5.9})},
			0.2, 1, 0, []float64{0.2, -1, -1}},
		// IoU exactly 0.6 also clears the 0.60 threshold (>=, and the
		// threshold is the double 0.6): 3/10.
		{"IoU 0.6", dataset([]data.Object{obj(0, boxA)}),
			[]Detection{det(1, 0, 0.9, [4]float64{0, 0, 10, 6})},
			0.3, 1, 0, []float64{0.3, -1, -1}},
		// IoU 0.8 clears 0.50..0.80: 7/10.
		{"IoU 0.8", dataset([]data.Object{obj(0, boxA)}),
			[]Detection{det(1, 0, 0.9, [4]float64{0, 0, 10, 8})},
			0.7, 1, 1, []float64{0.7, -1, -1}},
		// A class with detections but no ground truth is left out of AP.
		{"class without ground truth", dataset([]data.Object{obj(0, boxA)}),
			[]Detection{det(1, 0, 0.5, boxA), det(1, 2, 0.99, boxA)},
			1, 1, 1, []float64{1, -1, -1}},
		{"no ground truth at all", dataset(nil), []Detection{det(1, 0, 0.5, boxA)},
			-1, -1, -1, []float64{-1, -1, -1}},
		// Classes average: a = 1, b = 0.
		{"mean over classes", dataset([]data.Object{obj(0, boxA), obj(1, boxB)}),
			[]Detection{det(1, 0, 0.9, boxA), det(1, 1, 0.9, far)},
			0.5, 0.5, 0.5, []float64{1, 0, -1}},
		// Scores rank across images: image 2's FP outranks image 1's TP.
		{"ranking across images", dataset([]data.Object{obj(0, boxA)}, nil),
			[]Detection{det(1, 0, 0.5, boxA), det(2, 0, 0.6, boxA)},
			0.5, 0.5, 0.5, []float64{0.5, -1, -1}},
		// 99 higher-scored FPs: the TP is the 100th detection, kept, at
		// recall 1 and precision 1/100.
		{"100 detections per image", dataset([]data.Object{obj(0, boxA)}),
			append(fps(99), det(1, 0, 0.1, boxA)),
			0.01, 0.01, 0.01, []float64{0.01, -1, -1}},
		// 100 higher-scored FPs: the TP is the 101st and is cut.
		{"101st detection dropped", dataset([]data.Object{obj(0, boxA)}),
			append(fps(100), det(1, 0, 0.1, boxA)),
			0, 0, 0, []float64{0, -1, -1}},
		// Detections of unknown images or classes are ignored.
		{"unknown image and class", dataset([]data.Object{obj(0, boxA)}),
			[]Detection{det(1, 0, 0.5, boxA), det(9, 0, 0.9, boxA), det(1, 7, 0.9, boxA), det(1, -1, 0.9, boxA)},
			1, 1, 1, []float64{1, -1, -1}},
	} {
		m := Evaluate(tc.gt, tc.dets, false)
		if !near(m.AP, tc.ap) || !near(m.AP50, tc.ap50) || !near(m.AP75, tc.ap75) {
			t.Errorf("%s: AP %v AP50 %v AP75 %v, want %v %v %v", tc.name, m.AP, m.AP50, m.AP75, tc.ap, tc.ap50, tc.ap75)
		}
		if fmt.Sprint(m.PerClassAP) != fmt.Sprint(tc.perClass) {
			if len(m.PerClassAP) != len(tc.perClass) {
				t.Errorf("%s: PerClassAP %v, want %v", tc.name, m.PerClassAP, tc.perClass)
				continue
			}
			for k := range tc.perClass {
				if !near(m.PerClassAP[k], tc.perClass[k]) {
					t.Errorf("%s: PerClassAP %v, want %v", tc.name, m.PerClassAP, tc.perClass)
					break
				}
			}
		}
		// With box-shaped masks, mask AP equals box AP, unless a box has
		// fractional coordinates (its pixel mask has another shape).
		if mm := Evaluate(tc.gt, tc.dets, true); integerBoxes(tc.dets) && !near(mm.AP, m.AP) {
			t.Errorf("%s: mask AP %v, box AP %v; the masks are the boxes", tc.name, mm.AP, m.AP)
		}
	}
}

func integerBoxes(dets []Detection) bool {
	for _, d := range dets {
		for _, v := range d.Box {
			if v != math.Trunc(v) {
				return false
			}
		}
	}
	return true
}

func TestEvaluateMasks(t *testing.T) {
	// The ground truth is a thin L inside boxA: its box matches the
	// detection's box exactly, but the detection's mask (the whole box)
	// overlaps the L by 19/100.
	l := data.NewMask(32, 32)
	for i := range 10 {
		l.Bits[i*32] = true   // column x=0
		l.Bits[9*32+i] = true // row y=9
	}
	gt := dataset([]data.Object{{Class: 0, Box: boxA, Mask: l}})
	dets := []Detection{det(1, 0, 0.9, boxA)}
	if got := MaskIoU(l, dets[0].Mask); !near(got, 0.19) {
		t.Fatalf("MaskIoU = %v, want 0.19", got)
	}
	if m := Evaluate(gt, dets, false); !near(m.AP, 1) {
		t.Errorf("box AP = %v, want 1", m.AP)
	}
	if m := Evaluate(gt, dets, true); !near(m.AP, 0) {
		t.Errorf("mask AP = %v, want 0", m.AP)
	}
	// A detection without a mask has an empty one.
	dets[0].Mask = nil
	if m := Evaluate(gt, dets, true); !near(m.AP, 0) {
		t.Errorf("mask AP without a mask = %v, want 0", m.AP)
	}
	dets[0].Mask = l
	if m := Evaluate(gt, dets, true); !near(m.AP, 1) {
		t.Errorf("mask AP with the right mask = %v, want 1", m.AP)
	}
}

func TestEvaluateCrowd(t *testing.T) {
	crowd := data.Object{Class: 0, Box: [4]float64{14, 14, 32, 32}, Mask: boxMask(32, 32, [4]float64{14, 14, 32, 32}), Crowd: true}
	gt := dataset([]data.Object{obj(0, boxA), crowd})
	// The top detection lies inside the crowd region (IoU against it is
	// inter/area(det) = 1): ignored rather than a false positive. Two such
	// detections are both ignored: crowd regions match repeatedly.
	dets := []Detection{det(1, 0, 0.95, far), det(1, 0, 0.92, [4]float64{20, 20, 24, 24}), det(1, 0, 0.9, boxA)}
	for _, masks := range []bool{false, true} {
		if m := Evaluate(gt, dets, masks); !near(m.AP, 1) {
			t.Errorf("masks=%v: AP = %v, want 1 (detections on the crowd ignored)", masks, m.AP)
		}
	}
	// Without the crowd flag the region is an ordinary object, which both
	// detections on it overlap by far less than 0.5 (36/324 and 16/324):
	// two false positives ranked first.
	gt.Images[0].Objects[1].Crowd = false
	if m := Evaluate(gt, dets, false); m.AP >= 1 {
		t.Errorf("without crowd: AP = %v, want < 1", m.AP)
	}
	// A crowd region alone does not count as ground truth.
	only := dataset([]data.Object{crowd})
	if m := Evaluate(only, dets, false); m.AP != -1 {
		t.Errorf("crowd only: AP = %v, want -1", m.AP)
	}
}

func TestEvaluateTiesKeepOrder(t *testing.T) {
	// Equal scores keep input order within an image (a stable sort, like
	// pycocotools' mergesort): TP then FP gives 1, FP then TP 0.5.
	gt := dataset([]data.Object{obj(0, boxA)})
	if m := Evaluate(gt, []Detection{det(1, 0, 0.5, boxA), det(1, 0, 0.5, far)}, false); !near(m.AP, 1) {
		t.Errorf("TP first: AP = %v, want 1", m.AP)
	}
	if m := Evaluate(gt, []Detection{det(1, 0, 0.5, far), det(1, 0, 0.5, boxA)}, false); !near(m.AP, 0.5) {
		t.Errorf("FP first: AP = %v, want 0.5", m.AP)
	}
}

func TestEvaluateSynthetic(t *testing.T) {
	// Ground truth fed back as detections scores 1 on a real dataset, with
	// boxes and with masks; a slightly shifted copy scores less.
	ds, err := data.Synthetic(data.DefaultSynthetic(3, 20))
	if err != nil {
		t.Fatal(err)
	}
	var dets, shifted []Detection
	for _, img := range ds.Images {
		for i, o := range img.Objects {
			d := Detection{ImageID: img.ID, Class: o.Class, Score: 1 - 0.01*float64(i), Box: o.Box, Mask: o.Mask}
			dets = append(dets, d)
			d.Box[0] += 3
			d.Box[2] += 3
			shifted = append(shifted, d)
		}
	}
	for _, masks := range []bool{false, true} {
		if m := Evaluate(ds, dets, masks); m.AP != 1 || m.AP50 != 1 || m.AP75 != 1 {
			t.Errorf("masks=%v: ground truth as detections: %+v", masks, m)
		}
	}
	if m := Evaluate(ds, shifted, false); !(m.AP < 1 && m.AP50 > m.AP75) {
		t.Errorf("shifted boxes: %+v", m)
	}
}
