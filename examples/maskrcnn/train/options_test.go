package train

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stheno-ml/stheno/examples/internal/option"
)

// Every option out of its range is reported with its flag's name and what
// it allows, all at once, before any work.
func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(*Options)
		want   []string // each must appear in the error
	}{
		{"train images 0", func(o *Options) { o.TrainImages = 0 }, []string{"-train-images 0: must be in [1, "}},
		{"val images negative", func(o *Options) { o.ValImages = -1 }, []string{"-val-images -1: must be in [0, "}},
		{"lr negative", func(o *Options) { o.LR = -1 }, []string{"-lr -1: must be a number in (0, 1]"}},
		{"lr NaN", func(o *Options) { o.LR = math.NaN() }, []string{"-lr NaN: must be a number in (0, 1]"}},
		{"lr Inf", func(o *Options) { o.LR = math.Inf(1) }, []string{"-lr +Inf"}},
		{"warmup negative", func(o *Options) { o.Warmup = -5 }, []string{"-warmup -5: must be at least 0"}},
		{"size 16", func(o *Options) { o.Model.ImageSize = 16 }, []string{"-size 16: must be a multiple of 16 in [32, 2048]"}},
		{"size 40", func(o *Options) { o.Model.ImageSize = 40 }, []string{"-size 40: must be a multiple of 16"}},
		{"batch 1", func(o *Options) { o.Batch = 1 }, []string{"-batch 1: must be in [2, 1024]"}},
		{"iters 0", func(o *Options) { o.Iters = 0 }, []string{"-iters 0: must be at least 1"}},
		{"steps unsorted", func(o *Options) { o.Steps = []float64{0.9, 0.5} }, []string{"-steps 0.9,0.5: must be increasing fractions"}},
		{"steps past the end", func(o *Options) { o.Steps = []float64{0.5, 1} }, []string{"-steps 0.5,1"}},
		{"steps NaN", func(o *Options) { o.Steps = []float64{math.NaN()} }, []string{"-steps NaN"}},
		{"wd", func(o *Options) { o.WeightDecay = -0.1 }, []string{"-wd -0.1: must be a number in [0, 1)"}},
		{"clip NaN", func(o *Options) { o.ClipNorm = math.NaN() }, []string{"-clip NaN"}},
		{"width", func(o *Options) { o.Model.Width = 0 }, []string{"-width 0: must be in [1, 512]"}},
		{"depth", func(o *Options) { o.Model.Depth = 100 }, []string{"-depth 100: must be in [1, 32]"}},
		{"eval every", func(o *Options) { o.EvalEvery = 0 }, []string{"-eval-every 0: must be at least 1"}},
		{"no out", func(o *Options) { o.Out = "" }, []string{"-out"}},
		{"several at once", func(o *Options) { o.LR, o.Warmup = -1, -5 }, []string{"-lr -1", "-warmup -5"}},
	} {
		o := DefaultOptions()
		tc.modify(&o)
		err := o.Validate()
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: Validate() = %v, want an error containing %q", tc.name, err, w)
			}
		}
		var oe *option.Error
		if err != nil && !errors.As(err, &oe) {
			t.Errorf("%s: %v is not an *option.Error", tc.name, err)
		}
		// Run refuses before it does anything: no output directory.
		o.Out = filepath.Join(t.TempDir(), "out")
		if tc.name == "no out" {
			o.Out = ""
		}
		start := time.Now()
		if _, err := Run(context.Background(), o); err == nil || time.Since(start) > time.Second {
			t.Errorf("%s: Run = %v after %v, want an error at once", tc.name, err, time.Since(start))
		}
		if _, err := os.Stat(o.Out); err == nil {
			t.Errorf("%s: Run created %s before refusing", tc.name, o.Out)
		}
	}
	o := DefaultOptions()
	if err := o.Validate(); err != nil {
		t.Errorf("the default options: %v", err)
	}
	// With -data, the synthetic counts are not used, so not checked.
	o.Data, o.TrainImages, o.ValImages = "x.json", 0, 0
	if err := o.Validate(); err != nil {
		t.Errorf("-data with no synthetic counts: %v", err)
	}
}

func TestDiff(t *testing.T) {
	a := DefaultOptions().RunConfig
	b := a
	b.Iters, b.LR, b.Steps, b.Model.Width = 99, 0.5, []float64{0.5}, 8
	got := strings.Join(b.Diff(a), "\n")
	for _, want := range []string{"-lr: the checkpoint's is 0.001, given 0.5", "-steps: the checkpoint's is 0.75,0.9, given 0.5", "-width: the checkpoint's is 16, given 8"} {
		if !strings.Contains(got, want) {
			t.Errorf("Diff = %q, want it to contain %q", got, want)
		}
	}
	if strings.Contains(got, "iters") {
		t.Errorf("Diff = %q lists -iters, which may change", got)
	}
	if d := a.Diff(a); len(d) != 0 {
		t.Errorf("a config differs from itself: %q", d)
	}
	c := a
	c.Model.RPNNMS = 0.5
	if d := c.Diff(a); len(d) != 1 || !strings.Contains(d[0], "model configuration") {
		t.Errorf("a change of a flag-less model field: %q", d)
	}
}
