package train

import (
	"image"

	"github.com/stheno-ml/stheno/examples/internal/eval"
	"github.com/stheno-ml/stheno/examples/internal/history"
	"github.com/stheno-ml/stheno/examples/maskrcnn/model"
)

// History is what curves.png shows and history.json holds: the training
// losses, averaged over every LogEvery iterations, and the periodic
// evaluations. Its JSON names every field (see README, "Outputs").
type History struct {
	Losses []LossPoint `json:"losses"`
	Evals  []EvalPoint `json:"evaluations"`
}

// LossPoint is each loss's mean over the iterations that end at Iter
// (LogEvery of them, fewer for the last point of a run).
type LossPoint struct {
	Iter          int     `json:"iteration"`
	Total         float64 `json:"total"`          // sum of the five below
	RPNObjectness float64 `json:"rpn_objectness"` // RPN anchor classification (BCE)
	RPNBox        float64 `json:"rpn_box"`        // RPN box regression (smooth L1)
	Class         float64 `json:"classification"` // box head classification (cross-entropy)
	Box           float64 `json:"box_regression"` // box head regression (smooth L1)
	Mask          float64 `json:"mask"`           // mask head (per-pixel BCE)
}

// lossPoint names the entries of l (in model.LossNames' order).
func lossPoint(iter int, l model.Losses) LossPoint {
	return LossPoint{Iter: iter, Total: l[0], RPNObjectness: l[1], RPNBox: l[2], Class: l[3], Box: l[4], Mask: l[5]}
}

// values returns p's losses in model.LossNames' order.
func (p LossPoint) values() model.Losses {
	return model.Losses{p.Total, p.RPNObjectness, p.RPNBox, p.Class, p.Box, p.Mask}
}

// EvalPoint is one periodic evaluation on the validation images.
type EvalPoint struct {
	Iter    int      `json:"iteration"`
	Seconds float64  `json:"seconds"` // wall time into the run (of this process)
	Box     eval.APs `json:"box"`
	Mask    eval.APs `json:"mask"`
	// Throughput: training images per second over the run so far (this
	// process), and validation images per second of this evaluation.
	TrainImagesPerSecond float64 `json:"train_images_per_second"`
	InferImagesPerSecond float64 `json:"infer_images_per_second"`
	ValidationImages     int     `json:"validation_images"`
}

// curves draws h as curves.png: the losses above, named as in
// model.LossNames, and box and mask AP and AP50 below.
func curves(h History) image.Image {
	return history.Curves(h.lossSeries(), h.apSeries())
}

// lossSeries is h's losses in model.LossNames' order.
func (h History) lossSeries() history.Series {
	s := history.Series{Names: model.LossNames[:]}
	for _, p := range h.Losses {
		v := p.values()
		s.Add(p.Iter, v[:]...)
	}
	return s
}

// apSeries is box and mask AP and AP50 of h's evaluations.
func (h History) apSeries() history.Series {
	s := history.Series{Names: []string{"box AP", "box AP50", "mask AP", "mask AP50"}}
	for _, e := range h.Evals {
		s.Add(e.Iter, float64(e.Box.AP), float64(e.Box.AP50), float64(e.Mask.AP), float64(e.Mask.AP50))
	}
	return s
}
