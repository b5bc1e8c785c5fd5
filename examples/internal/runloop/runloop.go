package runloop

import (
	"context"
	"fmt"
	"image"
	"io"
	"math"
	"path/filepath"
	"time"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/examples/internal/checkpoint"
	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/internal/eval"
	"github.com/stheno-ml/stheno/examples/internal/history"
	"github.com/stheno-ml/stheno/examples/internal/progress"
	"github.com/stheno-ml/stheno/examples/internal/schedule"
	"github.com/stheno-ml/stheno/examples/internal/viz"
)

// Config is what the loop needs of a run.
type Config struct {
	Start time.Time // the run's start, for the evaluations' Seconds and Result.Wall
	Log   io.Writer // nil: io.Discard

	Iters, Batch int
	First        int    // iterations done before this process (a resumed checkpoint's)
	Resume       string // the checkpoint resumed, empty if none

	// The learning rate schedule: linear warm-up over Warmup iterations
	// from LR/100 to LR, then LR times 0.1 at each fraction of Iters in
	// Steps.
	LR     float64
	Warmup int
	Steps  []float64

	Data       string        // the annotations file, empty for synthetic data
	Train, Val *data.Dataset // Val may be empty: no evaluations then

	EvalEvery, LogEvery     int
	Out                     string
	SheetImages, SheetScale int
	SheetScoreMin           float64 // lowest score drawn in val_*.png

	Device  *backend.Device // nil: the host
	Verbose bool            // print the device's memory and graph replays every 100 iterations

	// Model and Optimizer describe the run in its introduction: Model is
	// the first line, Optimizer the optimiser's part of the second
	// ("AdamW lr 0.001").
	Model, Optimizer string
}

// Hooks are the example's parts of the loop. Metrics M print as one line.
type Hooks[M fmt.Stringer] struct {
	// Step trains iteration it at learning rate lr and returns its losses,
	// the total first, and what an error about them prints (with %+v).
	Step func(it int, lr float64) (losses []float64, detail any, err error)
	// Losses formats a step's losses for the progress line ("loss 1.234
	// (cls ...)").
	Losses func(losses []float64) string
	// AddLosses records the losses' means over the iterations ending at
	// iter in the history.
	AddLosses func(iter int, means []float64)
	// Evaluate predicts on the validation images and scores the
	// predictions; it is not called when there are none.
	Evaluate func() (M, []eval.Detection, error)
	// AddEval records an evaluation in the history.
	AddEval func(Eval[M])
	// Curves draws the history as curves.png; History is what
	// history.json holds.
	Curves  func() image.Image
	History func() any
	// Save writes the checkpoint after iter iterations to path.
	Save func(iter int, path string) error
}

// Eval is one periodic evaluation.
type Eval[M any] struct {
	Iter                 int
	Seconds              float64 // wall time into the run (of this process)
	Metrics              M
	TrainImagesPerSecond float64 // over the run so far (this process)
	InferImagesPerSecond float64 // of this evaluation
	ValidationImages     int
}

// Result summarises a run.
type Result[M any] struct {
	Iters      int  // iterations done in all
	Evaluated  bool // Final holds an evaluation
	Final      M
	Wall       time.Duration
	Checkpoint string // the checkpoint written last; empty when nothing was trained
}

// Run trains from cfg.First to cfg.Iters iterations, evaluating, drawing
// and saving every cfg.EvalEvery iterations and at the end; with
// cfg.First >= cfg.Iters it trains nothing and evaluates. When ctx is
// cancelled it finishes the iteration under way, saves it and returns the
// result so far with a *checkpoint.InterruptedError.
func Run[M fmt.Stringer](ctx context.Context, cfg Config, h Hooks[M]) (*Result[M], error) {
	log := cfg.Log
	if log == nil {
		log = io.Discard
	}
	res := &Result[M]{Iters: cfg.First}
	prog := progress.New(log, cfg.Iters)
	validate := len(cfg.Val.Images) > 0
	evaluate := func(iter int) (M, []eval.Detection, error) {
		te := time.Now()
		m, dets, err := h.Evaluate()
		if err != nil {
			return m, nil, err
		}
		res.Final, res.Evaluated = m, true
		prog.Println("iteration %d: %v (%d images, %.1fs)", iter, m, len(cfg.Val.Images), time.Since(te).Seconds())
		return m, dets, nil
	}
	if cfg.First >= cfg.Iters {
		fmt.Fprintf(log, "%s has done %d iterations and -iters is %d: nothing to train; evaluating the checkpoint as it is\n", cfg.Resume, cfg.First, cfg.Iters)
		if !validate {
			fmt.Fprintln(log, "no validation images: nothing to evaluate")
		} else if _, _, err := evaluate(cfg.First); err != nil {
			return nil, err
		}
		res.Wall = time.Since(cfg.Start)
		return res, nil
	}

	if cfg.Resume != "" {
		fmt.Fprintf(log, "resuming %s at iteration %d\n", cfg.Resume, cfg.First)
	}
	sched := schedule.WarmupMultiStep{LR: cfg.LR, Warmup: cfg.Warmup, WarmupFactor: 0.01, Gamma: 0.1}
	for _, f := range cfg.Steps {
		sched.Steps = append(sched.Steps, int(f*float64(cfg.Iters)))
	}
	fmt.Fprintln(log, cfg.Model)
	if cfg.Train.ClippedBoxes > 0 {
		fmt.Fprintf(log, "%d boxes of %s crossed their image's border and were clipped to it\n", cfg.Train.ClippedBoxes, cfg.Data)
	}
	if !validate {
		fmt.Fprintln(log, "no validation images: evaluations and pictures of predictions are skipped")
	}
	where := "on the CPU"
	if cfg.Device != nil {
		where = "on " + cfg.Device.String()
	}
	fmt.Fprintf(log, "training %d iterations of %d images %s, %s, output in %s\n", cfg.Iters, cfg.Batch, where, cfg.Optimizer, cfg.Out)

	ckptPath := filepath.Join(cfg.Out, "checkpoint.gob")
	var sums []float64
	var nsum int
	trainTime := time.Duration(0)
	trainIters := 0
	for it := cfg.First; it < cfg.Iters; it++ {
		t0 := time.Now()
		lr := sched.At(it)
		losses, detail, err := h.Step(it, lr)
		if err != nil {
			return nil, fmt.Errorf("train: iteration %d: %w", it, err)
		}
		if math.IsNaN(losses[0]) || math.IsInf(losses[0], 0) {
			return nil, fmt.Errorf("train: iteration %d: the loss is %v (%+v); try a lower -lr", it, losses[0], detail)
		}
		trainTime += time.Since(t0)
		trainIters++
		if sums == nil {
			sums = make([]float64, len(losses))
		}
		for i, v := range losses {
			sums[i] += v
		}
		nsum++
		done := it + 1
		last := done == cfg.Iters
		if done%cfg.LogEvery == 0 || last {
			for i := range sums {
				sums[i] /= float64(nsum)
			}
			h.AddLosses(done, sums)
			sums, nsum = nil, 0
		}
		rate := float64(trainIters*cfg.Batch) / trainTime.Seconds()
		remaining := time.Duration(float64(cfg.Iters-done) * float64(cfg.Batch) / rate * float64(time.Second))
		prog.Update(done, fmt.Sprintf("%s lr %.1e %.1f img/s ETA %s", h.Losses(losses), lr, rate, progress.ETA(remaining)), last)
		if cfg.Verbose && cfg.Device != nil && (done%100 == 0 || last) {
			m, g := cfg.Device.MemStats(), cfg.Device.GraphStats()
			prog.Println("iteration %d: device memory in use %.1f MiB, high-water mark %.1f MiB, cached %.1f MiB, reserved %.1f MiB (at most %.1f), driver allocations %d; stretches of launches replayed as CUDA graphs %d, issued one by one %d",
				done, mib(m.InUse), mib(m.PeakInUse), mib(m.Cached), mib(m.Reserved), mib(m.PeakReserved), m.DriverAllocs, g.Replays, g.Direct)
		}

		periodic := done%cfg.EvalEvery == 0 || last
		interrupted := ctx.Err() != nil && !last
		if !periodic && !interrupted {
			continue
		}
		if periodic && validate {
			te := time.Now()
			m, dets, err := evaluate(done)
			if err != nil {
				return nil, err
			}
			h.AddEval(Eval[M]{
				Iter: done, Seconds: time.Since(cfg.Start).Seconds(), Metrics: m,
				TrainImagesPerSecond: rate,
				InferImagesPerSecond: float64(len(cfg.Val.Images)) / time.Since(te).Seconds(),
				ValidationImages:     len(cfg.Val.Images),
			})
			if err := writeSheet(cfg, done, dets); err != nil {
				return nil, err
			}
		}
		if err := writeHistory(cfg.Out, h); err != nil {
			return nil, err
		}
		if err := h.Save(done, ckptPath); err != nil {
			return nil, err
		}
		res.Iters, res.Checkpoint = done, ckptPath
		if interrupted {
			prog.Done()
			return res, &checkpoint.InterruptedError{Iter: done, Checkpoint: ckptPath, Cause: context.Cause(ctx)}
		}
	}
	prog.Done()
	res.Wall = time.Since(cfg.Start)
	fmt.Fprintf(log, "done in %v; outputs in %s\n", res.Wall.Round(time.Second), cfg.Out)
	return res, nil
}

func mib(bytes int64) float64 { return float64(bytes) / (1 << 20) }

// writeHistory draws the curves and writes the history as JSON.
func writeHistory[M fmt.Stringer](out string, h Hooks[M]) error {
	if err := viz.SavePNG(filepath.Join(out, "curves.png"), h.Curves()); err != nil {
		return err
	}
	return history.WriteJSON(filepath.Join(out, "history.json"), h.History())
}

// writeSheet draws the predictions of the evaluation at iteration iter.
func writeSheet(cfg Config, iter int, dets []eval.Detection) error {
	if cfg.SheetImages == 0 {
		return nil
	}
	sheet := viz.PredictionSheet(cfg.Val, dets, cfg.SheetImages, cfg.SheetScale, cfg.SheetScoreMin)
	return viz.SavePNG(filepath.Join(cfg.Out, fmt.Sprintf("val_%06d.png", iter)), sheet)
}
