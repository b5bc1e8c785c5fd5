package train

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/stheno-ml/stheno/examples/internal/checkpoint"
	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/internal/eval"
	"github.com/stheno-ml/stheno/examples/internal/history"
	"github.com/stheno-ml/stheno/examples/internal/option"
	"github.com/stheno-ml/stheno/examples/internal/progress"
	"github.com/stheno-ml/stheno/examples/internal/schedule"
	"github.com/stheno-ml/stheno/examples/internal/viz"
	"github.com/stheno-ml/stheno/examples/maskrcnn/model"
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
	log := opt.Log
	if log == nil {
		log = io.Discard
	}
	if err := opt.Validate(); err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	var ckpt *Checkpoint
	if opt.Resume != "" {
		var err error
		if ckpt, err = LoadCheckpoint(opt.Resume); err != nil {
			return nil, err
		}
		if diff := opt.RunConfig.Diff(ckpt.Run); len(diff) > 0 {
			return nil, fmt.Errorf("train: %s comes from a run with other options; resuming needs the same ones (options not given are taken from the checkpoint):\n  %s",
				opt.Resume, strings.Join(diff, "\n  "))
		}
	}
	run := opt.RunConfig
	if run.Data != "" {
		// The checkpoint names the data wherever the run resumes from.
		run.Data = option.AbsPath(run.Data)
	}
	trainSet, valSet, err := data.Load(run.Data, run.Seed, run.TrainImages, run.ValImages, run.Model.ImageSize)
	if err != nil {
		return nil, err
	}
	if ckpt != nil && !slices.Equal(ckpt.Classes, trainSet.Classes) {
		return nil, fmt.Errorf("train: %s has the classes %q, the data %q", opt.Resume, ckpt.Classes, trainSet.Classes)
	}
	run.Model.NumClasses = len(trainSet.Classes)
	if err := os.MkdirAll(opt.Out, 0o755); err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}

	params := model.NewParams(run.Seed, opt.Device)
	defer params.Free()
	trainNet, err := model.Build(run.Model, params, model.Train, run.Batch)
	if err != nil {
		return nil, err
	}
	defer trainNet.Close()
	if err := trainNet.NewOptimizer(run.WeightDecay, run.ClipNorm); err != nil {
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
		if err := ckpt.restore(params, trainNet); err != nil {
			return nil, err
		}
		first, hist = ckpt.Iter, ckpt.History
	}
	res := &Result{Iters: first, History: hist}
	prog := progress.New(log, run.Iters)
	evaluate := func(iter int) (Metrics, []eval.Detection, error) {
		te := time.Now()
		m, dets, err := Evaluate(inferNet, valSet)
		if err != nil {
			return m, nil, err
		}
		res.Final, res.Evaluated = m, true
		prog.Println("iteration %d: %v (%d images, %.1fs)", iter, m, len(valSet.Images), time.Since(te).Seconds())
		return m, dets, nil
	}
	if first >= run.Iters {
		fmt.Fprintf(log, "%s has done %d iterations and -iters is %d: nothing to train; evaluating the checkpoint as it is\n", opt.Resume, first, run.Iters)
		if inferNet == nil {
			fmt.Fprintln(log, "no validation images: nothing to evaluate")
		} else if _, _, err := evaluate(first); err != nil {
			return nil, err
		}
		res.Wall = time.Since(start)
		return res, nil
	}

	if ckpt != nil {
		fmt.Fprintf(log, "resuming %s at iteration %d\n", opt.Resume, first)
	}
	sched := schedule.WarmupMultiStep{LR: run.LR, Warmup: run.Warmup, WarmupFactor: 0.01, Gamma: 0.1}
	for _, f := range run.Steps {
		sched.Steps = append(sched.Steps, int(f*float64(run.Iters)))
	}
	fmt.Fprintf(log, "Mask R-CNN: %d parameters, %dx%d images, %d classes; %d training and %d validation images\n",
		params.Size(), run.Model.ImageSize, run.Model.ImageSize, run.Model.NumClasses, len(trainSet.Images), len(valSet.Images))
	if trainSet.ClippedBoxes > 0 {
		fmt.Fprintf(log, "%d boxes of %s crossed their image's border and were clipped to it\n", trainSet.ClippedBoxes, run.Data)
	}
	if inferNet == nil {
		fmt.Fprintln(log, "no validation images: evaluations and pictures of predictions are skipped")
	}
	where := "on the CPU"
	if opt.Device != nil {
		where = "on " + opt.Device.String()
	}
	fmt.Fprintf(log, "training %d iterations of %d images %s, AdamW lr %g, output in %s\n", run.Iters, run.Batch, where, run.LR, opt.Out)

	ckptPath := filepath.Join(opt.Out, "checkpoint.gob")
	var sums model.Losses
	var nsum int
	trainTime := time.Duration(0)
	trainIters := 0
	// Each iteration's anchors are assigned while the one before runs.
	prepare := func(it int) *model.Step {
		imgs := data.Batch(trainSet.Images, run.Seed, it, run.Batch)
		pix := make([][]float32, len(imgs))
		targets := make([]model.Target, len(imgs))
		for i, img := range imgs {
			pix[i], targets[i] = img.Pix, TargetOf(img)
		}
		return trainNet.Prepare(pix, targets, stepRNG(run.Seed, it))
	}
	next := prepare(first)
	for it := first; it < run.Iters; it++ {
		t0 := time.Now()
		step := next
		if it+1 < run.Iters {
			next = prepare(it + 1)
		}
		lr := sched.At(it)
		losses, err := trainNet.TrainPrepared(step, lr)
		if err != nil {
			return nil, fmt.Errorf("train: iteration %d: %w", it, err)
		}
		if math.IsNaN(losses[0]) || math.IsInf(losses[0], 0) {
			return nil, fmt.Errorf("train: iteration %d: the loss is %v (%v); try a lower -lr", it, losses[0], losses)
		}
		trainTime += time.Since(t0)
		trainIters++
		for i, v := range losses {
			sums[i] += v
		}
		nsum++
		done := it + 1
		last := done == run.Iters
		if done%opt.LogEvery == 0 || last {
			for i := range sums {
				sums[i] /= float64(nsum)
			}
			hist.Losses = append(hist.Losses, lossPoint(done, sums))
			sums, nsum = model.Losses{}, 0
		}
		rate := float64(trainIters*run.Batch) / trainTime.Seconds()
		remaining := time.Duration(float64(run.Iters-done) * float64(run.Batch) / rate * float64(time.Second))
		prog.Update(done, fmt.Sprintf("loss %.3f (rpn %.3f/%.3f cls %.3f box %.3f mask %.3f) lr %.1e %.1f img/s ETA %s",
			losses[0], losses[1], losses[2], losses[3], losses[4], losses[5], lr, rate, progress.ETA(remaining)), last)
		if opt.Verbose && opt.Device != nil && (done%100 == 0 || last) {
			m := opt.Device.MemStats()
			prog.Println("iteration %d: device memory in use %.1f MiB, high-water mark %.1f MiB, cached %.1f MiB, driver allocations %d",
				done, mib(m.InUse), mib(m.PeakInUse), mib(m.Cached), m.DriverAllocs)
		}

		periodic := done%opt.EvalEvery == 0 || last
		interrupted := ctx.Err() != nil && !last
		if !periodic && !interrupted {
			continue
		}
		if periodic && inferNet != nil {
			te := time.Now()
			m, dets, err := evaluate(done)
			if err != nil {
				return nil, err
			}
			hist.Evals = append(hist.Evals, EvalPoint{
				Iter: done, Seconds: time.Since(start).Seconds(),
				Box: m.Box.APs(), Mask: m.Mask.APs(),
				TrainImagesPerSecond: rate,
				InferImagesPerSecond: float64(len(valSet.Images)) / time.Since(te).Seconds(),
				ValidationImages:     len(valSet.Images),
			})
			if err := writeSheet(opt, done, valSet, dets); err != nil {
				return nil, err
			}
		}
		if err := writeHistory(opt, hist); err != nil {
			return nil, err
		}
		c, err := snapshot(run, trainSet, done, params, trainNet, hist)
		if err != nil {
			return nil, err
		}
		if err := c.Save(ckptPath); err != nil {
			return nil, err
		}
		res.Iters, res.History, res.Checkpoint = done, hist, ckptPath
		if interrupted {
			prog.Done()
			return res, &InterruptedError{Iter: done, Checkpoint: ckptPath, Cause: context.Cause(ctx)}
		}
	}
	prog.Done()
	res.Wall = time.Since(start)
	fmt.Fprintf(log, "done in %v; outputs in %s\n", res.Wall.Round(time.Second), opt.Out)
	return res, nil
}

func mib(bytes int64) float64 { return float64(bytes) / (1 << 20) }

// writeHistory draws the curves and writes the history as JSON.
func writeHistory(opt Options, hist History) error {
	if err := viz.SavePNG(filepath.Join(opt.Out, "curves.png"), curves(hist)); err != nil {
		return err
	}
	return history.WriteJSON(filepath.Join(opt.Out, "history.json"), hist)
}

// writeSheet draws the predictions of the evaluation at iteration iter.
func writeSheet(opt Options, iter int, val *data.Dataset, dets []eval.Detection) error {
	if opt.SheetImages == 0 {
		return nil
	}
	sheet := viz.PredictionSheet(val, dets, opt.SheetImages, opt.SheetScale, 0.5)
	return viz.SavePNG(filepath.Join(opt.Out, fmt.Sprintf("val_%06d.png", iter)), sheet)
}
