package train

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"

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
	Iter    int     `json:"iteration"`
	Seconds float64 `json:"seconds"` // wall time into the run (of this process)
	Box     APs     `json:"box"`
	Mask    APs     `json:"mask"`
	// Throughput: training images per second over the run so far (this
	// process), and validation images per second of this evaluation.
	TrainImagesPerSecond float64 `json:"train_images_per_second"`
	InferImagesPerSecond float64 `json:"infer_images_per_second"`
	ValidationImages     int     `json:"validation_images"`
}

// APs are COCO's headline precisions of one evaluation.
type APs struct {
	AP   Precision `json:"ap"`   // mean over IoU 0.50:0.05:0.95
	AP50 Precision `json:"ap50"` // at IoU 0.50
	AP75 Precision `json:"ap75"` // at IoU 0.75
}

// String formats the three as "AP 0.669 AP50 0.930 AP75 0.752".
func (a APs) String() string {
	return fmt.Sprintf("AP %v AP50 %v AP75 %v", a.AP, a.AP50, a.AP75)
}

// Precision is an average precision in [0, 1], or undefined (NaN) where no
// class of the validation images has ground truth: printed as "n/a",
// written to JSON as null.
type Precision float64

func (p Precision) defined() bool { return !math.IsNaN(float64(p)) }

func (p Precision) String() string {
	if !p.defined() {
		return "n/a"
	}
	return strconv.FormatFloat(float64(p), 'f', 3, 64)
}

// MarshalJSON writes null for an undefined precision (JSON has no NaN).
func (p Precision) MarshalJSON() ([]byte, error) {
	if !p.defined() {
		return []byte("null"), nil
	}
	return json.Marshal(float64(p))
}

// UnmarshalJSON reads what MarshalJSON writes.
func (p *Precision) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*p = Precision(math.NaN())
		return nil
	}
	var v float64
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*p = Precision(v)
	return nil
}

// apsOf converts eval's metrics, which mark an undefined precision with
// pycocotools' sentinel -1, to APs.
func apsOf(m eval.Metrics) APs {
	conv := func(v float64) Precision {
		if v < 0 {
			return Precision(math.NaN())
		}
		return Precision(v)
	}
	return APs{AP: conv(m.AP), AP50: conv(m.AP50), AP75: conv(m.AP75)}
}
