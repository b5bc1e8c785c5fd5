package model

import (
	"cmp"
	"math"
	"slices"

	"github.com/stheno-ml/stheno/examples/internal/data"
)

// minBoxSide drops degenerate decoded boxes, as torchvision's
// remove_small_boxes with min_size 1e-3.
const minBoxSide = 1e-3

// rpnOutputs are the RPN's outputs for a batch, per level: objectness
// logits [N, A, H, W] and deltas [N, A*4, H, W].
type rpnOutputs struct {
	obj, delta [][]float32
}

// proposals decodes image n's RPN outputs into at most post boxes, best
// first, as torchvision's RPN: per level, the pre best-scored anchors are
// decoded, clipped to the image, stripped of degenerate boxes and NMS'd at
// thresh (levelProposals); the survivors of all levels compete for the
// post places by score (mergeProposals).
func proposals(cfg Config, anchors [][]Box, out rpnOutputs, n, pre, post int, thresh float64) []Box {
	levels := make([][]proposal, len(anchors))
	for l := range anchors {
		levels[l] = levelProposals(cfg, anchors, out, l, n, pre, post, thresh)
	}
	return mergeProposals(levels, post)
}

// proposal is a decoded box with its objectness logit.
type proposal struct {
	box   Box
	score float64
}

// levelProposals is proposals' work on level l of image n: its candidates,
// best first.
//
// The pre best anchors are decoded in anchor order, which reads the deltas
// and anchors in memory order; NMS then orders them by score, ties in
// anchor order, as a stable sort by score would.
func levelProposals(cfg Config, anchors [][]Box, out rpnOutputs, l, n, pre, post int, thresh float64) []proposal {
	boxes := anchors[l]
	size := len(boxes)
	hw := size / cfg.NumAnchors()
	obj := out.obj[l][n*size : (n+1)*size]
	del := out.delta[l][n*4*size : (n+1)*4*size]
	best := topKSet(obj, pre)
	bs := make([]Box, 0, len(best))
	ss := make([]float64, 0, len(best))
	for _, j := range best {
		an, p := j/hw, j%hw
		d := [4]float64{}
		for k := range 4 {
			d[k] = float64(del[(an*4+k)*hw+p])
		}
		b := Clip(rpnCoder.Decode(d, boxes[j]), float64(cfg.ImageSize))
		if b[2]-b[0] < minBoxSide || b[3]-b[1] < minBoxSide || math.IsNaN(b[0]+b[1]+b[2]+b[3]) {
			continue
		}
		bs = append(bs, b)
		ss = append(ss, float64(obj[j]))
	}
	keep := NMS(bs, ss, thresh, post)
	cands := make([]proposal, len(keep))
	for i, k := range keep {
		cands[i] = proposal{bs[k], ss[k]}
	}
	return cands
}

// mergeProposals keeps the post best of an image's levels' candidates,
// best first (ties: the finer level's, then the level's order): the first
// post of a stable sort of them all by descending score. Each level's
// candidates come best first (levelProposals' order, that of cmp.Compare),
// so merging the levels' lists gives that order.
func mergeProposals(levels [][]proposal, post int) []Box {
	total := 0
	for _, cs := range levels {
		total += len(cs)
	}
	boxes := make([]Box, 0, min(post, total))
	heads := make([]int, len(levels))
	for len(boxes) < cap(boxes) {
		best := -1
		for l, cs := range levels {
			if heads[l] < len(cs) && (best < 0 || cmp.Compare(cs[heads[l]].score, levels[best][heads[best]].score) > 0) {
				best = l
			}
		}
		boxes = append(boxes, levels[best][heads[best]].box)
		heads[best]++
	}
	return boxes
}

// Detection is one detected object in the model's input coordinates.
type Detection struct {
	Class int // foreground class, 0-based
	Score float64
	Box   Box
}

// detect turns the box head's outputs for one image's proposals into
// detections, as torchvision's RoIHeads.postprocess_detections: softmax
// scores, class-specific boxes decoded from each proposal and clipped,
// scores below ScoreThresh and degenerate boxes dropped, NMS per class at
// DetNMS, and the best MaxDetections kept. logits(k) and deltas(k) return
// proposal k's class logits (background first) and its 4*NumClasses deltas.
func detect(cfg Config, props []Box, logits, deltas func(k int) []float32) []Detection {
	nc := cfg.NumClasses
	perClass := make([][]Detection, nc)
	probs := make([]float64, nc+1)
	for k, p := range props {
		softmax(logits(k), probs)
		d := deltas(k)
		for c := range nc {
			s := probs[c+1]
			if !(s > cfg.ScoreThresh) {
				continue
			}
			dc := [4]float64{float64(d[4*c]), float64(d[4*c+1]), float64(d[4*c+2]), float64(d[4*c+3])}
			b := Clip(boxCoder.Decode(dc, p), float64(cfg.ImageSize))
			if b[2]-b[0] < 1e-2 || b[3]-b[1] < 1e-2 || math.IsNaN(b[0]+b[1]+b[2]+b[3]) {
				continue
			}
			perClass[c] = append(perClass[c], Detection{Class: c, Score: s, Box: b})
		}
	}
	var dets []Detection
	for _, cands := range perClass {
		boxes := make([]Box, len(cands))
		scores := make([]float64, len(cands))
		for i, d := range cands {
			boxes[i], scores[i] = d.Box, d.Score
		}
		for _, i := range NMS(boxes, scores, cfg.DetNMS, cfg.MaxDetections) {
			dets = append(dets, cands[i])
		}
	}
	slices.SortStableFunc(dets, func(x, y Detection) int { return cmp.Compare(y.Score, x.Score) })
	return dets[:min(len(dets), cfg.MaxDetections)]
}

// softmax writes the softmax of logits into p, in float64.
func softmax(logits []float32, p []float64) {
	m := math.Inf(-1)
	for _, v := range logits {
		m = math.Max(m, float64(v))
	}
	var s float64
	for i, v := range logits {
		p[i] = math.Exp(float64(v) - m)
		s += p[i]
	}
	for i := range p {
		p[i] /= s
	}
}

// PasteMask places an m x m mask of probabilities (row-major), predicted
// for box, into a w x h image: each image pixel whose centre lies in the
// box samples the mask bilinearly at the matching point (pixel-centre
// aligned, clamped at the mask's border, the inverse of how MaskTarget
// resamples the ground truth) and is set when the probability is at least
// 0.5.
func PasteMask(probs []float32, m int, box Box, w, h int) *data.Mask {
	out := data.NewMask(w, h)
	bw, bh := box[2]-box[0], box[3]-box[1]
	if !(bw > 0 && bh > 0) {
		return out
	}
	x0, x1 := max(int(math.Floor(box[0])), 0), min(int(math.Ceil(box[2])), w)
	y0, y1 := max(int(math.Floor(box[1])), 0), min(int(math.Ceil(box[3])), h)
	for y := y0; y < y1; y++ {
		cy := float64(y) + 0.5
		if cy < box[1] || cy >= box[3] {
			continue
		}
		v := (cy-box[1])/bh*float64(m) - 0.5
		for x := x0; x < x1; x++ {
			cx := float64(x) + 0.5
			if cx < box[0] || cx >= box[2] {
				continue
			}
			u := (cx-box[0])/bw*float64(m) - 0.5
			if bilinear(probs, m, u, v) >= 0.5 {
				out.Bits[y*w+x] = true
			}
		}
	}
	return out
}

// bilinear samples an m x m grid at (u, v), clamping to the border.
func bilinear(g []float32, m int, u, v float64) float64 {
	u = min(max(u, 0), float64(m-1))
	v = min(max(v, 0), float64(m-1))
	x0, y0 := int(u), int(v)
	x1, y1 := min(x0+1, m-1), min(y0+1, m-1)
	fx, fy := u-float64(x0), v-float64(y0)
	at := func(x, y int) float64 { return float64(g[y*m+x]) }
	return (1-fy)*((1-fx)*at(x0, y0)+fx*at(x1, y0)) + fy*((1-fx)*at(x0, y1)+fx*at(x1, y1))
}

// topKSet returns the indices of the k highest of scores (all of them when
// k >= len(scores)), ties to the lower index: the first k of a stable sort
// by descending score, in increasing order. It finds them by selecting, in
// linear time (the RPN's levels have up to ~50,000 anchors an image, of
// which 2000 are kept), in the order of integer keys: rankKey's, then the
// index.
func topKSet(scores []float32, k int) []int {
	k = min(max(k, 0), len(scores))
	idx := make([]int, 0, k)
	if k == 0 {
		return idx
	}
	if k == len(scores) {
		for i := range scores {
			idx = append(idx, i)
		}
		return idx
	}
	// A histogram of the keys' top bits finds the bucket of the k-th key:
	// the keys of the buckets before it are among the k, those after it
	// not; quickselect picks the rest among the bucket's keys, as
	// (key, index) pairs packed in a uint64.
	const bits = 11
	var hist [1 << bits]int
	for _, s := range scores {
		hist[^rankKey(s)>>(32-bits)]++
	}
	cut, before := uint32(0), 0
	for before+hist[cut] < k {
		before += hist[cut]
		cut++
	}
	// The keys of the buckets before cut, in index order, and the pairs of
	// the bucket.
	var bucket []uint64
	for i, s := range scores {
		switch key := ^rankKey(s); {
		case key>>(32-bits) < cut:
			idx = append(idx, i)
		case key>>(32-bits) == cut:
			bucket = append(bucket, uint64(key)<<32|uint64(i))
		}
	}
	// before < k: the bucket holds the rest.
	selectSmallest(bucket, k-before)
	rest := make([]int, k-before)
	for j, key := range bucket[:k-before] {
		rest[j] = int(uint32(key))
	}
	slices.Sort(rest)
	// Both in index order: merged in place from the end.
	idx = idx[:k]
	i, j := before-1, len(rest)-1
	for o := k - 1; j >= 0; o-- {
		if i >= 0 && idx[i] > rest[j] {
			idx[o] = idx[i]
			i--
		} else {
			idx[o] = rest[j]
			j--
		}
	}
	return idx
}

// selectSmallest moves the k smallest of keys, which are distinct, to
// keys[:k] (quickselect), 0 < k <= len(keys).
func selectSmallest(keys []uint64, k int) {
	lo, hi := 0, len(keys)
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		// Median of three as the pivot, moved to hi-1.
		a, b, c := lo, mid, hi-1
		if keys[b] < keys[a] {
			a, b = b, a
		}
		if keys[c] < keys[b] {
			b = c
			if keys[b] < keys[a] {
				b = a
			}
		}
		keys[b], keys[hi-1] = keys[hi-1], keys[b]
		pivot := keys[hi-1]
		p := lo
		for i := lo; i < hi-1; i++ {
			if keys[i] < pivot {
				keys[i], keys[p] = keys[p], keys[i]
				p++
			}
		}
		keys[p], keys[hi-1] = keys[hi-1], keys[p]
		switch {
		case p == k || p+1 == k:
			return
		case p < k:
			lo = p + 1
		default:
			hi = p
		}
	}
}
