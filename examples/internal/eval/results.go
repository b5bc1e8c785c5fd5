package eval

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/stheno-ml/stheno/examples/internal/data"
)

// COCOResult is one detection in COCO's results format, the file
// pycocotools' loadRes reads.
type COCOResult struct {
	ImageID    int        `json:"image_id"`
	CategoryID int        `json:"category_id"`
	BBox       [4]float64 `json:"bbox"` // x, y, w, h
	Score      float64    `json:"score"`
	// Segmentation is the mask as compressed RLE; absent for a detection
	// without a mask (a box detector's), which pycocotools scores by box.
	Segmentation *COCORLE `json:"segmentation,omitempty"`
}

// COCORLE is a mask in COCO's compressed RLE form.
type COCORLE struct {
	Size   [2]int `json:"size"` // height, width
	Counts string `json:"counts"`
}

// COCOResults converts dets to COCO's results format. categoryID maps a
// class index to the category id the results are to carry (a COCO file's
// own ids, or the training data's).
func COCOResults(dets []Detection, categoryID func(class int) int) []COCOResult {
	results := []COCOResult{} // [] in JSON when there are none, not null
	for _, d := range dets {
		r := COCOResult{
			ImageID: d.ImageID, CategoryID: categoryID(d.Class), Score: d.Score,
			BBox: [4]float64{d.Box[0], d.Box[1], d.Box[2] - d.Box[0], d.Box[3] - d.Box[1]},
		}
		if d.Mask != nil {
			r.Segmentation = &COCORLE{Size: [2]int{d.Mask.H, d.Mask.W}, Counts: data.CompressRLE(data.EncodeRLE(d.Mask))}
		}
		results = append(results, r)
	}
	return results
}

// WriteCOCOResults writes dets to path as COCOResults gives them, one JSON
// array.
func WriteCOCOResults(path string, dets []Detection, categoryID func(class int) int) error {
	js, err := json.Marshal(COCOResults(dets, categoryID))
	if err != nil {
		return fmt.Errorf("eval: %w", err)
	}
	if err := os.WriteFile(path, js, 0o644); err != nil {
		return fmt.Errorf("eval: %w", err)
	}
	return nil
}
