package train

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/stheno-ml/stheno/examples/maskrcnn/data"
	"github.com/stheno-ml/stheno/examples/maskrcnn/eval"
	"github.com/stheno-ml/stheno/examples/maskrcnn/model"
	"github.com/stheno-ml/stheno/examples/maskrcnn/viz"
)

// Options configure Run. DefaultOptions gives the ten-minute CPU run.
type Options struct {
	Iters     int // training iterations (in all, counting those of a resumed checkpoint)
	Batch     int // images per iteration
	EvalBatch int // images per inference run

	// LR is AdamW's peak learning rate, reached after Warmup iterations of
	// linear warm-up from LR/100, and multiplied by 0.1 at each fraction of
	// Iters in Steps.
	LR          float64
	Warmup      int
	Steps       []float64
	WeightDecay float64
	ClipNorm    float64

	// Data is a COCO annotations file; empty means the synthetic dataset of
	// TrainImages and ValImages images.
	Data                    string
	TrainImages, ValImages  int
	Seed                    uint64
	Model                   model.Config // NumClasses is set from the data
	EvalEvery               int          // iterations between evaluations (and checkpoints)
	LogEvery                int          // iterations each point of the loss curves averages
	Out                     string       // output directory, created
	Resume                  string       // checkpoint to continue from
	Log                     io.Writer
	SheetImages, SheetScale int // validation images drawn per evaluation, and their zoom
}

// DefaultOptions is the run `go run ./examples/maskrcnn` makes.
func DefaultOptions() Options {
	return Options{
		Iters: 3200, Batch: 4, EvalBatch: 8,
		LR: 1e-3, Warmup: 100, Steps: []float64{0.75, 0.9}, WeightDecay: 1e-4, ClipNorm: 20,
		TrainImages: 2000, ValImages: 200, Seed: 1,
		Model:     model.DefaultConfig(3, 64),
		EvalEvery: 800, LogEvery: 20, Out: filepath.Join("out", "maskrcnn"),
		Log: os.Stdout, SheetImages: 8, SheetScale: 4,
	}
}

// Result summarises a run.
type Result struct {
	Iters      int
	Final      Metrics
	History    History
	Wall       time.Duration
	Checkpoint string
}

// Run trains the model as opt says, evaluating, plotting and saving a
// checkpoint every EvalEvery iterations and at the end.
func Run(opt Options) (*Result, error) {
	start := time.Now()
	log := opt.Log
	if log == nil {
		log = io.Discard
	}
	if opt.Iters < 1 || opt.Batch < 2 || opt.EvalBatch < 1 || opt.EvalEvery < 1 || opt.LogEvery < 1 {
		return nil, fmt.Errorf("train: need Iters >= 1, Batch >= 2, EvalBatch >= 1, EvalEvery >= 1 and LogEvery >= 1")
	}
	if err := os.MkdirAll(opt.Out, 0o755); err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}

	var ckpt *Checkpoint
	cfg, seed := opt.Model, opt.Seed
	if opt.Resume != "" {
		var err error
		if ckpt, err = LoadCheckpoint(opt.Resume); err != nil {
			return nil, err
		}
		// The checkpoint decides the model and the seed: anything else
		// would not continue the same run.
		cfg, seed = ckpt.Config, ckpt.Seed
	}
	trainSet, valSet, err := loadData(opt.Data, seed, opt.TrainImages, opt.ValImages, cfg.ImageSize)
	if err != nil {
		return nil, err
	}
	if ckpt != nil && len(ckpt.Classes) != len(trainSet.Classes) {
		return nil, fmt.Errorf("train: the checkpoint has %d classes, the data %d", len(ckpt.Classes), len(trainSet.Classes))
	}
	cfg.NumClasses = len(trainSet.Classes)

	params := model.NewParams(seed)
	trainNet, err := model.Build(cfg, params, model.Train, opt.Batch, nil)
	if err != nil {
		return nil, err
	}
	defer trainNet.Close()
	inferNet, err := model.Build(cfg, params, model.Infer, opt.EvalBatch, nil)
	if err != nil {
		return nil, err
	}
	defer inferNet.Close()
	adam := NewAdam(opt.WeightDecay, opt.ClipNorm)
	first := 0
	var hist History
	if ckpt != nil {
		if err := ckpt.restore(params, adam); err != nil {
			return nil, err
		}
		first, hist = ckpt.Iter, ckpt.History
		fmt.Fprintf(log, "resuming %s at iteration %d\n", opt.Resume, first)
	}
	sched := Schedule{LR: opt.LR, Warmup: opt.Warmup, WarmupFactor: 0.01, Gamma: 0.1}
	for _, f := range opt.Steps {
		sched.Steps = append(sched.Steps, int(f*float64(opt.Iters)))
	}
	fmt.Fprintf(log, "Mask R-CNN: %d parameters, %dx%d images, %d classes; %d training and %d validation images\n",
		params.Size(), cfg.ImageSize, cfg.ImageSize, cfg.NumClasses, len(trainSet.Images), len(valSet.Images))
	fmt.Fprintf(log, "training %d iterations of %d images, AdamW lr %g, output in %s\n", opt.Iters, opt.Batch, opt.LR, opt.Out)

	ckptPath := filepath.Join(opt.Out, "checkpoint.gob")
	prog := newProgress(log, opt.Iters)
	var sums model.Losses
	var nsum int
	trainTime := time.Duration(0)
	trainIters := 0
	var last Metrics
	for it := first; it < opt.Iters; it++ {
		t0 := time.Now()
		imgs := batchOf(trainSet.Images, seed, it, opt.Batch)
		pix := make([][]float32, len(imgs))
		targets := make([]model.Target, len(imgs))
		for i, img := range imgs {
			pix[i], targets[i] = img.Pix, TargetOf(img)
		}
		losses, err := trainNet.TrainStep(pix, targets, stepRNG(seed, it))
		if err != nil {
			return nil, fmt.Errorf("train: iteration %d: %w", it, err)
		}
		if math.IsNaN(losses[0]) || math.IsInf(losses[0], 0) {
			return nil, fmt.Errorf("train: iteration %d: the loss is %v (%v); try a lower -lr", it, losses[0], losses)
		}
		lr := sched.At(it)
		if _, err := adam.Update(params, trainNet.ParamNames(), trainNet.Grads(), lr); err != nil {
			return nil, fmt.Errorf("train: iteration %d: %w", it, err)
		}
		trainTime += time.Since(t0)
		trainIters++
		for i, v := range losses {
			sums[i] += v
		}
		nsum++
		done := it + 1
		if done%opt.LogEvery == 0 || done == opt.Iters {
			for i := range sums {
				sums[i] /= float64(nsum)
			}
			hist.Losses = append(hist.Losses, lossPoint(done, sums))
			sums, nsum = model.Losses{}, 0
		}
		rate := float64(trainIters*opt.Batch) / trainTime.Seconds()
		remaining := time.Duration(float64(opt.Iters-done) * float64(opt.Batch) / rate * float64(time.Second))
		prog.update(done, fmt.Sprintf("loss %.3f (rpn %.3f/%.3f cls %.3f box %.3f mask %.3f) lr %.1e %.1f img/s ETA %s",
			losses[0], losses[1], losses[2], losses[3], losses[4], losses[5], lr, rate, eta(remaining)), done == opt.Iters)

		if done%opt.EvalEvery != 0 && done != opt.Iters {
			continue
		}
		te := time.Now()
		m, dets, err := Evaluate(inferNet, valSet)
		if err != nil {
			return nil, err
		}
		evalTime := time.Since(te)
		last = m
		hist.Evals = append(hist.Evals, EvalPoint{
			Iter: done, Seconds: time.Since(start).Seconds(),
			Box: apsOf(m.Box), Mask: apsOf(m.Mask),
			TrainImagesPerSecond: rate,
			InferImagesPerSecond: float64(len(valSet.Images)) / evalTime.Seconds(),
			ValidationImages:     len(valSet.Images),
		})
		prog.println("iteration %d: box AP %.3f AP50 %.3f AP75 %.3f | mask AP %.3f AP50 %.3f AP75 %.3f (%d images, %.1fs)",
			done, m.Box.AP, m.Box.AP50, m.Box.AP75, m.Mask.AP, m.Mask.AP50, m.Mask.AP75, len(valSet.Images), evalTime.Seconds())
		if err := writeOutputs(opt, done, valSet, dets, hist); err != nil {
			return nil, err
		}
		if err := snapshot(cfg, trainSet.Classes, seed, done, params, adam, hist).Save(ckptPath); err != nil {
			return nil, err
		}
	}
	prog.done()
	res := &Result{Iters: opt.Iters, Final: last, History: hist, Wall: time.Since(start), Checkpoint: ckptPath}
	if first >= opt.Iters {
		fmt.Fprintf(log, "the checkpoint has already done %d of %d iterations\n", first, opt.Iters)
	}
	fmt.Fprintf(log, "done in %v; outputs in %s\n", res.Wall.Round(time.Second), opt.Out)
	return res, nil
}

// writeOutputs draws the curves and the predictions of an evaluation and
// writes the history as JSON.
func writeOutputs(opt Options, iter int, val *data.Dataset, dets []eval.Detection, hist History) error {
	if err := viz.SavePNG(filepath.Join(opt.Out, "curves.png"), curves(hist)); err != nil {
		return err
	}
	sheet := predictionSheet(val, dets, opt.SheetImages, opt.SheetScale)
	if err := viz.SavePNG(filepath.Join(opt.Out, fmt.Sprintf("val_%06d.png", iter)), sheet); err != nil {
		return err
	}
	js, err := json.MarshalIndent(hist, "", " ")
	if err != nil {
		return fmt.Errorf("train: %w", err)
	}
	if err := os.WriteFile(filepath.Join(opt.Out, "history.json"), js, 0o644); err != nil {
		return fmt.Errorf("train: %w", err)
	}
	return nil
}
