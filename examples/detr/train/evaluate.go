package train

import (
	"fmt"

	"github.com/stheno-ml/stheno/examples/detr/model"
	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/internal/eval"
)

// Predict runs an inference graph over images, a batch at a time, and
// returns every image's detections (the model's MaxDetections best (query,
// class) pairs, boxes in the image's pixels) as eval.Detections. Images of
// another size than the model's input are resized to it, and their boxes
// scaled back. The last batch is filled up with repeats of its last image,
// whose results are dropped.
func Predict(net *model.Net, images []*data.Image) ([]eval.Detection, error) {
	size := net.Config().ImageSize
	var out []eval.Detection
	n := net.Batch()
	for start := 0; start < len(images); start += n {
		batch := make([][]float32, n)
		for i := range n {
			img := images[min(start+i, len(images)-1)]
			if img.W != size || img.H != size {
				img = data.Resize(img, size)
			}
			batch[i] = img.Pix
		}
		dets, err := net.Predict(batch)
		if err != nil {
			return nil, fmt.Errorf("train: predicting images %d..: %w", start, err)
		}
		for i := range min(n, len(images)-start) {
			img := images[start+i]
			sx, sy := float64(img.W)/float64(size), float64(img.H)/float64(size)
			for _, d := range dets[i] {
				b := [4]float64{d.Box[0] * sx, d.Box[1] * sy, d.Box[2] * sx, d.Box[3] * sy}
				out = append(out, eval.Detection{ImageID: img.ID, Class: d.Class, Score: d.Score, Box: b})
			}
		}
	}
	return out, nil
}

// Metrics are the box AP of one evaluation (DETR predicts no masks).
type Metrics struct {
	Box eval.Metrics
}

// String formats m as "box AP 0.669 AP50 0.930 AP75 0.752", with n/a for a
// precision that is undefined.
func (m Metrics) String() string { return fmt.Sprintf("box %v", m.Box.APs()) }

// Evaluate predicts on ds and scores the predictions against it.
func Evaluate(net *model.Net, ds *data.Dataset) (Metrics, []eval.Detection, error) {
	dets, err := Predict(net, ds.Images)
	if err != nil {
		return Metrics{}, nil, err
	}
	return Metrics{Box: eval.Evaluate(ds, dets, false)}, dets, nil
}
