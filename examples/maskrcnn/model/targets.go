package model

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/kernels"
)

// Target is the ground truth of one training image, in the model's input
// coordinates.
type Target struct {
	Boxes   []Box
	Classes []int        // foreground classes, 0-based
	Masks   []*data.Mask // image-sized; a nil mask gets no mask loss
}

// match finds, for each of the boxes, the ground-truth box of highest IoU
// (-1 and 0 when there is none).
func match(boxes, gt []Box) (idx []int, iou []float64) {
	idx, iou = make([]int, len(boxes)), make([]float64, len(boxes))
	for i, b := range boxes {
		idx[i] = -1
		for g, t := range gt {
			if v := IoU(b, t); v > iou[i] || idx[i] < 0 {
				idx[i], iou[i] = g, v
			}
		}
	}
	return idx, iou
}

// rpnLabels labels flattened anchors for one image as torchvision's RPN
// does: 1 (IoU >= fg), 0 (IoU < bg) or -1 (in between: ignored), and 1 for
// the anchors that are the best match of some ground-truth box (ties
// included), so that every box has a positive anchor, however badly anchors
// fit it. matched is each anchor's best ground-truth box.
func rpnLabels(anchors, gt []Box, fg, bg float64) (labels []int8, matched []int) {
	labels = make([]int8, len(anchors))
	matched = make([]int, len(anchors))
	// Each box's IoU with every anchor, computed once: the best match of
	// each anchor (as match finds it) and each box's best anchors read it.
	ious := make([][]float64, len(gt))
	best := make([]float64, len(gt))
	for g, t := range gt {
		ious[g] = make([]float64, len(anchors))
		for i, a := range anchors {
			v := IoU(a, t)
			ious[g][i] = v
			best[g] = max(best[g], v)
		}
	}
	for i := range anchors {
		m, v := -1, 0.0
		for g := range gt {
			if ious[g][i] > v || m < 0 {
				m, v = g, ious[g][i]
			}
		}
		matched[i] = m
		switch {
		case len(gt) == 0 || v < bg:
			labels[i] = 0
		case v >= fg:
			labels[i] = 1
		default:
			labels[i] = -1
		}
	}
	for g := range gt {
		if best[g] == 0 {
			continue // the box overlaps no anchor at all
		}
		for i, v := range ious[g] {
			if v == best[g] {
				labels[i] = 1
			}
		}
	}
	return labels, matched
}

// sample picks at most want of the indices whose label is 1 (at most
// fraction*want of them) and fills up with indices whose label is 0, at
// random, as torchvision's BalancedPositiveNegativeSampler. It returns the
// positives and negatives, each in random order.
func sample(rng *rand.Rand, labels []int8, want int, fraction float64) (pos, neg []int) {
	for i, l := range labels {
		switch l {
		case 1:
			pos = append(pos, i)
		case 0:
			neg = append(neg, i)
		}
	}
	rng.Shuffle(len(pos), func(i, j int) { pos[i], pos[j] = pos[j], pos[i] })
	rng.Shuffle(len(neg), func(i, j int) { neg[i], neg[j] = neg[j], neg[i] })
	pos = pos[:min(len(pos), int(float64(want)*fraction))]
	neg = neg[:min(len(neg), want-len(pos))]
	return pos, neg
}

// RPNTargets are the inputs of the RPN losses for a batch, per level, in
// the layouts of the RPN's outputs: Obj and ObjW [N, A, H, W], Delta and
// DeltaW [N, A*4, H, W].
type RPNTargets struct {
	Obj, ObjW, Delta, DeltaW [][]float32
}

// AssignRPN labels and samples the anchors of every image (RPNBatch per
// image, at most half positive) and returns the RPN's targets. The weights
// are 1/(anchors sampled in the batch) on sampled anchors, for objectness,
// and on the four deltas of positive anchors, for regression (torchvision
// normalises both losses by the sampled count), and 0 elsewhere.
func AssignRPN(cfg Config, anchors [][]Box, targets []Target, rng *rand.Rand) RPNTargets {
	a := cfg.NumAnchors()
	n := len(targets)
	t := RPNTargets{}
	var flat []Box
	offset := make([]int, len(anchors)+1)
	for l, boxes := range anchors {
		flat = append(flat, boxes...)
		offset[l+1] = offset[l] + len(boxes)
		t.Obj = append(t.Obj, make([]float32, n*len(boxes)))
		t.ObjW = append(t.ObjW, make([]float32, n*len(boxes)))
		t.Delta = append(t.Delta, make([]float32, 4*n*len(boxes)))
		t.DeltaW = append(t.DeltaW, make([]float32, 4*n*len(boxes)))
	}
	// locate maps a flat anchor index to its level and index in the level.
	locate := func(i int) (l, j int) {
		for l = 0; i >= offset[l+1]; l++ {
		}
		return l, i - offset[l]
	}
	type picked struct{ pos, neg, matched []int }
	picks := make([]picked, n)
	total := 0
	// The anchors' labels of each image in parallel; the sampling after,
	// in image order, as it draws from rng.
	labels, matched := make([][]int8, n), make([][]int, n)
	parallelImages(n, func(img int) {
		labels[img], matched[img] = rpnLabels(flat, targets[img].Boxes, cfg.RPNFgIoU, cfg.RPNBgIoU)
	})
	for img := range targets {
		pos, neg := sample(rng, labels[img], cfg.RPNBatch, 0.5)
		picks[img] = picked{pos, neg, matched[img]}
		total += len(pos) + len(neg)
	}
	if total == 0 {
		return t
	}
	w := float32(1 / float64(total))
	for img, pk := range picks {
		for _, i := range pk.neg {
			l, j := locate(i)
			t.ObjW[l][img*len(anchors[l])+j] = w
		}
		for _, i := range pk.pos {
			l, j := locate(i)
			size := len(anchors[l])
			t.Obj[l][img*size+j] = 1
			t.ObjW[l][img*size+j] = w
			d := rpnCoder.Encode(targets[img].Boxes[pk.matched[i]], anchors[l][j])
			// Anchor j = (anchor a, pixel p) sits at a*HW+p; its deltas at
			// channels a*4..a*4+3 of [A*4, H, W].
			hw := size / a
			an, p := j/hw, j%hw
			for k := range 4 {
				o := img*4*size + (an*4+k)*hw + p
				t.Delta[l][o] = float32(d[k])
				t.DeltaW[l][o] = w
			}
		}
	}
	return t
}

// sampledRoI is one RoI sampled for the heads: its box, its label (0 for
// background, class+1 otherwise) and the ground-truth box it matched.
type sampledRoI struct {
	box     Box
	label   int
	matched int
}

// sampleRoIs appends the ground-truth boxes to an image's proposals (so
// that the heads see well-placed RoIs from the first step), labels each
// candidate with the class of its best ground-truth box when their IoU
// reaches RoIFgIoU and as background otherwise, and samples RoIsPerImage of
// them, at most RoIPositiveFraction foreground. Foreground RoIs come first.
func sampleRoIs(cfg Config, proposals []Box, tg Target, rng *rand.Rand) []sampledRoI {
	return labelRoIs(cfg, proposals, tg).sample(cfg, tg, rng)
}

// roiCandidates are an image's candidate RoIs, labelled: sampleRoIs'
// work before it draws from its random stream, which images can do in
// parallel.
type roiCandidates struct {
	boxes   []Box
	matched []int
	labels  []int8
}

// labelRoIs is the first half of sampleRoIs: the candidates and their
// labels.
func labelRoIs(cfg Config, proposals []Box, tg Target) roiCandidates {
	cand := append(append([]Box(nil), proposals...), tg.Boxes...)
	matched, iou := match(cand, tg.Boxes)
	labels := make([]int8, len(cand))
	for i := range cand {
		if len(tg.Boxes) > 0 && iou[i] >= cfg.RoIFgIoU {
			labels[i] = 1
		}
	}
	return roiCandidates{cand, matched, labels}
}

// sample is the second half of sampleRoIs: the draw among the candidates.
func (c roiCandidates) sample(cfg Config, tg Target, rng *rand.Rand) []sampledRoI {
	pos, neg := sample(rng, c.labels, cfg.RoIsPerImage, cfg.RoIPositiveFraction)
	out := make([]sampledRoI, 0, len(pos)+len(neg))
	for _, i := range pos {
		out = append(out, sampledRoI{box: c.boxes[i], label: tg.Classes[c.matched[i]] + 1, matched: c.matched[i]})
	}
	for _, i := range neg {
		out = append(out, sampledRoI{box: c.boxes[i], matched: -1})
	}
	return out
}

// MaskTarget returns the m x m training target of a RoI: the ground-truth
// mask resampled into the box with RoIAlign (pixel-centre aligned, 2x2
// samples per bin) and thresholded at 0.5, row-major. Resampling with the
// same kernel the mask head's input is pooled with keeps targets and
// features registered.
func MaskTarget(mask *data.Mask, box Box, m int) ([]float32, error) {
	return MaskTargets(mask, []Box{box}, m)
}

// MaskTargets is MaskTarget of several RoIs of one mask, one after the
// other: the mask is read once for all of them.
func MaskTargets(mask *data.Mask, boxes []Box, m int) ([]float32, error) {
	out := make([]float32, len(boxes)*m*m)
	if err := maskTargets(mask, boxes, m, make([]float32, mask.W*mask.H), out); err != nil {
		return nil, err
	}
	return out, nil
}

// maskTargets is MaskTargets into out, with img, of the mask's size, for
// the mask as floats. Of img it writes only the pixels RoIAlign weighs
// (those within two pixels of the boxes: its samples lie inside the boxes,
// shifted by half a pixel, and it weighs the pixels either side of a
// sample), or all of them when a box has a NaN corner: the RoIs of one
// ground-truth mask cover a small part of the image. img may come from an
// earlier call; it must hold finite values (what the calls write: 0 and
// 1), as RoIAlign reads pixels it does not weigh with a weight of 0.
func maskTargets(mask *data.Mask, boxes []Box, m int, img, out []float32) error {
	x0, y0, x1, y1 := math.Inf(1), math.Inf(1), math.Inf(-1), math.Inf(-1)
	for _, b := range boxes {
		if math.IsNaN(b[0] + b[1] + b[2] + b[3]) {
			x0, y0, x1, y1 = math.Inf(-1), math.Inf(-1), math.Inf(1), math.Inf(1)
			break
		}
		x0, x1 = min(x0, b[0], b[2]), max(x1, b[0], b[2])
		y0, y1 = min(y0, b[1], b[3]), max(y1, b[1], b[3])
	}
	// Clamped to the image as floats, so that far corners convert safely.
	clamp := func(v float64, n int) int { return int(min(max(v, 0), float64(n-1))) }
	c0, c1 := clamp(math.Floor(x0)-2, mask.W), clamp(math.Ceil(x1)+2, mask.W)
	for y := clamp(math.Floor(y0)-2, mask.H); y <= clamp(math.Ceil(y1)+2, mask.H) && c0 <= c1; y++ {
		row := y * mask.W
		for x, b := range mask.Bits[row+c0 : row+c1+1] {
			v := float32(0)
			if b {
				v = 1
			}
			img[row+c0+x] = v
		}
	}
	p := kernels.RoIAlignParams{N: 1, C: 1, H: mask.H, W: mask.W, K: len(boxes), PooledH: m, PooledW: m,
		SpatialScale: 1, SamplingRatio: 2, Aligned: true}
	rois := make([]float32, 0, 5*len(boxes))
	for _, b := range boxes {
		rois = append(rois, 0, float32(b[0]), float32(b[1]), float32(b[2]), float32(b[3]))
	}
	if err := kernels.RoIAlignForward(p, img, rois, out); err != nil {
		return fmt.Errorf("model: MaskTarget: %w", err)
	}
	for i, v := range out {
		if v >= 0.5 {
			out[i] = 1
		} else {
			out[i] = 0
		}
	}
	return nil
}
