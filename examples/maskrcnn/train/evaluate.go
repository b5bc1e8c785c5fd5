package train

import (
	"fmt"

	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/internal/eval"
	"github.com/stheno-ml/stheno/examples/maskrcnn/model"
)

// Predict runs an inference graph over images (of the model's input size),
// a batch at a time, and returns every image's detections with their masks
// pasted into the image, as eval.Detections. The last batch is filled up
// with repeats of its first image, whose results are dropped.
func Predict(net *model.Net, images []*data.Image) ([]eval.Detection, error) {
	var out []eval.Detection
	n := net.Batch()
	for start := 0; start < len(images); start += n {
		batch := make([][]float32, n)
		for i := range n {
			img := images[start]
			if start+i < len(images) {
				img = images[start+i]
			}
			batch[i] = img.Pix
		}
		dets, masks, err := net.Predict(batch)
		if err != nil {
			return nil, fmt.Errorf("train: predicting images %d..: %w", start, err)
		}
		for i := range n {
			if start+i >= len(images) {
				break
			}
			img := images[start+i]
			for j, d := range dets[i] {
				out = append(out, eval.Detection{
					ImageID: img.ID, Class: d.Class, Score: d.Score, Box: d.Box,
					Mask: model.PasteMask(masks[i][j].Probs, masks[i][j].Size, d.Box, img.W, img.H),
				})
			}
		}
	}
	return out, nil
}

// Metrics are box and mask AP of one evaluation.
type Metrics struct {
	Box, Mask eval.Metrics
}

// String formats m as "box AP 0.669 AP50 0.930 AP75 0.752 | mask AP ...",
// with n/a for a precision that is undefined.
func (m Metrics) String() string {
	return fmt.Sprintf("box %v | mask %v", m.Box.APs(), m.Mask.APs())
}

// Evaluate predicts on ds and scores the predictions against it.
func Evaluate(net *model.Net, ds *data.Dataset) (Metrics, []eval.Detection, error) {
	dets, err := Predict(net, ds.Images)
	if err != nil {
		return Metrics{}, nil, err
	}
	return Metrics{Box: eval.Evaluate(ds, dets, false), Mask: eval.Evaluate(ds, dets, true)}, dets, nil
}
