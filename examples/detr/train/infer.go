package train

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/examples/detr/model"
	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/internal/eval"
	"github.com/stheno-ml/stheno/examples/internal/option"
	"github.com/stheno-ml/stheno/examples/internal/viz"
)

// InferOptions configure Infer.
type InferOptions struct {
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

// Infer loads a checkpoint, predicts on every image of opt.Images (resized
// to the model's input size, boxes mapped back to the image's own size:
// the top MaxDetections of queries x classes, the reference's
// post-processing), and writes into opt.Out a picture of each image's
// detections and predictions.json, the detections in COCO's results
// format. Its category_id is the COCO file's own id of the class when
// opt.Images is one (whose categories must have the checkpoint's class
// names, in the same id order), and otherwise the id the class had in the
// training data (the synthetic dataset's are 1, 2, 3).
func Infer(opt InferOptions) error {
	log := opt.Log
	if log == nil {
		log = io.Discard
	}
	if opt.Batch < 1 || opt.Batch > maxBatch {
		return fmt.Errorf("train: Infer: Batch must be in [1, %d], got %d", maxBatch, opt.Batch)
	}
	if !(opt.ScoreMin >= 0 && opt.ScoreMin <= 1) {
		return &option.Error{Option: "score", Value: opt.ScoreMin, Allowed: "must be a number in [0, 1]"}
	}
	ckpt, err := LoadCheckpoint(opt.Checkpoint)
	if err != nil {
		return err
	}
	ds, annotated, err := data.ReadImages(opt.Images)
	if err != nil {
		return err
	}
	categoryID := func(k int) int { return ckpt.CategoryIDs[k] }
	if annotated {
		if !slices.Equal(ds.Classes, ckpt.Classes) {
			return fmt.Errorf("train: %s has the categories %q (in id order), the checkpoint the classes %q: the names must match",
				opt.Images, ds.Classes, ckpt.Classes)
		}
		categoryID = ds.CategoryID
	}
	if ds.ClippedBoxes > 0 {
		fmt.Fprintf(log, "%d boxes of %s crossed their image's border and were clipped to it\n", ds.ClippedBoxes, opt.Images)
	}
	params := model.NewParams(ckpt.Run.Seed, opt.Device)
	defer params.Free()
	net, err := model.Build(ckpt.Run.Model, params, model.Infer, opt.Batch)
	if err != nil {
		return err
	}
	defer net.Close()
	if err := ckpt.Restore(params); err != nil {
		return err
	}
	if err := os.MkdirAll(opt.Out, 0o755); err != nil {
		return fmt.Errorf("train: %w", err)
	}
	start := time.Now()
	dets, err := Predict(net, ds.Images)
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
		pic := viz.DrawDetections(img, byImage[img.ID], ckpt.Classes, opt.ScoreMin, scale)
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
		fmt.Fprintln(log, Metrics{Box: eval.Evaluate(ds, dets, false)})
	}
	return nil
}
