package train

import (
	"github.com/stheno-ml/stheno/examples/internal/eval"
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
