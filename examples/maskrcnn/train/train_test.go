package train

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/internal/eval"
	"github.com/stheno-ml/stheno/examples/maskrcnn/model"
)

// tinyOptions is a configuration small enough for CI: 32x32 images, a
// network of a few thousand parameters, a few iterations.
func tinyOptions(dir string) Options {
	o := DefaultOptions()
	m := model.DefaultConfig(3, 32)
	m.Width, m.FPNChannels, m.BoxHeadDim = 4, 8, 32
	m.AnchorSizes = []float64{8, 16, 32}
	m.CanonicalSize = 28
	m.MaskPoolSize, m.MaskConvs, m.MaskChannels = 7, 1, 8
	m.RPNBatch, m.RPNPreNMS, m.RPNPostNMSTrain, m.RPNPostNMSTest = 64, 100, 50, 20
	m.RoIsPerImage, m.MaskRoIsPerImage, m.MaxDetections = 16, 4, 10
	o.Model = m
	o.Iters, o.Batch, o.EvalBatch = 40, 2, 4
	o.LR, o.Warmup = 3e-3, 5
	o.TrainImages, o.ValImages = 16, 6
	o.EvalEvery, o.LogEvery = 20, 5
	o.Out, o.Log = dir, io.Discard
	o.SheetImages, o.SheetScale = 2, 2
	return o
}

// A tiny run trains (the loss falls), evaluates, and writes its pictures,
// history and checkpoint.
func TestRunSmoke(t *testing.T) {
	dir := t.TempDir()
	res, err := Run(context.Background(), tinyOptions(dir))
	if err != nil {
		t.Fatal(err)
	}
	losses := res.History.Losses
	if len(losses) != 8 || losses[7].Iter != 40 {
		t.Fatalf("loss points %+v, want 8 ending at iteration 40", losses)
	}
	if !(losses[7].Total < 0.8*losses[0].Total) {
		t.Errorf("the loss did not fall: %v", losses)
	}
	if len(res.History.Evals) != 2 || res.History.Evals[1].Iter != 40 {
		t.Errorf("evaluations %+v, want at 20 and 40", res.History.Evals)
	}
	for _, f := range []string{"checkpoint.gob", "curves.png", "val_000020.png", "val_000040.png", "history.json"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("output %s: %v", f, err)
		}
	}
	var h History
	js, _ := os.ReadFile(filepath.Join(dir, "history.json"))
	if err := json.Unmarshal(js, &h); err != nil || !reflect.DeepEqual(h, res.History) {
		t.Errorf("history.json does not hold the history: %v", err)
	}
	// Self-describing: every field has its name in the file.
	for _, field := range []string{`"losses"`, `"evaluations"`, `"iteration"`, `"rpn_objectness"`, `"box_regression"`, `"ap50"`, `"train_images_per_second"`} {
		if !strings.Contains(string(js), field) {
			t.Errorf("history.json has no %s field", field)
		}
	}
}

// predictAll restores ckpt into a fresh model made from seed and predicts
// on images.
func predictAll(t *testing.T, ckpt *Checkpoint, seed uint64, images []*data.Image) []eval.Detection {
	t.Helper()
	params := model.NewParams(seed, nil)
	net, err := model.Build(ckpt.Run.Model, params, model.Infer, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer net.Close()
	if ckpt != nil {
		if err := ckpt.Restore(params, nil); err != nil {
			t.Fatal(err)
		}
	}
	dets, err := Predict(net, images)
	if err != nil {
		t.Fatal(err)
	}
	return dets
}

// A checkpoint restores every tensor: models initialised differently
// predict exactly alike once it is loaded, and saving them again gives the
// same tensors.
func TestCheckpointRoundTrip(t *testing.T) {
	dir := t.TempDir()
	o := tinyOptions(dir)
	o.Iters, o.EvalEvery = 10, 10
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	ckpt, err := LoadCheckpoint(filepath.Join(dir, "checkpoint.gob"))
	if err != nil {
		t.Fatal(err)
	}
	_, val, err := data.Load("", ckpt.Run.Seed, 1, 6, ckpt.Run.Model.ImageSize)
	if err != nil {
		t.Fatal(err)
	}
	a := predictAll(t, ckpt, 1, val.Images)
	b := predictAll(t, ckpt, 12345, val.Images)
	if len(a) == 0 {
		t.Fatal("no detections")
	}
	if !reflect.DeepEqual(a, b) {
		t.Error("models restored from one checkpoint predict differently")
	}

	params := model.NewParams(777, nil)
	net, err := model.Build(ckpt.Run.Model, params, model.Infer, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer net.Close()
	if err := ckpt.Restore(params, nil); err != nil {
		t.Fatal(err)
	}
	again, err := snapshot(ckpt.Run, &data.Dataset{Classes: ckpt.Classes, CategoryIDs: ckpt.CategoryIDs}, ckpt.Iter, params, nil, ckpt.History)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(again.Params, ckpt.Params) || !reflect.DeepEqual(again.BNStats, ckpt.BNStats) {
		t.Error("saving a restored model changes its tensors")
	}
	path := filepath.Join(dir, "again.gob")
	if err := again.Save(path); err != nil {
		t.Fatal(err)
	}
	back, err := LoadCheckpoint(path)
	if err != nil || !reflect.DeepEqual(back.Params, ckpt.Params) {
		t.Errorf("Save/LoadCheckpoint round trip: %v", err)
	}
}

// Training 6 iterations at once and 3 + 3 with a resume in between end in
// the same weights, optimiser state and history, bit for bit.
func TestResumeIsExact(t *testing.T) {
	whole, part, resumed := t.TempDir(), t.TempDir(), t.TempDir()
	o := tinyOptions(whole)
	o.Steps = nil // the schedule must not depend on Iters
	o.Iters, o.EvalEvery, o.LogEvery, o.ValImages = 6, 3, 1, 2
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	o.Out, o.Iters = part, 3
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	o.Out, o.Iters, o.Resume = resumed, 6, filepath.Join(part, "checkpoint.gob")
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	a, err := LoadCheckpoint(filepath.Join(whole, "checkpoint.gob"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadCheckpoint(filepath.Join(resumed, "checkpoint.gob"))
	if err != nil {
		t.Fatal(err)
	}
	if a.Iter != 6 || b.Iter != 6 {
		t.Fatalf("iterations %d and %d, want 6", a.Iter, b.Iter)
	}
	if !reflect.DeepEqual(a.Params, b.Params) || !reflect.DeepEqual(a.BNStats, b.BNStats) || !reflect.DeepEqual(a.Adam, b.Adam) {
		t.Error("the resumed run ended with different weights or optimiser state")
	}
	if !reflect.DeepEqual(a.History.Losses, b.History.Losses) {
		t.Errorf("loss histories differ:\n%v\n%v", a.History.Losses, b.History.Losses)
	}
}

// Inference on a COCO file and on a directory of images writes pictures and
// COCO-format results.
func TestInfer(t *testing.T) {
	dir := t.TempDir()
	o := tinyOptions(filepath.Join(dir, "run"))
	o.Iters, o.EvalEvery = 4, 4
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	ds, err := data.Synthetic(data.SyntheticConfig{Seed: 9, Count: 3, Size: 48})
	if err != nil {
		t.Fatal(err)
	}
	if err := data.WriteCOCO(ds, filepath.Join(dir, "coco")); err != nil {
		t.Fatal(err)
	}
	for _, images := range []string{filepath.Join(dir, "coco", "annotations.json"), filepath.Join(dir, "coco", "images")} {
		out := filepath.Join(dir, "pred"+filepath.Ext(images))
		err := Infer(InferOptions{Checkpoint: filepath.Join(dir, "run", "checkpoint.gob"), Images: images,
			Out: out, Batch: 2, ScoreMin: 0, Log: io.Discard})
		if err != nil {
			t.Fatalf("%s: %v", images, err)
		}
		var results []eval.COCOResult
		js, err := os.ReadFile(filepath.Join(out, "predictions.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(js, &results); err != nil {
			t.Fatal(err)
		}
		for _, r := range results {
			// Predictions come back at the images' own size (48), not the
			// model's (32).
			if r.Segmentation.Size != [2]int{48, 48} || r.CategoryID < 1 || r.CategoryID > 3 || r.ImageID < 1 || r.ImageID > 3 {
				t.Fatalf("%s: bad result %+v", images, r)
			}
		}
		pics, _ := filepath.Glob(filepath.Join(out, "*_pred.png"))
		if len(pics) != 3 {
			t.Errorf("%s: %d pictures, want 3", images, len(pics))
		}
	}
}
