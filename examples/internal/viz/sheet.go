package viz

import (
	"fmt"
	"image"

	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/internal/eval"
)

// PredictionSheet draws the first cols images of ds twice, scale times
// their size: the ground truth on the top row, captioned "image N: truth",
// and below each its detections scoring at least scoreMin, captioned
// "predicted". A run draws one at each evaluation, on its validation
// images.
func PredictionSheet(ds *data.Dataset, dets []eval.Detection, cols, scale int, scoreMin float64) *image.RGBA {
	cols = min(cols, len(ds.Images))
	byImage := map[int][]eval.Detection{}
	for _, d := range dets {
		byImage[d.ImageID] = append(byImage[d.ImageID], d)
	}
	cells := make([]image.Image, 2*cols)
	for i, img := range ds.Images[:cols] {
		cells[i] = Caption(DrawGroundTruth(img, ds.Classes, scale), fmt.Sprintf("image %d: truth", img.ID))
		cells[cols+i] = Caption(DrawDetections(img, byImage[img.ID], ds.Classes, scoreMin, scale), "predicted")
	}
	return Grid(cells, cols)
}
