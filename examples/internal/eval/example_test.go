package eval_test

import (
	"fmt"

	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/internal/eval"
)

// Score two detections of one object: the better-ranked one overlaps it by
// IoU 0.7, and a false positive comes second.
func ExampleEvaluate() {
	gt := &data.Dataset{
		Classes: []string{"circle"},
		Images: []*data.Image{{ID: 1, W: 32, H: 32, Objects: []data.Object{
			{Class: 0, Box: [4]float64{0, 0, 10, 10}},
		}}},
	}
	dets := []eval.Detection{
		{ImageID: 1, Class: 0, Score: 0.9, Box: [4]float64{0, 0, 10, 7}}, // IoU 0.7
		{ImageID: 1, Class: 0, Score: 0.4, Box: [4]float64{20, 20, 30, 30}},
	}
	m := eval.Evaluate(gt, dets, false)
	// Matched at thresholds 0.50 to 0.70: 5 of 10.
	fmt.Printf("AP %.2f AP50 %.2f AP75 %.2f per class %.2f\n", m.AP, m.AP50, m.AP75, m.PerClassAP)
	// Output: AP 0.50 AP50 1.00 AP75 0.00 per class [0.50]
}
