package viz

import (
	"image"
	"image/color"
	"testing"

	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/internal/eval"
)

// The sheet has the truth above the predictions, one column per image (at
// most cols), and draws only the detections scoring scoreMin or more, each
// under its own image; box-only objects and detections draw as boxes.
func TestPredictionSheet(t *testing.T) {
	ds := &data.Dataset{Classes: []string{"a", "b"}}
	for id := 1; id <= 3; id++ {
		img := grey(16, 16, 0.5)
		img.ID = id
		img.Objects = []data.Object{{Class: 0, Box: [4]float64{2, 2, 8, 8}}}
		ds.Images = append(ds.Images, img)
	}
	dets := []eval.Detection{
		{ImageID: 2, Class: 1, Score: 0.9, Box: [4]float64{4, 4, 12, 12}},
		{ImageID: 1, Class: 1, Score: 0.3, Box: [4]float64{4, 4, 12, 12}},
	}
	const scale = 2
	sheet := PredictionSheet(ds, dets, 2, scale, 0.5)
	cell := Caption(DrawGroundTruth(ds.Images[0], ds.Classes, scale), "image 1: truth").Bounds()
	want := Grid([]image.Image{image.NewRGBA(cell), nil, nil, nil}, 2).Bounds()
	if sheet.Bounds() != want {
		t.Fatalf("sheet %v, want %v (2 columns, 2 rows of %v)", sheet.Bounds(), want, cell)
	}
	// Class b's colour shows in image 2's prediction only.
	b := Colour(1)
	cw, ch := cell.Dx()+gridGap, cell.Dy()+gridGap
	for i, tc := range []struct {
		r    image.Rectangle
		want bool
	}{
		{image.Rect(gridGap, gridGap+ch, gridGap+cw, gridGap+2*ch), false},     // image 1, predicted
		{image.Rect(gridGap+cw, gridGap+ch, gridGap+2*cw, gridGap+2*ch), true}, // image 2, predicted
		{image.Rect(0, 0, sheet.Bounds().Dx(), gridGap+ch), false},             // the truth row
	} {
		if got := hasColour(sheet, tc.r, b); got != tc.want {
			t.Errorf("cell %d: class b's colour drawn %t, want %t", i, got, tc.want)
		}
	}
	if empty := PredictionSheet(ds, nil, 0, scale, 0.5); !empty.Bounds().Empty() {
		t.Errorf("a sheet of no images is %v", empty.Bounds())
	}
}

// hasColour reports whether a pixel of img inside r has colour c.
func hasColour(img *image.RGBA, r image.Rectangle, c color.RGBA) bool {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if img.RGBAAt(x, y) == c {
				return true
			}
		}
	}
	return false
}
