package infer

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/internal/eval"
	"github.com/stheno-ml/stheno/examples/internal/option"
	"github.com/stheno-ml/stheno/examples/internal/viz"
)

// Options configure Run.
type Options struct {
	Checkpoint string
	// Images is a directory of PNG or JPEG files, or a COCO annotations
	// file (whose images are then also scored against its annotations).
	Images   string
	Out      string
	Batch    int
	ScoreMin float64 // detections drawn in the pictures score at least this
	Log      io.Writer
	// Device runs the model on a GPU (nil: the host).
	Device *backend.Device
}

// Hooks are the example's parts of Run.
type Hooks struct {
	// MaxBatch is the largest Batch allowed.
	MaxBatch int
	// Load reads the checkpoint opt.Checkpoint: its classes and the COCO
	// category id of each.
	Load func() (classes []string, categoryIDs []int, err error)
	// Build makes the checkpoint's network for opt.Batch images, with its
	// weights, on opt.Device. predict returns the detections of images of
	// any size, in their own pixels; free releases the network.
	Build func() (predict func([]*data.Image) ([]eval.Detection, error), free func(), err error)
	// Score scores annotated images' detections, as a line to print.
	Score func(ds *data.Dataset, dets []eval.Detection) fmt.Stringer
}

// Run loads a checkpoint, predicts on every image of opt.Images and writes
// into opt.Out a picture of each image's detections and predictions.json,
// the detections in COCO's results format. Its category_id is the COCO
// file's own id of the class when opt.Images is one (whose categories must
// have the checkpoint's class names, in the same id order), and otherwise
// the id the class had in the training data.
func Run(opt Options, h Hooks) error {
	log := opt.Log
	if log == nil {
		log = io.Discard
	}
	if opt.Batch < 1 || opt.Batch > h.MaxBatch {
		return fmt.Errorf("train: Infer: Batch must be in [1, %d], got %d", h.MaxBatch, opt.Batch)
	}
	if !(opt.ScoreMin >= 0 && opt.ScoreMin <= 1) {
		return &option.Error{Option: "score", Value: opt.ScoreMin, Allowed: "must be a number in [0, 1]"}
	}
	classes, ids, err := h.Load()
	if err != nil {
		return err
	}
	ds, annotated, err := data.ReadImages(opt.Images)
	if err != nil {
		return err
	}
	categoryID := func(k int) int { return ids[k] }
	if annotated {
		if !slices.Equal(ds.Classes, classes) {
			return fmt.Errorf("train: %s has the categories %q (in id order), the checkpoint the classes %q: the names must match",
				opt.Images, ds.Classes, classes)
		}
		categoryID = ds.CategoryID
	}
	if ds.ClippedBoxes > 0 {
		fmt.Fprintf(log, "%d boxes of %s crossed their image's border and were clipped to it\n", ds.ClippedBoxes, opt.Images)
	}
	predict, free, err := h.Build()
	if err != nil {
		return err
	}
	defer free()
	if err := os.MkdirAll(opt.Out, 0o755); err != nil {
		return fmt.Errorf("train: %w", err)
	}
	start := time.Now()
	dets, err := predict(ds.Images)
	if err != nil {
		return err
	}
	fmt.Fprintf(log, "%d images, %d detections in %v\n", len(ds.Images), len(dets), time.Since(start).Round(time.Millisecond))

	byImage := map[int][]eval.Detection{}
	for _, d := range dets {
		byImage[d.ImageID] = append(byImage[d.ImageID], d)
	}
	for _, img := range ds.Images {
		scale := max(1, 256/max(img.W, img.H))
		pic := viz.DrawDetections(img, byImage[img.ID], classes, opt.ScoreMin, scale)
		name := strings.TrimSuffix(filepath.Base(img.File), filepath.Ext(img.File)) + "_pred.png"
		if img.File == "" {
			name = fmt.Sprintf("%06d_pred.png", img.ID)
		}
		if err := viz.SavePNG(filepath.Join(opt.Out, name), pic); err != nil {
			return err
		}
	}
	jsonPath := filepath.Join(opt.Out, "predictions.json")
	if err := eval.WriteCOCOResults(jsonPath, dets, categoryID); err != nil {
		return err
	}
	fmt.Fprintf(log, "wrote %s and %d pictures to %s\n", jsonPath, len(ds.Images), opt.Out)
	switch {
	case annotated && ds.CountObjects() == 0:
		fmt.Fprintf(log, "%s has no annotations: the predictions are not scored\n", opt.Images)
	case annotated:
		fmt.Fprintln(log, h.Score(ds, dets))
	}
	return nil
}
