package model

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-12*max(1, math.Abs(b)) }

func nearBox(a, b Box) bool {
	for i := range a {
		if !near(a[i], b[i]) {
			return false
		}
	}
	return true
}

func TestIoU(t *testing.T) {
	for _, c := range []struct {
		a, b Box
		want float64
	}{
		{Box{0, 0, 2, 2}, Box{1, 1, 3, 3}, 1.0 / 7},
		{Box{0, 0, 2, 2}, Box{0, 0, 2, 2}, 1},
		{Box{0, 0, 4, 2}, Box{0, 0, 2, 2}, 0.5},
		{Box{0, 0, 2, 2}, Box{2, 0, 4, 2}, 0}, // touching edges
		{Box{0, 0, 2, 2}, Box{5, 5, 6, 6}, 0}, // apart
		{Box{1, 1, 1, 5}, Box{0, 0, 2, 2}, 0}, // empty
		{Box{3, 3, 1, 1}, Box{0, 0, 4, 4}, 0}, // inverted
		{Box{0, 0, 10, 10}, Box{2, 0, 12, 10}, 80.0 / 120},
	} {
		if got := IoU(c.a, c.b); !near(got, c.want) {
			t.Errorf("IoU(%v, %v) = %v, want %v", c.a, c.b, got, c.want)
		}
		if got := IoU(c.b, c.a); !near(got, c.want) {
			t.Errorf("IoU(%v, %v) = %v, want %v (symmetry)", c.b, c.a, got, c.want)
		}
	}
}

func TestBoxCoder(t *testing.T) {
	ref := Box{0, 0, 10, 20} // centre (5, 10), 10 x 20
	for _, c := range []struct {
		coder BoxCoder
		box   Box
		want  [4]float64
	}{
		{rpnCoder, Box{0, 0, 10, 20}, [4]float64{0, 0, 0, 0}},
		{rpnCoder, Box{2, 4, 12, 24}, [4]float64{0.2, 0.2, 0, 0}},
		{rpnCoder, Box{0, 0, 20, 10}, [4]float64{0.5, -0.25, math.Log(2), math.Log(0.5)}},
		{boxCoder, Box{0, 0, 20, 10}, [4]float64{5, -2.5, 5 * math.Log(2), 5 * math.Log(0.5)}},
	} {
		d := c.coder.Encode(c.box, ref)
		for i := range d {
			if !near(d[i], c.want[i]) {
				t.Errorf("%v: Encode(%v) = %v, want %v", c.coder, c.box, d, c.want)
				break
			}
		}
		if back := c.coder.Decode(d, ref); !nearBox(back, c.box) {
			t.Errorf("%v: Decode(Encode(%v)) = %v", c.coder, c.box, back)
		}
	}
	// A wild size delta is capped at 1000/16 times the reference.
	b := rpnCoder.Decode([4]float64{0, 0, 50, 0}, ref)
	if w := b[2] - b[0]; !near(w, 10*1000.0/16) {
		t.Errorf("capped width %v, want %v", w, 10*1000.0/16)
	}
}

func TestClip(t *testing.T) {
	if got := Clip(Box{-3, 5, 70, 64.5}, 64); got != (Box{0, 5, 64, 64}) {
		t.Errorf("Clip = %v", got)
	}
}

func TestNMS(t *testing.T) {
	boxes := []Box{
		{0, 0, 10, 10},   // 0
		{1, 1, 11, 11},   // 1: IoU 81/119 = 0.68 with 0 and 3
		{20, 20, 30, 30}, // 2: apart
		{0, 0, 10, 10},   // 3: same as 0, best score
	}
	scores := []float64{0.9, 0.8, 0.7, 0.95}
	for _, c := range []struct {
		thresh float64
		limit  int
		want   []int
	}{
		{0.5, 0, []int{3, 2}},
		{0.7, 0, []int{3, 1, 2}},
		{0.7, 2, []int{3, 1}},
		{1, 0, []int{3, 0, 1, 2}}, // nothing overlaps more than completely
	} {
		if got := NMS(boxes, scores, c.thresh, c.limit); !slices.Equal(got, c.want) {
			t.Errorf("NMS(thresh %v, limit %d) = %v, want %v", c.thresh, c.limit, got, c.want)
		}
	}
	// Equal scores keep the earlier box.
	if got := NMS([]Box{{0, 0, 1, 1}, {0, 0, 1, 1}}, []float64{1, 1}, 0.5, 0); !slices.Equal(got, []int{0}) {
		t.Errorf("ties: %v, want [0]", got)
	}
	if got := NMS(nil, nil, 0.5, 0); len(got) != 0 {
		t.Errorf("no boxes: %v", got)
	}
}

func TestAnchors(t *testing.T) {
	cfg := DefaultConfig(3, 32) // levels of 8x8, 4x4 and 2x2 cells
	levels := Anchors(cfg)
	for l, boxes := range levels {
		n := cfg.LevelSize(l)
		if len(boxes) != 3*n*n {
			t.Fatalf("level %d: %d anchors, want %d", l, len(boxes), 3*n*n)
		}
	}
	// Level 0 (stride 4, size 12): ratio 1 (a=1) at cell (x=2, y=1) is
	// centred on (10, 6).
	got := levels[0][(1*8+1)*8+2]
	if want := (Box{4, 0, 16, 12}); !nearBox(got, want) {
		t.Errorf("level 0, a=1, (2,1): %v, want %v", got, want)
	}
	// Ratio 0.5 (height/width, a=0) keeps the area: 12*sqrt2 wide, 12/sqrt2
	// high, at cell (0, 0) of level 2 (stride 16, size 48: centre (8, 8)).
	got = levels[2][0]
	w, h := 48*math.Sqrt2, 48/math.Sqrt2
	if want := (Box{8 - w/2, 8 - h/2, 8 + w/2, 8 + h/2}); !nearBox(got, want) {
		t.Errorf("level 2, a=0, (0,0): %v, want %v", got, want)
	}
	if a := Area(got); !near(a, 48*48) {
		t.Errorf("area %v, want %v", a, 48*48)
	}
}

// NMS keeps exactly what comparing each box with every kept box keeps, on
// random boxes of mixed sizes with tied and NaN scores, duplicates, boxes with
// NaN or infinite corners, inverted and empty boxes, boxes far from the
// rest, thresholds from 0 to 1, and limits.
func TestNMSMatchesEveryPairCompared(t *testing.T) {
	everyPair := func(boxes []Box, scores []float64, thresh float64, limit int) []int {
		order := make([]int, len(boxes))
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(scores[b], scores[a]) })
		var keep []int
		for _, i := range order {
			if limit > 0 && len(keep) == limit {
				break
			}
			ok := true
			for _, j := range keep {
				if IoU(boxes[i], boxes[j]) > thresh {
					ok = false
					break
				}
			}
			if ok {
				keep = append(keep, i)
			}
		}
		return keep
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := range 1400 {
		n := 1 + rng.IntN(400)
		thresh := []float64{0.3, 0.5, 0.7, 0.05, 0.95, 0, 1}[trial%7]
		boxes, scores := make([]Box, n), make([]float64, n)
		for i := range boxes {
			x, y := rng.Float64()*500-50, rng.Float64()*500-50
			w, h := math.Exp(rng.Float64()*5), math.Exp(rng.Float64()*5)
			boxes[i] = Box{x, y, x + w, y + h}
			scores[i] = float64(rng.IntN(20)) // many ties
			switch rng.IntN(40) {
			case 0:
				boxes[i][rng.IntN(4)] = math.NaN()
			case 1:
				boxes[i] = boxes[rng.IntN(i+1)] // a duplicate
			case 2:
				if trial%3 == 0 {
					boxes[i][2] = math.Inf(1)
				}
			case 3:
				if trial%5 == 0 {
					// Far from the others: the grid's cells widen.
					boxes[i][0] += 1e7
					boxes[i][2] += 1e7
				}
			case 4:
				scores[i] = math.NaN() // last, as cmp.Compare orders it
			case 5:
				boxes[i][0], boxes[i][2] = boxes[i][2], boxes[i][0] // inverted
			case 6:
				boxes[i][2] = boxes[i][0] // no width
			case 7:
				boxes[i][3] = math.Inf(-1)
			}
			if i > 0 && rng.IntN(3) == 0 {
				// A neighbour of an earlier box, shifted by up to about
				// (1-IoU) of its size: IoUs near the thresholds.
				o := boxes[rng.IntN(i)]
				w, h := o[2]-o[0], o[3]-o[1]
				dx, dy := (rng.Float64()-0.5)*0.8*w, (rng.Float64()-0.5)*0.8*h
				boxes[i] = Box{o[0] + dx, o[1] + dy, o[2] + dx, o[3] + dy}
				if rng.IntN(2) == 0 && thresh > 0 {
					// Around it, nearly 1/thresh times as wide (or high),
					// sharing its right (or bottom) edge: the farthest
					// corner that suppresses it, or is suppressed by it.
					f := min(1/thresh, 1e3) * (1 - 0.01*rng.Float64())
					boxes[i] = o
					if d := rng.IntN(2); d == 0 {
						boxes[i][0] = o[2] - f*w
					} else {
						boxes[i][1] = o[3] - f*h
					}
				}
			}
		}
		limit := []int{0, 5, n / 2}[trial%3]
		got, want := NMS(boxes, scores, thresh, limit), everyPair(boxes, scores, thresh, limit)
		if !slices.Equal(got, want) {
			t.Fatalf("trial %d (%d boxes, thresh %v, limit %d): kept %v, every pair compared keeps %v", trial, n, thresh, limit, got, want)
		}
	}
}

// topKSet is the first k of a stable sort by descending score, in index
// order, for every k: on scores with ties and NaNs, and on spread scores
// of both signs, zeros of both signs and infinities.
func TestTopKSet(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for trial := range 300 {
		n := rng.IntN(300)
		if trial%10 == 0 {
			n = 5000 + rng.IntN(5000)
		}
		scores := make([]float32, n)
		for i := range scores {
			if trial%2 == 0 {
				scores[i] = float32(rng.IntN(1 + trial%50))
			} else {
				scores[i] = float32(rng.NormFloat64() * math.Exp(rng.Float64()*10-5))
			}
			switch rng.IntN(30) {
			case 0:
				scores[i] = float32(math.NaN())
			case 1:
				scores[i] = float32(math.Copysign(0, rng.NormFloat64()))
			case 2:
				scores[i] = float32(math.Inf(1 - 2*rng.IntN(2)))
			}
		}
		order := make([]int, n)
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(scores[b], scores[a]) })
		for _, k := range []int{0, 1, n / 3, n - 1, n, n + 5} {
			if k < 0 {
				continue
			}
			want := slices.Sorted(slices.Values(order[:min(k, n)]))
			if got := topKSet(scores, k); !slices.Equal(got, want) {
				t.Fatalf("trial %d, k %d: %v, want %v (scores %v)", trial, k, got, want, scores)
			}
		}
	}
}

// rankKey and rankKey64 order scores as cmp.Compare does, on special
// values and their neighbours.
func TestRankKey(t *testing.T) {
	vals := []float64{math.NaN(), math.Inf(-1), -math.MaxFloat64, -1.5, -1, -math.SmallestNonzeroFloat64,
		math.Copysign(0, -1), 0, math.SmallestNonzeroFloat64, 1e-40, 1, 1.5, math.MaxFloat64, math.Inf(1)}
	for _, a := range vals {
		for _, b := range vals {
			if got, want := cmp.Compare(rankKey64(a), rankKey64(b)), cmp.Compare(a, b); got != want {
				t.Errorf("rankKey64: %v vs %v compares %d, want %d", a, b, got, want)
			}
			a32, b32 := float32(a), float32(b)
			if got, want := cmp.Compare(rankKey(a32), rankKey(b32)), cmp.Compare(a32, b32); got != want {
				t.Errorf("rankKey: %v vs %v compares %d, want %d", a32, b32, got, want)
			}
		}
	}
}
