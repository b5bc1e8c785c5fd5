package model

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/stheno-ml/stheno/examples/detr/match"
	"github.com/stheno-ml/stheno/examples/internal/hostop"
)

// Target is one image's ground truth: a class (0..NumClasses-1) and a
// normalised (cx, cy, w, h) box per object, widths and heights positive.
type Target struct {
	Labels []int
	Boxes  []Box
}

// checkTargets refuses targets that the matching or the losses cannot take.
func checkTargets(targets []Target, batch, numClasses int) error {
	if len(targets) != batch {
		return fmt.Errorf("model: got %d targets for a batch of %d", len(targets), batch)
	}
	for i, t := range targets {
		if len(t.Labels) != len(t.Boxes) {
			return fmt.Errorf("model: target %d has %d labels and %d boxes", i, len(t.Labels), len(t.Boxes))
		}
		for j, c := range t.Labels {
			if c < 0 || c >= numClasses {
				return fmt.Errorf("model: target %d, object %d: label %d is not in [0, %d)", i, j, c, numClasses)
			}
			b := t.Boxes[j]
			if !(b[2] > 0 && b[3] > 0) || math.IsInf(b[0]+b[1]+b[2]+b[3], 0) || math.IsNaN(b[0]+b[1]) {
				return fmt.Errorf("model: target %d, object %d: box %v must be finite (cx, cy, w, h) with w, h > 0", i, j, b)
			}
		}
	}
	return nil
}

// numBoxes is the reference's num_boxes on one process: the objects of the
// batch, at least 1.
func numBoxes(targets []Target) float64 {
	n := 0
	for _, t := range targets {
		n += len(t.Labels)
	}
	return math.Max(1, float64(n))
}

// MatchImage is the reference's HungarianMatcher (focal-loss variant) for
// one image: the cost of giving query i object j is
//
//	CostClass * (pos - neg) + CostBox * |box_i - box_j|_1 - CostGIoU * GIoU(box_i, box_j)
//
// with p = sigmoid(logit of object j's class), pos = alpha (1-p)^gamma
// (-log(p + 1e-8)) and neg = (1-alpha) p^gamma (-log(1 - p + 1e-8)), the
// boxes (cx, cy, w, h) and the GIoU taken on their corners. logits is
// [Q, C] and boxes [Q, 4], row-major. It returns, for each query, the
// object it is matched to, or -1; every object gets a query when Q is at
// least the number of objects.
func MatchImage(cfg Config, logits, boxes []float64, q int, t Target) ([]int, error) {
	return matchImage(cfg, logits, boxes, q, cfg.NumClasses, t)
}

// matchImage is MatchImage for logits of c classes: the config's, or one
// for the encoder's proposals (TwoStage), whose objects are all class 0.
func matchImage[F hostop.Float](cfg Config, logits, boxes []F, q, c int, t Target) ([]int, error) {
	n := len(t.Labels)
	if len(logits) != q*c || len(boxes) != q*4 {
		return nil, fmt.Errorf("model: MatchImage: logits has %d values and boxes %d, want %d and %d", len(logits), len(boxes), q*c, q*4)
	}
	alpha, gamma := cfg.FocalAlpha, cfg.FocalGamma
	pow := func(x float64) float64 { return math.Pow(x, gamma) }
	if gamma == 2 { // the reference's: a product, not a call
		pow = func(x float64) float64 { return x * x }
	}
	// The class cost depends on the query and the object's class only:
	// made once per class present (the proposals' S queries see only
	// class 0), then shared by that class's objects.
	var classes []int
	slot := make([]int, n)
	for j, label := range t.Labels {
		k := slices.Index(classes, label)
		if k < 0 {
			k = len(classes)
			classes = append(classes, label)
		}
		slot[j] = k
	}
	targetXY := make([]Box, n)
	for j, tb := range t.Boxes {
		targetXY[j] = tb.XYXY()
	}
	classCost := make([]float64, len(classes))
	cost := make([]float64, q*n)
	for i := range q {
		for k, label := range classes {
			p := sigmoid(float64(logits[i*c+label]))
			neg := (1 - alpha) * pow(p) * -math.Log(1-p+1e-8)
			pos := alpha * pow(1-p) * -math.Log(p+1e-8)
			classCost[k] = cfg.CostClass * (pos - neg)
		}
		pb := Box{float64(boxes[4*i]), float64(boxes[4*i+1]), float64(boxes[4*i+2]), float64(boxes[4*i+3])}
		pxy := pb.XYXY()
		for j, tb := range t.Boxes {
			l1 := 0.0
			for k := range 4 {
				l1 += math.Abs(pb[k] - tb[k])
			}
			cost[i*n+j] = cfg.CostBox*l1 + classCost[slot[j]] - cfg.CostGIoU*GIoU(pxy, targetXY[j])
		}
	}
	return match.Assign(cost, q, n)
}

// layerTargets are one decoder layer's loss targets for a batch, in the
// layout of its outputs: B*Q rows, query-major within an image.
type layerTargets struct {
	onehot []float64 // [B, Q, C]: 1 at a matched query's object class
	boxT   []float64 // [B, Q, 4]: the matched object's (cx, cy, w, h)
	l1W    []float64 // [B, Q, 4]: WeightBox/num_boxes on matched queries, else 0
	giouT  []float64 // [B*Q, 4]: the matched object's corners; a unit box elsewhere
	giouW  []float64 // [B*Q]: WeightGIoU/num_boxes on matched queries, else 0
}

// lossTargets are a step's targets: the focal loss's weights, shared by the
// layers, and each layer's targets; under TwoStage also the encoder's
// proposals' targets, in the layout of a layer's for S queries of one
// class (the focal loss's other classes are all negatives, and its
// weight, the same everywhere, is encScale).
type lossTargets struct {
	focalW   []float64 // [B, Q, C]: WeightClass/num_boxes everywhere
	layers   []layerTargets
	enc      *layerTargets // TwoStage: onehot [B, S, 1], the rest as a layer's
	encScale float64       // TwoStage: WeightClass/num_boxes
}

// fits reports whether lt (nil: no) has the sizes of a step's targets of
// layers layers, focal weights of focal values, and the proposals' when
// twoStage, so that buildTargets may write over it.
func (lt *lossTargets) fits(layers, focal int, twoStage bool) bool {
	return lt != nil && len(lt.layers) == layers && len(lt.focalW) == focal && (lt.enc != nil) == twoStage
}

func newLayerTargets(b, q, c int) layerTargets {
	return layerTargets{
		onehot: make([]float64, b*q*c),
		boxT:   make([]float64, b*q*4),
		l1W:    make([]float64, b*q*4),
		giouT:  make([]float64, b*q*4),
		giouW:  make([]float64, b*q),
	}
}

// buildTargets matches every decoder layer's predictions to the targets
// and returns the losses' targets and weights. logits[l] is layer l's [B,
// Q, C] and boxes[l] its [B, Q, 4]; under TwoStage encLogits is the
// proposals' first-class logits [B, S, 1] and encBoxes their boxes [B, S,
// 4] (else both nil).
//
// The weights reproduce the reference's SetCriterion: its focal loss is
// sigmoid_focal_loss(...).mean(1).sum() / num_boxes * Q, the mean over the
// Q queries undone by the factor Q, so the sum of every element's loss
// over num_boxes; its L1 and GIoU losses are the matched pairs' sums over
// num_boxes. With the loss coefficients folded in, every element of the
// focal loss weighs WeightClass/num_boxes, and every matched query's box
// coordinates WeightBox/num_boxes (L1) and its box WeightGIoU/num_boxes
// (GIoU); an unmatched query's box weighs 0. Each layer (the auxiliary
// outputs too) is matched on its own, as the reference does; the
// proposals are matched to the same objects with every label 0 (the
// reference's bin_targets).
//
// reuse, when not nil, is an earlier result for the same shapes, no longer
// needed: its memory is written over instead of allocated afresh (the
// targets of a GPU-sized step are megabytes, and the GPU waits for them).
func buildTargets[F hostop.Float](cfg Config, logits, boxes [][]F, encLogits, encBoxes []F, targets []Target, reuse *lossTargets) (*lossTargets, error) {
	b, q, c := len(targets), cfg.Queries, cfg.NumClasses
	nb := numBoxes(targets)
	lt := reuse
	if !lt.fits(len(logits), b*q*c, encLogits != nil) {
		lt = &lossTargets{focalW: make([]float64, b*q*c)}
		for range logits {
			lt.layers = append(lt.layers, newLayerTargets(b, q, c))
		}
		if encLogits != nil {
			enc := newLayerTargets(b, cfg.Tokens(), 1)
			lt.enc = &enc
		}
	}
	type task struct {
		t             *layerTargets
		logits, boxes []F
		q, c          int
		targets       []Target
		name          string
		fillFocal     bool // this task also writes its image's focal weights
	}
	var tasks []task
	// The proposals' matching (S queries, several times a layer's) first:
	// the longest tasks start first and the layers' fill in around them.
	if encLogits != nil {
		lt.encScale = cfg.WeightClass / nb
		bin := make([]Target, len(targets))
		for i, t := range targets {
			bin[i] = Target{Labels: make([]int, len(t.Labels)), Boxes: t.Boxes}
		}
		tasks = append(tasks, task{lt.enc, encLogits, encBoxes, cfg.Tokens(), 1, bin, "the encoder's proposals", false})
	}
	for l := range logits {
		tasks = append(tasks, task{&lt.layers[l], logits[l], boxes[l], q, c, targets, fmt.Sprintf("layer %d", l), l == 0})
	}
	// Every (layer, image) pair is matched on its own, in parallel: each
	// writes only its image's rows of its layer's targets.
	errs := make([]error, len(tasks)*b)
	var wg sync.WaitGroup
	var next atomic.Int64
	for range min(len(errs), runtime.GOMAXPROCS(0)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := int(next.Add(1) - 1); k < len(errs); k = int(next.Add(1) - 1) {
				tk, img := tasks[k/b], k%b
				if tk.fillFocal {
					for i := range lt.focalW[img*q*c : (img+1)*q*c] {
						lt.focalW[img*q*c+i] = cfg.WeightClass / nb
					}
				}
				errs[k] = matchInto(cfg, tk.t, tk.logits, tk.boxes, tk.q, tk.c, tk.targets, img, nb)
				if errs[k] != nil {
					errs[k] = fmt.Errorf("model: matching %s, image %d: %w", tk.name, img, errs[k])
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return lt, nil
}

// matchInto matches image img of a layer's predictions (logits [B, q, c],
// boxes [B, q, 4]) and writes its rows of t.
func matchInto[F hostop.Float](cfg Config, t *layerTargets, logits, boxes []F, q, c int, targets []Target, img int, nb float64) error {
	assign, err := matchImage(cfg, logits[img*q*c:(img+1)*q*c], boxes[img*q*4:(img+1)*q*4], q, c, targets[img])
	if err != nil {
		return err
	}
	// The image's rows start at zero (the memory may be an earlier
	// step's); giouT is written whole below.
	clear(t.onehot[img*q*c : (img+1)*q*c])
	clear(t.boxT[img*q*4 : (img+1)*q*4])
	clear(t.l1W[img*q*4 : (img+1)*q*4])
	clear(t.giouW[img*q : (img+1)*q])
	for i, j := range assign {
		r := img*q + i
		// Unmatched: a valid box of weight 0, so GIoU stays finite.
		copy(t.giouT[4*r:], []float64{0, 0, 1, 1})
		if j < 0 {
			continue
		}
		tb := targets[img].Boxes[j]
		t.onehot[r*c+targets[img].Labels[j]] = 1
		xy := tb.XYXY()
		for k := range 4 {
			t.boxT[4*r+k] = tb[k]
			t.l1W[4*r+k] = cfg.WeightBox / nb
			t.giouT[4*r+k] = xy[k]
		}
		t.giouW[r] = cfg.WeightGIoU / nb
	}
	return nil
}

// packTargets writes lt in the packed layout of the matching op's output:
// focalW, then per layer onehot, boxT, l1W, giouT, giouW; under TwoStage
// then encScale and the proposals' onehot, boxT, l1W, giouT, giouW. The
// parts are copied in parallel: together they are millions of values,
// and the GPU waits for them.
func packTargets[F hostop.Float](lt *lossTargets, out []F) {
	parts := [][]float64{lt.focalW}
	for _, t := range lt.layers {
		parts = append(parts, t.onehot, t.boxT, t.l1W, t.giouT, t.giouW)
	}
	if t := lt.enc; t != nil {
		parts = append(parts, []float64{lt.encScale}, t.onehot, t.boxT, t.l1W, t.giouT, t.giouW)
	}
	var wg sync.WaitGroup
	k := 0
	for _, src := range parts {
		dst := out[k : k+len(src)]
		wg.Go(func() { put(dst, src) })
		k += len(src)
	}
	wg.Wait()
}

// put copies src into dst, converted to dst's type, and returns how many.
func put[F hostop.Float](dst []F, src []float64) int {
	for i, v := range src {
		dst[i] = F(v)
	}
	return len(src)
}

// Detection is one detected object: its box (x1, y1, x2, y2) in pixels,
// its score (the sigmoid of its class logit) and its class.
type Detection struct {
	Box   Box
	Score float64
	Class int
}

// PostProcess is the reference's PostProcess for one image: the k best
// of the Q x C sigmoid scores (best first, ties to the lower index), each
// with its query's box converted to corners and scaled to a width x height
// image. logits is [Q, C], boxes [Q, 4] (cx, cy, w, h), row-major.
func PostProcess(logits, boxes []float64, q, c, k int, width, height float64) []Detection {
	k = min(k, q*c)
	idx := make([]int, q*c)
	for i := range idx {
		idx[i] = i
	}
	// A partial selection sort: k is small (100) next to Q*C.
	for s := range k {
		best := s
		for i := s + 1; i < len(idx); i++ {
			if logits[idx[i]] > logits[idx[best]] || logits[idx[i]] == logits[idx[best]] && idx[i] < idx[best] {
				best = i
			}
		}
		idx[s], idx[best] = idx[best], idx[s]
	}
	out := make([]Detection, k)
	for s := range k {
		qi, cls := idx[s]/c, idx[s]%c
		xy := Box(boxes[4*qi : 4*qi+4]).XYXY()
		out[s] = Detection{
			Box:   Box{xy[0] * width, xy[1] * height, xy[2] * width, xy[3] * height},
			Score: sigmoid(logits[idx[s]]),
			Class: cls,
		}
	}
	return out
}
