package train

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/examples/internal/option"
	"github.com/stheno-ml/stheno/examples/maskrcnn/model"
)

// RunConfig is what shapes a training run: its data, model, schedule and
// seed. A checkpoint stores it, and a run resumes only with the same one
// (Iters excepted: a run may be resumed to train longer), so that it
// continues the run that wrote the checkpoint.
type RunConfig struct {
	Iters int // training iterations in all, counting those of a resumed checkpoint
	Batch int // images per iteration (at least 2: BatchNorm needs them)

	// LR is AdamW's peak learning rate, reached after Warmup iterations of
	// linear warm-up from LR/100, and multiplied by 0.1 at each fraction of
	// Iters in Steps.
	LR          float64
	Warmup      int
	Steps       []float64
	WeightDecay float64 // decoupled, on weights only
	ClipNorm    float64 // gradients' global norm is clipped to this (0: no clipping)

	// Data is a COCO annotations file; empty means the synthetic dataset of
	// TrainImages and ValImages images.
	Data                   string
	TrainImages, ValImages int
	Seed                   uint64
	Model                  model.Config // NumClasses is set from the data
}

// Options configure Run. DefaultOptions gives the example's default run.
type Options struct {
	RunConfig
	EvalBatch int // images per inference run
	EvalEvery int // iterations between evaluations and checkpoints
	LogEvery  int // iterations each point of the loss curves averages
	Out       string
	Resume    string // checkpoint to continue from
	Log       io.Writer
	// SheetImages validation images are drawn per evaluation, each
	// SheetScale times its size.
	SheetImages, SheetScale int
	// Device trains and evaluates on a GPU (nil: the host). It is not part
	// of the run's identity: a checkpoint resumes on either.
	Device *backend.Device
	// Verbose prints, every 100 iterations, the device's memory: in use,
	// and its high-water mark.
	Verbose bool
}

// DefaultOptions is the run `go run ./examples/maskrcnn` makes.
func DefaultOptions() Options {
	return Options{
		RunConfig: RunConfig{
			Iters: 3200, Batch: 4,
			LR: 1e-3, Warmup: 100, Steps: []float64{0.75, 0.9}, WeightDecay: 1e-4, ClipNorm: 20,
			TrainImages: 2000, ValImages: 200, Seed: 1,
			Model: model.DefaultConfig(3, 64),
		},
		EvalBatch: 8, EvalEvery: 800, LogEvery: 20, Out: filepath.Join("out", "maskrcnn"),
		Log: os.Stdout, SheetImages: 8, SheetScale: 4,
	}
}

// Limits of the options that have no natural bound. They keep a typo from
// starting a run that cannot fit in memory: the default model is width 16,
// depth 1, 64-pixel images.
const (
	maxBatch     = 1024
	maxImageSize = 2048
	maxWidth     = 512
	maxDepth     = 32
	maxImages    = 1 << 24
)

// Validate checks every option against its range and the options against
// each other, and returns all problems found (errors.Join of
// *option.Error), or nil.
func (o *Options) Validate() error {
	var checks option.Checks
	check := checks.Check
	c := &o.RunConfig
	check(c.Iters >= 1, "iters", c.Iters, "must be at least 1")
	check(c.Batch >= 2 && c.Batch <= maxBatch, "batch", c.Batch, "must be in [2, %d] (BatchNorm needs 2 images)", maxBatch)
	// The coarsest pyramid level's stride divides the size: 16 for the
	// default backbone, 64 for the r50fpn preset's.
	strides := c.Model.Strides()
	top := strides[len(strides)-1]
	check(c.Model.ImageSize >= 32 && c.Model.ImageSize <= maxImageSize && c.Model.ImageSize%top == 0,
		"size", c.Model.ImageSize, "must be a multiple of %d in [32, %d]", top, maxImageSize)
	check(option.Finite(c.LR) && c.LR > 0 && c.LR <= 1, "lr", c.LR, "must be a number in (0, 1]")
	checks.Schedule(c.schedule())
	check(c.Model.Width >= 1 && c.Model.Width <= maxWidth, "width", c.Model.Width, "must be in [1, %d]", maxWidth)
	check(c.Model.Depth >= 1 && c.Model.Depth <= maxDepth, "depth", c.Model.Depth, "must be in [1, %d]", maxDepth)
	checks.Data(c.data(), maxImages)
	checks.Output(o.output(), maxBatch)
	return checks.Err()
}

// Diff lists, as "-flag: was X, now Y", the options in which c differs
// from want (a checkpoint's), Iters excepted. Data paths are compared as
// absolute paths.
func (c RunConfig) Diff(want RunConfig) []string {
	var out option.Changes
	add := out.Compare
	add("batch", c.Batch, want.Batch)
	add("lr", c.LR, want.LR)
	out.Schedule(c.schedule(), want.schedule())
	out.Data(c.data(), want.data())
	add("size", c.Model.ImageSize, want.Model.ImageSize)
	add("width", c.Model.Width, want.Model.Width)
	add("depth", c.Model.Depth, want.Model.Depth)
	// The rest of the model's configuration has no flag; a library caller
	// may still have changed it.
	a, b := c.Model, want.Model
	a.ImageSize, a.Width, a.Depth, a.NumClasses = 0, 0, 0, 0
	b.ImageSize, b.Width, b.Depth, b.NumClasses = 0, 0, 0, 0
	if fmt.Sprintf("%+v", a) != fmt.Sprintf("%+v", b) {
		out = append(out, fmt.Sprintf("model configuration: the checkpoint's is %+v, given %+v", b, a))
	}
	return slices.Clip([]string(out))
}

// schedule, data and output are c's and o's options that both examples
// have, grouped as the option package checks and compares them.
func (c RunConfig) schedule() option.Schedule {
	return option.Schedule{Warmup: c.Warmup, Steps: c.Steps, WeightDecay: c.WeightDecay, ClipNorm: c.ClipNorm}
}

func (c RunConfig) data() option.Data {
	return option.Data{Path: c.Data, TrainImages: c.TrainImages, ValImages: c.ValImages, Seed: c.Seed}
}

func (o *Options) output() option.Output {
	return option.Output{EvalBatch: o.EvalBatch, EvalEvery: o.EvalEvery, LogEvery: o.LogEvery, Out: o.Out,
		SheetImages: o.SheetImages, SheetScale: o.SheetScale}
}
