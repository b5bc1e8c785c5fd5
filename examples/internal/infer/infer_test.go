package infer

import (
	"errors"
	"strings"
	"testing"

	"github.com/stheno-ml/stheno/examples/internal/option"
)

// Bad options are refused before the checkpoint is read.
func TestRunBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opt   Options
		want  string
		isOpt bool
	}{
		{"zero batch", Options{Batch: 0}, "Batch must be in [1, 8], got 0", false},
		{"big batch", Options{Batch: 9}, "Batch must be in [1, 8], got 9", false},
		{"negative score", Options{Batch: 1, ScoreMin: -0.1}, "score", true},
		{"score over 1", Options{Batch: 1, ScoreMin: 1.5}, "score", true},
	} {
		h := Hooks{MaxBatch: 8, Load: func() ([]string, []int, error) {
			t.Errorf("%s: the checkpoint was read", tc.name)
			return nil, nil, errors.New("no checkpoint")
		}}
		err := Run(tc.opt, h)
		var oe *option.Error
		if err == nil || !strings.Contains(err.Error(), tc.want) || errors.As(err, &oe) != tc.isOpt {
			t.Errorf("%s: got %v, want an error with %q (an *option.Error: %v)", tc.name, err, tc.want, tc.isOpt)
		}
	}
}
