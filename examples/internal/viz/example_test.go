package viz_test

import (
	"fmt"
	"image"
	"os"
	"path/filepath"

	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/internal/eval"
	"github.com/stheno-ml/stheno/examples/internal/viz"
)

// Draw predictions next to the ground truth and save the pair.
func ExampleDrawDetections() {
	ds, err := data.Synthetic(data.DefaultSynthetic(1, 1))
	if err != nil {
		panic(err)
	}
	img := ds.Images[0]
	// Stand-in predictions: the ground truth itself.
	var dets []eval.Detection
	for _, o := range img.Objects {
		dets = append(dets, eval.Detection{ImageID: img.ID, Class: o.Class, Score: 0.9, Box: o.Box, Mask: o.Mask})
	}
	pair := viz.Grid([]image.Image{
		viz.Caption(viz.DrawDetections(img, dets, ds.Classes, 0.5, 4), "prediction"),
		viz.Caption(viz.DrawGroundTruth(img, ds.Classes, 4), "ground truth"),
	}, 2)
	dir, _ := os.MkdirTemp("", "viz")
	defer os.RemoveAll(dir)
	if err := viz.SavePNG(filepath.Join(dir, "pair.png"), pair); err != nil {
		panic(err)
	}
	fmt.Println(pair.Bounds().Size())
	// Output: (524,281)
}
