package train

import (
	"context"
	"fmt"
	"image"
	"time"

	"github.com/stheno-ml/stheno/examples/detr/model"
	"github.com/stheno-ml/stheno/examples/internal/checkpoint"
	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/internal/eval"
	"github.com/stheno-ml/stheno/examples/internal/runloop"
)

// Result summarises a run.
type Result struct {
	Iters     int  // iterations done in all
	Evaluated bool // Final holds an evaluation (there are validation images)
	Final     Metrics
	History   History
	Wall      time.Duration
	// Checkpoint is the checkpoint written last; empty when Run trained
	// nothing.
	Checkpoint string
}

// InterruptedError is Run's error when its context is cancelled: the
// iteration under way was finished and the run saved in Checkpoint, from
// which it resumes exactly.
type InterruptedError = checkpoint.InterruptedError

// Run trains the model as opt says, evaluating on the validation images,
// plotting and saving a checkpoint every EvalEvery iterations and at the
// end. With no validation images it trains and saves the same way, without
// evaluations or pictures of predictions. Resuming (opt.Resume) needs the
// checkpoint's RunConfig (Iters excepted); if the checkpoint has done
// opt.Iters iterations or more, Run trains nothing and evaluates it.
//
// When ctx is cancelled, Run finishes the iteration under way, saves the
// checkpoint and returns an *InterruptedError.
func Run(ctx context.Context, opt Options) (*Result, error) {
	start := time.Now()
	if err := opt.Validate(); err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	var ckpt *Checkpoint
	setup := runloop.Setup{Resume: opt.Resume, Data: opt.Data, Seed: opt.Seed,
		TrainImages: opt.TrainImages, ValImages: opt.ValImages, ImageSize: opt.Model.ImageSize, Out: opt.Out}
	if opt.Resume != "" {
		var err error
		if ckpt, err = LoadCheckpoint(opt.Resume); err != nil {
			return nil, err
		}
		setup.Diff, setup.Classes = opt.RunConfig.Diff(ckpt.Run), ckpt.Classes
	}
	run := opt.RunConfig
	var trainSet, valSet *data.Dataset
	var err error
	if run.Data, trainSet, valSet, err = setup.Load(); err != nil {
		return nil, err
	}
	run.Model.NumClasses = len(trainSet.Classes)

	params := model.NewParams(run.Seed, opt.Device)
	defer params.Free()
	trainNet, err := model.Build(run.Model, params, model.Train, run.Batch)
	if err != nil {
		return nil, err
	}
	defer trainNet.Close()
	if err := trainNet.NewOptimizer(run.optimizer()); err != nil {
		return nil, err
	}
	var inferNet *model.Net
	if len(valSet.Images) > 0 {
		if inferNet, err = model.Build(run.Model, params, model.Infer, opt.EvalBatch); err != nil {
			return nil, err
		}
		defer inferNet.Close()
	}
	first := 0
	var hist History
	if ckpt != nil {
		if err := ckpt.Restore(params, optimizer(trainNet)); err != nil {
			return nil, err
		}
		first, hist = ckpt.Iter, ckpt.History
	}
	cfg := runloop.Config{
		Start: start, Log: opt.Log,
		Iters: run.Iters, Batch: run.Batch, First: first, Resume: opt.Resume,
		LR: run.LR, Warmup: run.Warmup, Steps: run.Steps,
		Data: run.Data, Train: trainSet, Val: valSet,
		EvalEvery: opt.EvalEvery, LogEvery: opt.LogEvery, Out: opt.Out,
		SheetImages: opt.SheetImages, SheetScale: opt.SheetScale, SheetScoreMin: SheetScoreMin,
		Device: opt.Device, Verbose: opt.Verbose,
		Model: fmt.Sprintf("Deformable DETR: %d parameters, %dx%d images, %d classes, d_model %d, %d+%d layers, %d queries; %d training and %d validation images",
			params.Size(), run.Model.ImageSize, run.Model.ImageSize, run.Model.NumClasses, run.Model.DModel, run.Model.EncLayers, run.Model.DecLayers,
			run.Model.Queries, len(trainSet.Images), len(valSet.Images)),
		Optimizer: fmt.Sprintf("AdamW lr %g (backbone %g, sampling offsets and reference points %g)", run.LR, run.LRBackbone, run.LR*run.LRLinearProjMult),
	}
	hooks := runloop.Hooks[Metrics]{
		Step: func(it int, lr float64) ([]float64, any, error) {
			imgs := data.Batch(trainSet.Images, run.Seed, it, run.Batch)
			pix := make([][]float32, len(imgs))
			targets := make([]model.Target, len(imgs))
			for i, img := range imgs {
				pix[i], targets[i] = img.Pix, TargetOf(img)
			}
			l, err := trainNet.TrainStep(pix, targets, it, lr)
			return []float64{l.Total, l.Class, l.Box, l.GIoU}, l, err
		},
		Losses: func(l []float64) string {
			return fmt.Sprintf("loss %.3f (cls %.3f L1 %.3f GIoU %.3f)", l[0], l[1], l[2], l[3])
		},
		AddLosses: func(iter int, m []float64) {
			hist.Losses = append(hist.Losses, LossPoint{Iter: iter, Total: m[0], Class: m[1], Box: m[2], GIoU: m[3]})
		},
		Evaluate: func() (Metrics, []eval.Detection, error) { return Evaluate(inferNet, valSet) },
		AddEval: func(e runloop.Eval[Metrics]) {
			hist.Evals = append(hist.Evals, EvalPoint{
				Iter: e.Iter, Seconds: e.Seconds, Box: e.Metrics.Box.APs(),
				TrainImagesPerSecond: e.TrainImagesPerSecond, InferImagesPerSecond: e.InferImagesPerSecond,
				ValidationImages: e.ValidationImages,
			})
		},
		Curves:  func() image.Image { return curves(hist) },
		History: func() any { return hist },
		Save: func(iter int, path string) error {
			c, err := snapshot(run, trainSet, iter, params, trainNet, hist)
			if err != nil {
				return err
			}
			return c.Save(path)
		},
	}
	r, err := runloop.Run(ctx, cfg, hooks)
	if r == nil {
		return nil, err
	}
	return &Result{Iters: r.Iters, Evaluated: r.Evaluated, Final: r.Final, History: hist, Wall: r.Wall, Checkpoint: r.Checkpoint}, err
}

// SheetScoreMin is the lowest score drawn in the pictures of predictions:
// the focal loss's sigmoid scores sit lower than a softmax's, and a short
// run's true detections score 0.3 to 0.7.
const SheetScoreMin = 0.3
