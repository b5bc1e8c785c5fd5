package cli

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/stheno-ml/stheno/examples/internal/checkpoint"
)

// Each kind of error gets its exit status and message.
func TestExitCode(t *testing.T) {
	p := Program{Name: "det", Pkg: "./examples/det"}
	for _, c := range []struct {
		err  error
		code int
		want string
	}{
		{nil, 0, ""},
		{errors.New("boom"), 1, "det: boom\n"},
		{Usagef("-x %d", 3), 2, "det: -x 3\nrun 'det -h'"},
		{fmt.Errorf("w: %w", &checkpoint.InterruptedError{Iter: 4, Checkpoint: "c.gob", Cause: SignalError{syscall.SIGTERM}}), 128 + int(syscall.SIGTERM), "go run ./examples/det -checkpoint c.gob"},
		{&checkpoint.InterruptedError{Iter: 4, Checkpoint: "c.gob", Cause: errors.New("deadline")}, 1, "interrupted after iteration 4"},
	} {
		var stderr bytes.Buffer
		if code := p.ExitCode(c.err, &stderr); code != c.code || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("ExitCode(%v): %d, %q; want %d and %q", c.err, code, stderr.String(), c.code, c.want)
		}
	}
}

// Only names the flags a mode does not take, sorted; lists of numbers read
// back as written.
func TestOnlyAndFloats(t *testing.T) {
	err := Only(map[string]bool{"infer": true, "lr": true, "batch": true}, "-infer", []string{"infer", "out"})
	var usage UsageError
	if !errors.As(err, &usage) || err.Error() != "-batch, -lr does not go with -infer (it takes only -out)" {
		t.Errorf("Only: %v", err)
	}
	if err := Only(map[string]bool{"out": true}, "-infer", []string{"infer", "out"}); err != nil {
		t.Errorf("Only of allowed flags: %v", err)
	}
	v := []float64{0.5, 0.75, 1e-3}
	if back, err := ParseFloats(JoinFloats(v) + ", "); err != nil || !reflect.DeepEqual(back, v) {
		t.Errorf("ParseFloats(JoinFloats(%v)): %v, %v", v, back, err)
	}
	if _, err := ParseFloats("1,x"); err == nil {
		t.Error("ParseFloats(\"1,x\"): no error")
	}
}
