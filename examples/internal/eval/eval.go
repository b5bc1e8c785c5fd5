package eval

import (
	"cmp"
	"math"
	"slices"

	"github.com/stheno-ml/stheno/examples/internal/data"
)

// Detection is one predicted instance.
type Detection struct {
	// ImageID is the data.Image's ID.
	ImageID int
	// Class indexes the dataset's Classes.
	Class int
	Score float64
	// Box is [x1, y1, x2, y2] in pixels, exclusive end (as data.Object.Box).
	Box [4]float64
	// Mask is image-sized; only Evaluate with useMasks reads it (nil counts
	// as an empty mask there).
	Mask *data.Mask
}

// Metrics are COCO's headline numbers, in [0, 1].
type Metrics struct {
	// AP averages precision over IoU thresholds 0.50:0.05:0.95 and the
	// classes that have ground truth; AP50 and AP75 are at one threshold.
	// All three are -1 when no class has ground truth (as pycocotools).
	AP, AP50, AP75 float64
	// PerClassAP is AP@[.5:.95] of each class; -1 for a class without
	// ground truth (as pycocotools).
	PerClassAP []float64
}

// MaxDets is the number of detections per image and class that count, as
// pycocotools' maxDets[-1].
const MaxDets = 100

// IoUThresholds are COCO's thresholds 0.50:0.05:0.95, computed as numpy's
// linspace computes them (i*step + start, the last one exactly 0.95), so
// that an IoU falling on a threshold is judged as pycocotools judges it.
var IoUThresholds = linspace(0.5, 0.95, 10)

// recallLevels are the 101 recall levels 0:0.01:1 of the interpolated
// precision, again as numpy's linspace.
var recallLevels = linspace(0, 1, 101)

func linspace(start, stop float64, n int) []float64 {
	step := (stop - start) / float64(n-1)
	v := make([]float64, n)
	for i := range v {
		v[i] = float64(i)*step + start
	}
	v[n-1] = stop
	return v
}

// IoU is the intersection over union of two boxes [x1, y1, x2, y2]; 0 when
// the union is empty. Boxes with x2 < x1 or y2 < y1 count as empty.
func IoU(a, b [4]float64) float64 {
	inter := overlap(a, b)
	union := boxArea(a) + boxArea(b) - inter
	if !(union > 0) {
		return 0
	}
	return inter / union
}

func boxArea(b [4]float64) float64 {
	return math.Max(0, b[2]-b[0]) * math.Max(0, b[3]-b[1])
}

func overlap(a, b [4]float64) float64 {
	w := math.Min(a[2], b[2]) - math.Max(a[0], b[0])
	h := math.Min(a[3], b[3]) - math.Max(a[1], b[1])
	if !(w > 0 && h > 0) {
		return 0
	}
	return w * h
}

// MaskIoU is the intersection over union of two masks' set pixels; 0 when
// both are empty. Masks of different sizes are compared pixel by pixel where
// they overlap (pixel (x, y) of one against pixel (x, y) of the other). A
// nil mask is empty.
func MaskIoU(a, b *data.Mask) float64 {
	ma, mb := newMaskInfo(a), newMaskInfo(b)
	inter := maskOverlap(ma, mb)
	union := ma.area + mb.area - inter
	if union == 0 {
		return 0
	}
	return float64(inter) / float64(union)
}

// maskInfo caches what mask IoUs need again and again: the area and the
// tight box, which bounds the pixels the intersection has to visit.
type maskInfo struct {
	m    *data.Mask
	area int
	box  [4]float64
}

func newMaskInfo(m *data.Mask) maskInfo {
	if m == nil {
		return maskInfo{}
	}
	return maskInfo{m: m, area: m.Area(), box: data.BoxOf(m)}
}

func maskOverlap(a, b maskInfo) int {
	if a.area == 0 || b.area == 0 {
		return 0
	}
	x0, y0 := int(max(a.box[0], b.box[0])), int(max(a.box[1], b.box[1]))
	x1, y1 := int(min(a.box[2], b.box[2])), int(min(a.box[3], b.box[3]))
	n := 0
	for y := y0; y < y1; y++ {
		ra := a.m.Bits[y*a.m.W : (y+1)*a.m.W]
		rb := b.m.Bits[y*b.m.W : (y+1)*b.m.W]
		for x := x0; x < x1; x++ {
			if ra[x] && rb[x] {
				n++
			}
		}
	}
	return n
}

// imageEval is evaluateImg's result for one image and class: the kept
// detections' scores and, per threshold, whether each was matched and
// whether it is ignored (matched to a crowd region).
type imageEval struct {
	scores  []float64
	matched [][]bool // [threshold][detection]
	ignored [][]bool
	npig    int // ground truth objects that count (not crowd)
}

// Evaluate computes COCO-style AP of dets against gt, with box IoU, or mask
// IoU if useMasks. See the package documentation for the procedure.
func Evaluate(gt *data.Dataset, dets []Detection, useMasks bool) Metrics {
	K := len(gt.Classes)
	// Images in id order, as pycocotools sorts its imgIds: the order in
	// which tied scores of different images are ranked.
	imgs := slices.Clone(gt.Images)
	slices.SortStableFunc(imgs, func(a, b *data.Image) int { return cmp.Compare(a.ID, b.ID) })
	index := make(map[int]int, len(imgs))
	for i, img := range imgs {
		index[img.ID] = i
	}
	// byCell[i*K+k] holds the detections of image i and class k.
	byCell := make([][]Detection, len(imgs)*K)
	for _, d := range dets {
		i, ok := index[d.ImageID]
		if !ok || d.Class < 0 || d.Class >= K {
			continue
		}
		byCell[i*K+d.Class] = append(byCell[i*K+d.Class], d)
	}

	T := len(IoUThresholds)
	// precision[k][t][r]; nil for a class without ground truth.
	precision := make([][][]float64, K)
	for k := range K {
		var evals []imageEval
		npig := 0
		for i, img := range imgs {
			e, ok := evaluateImage(img, k, byCell[i*K+k], useMasks)
			if !ok {
				continue
			}
			npig += e.npig
			evals = append(evals, e)
		}
		if npig == 0 {
			continue
		}
		precision[k] = accumulate(evals, npig)
	}

	m := Metrics{PerClassAP: make([]float64, K)}
	var sum, sum50, sum75 float64
	valid := 0
	for k, p := range precision {
		if p == nil {
			m.PerClassAP[k] = -1
			continue
		}
		valid++
		var s float64
		for t := range T {
			s += mean(p[t])
		}
		m.PerClassAP[k] = s / float64(T)
		sum += m.PerClassAP[k]
		sum50 += mean(p[0])
		sum75 += mean(p[5])
	}
	if valid == 0 {
		m.AP, m.AP50, m.AP75 = -1, -1, -1
		return m
	}
	m.AP, m.AP50, m.AP75 = sum/float64(valid), sum50/float64(valid), sum75/float64(valid)
	return m
}

func mean(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// evaluateImage matches the detections of class k in img to its ground truth
// at every threshold (pycocotools' evaluateImg). ok is false when the image
// has neither ground truth nor detections of the class.
func evaluateImage(img *data.Image, k int, dets []Detection, useMasks bool) (e imageEval, ok bool) {
	// Ground truth with the ignored (crowd) objects last, as pycocotools
	// sorts it, so that a real object is preferred to a crowd region.
	var gts []data.Object
	for _, o := range img.Objects {
		if o.Class == k && !o.Crowd {
			gts = append(gts, o)
			e.npig++
		}
	}
	for _, o := range img.Objects {
		if o.Class == k && o.Crowd {
			gts = append(gts, o)
		}
	}
	if len(gts) == 0 && len(dets) == 0 {
		return e, false
	}
	dets = slices.Clone(dets)
	slices.SortStableFunc(dets, func(a, b Detection) int { return cmp.Compare(b.Score, a.Score) })
	if len(dets) > MaxDets {
		dets = dets[:MaxDets]
	}

	// ious[d][g].
	ious := make([][]float64, len(dets))
	var gtMasks []maskInfo
	if useMasks {
		gtMasks = make([]maskInfo, len(gts))
		for g, o := range gts {
			gtMasks[g] = newMaskInfo(o.Mask)
		}
	}
	for d, det := range dets {
		ious[d] = make([]float64, len(gts))
		var dm maskInfo
		if useMasks {
			dm = newMaskInfo(det.Mask)
		}
		for g, o := range gts {
			// Against a crowd region, overlap is measured relative to the
			// detection alone: a detection inside the crowd is fully "on"
			// it however large the region.
			var inter, union float64
			if useMasks {
				inter = float64(maskOverlap(dm, gtMasks[g]))
				union = float64(dm.area)
				if !o.Crowd {
					union += float64(gtMasks[g].area) - inter
				}
			} else {
				inter = overlap(det.Box, o.Box)
				union = boxArea(det.Box)
				if !o.Crowd {
					union += boxArea(o.Box) - inter
				}
			}
			if union > 0 {
				ious[d][g] = inter / union
			}
		}
	}

	T := len(IoUThresholds)
	e.scores = make([]float64, len(dets))
	for d, det := range dets {
		e.scores[d] = det.Score
	}
	e.matched = make([][]bool, T)
	e.ignored = make([][]bool, T)
	for t, thr := range IoUThresholds {
		e.matched[t] = make([]bool, len(dets))
		e.ignored[t] = make([]bool, len(dets))
		taken := make([]bool, len(gts))
		for d := range dets {
			best := math.Min(thr, 1-1e-10)
			m := -1
			for g, o := range gts {
				if taken[g] && !o.Crowd {
					continue
				}
				// Once matched to a real object, stop at the crowd regions
				// (they are sorted last).
				if m > -1 && !gts[m].Crowd && o.Crowd {
					break
				}
				if ious[d][g] < best {
					continue
				}
				best, m = ious[d][g], g
			}
			if m == -1 {
				continue
			}
			e.matched[t][d] = true
			e.ignored[t][d] = gts[m].Crowd
			taken[m] = true
		}
	}
	return e, true
}

// accumulate ranks a class's detections over all images and returns the
// interpolated precision at each threshold and recall level (pycocotools'
// accumulate).
func accumulate(evals []imageEval, npig int) [][]float64 {
	type ranked struct {
		score  float64
		e, idx int
	}
	var all []ranked
	for ei, e := range evals {
		for d, s := range e.scores {
			all = append(all, ranked{s, ei, d})
		}
	}
	// Stable, like numpy's mergesort: ties stay in image order.
	slices.SortStableFunc(all, func(a, b ranked) int { return cmp.Compare(b.score, a.score) })

	T := len(IoUThresholds)
	out := make([][]float64, T)
	// numpy's spacing(1): keeps 0/0 at zero precision.
	const eps = 0x1p-52
	rc := make([]float64, len(all))
	pr := make([]float64, len(all))
	for t := range T {
		tp, fp := 0.0, 0.0
		for i, r := range all {
			if !evals[r.e].ignored[t][r.idx] {
				if evals[r.e].matched[t][r.idx] {
					tp++
				} else {
					fp++
				}
			}
			rc[i] = tp / float64(npig)
			pr[i] = tp / (fp + tp + eps)
		}
		// Precision envelope: the best precision at this recall or beyond.
		for i := len(pr) - 1; i > 0; i-- {
			if pr[i] > pr[i-1] {
				pr[i-1] = pr[i]
			}
		}
		q := make([]float64, len(recallLevels))
		for ri, level := range recallLevels {
			// First rank reaching this recall (numpy searchsorted, left);
			// a recall never reached keeps precision 0.
			if i, _ := slices.BinarySearch(rc, level); i < len(rc) {
				q[ri] = pr[i]
			}
		}
		out[t] = q
	}
	return out
}
