package viz

import (
	"errors"
	"image"

	"github.com/stheno-ml/stheno/examples/maskrcnn/data"
	"github.com/stheno-ml/stheno/examples/maskrcnn/eval"
)

// DrawDetections draws img upscaled scale times (nearest neighbour), with a
// translucent mask, a box and a "class score" label for each detection whose
// score is at least scoreMin.
func DrawDetections(img *data.Image, dets []eval.Detection, classes []string, scoreMin float64, scale int) *image.RGBA {
	return nil
}

// SavePNG writes img to path as PNG.
func SavePNG(path string, img image.Image) error { return errors.New("viz: not implemented yet") }

// Series is one line of a plot.
type Series struct {
	Name string
	X, Y []float64
}

// PlotLines draws series as lines on linear axes with ticks, numbers and a
// legend.
func PlotLines(title string, width, height int, series ...Series) *image.RGBA { return nil }

// Grid tiles imgs row by row, cols per row, into one picture.
func Grid(imgs []image.Image, cols int) *image.RGBA { return nil }
