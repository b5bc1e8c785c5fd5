package train

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/examples/detr/model"
	"github.com/stheno-ml/stheno/examples/internal/option"
)

// RunConfig is what shapes a training run: its data, model, optimiser,
// schedule and seed. A checkpoint stores it, and a run resumes only with
// the same one (Iters excepted: a run may be resumed to train longer), so
// that it continues the run that wrote the checkpoint.
type RunConfig struct {
	Iters int // training iterations in all, counting those of a resumed checkpoint
	Batch int // images per iteration

	// LR is AdamW's peak learning rate of the transformer, reached after
	// Warmup iterations of linear warm-up from LR/100 and multiplied by 0.1
	// at each fraction of Iters in Steps. The backbone trains at
	// LRBackbone, the sampling offsets and reference points at
	// LR*LRLinearProjMult, on the same schedule (the reference's lr,
	// lr_backbone, lr_linear_proj_mult, lr_drop).
	LR, LRBackbone, LRLinearProjMult float64
	Warmup                           int
	Steps                            []float64
	WeightDecay                      float64 // decoupled, on every parameter
	ClipNorm                         float64 // gradients' global norm is clipped to this (0: no clipping)

	// Data is a COCO annotations file; empty means the synthetic dataset of
	// TrainImages and ValImages images.
	Data                   string
	TrainImages, ValImages int
	Seed                   uint64
	Model                  model.Config // NumClasses is set from the data
}

// optimizer is the model's AdamW configuration of c.
func (c RunConfig) optimizer() model.OptimizerConfig {
	return model.OptimizerConfig{WeightDecay: c.WeightDecay, ClipNorm: c.ClipNorm,
		BackboneLRMult: c.LRBackbone / c.LR, LinearProjLRMult: c.LRLinearProjMult}
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

// Presets are the named runs -preset selects: "cpu", the default, a small
// network trained from scratch on the host in minutes; "r50", the
// reference's network (model.GPUConfig) and optimiser on 512x512 images,
// batches of 8, for a GPU.
var Presets = []string{"cpu", "r50"}

// DefaultOptions is the run `go run ./examples/detr` makes: Preset("cpu").
func DefaultOptions() Options {
	o, _ := Preset("cpu")
	return o
}

// Preset returns the named preset's options (see Presets).
//
// "cpu" departs from the reference where measurement on the 2-core machine
// said so (README, "The Deformable DETR example"): a tiny network trained
// from scratch for minutes learns at a higher rate, its backbone, not
// pretrained, at the transformer's, and without dropout.
func Preset(name string) (Options, error) {
	o := Options{
		RunConfig: RunConfig{
			TrainImages: 2000, ValImages: 200, Seed: 1,
		},
		EvalBatch: 8, LogEvery: 20, Out: filepath.Join("out", "detr"),
		Log: os.Stdout, SheetImages: 8, SheetScale: 4,
	}
	switch name {
	case "cpu":
		o.Iters, o.Batch = 2500, 4
		o.LR, o.LRBackbone, o.LRLinearProjMult = 1e-3, 1e-3, 0.1
		o.Warmup, o.Steps = 100, []float64{0.8}
		o.WeightDecay, o.ClipNorm = 1e-4, 0.1
		o.Model = model.DefaultConfig(3)
		// No dropout: a network this small, trained this briefly, does
		// not overfit the 2000 images, and the masks cost 8% of a step.
		o.Model.Dropout = 0
		o.EvalEvery = 500
	case "r50":
		o.Iters, o.Batch = 5000, 8
		o.LR, o.LRBackbone, o.LRLinearProjMult = 2e-4, 2e-5, model.LinearProjLRMult
		o.Warmup, o.Steps = 0, []float64{0.8}
		ref := model.ReferenceOptimizer()
		o.WeightDecay, o.ClipNorm = ref.WeightDecay, ref.ClipNorm
		o.Model = model.GPUConfig(3, 512)
		o.EvalEvery = 1000
	default:
		return Options{}, &option.Error{Option: "preset", Value: fmt.Sprintf("%q", name), Allowed: "must be one of " + strings.Join(Presets, ", ")}
	}
	return o, nil
}

// Limits of the options that have no natural bound. They keep a typo from
// starting a run that cannot fit in memory.
const (
	maxBatch     = 1024
	maxImageSize = 2048
	maxWidth     = 512
	maxDepth     = 32
	maxDModel    = 2048
	maxLayers    = 32
	maxQueries   = 4096
	maxImages    = 1 << 24
)

// Validate checks every option against its range and the options against
// each other, and returns all problems found (errors.Join of
// *option.Error), or nil.
func (o *Options) Validate() error {
	var checks option.Checks
	check := checks.Check
	c := &o.RunConfig
	m := &c.Model
	check(c.Iters >= 1, "iters", c.Iters, "must be at least 1")
	check(c.Batch >= 2 && c.Batch <= maxBatch, "batch", c.Batch, "must be in [2, %d] (BatchNorm needs 2 images)", maxBatch)
	stride := 1 << (m.Stages + 2)
	check(m.Stages >= 3 && m.ImageSize >= stride && m.ImageSize <= maxImageSize && m.ImageSize%stride == 0,
		"size", m.ImageSize, "must be a multiple of %d in [%d, %d] (the coarsest level's stride)", stride, stride, maxImageSize)
	check(option.Finite(c.LR) && c.LR > 0 && c.LR <= 1, "lr", c.LR, "must be a number in (0, 1]")
	check(option.Finite(c.LRBackbone) && c.LRBackbone >= 0 && c.LRBackbone <= 1, "lr-backbone", c.LRBackbone, "must be a number in [0, 1] (0: a frozen backbone)")
	check(option.Finite(c.LRLinearProjMult) && c.LRLinearProjMult >= 0 && c.LRLinearProjMult <= 10, "lr-linear-proj-mult", c.LRLinearProjMult, "must be a number in [0, 10]")
	checks.Schedule(c.schedule())
	check(m.Width >= 1 && m.Width <= maxWidth, "width", m.Width, "must be in [1, %d]", maxWidth)
	check(m.Depth >= 1 && m.Depth <= maxDepth, "depth", m.Depth, "must be in [1, %d]", maxDepth)
	unit := lcm(4, lcm(max(m.Heads, 1), max(m.NormGroups, 1)))
	check(m.DModel >= unit && m.DModel <= maxDModel && m.DModel%unit == 0, "dmodel", m.DModel,
		"must be a multiple of %d in [%d, %d] (of 4, the %d heads and the %d GroupNorm groups)", unit, unit, maxDModel, m.Heads, m.NormGroups)
	check(m.EncLayers >= 1 && m.EncLayers <= maxLayers, "enc-layers", m.EncLayers, "must be in [1, %d]", maxLayers)
	check(m.DecLayers >= 1 && m.DecLayers <= maxLayers, "dec-layers", m.DecLayers, "must be in [1, %d]", maxLayers)
	check(m.Queries >= 1 && m.Queries <= maxQueries, "queries", m.Queries, "must be in [1, %d]", maxQueries)
	check(!m.TwoStage || m.BoxRefine, "two-stage", m.TwoStage, "needs -box-refine (the reference's two-stage refines boxes)")
	if m.TwoStage && m.Stages >= 3 && m.ImageSize >= stride && m.ImageSize%stride == 0 {
		check(m.Queries <= m.Tokens(), "queries", m.Queries, "must not exceed the encoder's %d tokens with -two-stage (the queries are its best proposals)", m.Tokens())
	}
	checks.Data(c.data(), maxImages)
	checks.Output(o.output(), maxBatch)
	if err := checks.Err(); err != nil {
		return err
	}
	// The rest of the model's configuration has no flag; a library caller
	// may still have made it wrong.
	mc := *m
	if mc.NumClasses < 1 {
		mc.NumClasses = 1 // set from the data
	}
	return mc.Validate()
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func lcm(a, b int) int { return a / gcd(a, b) * b }

// Diff lists, as "-flag: was X, now Y", the options in which c differs
// from want (a checkpoint's), Iters excepted. Data paths are compared as
// absolute paths.
func (c RunConfig) Diff(want RunConfig) []string {
	var out option.Changes
	add := out.Compare
	add("batch", c.Batch, want.Batch)
	add("lr", c.LR, want.LR)
	add("lr-backbone", c.LRBackbone, want.LRBackbone)
	add("lr-linear-proj-mult", c.LRLinearProjMult, want.LRLinearProjMult)
	out.Schedule(c.schedule(), want.schedule())
	out.Data(c.data(), want.data())
	a, b := c.Model, want.Model
	add("size", a.ImageSize, b.ImageSize)
	add("width", a.Width, b.Width)
	add("depth", a.Depth, b.Depth)
	add("dmodel", a.DModel, b.DModel)
	add("enc-layers", a.EncLayers, b.EncLayers)
	add("dec-layers", a.DecLayers, b.DecLayers)
	add("queries", a.Queries, b.Queries)
	add("box-refine", a.BoxRefine, b.BoxRefine)
	add("two-stage", a.TwoStage, b.TwoStage)
	// The rest of the model's configuration has no flag but -preset; a
	// library caller may also have changed it.
	for _, m := range []*model.Config{&a, &b} {
		m.ImageSize, m.Width, m.Depth, m.DModel, m.EncLayers, m.DecLayers, m.Queries, m.NumClasses = 0, 0, 0, 0, 0, 0, 0, 0
		m.BoxRefine, m.TwoStage = false, false
	}
	if fmt.Sprintf("%+v", a) != fmt.Sprintf("%+v", b) {
		out = append(out, fmt.Sprintf("model configuration (-preset): the checkpoint's is %+v, given %+v", b, a))
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
