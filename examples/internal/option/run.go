package option

import "fmt"

// The options below are those both examples' runs have, each group
// checked, and compared with a checkpoint's, the same way.

// Schedule is the optimiser's options after the learning rate: its warm-up
// iterations, the fractions of the run at which the rate steps down, the
// weight decay and the gradients' clipping norm.
type Schedule struct {
	Warmup      int
	Steps       []float64
	WeightDecay float64
	ClipNorm    float64
}

// Schedule checks s (-warmup, -steps, -wd, -clip).
func (c *Checks) Schedule(s Schedule) {
	c.Check(s.Warmup >= 0, "warmup", s.Warmup, "must be at least 0")
	c.Check(IncreasingFractions(s.Steps), "steps", FormatList(s.Steps), "must be increasing fractions of -iters in (0, 1)")
	c.Check(Finite(s.WeightDecay) && s.WeightDecay >= 0 && s.WeightDecay < 1, "wd", s.WeightDecay, "must be a number in [0, 1)")
	c.Check(Finite(s.ClipNorm) && s.ClipNorm >= 0, "clip", s.ClipNorm, "must be a number >= 0 (0: no clipping)")
}

// Schedule compares the schedules given and saved.
func (c *Changes) Schedule(given, saved Schedule) {
	c.Compare("warmup", given.Warmup, saved.Warmup)
	c.Compare("steps", FormatList(given.Steps), FormatList(saved.Steps))
	c.Compare("wd", given.WeightDecay, saved.WeightDecay)
	c.Compare("clip", given.ClipNorm, saved.ClipNorm)
}

// Data is a run's data: a COCO annotations file (Path), or with Path
// empty the synthetic dataset of TrainImages and ValImages images; and the
// seed of the run.
type Data struct {
	Path                   string
	TrainImages, ValImages int
	Seed                   uint64
}

// Data checks the synthetic dataset's sizes (-train-images, -val-images)
// against maxImages.
func (c *Checks) Data(d Data, maxImages int) {
	if d.Path == "" {
		c.Check(d.TrainImages >= 1 && d.TrainImages <= maxImages, "train-images", d.TrainImages, "must be in [1, %d]", maxImages)
		c.Check(d.ValImages >= 0 && d.ValImages <= maxImages, "val-images", d.ValImages, "must be in [0, %d] (0: no evaluation)", maxImages)
	}
}

// Data compares the data given and saved: the files as absolute paths,
// the synthetic datasets by size, and the seeds.
func (c *Changes) Data(given, saved Data) {
	name := func(p string) string {
		if p == "" {
			return "(synthetic)"
		}
		return AbsPath(p)
	}
	c.Compare("data", name(given.Path), name(saved.Path))
	if given.Path == "" && saved.Path == "" {
		c.Compare("train-images", given.TrainImages, saved.TrainImages)
		c.Compare("val-images", given.ValImages, saved.ValImages)
	}
	c.Compare("seed", given.Seed, saved.Seed)
}

// Output is how a run reports: the images per inference run and the
// iterations between evaluations (and checkpoints), the iterations each
// point of the loss curves averages, the output directory, and the
// validation images drawn at each evaluation with their scale.
type Output struct {
	EvalBatch, EvalEvery, LogEvery int
	Out                            string
	SheetImages, SheetScale        int
}

// Output checks o (-eval-every, -eval-batch, -log-every, -out, -sheet),
// EvalBatch against maxBatch.
func (c *Checks) Output(o Output, maxBatch int) {
	c.Check(o.EvalEvery >= 1, "eval-every", o.EvalEvery, "must be at least 1")
	c.Check(o.EvalBatch >= 1 && o.EvalBatch <= maxBatch, "eval-batch", o.EvalBatch, "must be in [1, %d]", maxBatch)
	c.Check(o.LogEvery >= 1, "log-every", o.LogEvery, "must be at least 1")
	c.Check(o.Out != "", "out", `""`, "must name a directory")
	c.Check(o.SheetImages >= 0 && o.SheetScale >= 1, "sheet", fmt.Sprintf("%d images at %dx", o.SheetImages, o.SheetScale),
		"needs at least 0 images at 1x or more")
}
