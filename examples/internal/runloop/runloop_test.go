package runloop

import (
	"context"
	"errors"
	"fmt"
	"image"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stheno-ml/stheno/examples/internal/checkpoint"
	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/internal/eval"
)

type metrics float64

func (m metrics) String() string { return fmt.Sprintf("AP %g", float64(m)) }

// fake is a run whose step's loss is its iteration and whose evaluation
// scores the iteration it follows.
type fake struct {
	losses   [][]float64 // AddLosses' means
	evals    []int       // AddEval's iterations
	saved    []int       // Save's iterations
	cancel   func()      // called after Step's iteration cancelAt
	cancelAt int
}

func (f *fake) hooks() Hooks[metrics] {
	return Hooks[metrics]{
		Step: func(it int, lr float64) ([]float64, any, error) {
			if f.cancel != nil && it == f.cancelAt {
				f.cancel()
			}
			return []float64{float64(it), 1}, nil, nil
		},
		Losses:    func(l []float64) string { return "loss" },
		AddLosses: func(iter int, m []float64) { f.losses = append(f.losses, append([]float64(nil), m...)) },
		Evaluate:  func() (metrics, []eval.Detection, error) { return 1, nil, nil },
		AddEval:   func(e Eval[metrics]) { f.evals = append(f.evals, e.Iter) },
		Curves:    func() image.Image { return image.NewRGBA(image.Rect(0, 0, 2, 2)) },
		History:   func() any { return f.losses },
		Save: func(iter int, path string) error {
			f.saved = append(f.saved, iter)
			return os.WriteFile(path, nil, 0o644)
		},
	}
}

func config(t *testing.T, val int) Config {
	return Config{
		Start: time.Now(), Iters: 5, Batch: 2, LR: 0.1,
		Train: &data.Dataset{}, Val: &data.Dataset{Images: make([]*data.Image, val)},
		EvalEvery: 2, LogEvery: 2, Out: t.TempDir(),
	}
}

func TestRun(t *testing.T) {
	var f fake
	cfg := config(t, 0)
	res, err := Run(context.Background(), cfg, f.hooks())
	if err != nil {
		t.Fatal(err)
	}
	if res.Iters != 5 || res.Evaluated || res.Checkpoint != filepath.Join(cfg.Out, "checkpoint.gob") {
		t.Errorf("result %+v", res)
	}
	// Means of iterations 0-1, 2-3 and 4.
	want := [][]float64{{0.5, 1}, {2.5, 1}, {4, 1}}
	if len(f.losses) != len(want) {
		t.Fatalf("losses %v, want %v", f.losses, want)
	}
	for i := range want {
		if f.losses[i][0] != want[i][0] || f.losses[i][1] != want[i][1] {
			t.Errorf("losses %v, want %v", f.losses, want)
		}
	}
	if got := f.saved; len(got) != 3 || got[0] != 2 || got[1] != 4 || got[2] != 5 {
		t.Errorf("saved after %v, want [2 4 5]", got)
	}
	for _, name := range []string{"curves.png", "history.json"} {
		if _, err := os.Stat(filepath.Join(cfg.Out, name)); err != nil {
			t.Error(err)
		}
	}
}

func TestRunInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := fake{cancel: cancel, cancelAt: 2}
	cfg := config(t, 0)
	cfg.EvalEvery = 100
	res, err := Run(ctx, cfg, f.hooks())
	var ie *checkpoint.InterruptedError
	if !errors.As(err, &ie) || ie.Iter != 3 || res.Iters != 3 {
		t.Fatalf("got %+v, %v; want an interruption after 3 iterations", res, err)
	}
	if len(f.saved) != 1 || f.saved[0] != 3 {
		t.Errorf("saved after %v, want [3]", f.saved)
	}
}

func TestRunNothingToTrain(t *testing.T) {
	var f fake
	cfg := config(t, 3)
	cfg.First, cfg.Resume = 5, "old.gob"
	var log strings.Builder
	cfg.Log = &log
	res, err := Run(context.Background(), cfg, f.hooks())
	if err != nil {
		t.Fatal(err)
	}
	if !res.Evaluated || res.Final != 1 || len(f.saved) != 0 {
		t.Errorf("result %+v, saved %v: want an evaluation and nothing saved", res, f.saved)
	}
	if !strings.Contains(log.String(), "old.gob has done 5 iterations and -iters is 5: nothing to train") {
		t.Errorf("log %q", log.String())
	}
}
