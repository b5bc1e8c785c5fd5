package train

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/internal/eval"
)

// With no validation images a run trains, plots its losses and saves its
// checkpoint, and evaluates nothing.
func TestRunWithoutValidation(t *testing.T) {
	dir := t.TempDir()
	o := tinyOptions(dir)
	o.Iters, o.EvalEvery, o.ValImages = 6, 3, 0
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Evaluated || len(res.History.Evals) != 0 || res.Iters != 6 {
		t.Errorf("result %+v, want 6 iterations and no evaluation", res)
	}
	ckpt, err := LoadCheckpoint(filepath.Join(dir, "checkpoint.gob"))
	if err != nil || ckpt.Iter != 6 {
		t.Fatalf("checkpoint: %v", err)
	}
	for _, f := range []string{"curves.png", "history.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	if pics, _ := filepath.Glob(filepath.Join(dir, "val_*.png")); len(pics) != 0 {
		t.Errorf("pictures of predictions without validation images: %v", pics)
	}
}

// Resuming a checkpoint that has done -iters or more trains nothing and
// reports the checkpoint's real AP: the one its own run measured last.
func TestResumeNothingToTrain(t *testing.T) {
	dir := t.TempDir()
	o := tinyOptions(dir)
	o.Iters, o.EvalEvery = 8, 8
	first, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "checkpoint.gob")
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, iters := range []int{8, 5} {
		o.Resume, o.Iters = path, iters
		res, err := Run(context.Background(), o)
		if err != nil {
			t.Fatalf("-iters %d: %v", iters, err)
		}
		if !res.Evaluated || !reflect.DeepEqual(res.Final, first.Final) || res.Iters != 8 {
			t.Errorf("-iters %d: result %v after %d iterations, want the run's own %v after 8", iters, res.Final, res.Iters, first.Final)
		}
		if after, _ := os.ReadFile(path); !slices.Equal(before, after) {
			t.Errorf("-iters %d: the checkpoint was rewritten", iters)
		}
	}
}

// A checkpoint resumes only with the options of its run.
func TestResumeRefusesOtherOptions(t *testing.T) {
	dir := t.TempDir()
	o := tinyOptions(dir)
	o.Iters, o.EvalEvery = 2, 2
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	o.Resume, o.Iters = filepath.Join(dir, "checkpoint.gob"), 4
	o.LR, o.Batch = 0.5, 3
	_, err := Run(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), "-lr: the checkpoint's is 0.003, given 0.5") || !strings.Contains(err.Error(), "-batch: the checkpoint's is 2, given 3") {
		t.Errorf("resuming with other -lr and -batch: %v", err)
	}
}

// An interrupted run saves the iteration it finished, says so, and resumes
// from there to the same end as a run never interrupted.
func TestInterruptThenResumeIsExact(t *testing.T) {
	whole, part := t.TempDir(), t.TempDir()
	o := tinyOptions(whole)
	o.Iters, o.EvalEvery, o.LogEvery, o.ValImages = 5, 5, 1, 2
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	// Cancelled before it starts: the run finishes one iteration, saves
	// it and stops.
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("test signal")
	cancel(cause)
	o.Out = part
	_, err := Run(ctx, o)
	var ie *InterruptedError
	if !errors.As(err, &ie) || ie.Iter != 1 || ie.Checkpoint != filepath.Join(part, "checkpoint.gob") || !errors.Is(err, cause) {
		t.Fatalf("interrupted run: %v, want an InterruptedError after iteration 1 carrying the cause", err)
	}
	o.Resume = ie.Checkpoint
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	a, errA := LoadCheckpoint(filepath.Join(whole, "checkpoint.gob"))
	b, errB := LoadCheckpoint(filepath.Join(part, "checkpoint.gob"))
	if errA != nil || errB != nil {
		t.Fatal(errA, errB)
	}
	if a.Iter != 5 || b.Iter != 5 || !reflect.DeepEqual(a.Params, b.Params) || !reflect.DeepEqual(a.Adam, b.Adam) ||
		!reflect.DeepEqual(a.BNStats, b.BNStats) || !reflect.DeepEqual(a.History.Losses, b.History.Losses) {
		t.Error("the interrupted and resumed run ended elsewhere than the uninterrupted one")
	}
}

// A run trains on the synthetic set it exports (data's tests check that
// the export reads back as the images), and ExportSynthetic refuses a run
// on other data.
func TestExportSyntheticTrains(t *testing.T) {
	dir := t.TempDir()
	o := tinyOptions(filepath.Join(dir, "run"))
	o.TrainImages, o.ValImages = 18, 2
	n, err := ExportSynthetic(filepath.Join(dir, "coco"), o.RunConfig)
	if err != nil || n != 20 {
		t.Fatalf("ExportSynthetic = %d, %v; want 20 images", n, err)
	}
	o.Data, o.TrainImages, o.ValImages = filepath.Join(dir, "coco", "annotations.json"), 0, 0
	if _, err := ExportSynthetic(filepath.Join(dir, "again"), o.RunConfig); err == nil {
		t.Errorf("ExportSynthetic of a run on %s: no error", o.Data)
	}
	o.Iters, o.EvalEvery = 2, 2
	res, err := Run(context.Background(), o)
	if err != nil || !res.Evaluated {
		t.Fatalf("training on the export: %v", err)
	}
}

// A COCO file whose training images have no annotation is refused.
func TestRunRefusesEmptyData(t *testing.T) {
	dir := t.TempDir()
	ds, err := data.Synthetic(data.SyntheticConfig{Seed: 3, Count: 4, Size: 32})
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range ds.Images {
		img.Objects = nil
	}
	if err := data.WriteCOCO(ds, dir); err != nil {
		t.Fatal(err)
	}
	o := tinyOptions(filepath.Join(dir, "run"))
	o.Data, o.TrainImages, o.ValImages = filepath.Join(dir, "annotations.json"), 0, 0
	if _, err := Run(context.Background(), o); err == nil || !strings.Contains(err.Error(), "have no annotations") {
		t.Errorf("training on images without annotations: %v", err)
	}
}

// predictions.json carries the dataset's own category ids, and -infer
// refuses a COCO file whose category names differ from the checkpoint's.
func TestInferCategoryIDs(t *testing.T) {
	dir := t.TempDir()
	ds, err := data.Synthetic(data.SyntheticConfig{Seed: 4, Count: 10, Size: 32})
	if err != nil {
		t.Fatal(err)
	}
	ds.CategoryIDs = []int{40, 7, 12} // circle, square, triangle; in id order: square, triangle, circle
	coco := filepath.Join(dir, "coco")
	if err := data.WriteCOCO(ds, coco); err != nil {
		t.Fatal(err)
	}
	o := tinyOptions(filepath.Join(dir, "run"))
	o.Data, o.TrainImages, o.ValImages = filepath.Join(coco, "annotations.json"), 0, 0
	o.Iters, o.EvalEvery = 2, 2
	o.Model.ScoreThresh = 0 // detections of every class, trained or not
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	ckptPath := filepath.Join(dir, "run", "checkpoint.gob")
	ckpt, err := LoadCheckpoint(ckptPath)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ckpt.Classes, []string{"square", "triangle", "circle"}) || !reflect.DeepEqual(ckpt.CategoryIDs, []int{7, 12, 40}) {
		t.Fatalf("checkpoint classes %v ids %v", ckpt.Classes, ckpt.CategoryIDs)
	}
	for _, images := range []string{filepath.Join(coco, "annotations.json"), filepath.Join(coco, "images")} {
		out := filepath.Join(dir, "pred"+filepath.Ext(images))
		if err := Infer(InferOptions{Checkpoint: ckptPath, Images: images, Out: out, Batch: 2}); err != nil {
			t.Fatal(err)
		}
		js, err := os.ReadFile(filepath.Join(out, "predictions.json"))
		if err != nil {
			t.Fatal(err)
		}
		var results []eval.COCOResult
		if err := json.Unmarshal(js, &results); err != nil {
			t.Fatal(err)
		}
		if len(results) == 0 {
			t.Fatalf("%s: no predictions", images)
		}
		for _, r := range results {
			if !slices.Contains([]int{7, 12, 40}, r.CategoryID) {
				t.Fatalf("%s: category_id %d is none of the dataset's 7, 12, 40", images, r.CategoryID)
			}
		}
	}
	// The same classes under other names: refused.
	ds.Classes = []string{"disc", "square", "triangle"}
	other := filepath.Join(dir, "other")
	if err := data.WriteCOCO(ds, other); err != nil {
		t.Fatal(err)
	}
	err = Infer(InferOptions{Checkpoint: ckptPath, Images: filepath.Join(other, "annotations.json"), Out: filepath.Join(dir, "p"), Batch: 2})
	if err == nil || !strings.Contains(err.Error(), `the categories ["square" "triangle" "disc"]`) || !strings.Contains(err.Error(), "the names must match") {
		t.Errorf("-infer with other class names: %v", err)
	}
}

// A checkpoint names its data by absolute path, so the run resumes from
// any working directory.
func TestDataPathAbsolute(t *testing.T) {
	dir := t.TempDir()
	o := tinyOptions(filepath.Join(dir, "run"))
	o.TrainImages, o.ValImages = 9, 1
	if _, err := ExportSynthetic(filepath.Join(dir, "coco"), o.RunConfig); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	o.Data, o.TrainImages, o.ValImages = filepath.Join("coco", "annotations.json"), 0, 0
	o.Iters, o.EvalEvery = 2, 2
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	ckpt, err := LoadCheckpoint(filepath.Join(dir, "run", "checkpoint.gob"))
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "coco", "annotations.json"); ckpt.Run.Data != want {
		t.Fatalf("the checkpoint names its data %q, want %q", ckpt.Run.Data, want)
	}
	t.Chdir(t.TempDir())
	o.RunConfig, o.Resume, o.Iters = ckpt.Run, filepath.Join(dir, "run", "checkpoint.gob"), 3
	if _, err := Run(context.Background(), o); err != nil {
		t.Errorf("resuming from another directory: %v", err)
	}
}
