package train

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stheno-ml/stheno/examples/detr/model"
	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/internal/eval"
)

// tinyOptions is a configuration small enough for CI: 32x32 images, a
// network of some 60 thousand parameters, a few iterations.
func tinyOptions(dir string) Options {
	o := DefaultOptions()
	m := model.DefaultConfig(3)
	m.ImageSize = 32
	m.Width, m.Depth, m.Stages = 8, 1, 3
	m.DModel, m.Heads, m.Points, m.FFN, m.NormGroups = 32, 4, 2, 64, 8
	m.EncLayers, m.DecLayers, m.Queries, m.MaxDetections = 1, 2, 10, 10
	o.Model = m
	o.Iters, o.Batch, o.EvalBatch = 40, 2, 4
	o.LR, o.LRBackbone, o.Warmup = 2e-3, 2e-3, 5
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
	for _, field := range []string{`"losses"`, `"evaluations"`, `"iteration"`, `"classification"`, `"box_l1"`, `"giou"`, `"ap50"`, `"train_images_per_second"`} {
		if !strings.Contains(string(js), field) {
			t.Errorf("history.json has no %s field", field)
		}
	}
}

// Training 6 iterations at once and 3 + 3 with a resume in between end in
// the same weights, BatchNorm statistics, optimiser state and history, bit
// for bit: the batches and the dropout masks depend only on the seed and
// the iteration. So with two-stage as well, whose queries are selected on
// the host.
func TestResumeIsExact(t *testing.T) {
	t.Run("learned queries", func(t *testing.T) { resumeIsExact(t, false) })
	t.Run("two stage", func(t *testing.T) { resumeIsExact(t, true) })
}

func resumeIsExact(t *testing.T, twoStage bool) {
	whole, part, resumed := t.TempDir(), t.TempDir(), t.TempDir()
	o := tinyOptions(whole)
	o.Model.TwoStage = twoStage
	o.Steps = nil // the schedule must not depend on Iters
	o.Iters, o.EvalEvery, o.LogEvery, o.ValImages = 6, 3, 1, 2
	o.Model.Dropout = 0.1 // whose masks must follow the iteration
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

// An interrupted run saves the iteration it finished and says so.
func TestInterruptSaves(t *testing.T) {
	dir := t.TempDir()
	o := tinyOptions(dir)
	o.Iters, o.EvalEvery, o.ValImages = 5, 5, 2
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("test signal")
	cancel(cause)
	_, err := Run(ctx, o)
	var ie *InterruptedError
	if !errors.As(err, &ie) || ie.Iter != 1 || ie.Checkpoint != filepath.Join(dir, "checkpoint.gob") || !errors.Is(err, cause) {
		t.Fatalf("interrupted run: %v, want an InterruptedError after iteration 1 carrying the cause", err)
	}
	if c, err := LoadCheckpoint(ie.Checkpoint); err != nil || c.Iter != 1 {
		t.Fatalf("the interrupted run's checkpoint: %v", err)
	}
}

// A checkpoint resumes only with the options of its run.
func TestResumeRefusesOtherOptions(t *testing.T) {
	dir := t.TempDir()
	o := tinyOptions(dir)
	o.Iters, o.EvalEvery, o.ValImages = 2, 2, 0
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	o.Resume, o.Iters = filepath.Join(dir, "checkpoint.gob"), 4
	o.LR, o.Model.Queries, o.Model.TwoStage = 0.5, 12, true
	_, err := Run(context.Background(), o)
	for _, want := range []string{"-lr: the checkpoint's is 0.002, given 0.5", "-queries: the checkpoint's is 10, given 12", "-two-stage: the checkpoint's is false, given true"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("resuming with other -lr, -queries and -two-stage: %v, want %q", err, want)
		}
	}
}

// Inference on a COCO file and on a directory of images of another size
// than the model's writes pictures and COCO-format results, boxes in the
// images' own pixels and the top MaxDetections per image.
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
		if len(results) != 3*o.Model.MaxDetections {
			t.Errorf("%s: %d results, want %d per image", images, len(results), o.Model.MaxDetections)
		}
		for _, r := range results {
			// Boxes come back at the images' own size (48), not the
			// model's (32): sigmoid boxes may reach its border.
			b := r.BBox
			if b[0] < -1e-9 || b[1] < -1e-9 || b[0]+b[2] > 48+1e-9 || b[1]+b[3] > 48+1e-9 ||
				r.Segmentation != nil || r.CategoryID < 1 || r.CategoryID > 3 || r.ImageID < 1 || r.ImageID > 3 {
				t.Fatalf("%s: bad result %+v", images, r)
			}
		}
		pics, _ := filepath.Glob(filepath.Join(out, "*_pred.png"))
		if len(pics) != 3 {
			t.Errorf("%s: %d pictures, want 3", images, len(pics))
		}
	}
}

// TargetOf gives normalised (cx, cy, w, h) boxes and leaves crowds out.
func TestTargetOf(t *testing.T) {
	img := &data.Image{W: 64, H: 32, Objects: []data.Object{
		{Class: 2, Box: [4]float64{16, 8, 48, 24}},
		{Class: 1, Box: [4]float64{0, 0, 10, 10}, Crowd: true},
		{Class: 0, Box: [4]float64{5, 5, 5.5, 9}},
	}}
	got := TargetOf(img)
	want := model.Target{Labels: []int{2}, Boxes: []model.Box{{0.5, 0.5, 0.5, 0.5}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("TargetOf = %+v, want %+v", got, want)
	}
}

// Both presets validate; an unknown one is refused with the list.
func TestPresets(t *testing.T) {
	for _, name := range Presets {
		o, err := Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := o.Validate(); err != nil {
			t.Errorf("preset %s: %v", name, err)
		}
	}
	r50, _ := Preset("r50")
	ref := model.GPUConfig(3, 512)
	if !reflect.DeepEqual(r50.Model, ref) || r50.Batch != 8 || r50.LR != 2e-4 || r50.LRBackbone != 2e-5 ||
		r50.LRLinearProjMult != 0.1 || r50.WeightDecay != 1e-4 || r50.ClipNorm != 0.1 {
		t.Errorf("r50 preset %+v is not the reference's", r50.RunConfig)
	}
	if _, err := Preset("r101"); err == nil || !strings.Contains(err.Error(), "must be one of cpu, r50") {
		t.Errorf("unknown preset: %v", err)
	}
}
