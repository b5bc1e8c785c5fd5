package train

import (
	"image"

	"github.com/stheno-ml/stheno/examples/internal/eval"
	"github.com/stheno-ml/stheno/examples/internal/history"
)

// History is what curves.png shows and history.json holds: the training
// losses, averaged over every LogEvery iterations, and the periodic
// evaluations. Its JSON names every field (see README, "Outputs").
type History struct {
	Losses []LossPoint `json:"losses"`
	Evals  []EvalPoint `json:"evaluations"`
}

// lossNames are the losses' names in curves.png, in LossPoint's order.
var lossNames = []string{"total", "classification", "L1 box", "GIoU"}

// LossPoint is each loss's mean over the iterations that end at Iter
// (LogEvery of them, fewer for the last point of a run). The losses are
// weighted by their coefficients and summed over the decoder layers.
type LossPoint struct {
	Iter  int     `json:"iteration"`
	Total float64 `json:"total"`          // sum of the three below
	Class float64 `json:"classification"` // sigmoid focal loss
	Box   float64 `json:"box_l1"`         // L1 of the matched boxes
	GIoU  float64 `json:"giou"`           // 1 - GIoU of the matched boxes
}

// EvalPoint is one periodic evaluation on the validation images.
type EvalPoint struct {
	Iter    int      `json:"iteration"`
	Seconds float64  `json:"seconds"` // wall time into the run (of this process)
	Box     eval.APs `json:"box"`
	// Throughput: training images per second over the run so far (this
	// process), and validation images per second of this evaluation.
	TrainImagesPerSecond float64 `json:"train_images_per_second"`
	InferImagesPerSecond float64 `json:"infer_images_per_second"`
	ValidationImages     int     `json:"validation_images"`
}

// curves draws h as curves.png: the losses above, box AP, AP50 and AP75
// below.
func curves(h History) image.Image {
	return history.Curves(h.lossSeries(), h.apSeries())
}

func (h History) lossSeries() history.Series {
	s := history.Series{Names: lossNames}
	for _, p := range h.Losses {
		s.Add(p.Iter, p.Total, p.Class, p.Box, p.GIoU)
	}
	return s
}

func (h History) apSeries() history.Series {
	s := history.Series{Names: []string{"box AP", "box AP50", "box AP75"}}
	for _, e := range h.Evals {
		s.Add(e.Iter, float64(e.Box.AP), float64(e.Box.AP50), float64(e.Box.AP75))
	}
	return s
}
