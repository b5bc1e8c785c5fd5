package train

import (
	"fmt"

	"github.com/stheno-ml/stheno/examples/detr/model"
	"github.com/stheno-ml/stheno/examples/internal/data"
)

// TargetOf is an image's ground truth as the model trains on it: each
// object's class and its box as normalised (cx, cy, w, h). Crowd regions
// and boxes thinner than a pixel are left out: neither makes a useful
// training target.
func TargetOf(img *data.Image) model.Target {
	var t model.Target
	w, h := float64(img.W), float64(img.H)
	for _, o := range img.Objects {
		b := o.Box
		if o.Crowd || b[2]-b[0] < 1 || b[3]-b[1] < 1 {
			continue
		}
		t.Labels = append(t.Labels, o.Class)
		t.Boxes = append(t.Boxes, model.Box{(b[0] + b[2]) / (2 * w), (b[1] + b[3]) / (2 * h), (b[2] - b[0]) / w, (b[3] - b[1]) / h})
	}
	return t
}

// ExportSynthetic writes the synthetic dataset that a run of c trains and
// validates on (c.TrainImages then c.ValImages images of c.Model.ImageSize
// pixels, from c.Seed) to dir in COCO format, as data.ExportSynthetic does,
// and returns the number of images. Training with -data on the file holds
// out its last tenth, which is the validation images only when they are a
// tenth of the whole.
func ExportSynthetic(dir string, c RunConfig) (int, error) {
	if c.Data != "" {
		return 0, fmt.Errorf("train: ExportSynthetic: the run uses %s, not the synthetic dataset", c.Data)
	}
	return data.ExportSynthetic(dir, c.Seed, c.TrainImages, c.ValImages, c.Model.ImageSize)
}
