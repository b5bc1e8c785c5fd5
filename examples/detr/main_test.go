package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/examples/detr/train"
	"github.com/stheno-ml/stheno/examples/internal/cli"
)

// command runs the command line args and returns its exit status and what
// it printed.
func command(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = program.ExitCode(run(context.Background(), args, &out, &errOut), &errOut)
	return code, out.String(), errOut.String()
}

// A tiny model and dataset: a run of two iterations takes a second.
var tiny = []string{"-batch", "2", "-size", "32", "-width", "4", "-dmodel", "32", "-enc-layers", "1", "-dec-layers", "1",
	"-queries", "10", "-train-images", "4", "-val-images", "2", "-eval-every", "2"}

// Bad command lines are refused at once, with exit status 2, one message
// per problem naming the flag and what it allows, and nothing written.
func TestBadCommandLines(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-train-images", "0"}, []string{"detr: -train-images 0: must be in [1, "}},
		{[]string{"-lr", "-1", "-warmup", "-5"}, []string{"detr: -lr -1: must be a number in (0, 1]", "detr: -warmup -5: must be at least 0"}},
		{[]string{"-lr", "NaN"}, []string{"-lr NaN: must be a number in (0, 1]"}},
		{[]string{"-lr-backbone", "2"}, []string{"-lr-backbone 2: must be a number in [0, 1] (0: a frozen backbone)"}},
		{[]string{"-lr-linear-proj-mult", "-0.1"}, []string{"-lr-linear-proj-mult -0.1: must be a number in [0, 10]"}},
		{[]string{"-clip", "-1"}, []string{"-clip -1: must be a number >= 0"}},
		{[]string{"-wd", "1"}, []string{"-wd 1: must be a number in [0, 1)"}},
		{[]string{"-size", "48"}, []string{"-size 48: must be a multiple of 32 in [32, 2048]"}},
		{[]string{"-preset", "r50", "-size", "96"}, []string{"-size 96: must be a multiple of 64 in [64, 2048]"}},
		{[]string{"-dmodel", "48"}, []string{"-dmodel 48: must be a multiple of 32 in [32, 2048]"}},
		{[]string{"-enc-layers", "0", "-dec-layers", "33"}, []string{"-enc-layers 0: must be in [1, 32]", "-dec-layers 33: must be in [1, 32]"}},
		{[]string{"-queries", "0"}, []string{"-queries 0: must be in [1, 4096]"}},
		{[]string{"-two-stage", "-box-refine=false"}, []string{"-two-stage true: needs -box-refine"}},
		{[]string{"-two-stage", "-queries", "341"}, []string{"-queries 341: must not exceed the encoder's 340 tokens with -two-stage"}},
		{[]string{"-width", "0", "-depth", "0"}, []string{"-width 0: must be in [1, 512]", "-depth 0: must be in [1, 32]"}},
		{[]string{"-batch", "1"}, []string{"-batch 1: must be in [2, 1024]"}},
		{[]string{"-iters", "0"}, []string{"-iters 0: must be at least 1"}},
		{[]string{"-preset", "r101"}, []string{`-preset "r101": must be one of cpu, r50`}},
		{[]string{"-val-images", "-3"}, []string{"-val-images -3: must be in [0, "}},
		{[]string{"-steps", "0.5,x"}, []string{`-steps "0.5,x": must be comma-separated numbers`}},
		{[]string{"-steps", "0.9,0.5"}, []string{"-steps 0.9,0.5: must be increasing fractions of -iters in (0, 1)"}},
		{[]string{"-batch", "x"}, []string{`invalid value "x" for flag -batch`}},
		{[]string{"-data", "a.json", "-train-images", "5"}, []string{"with -data, the last tenth of its images is held out"}},
		{[]string{"-images", "dir"}, []string{"-images goes only with -infer"}},
		{[]string{"-infer", "-checkpoint", "c.gob", "-images", "d", "-iters", "5", "-lr", "1"}, []string{"-iters, -lr does not go with -infer"}},
		{[]string{"-infer", "-images", "d"}, []string{"-infer needs -checkpoint and -images"}},
		{[]string{"-infer", "-checkpoint", "c.gob", "-images", "d", "-score", "2"}, []string{"-score 2: must be a number in [0, 1]"}},
		{[]string{"-export-synthetic", "d", "-iters", "5"}, []string{"-iters does not go with -export-synthetic"}},
		{[]string{"-export-synthetic", "d", "-train-images", "0"}, []string{"-train-images 0"}},
		{[]string{"extra"}, []string{`unexpected arguments ["extra"`}},
		{[]string{"-device", "gpu"}, []string{`-device "gpu": must be cpu, cuda or cuda:N`}},
		{[]string{"-device", "cuda:x", "-lr", "2"}, []string{`-device "cuda:x"`}},
	} {
		dir := t.TempDir()
		start := time.Now()
		code, stdout, stderr := command(t, append(tc.args, "-out", filepath.Join(dir, "out"))...)
		if strings.Contains(strings.Join(tc.args, " "), "-export-synthetic") || strings.Contains(strings.Join(tc.args, " "), "-infer") {
			// These modes do not take -out as given above; run them alone.
			code, stdout, stderr = command(t, tc.args...)
		}
		if code != 2 || time.Since(start) > 2*time.Second {
			t.Errorf("%q: exit %d after %v, want 2 at once", tc.args, code, time.Since(start))
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%q: stderr %q, want it to contain %q", tc.args, stderr, w)
			}
		}
		if stdout != "" {
			t.Errorf("%q: printed %q on stdout", tc.args, stdout)
		}
		if _, err := os.Stat(filepath.Join(dir, "out")); err == nil {
			t.Errorf("%q: created the output directory", tc.args)
		}
	}
}

// Asking for a GPU where the program cannot use one (built without the
// stheno_cuda tag, or no GPU) is refused before any work: exit status 2
// and one line saying what is missing.
func TestDeviceWithoutGPU(t *testing.T) {
	if dev, err := backend.Open(0); err == nil {
		dev.Close()
		t.Skip("this machine has a GPU")
	}
	want := "no CUDA GPU found"
	if !backend.BuiltWithCUDA() {
		want = "-device cuda: this program was built without GPU support; build it with the stheno_cuda tag (go run -tags stheno_cuda ./examples/detr -device cuda"
	}
	dir := t.TempDir()
	for _, args := range [][]string{
		append([]string{"-device", "cuda", "-out", filepath.Join(dir, "out")}, tiny...),
		{"-infer", "-device", "cuda", "-checkpoint", filepath.Join(dir, "none.gob"), "-images", dir, "-out", filepath.Join(dir, "out")},
	} {
		code, stdout, stderr := command(t, args...)
		if code != 2 || !strings.Contains(stderr, want) || stdout != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 2 and %q", args, code, stdout, stderr, want)
		}
		if _, err := os.Stat(filepath.Join(dir, "out")); err == nil {
			t.Errorf("%q: created the output directory", args)
		}
	}
}

// An unknown flag is reported once, with the hint to -h.
func TestUnknownFlagOnce(t *testing.T) {
	code, _, stderr := command(t, "-itres", "5")
	if code != 2 || strings.Count(stderr, "flag provided but not defined: -itres") != 1 || !strings.Contains(stderr, "detr -h") {
		t.Errorf("exit %d, stderr %q; want 2 and the error once with a hint", code, stderr)
	}
}

func TestHelp(t *testing.T) {
	code, stdout, stderr := command(t, "-h")
	if code != 0 || !strings.Contains(stdout, "-lr float") || !strings.Contains(stdout, "-preset string") || stderr != "" {
		t.Errorf("-h: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// Training, then resuming: the run's options come from the checkpoint,
// others are refused, with nothing left to train the checkpoint's own AP
// is reported, and -infer predicts with it.
func TestResumeAndInferCommandLine(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "run")
	code, stdout, stderr := command(t, append(tiny, "-iters", "2", "-out", dir)...)
	if code != 0 {
		t.Fatalf("training: exit %d: %s", code, stderr)
	}
	final := finalLine(stdout)
	if !strings.HasPrefix(final, "final: box AP ") {
		t.Fatalf("training printed %q", stdout)
	}
	ckpt := filepath.Join(dir, "checkpoint.gob")

	code, _, stderr = command(t, "-checkpoint", ckpt, "-lr", "0.5", "-size", "64")
	if code != 2 && code != 1 || !strings.Contains(stderr, "-lr: the checkpoint's is 0.001, given 0.5") || !strings.Contains(stderr, "-size: the checkpoint's is 32, given 64") {
		t.Errorf("resuming with other options: exit %d, %q", code, stderr)
	}

	code, stdout, stderr = command(t, "-checkpoint", ckpt)
	if code != 0 || !strings.Contains(stdout, "nothing to train") || strings.Fields(finalLine(stdout))[2] != strings.Fields(final)[2] {
		t.Errorf("resuming a finished run: exit %d, stdout %q, stderr %q; want its AP as in %q", code, stdout, stderr, final)
	}

	code, stdout, stderr = command(t, "-checkpoint", ckpt, "-iters", "3")
	if code != 0 || !strings.Contains(stdout, "resuming "+ckpt+" at iteration 2") {
		t.Fatalf("training longer: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	c, err := train.LoadCheckpoint(ckpt)
	if err != nil || c.Iter != 3 || c.Run.Model.ImageSize != 32 || c.Run.Model.Queries != 10 {
		t.Errorf("after training longer the checkpoint is at %d iterations, %+v (%v)", c.Iter, c.Run, err)
	}

	syn := filepath.Join(root, "syn")
	if code, _, stderr := command(t, "-export-synthetic", syn, "-train-images", "2", "-val-images", "1", "-size", "64"); code != 0 {
		t.Fatalf("export: exit %d: %s", code, stderr)
	}
	pred := filepath.Join(root, "pred")
	code, stdout, stderr = command(t, "-infer", "-checkpoint", ckpt, "-images", filepath.Join(syn, "annotations.json"), "-out", pred)
	if code != 0 || !strings.Contains(stdout, "wrote "+filepath.Join(pred, "predictions.json")) || !strings.Contains(stdout, "box AP") {
		t.Errorf("-infer: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// The first SIGINT cancels the context with the signal as its cause, and
// an interrupted run exits with 128+2 and says how to resume.
func TestInterrupt(t *testing.T) {
	ctx, stop := program.InterruptContext()
	defer stop()
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("SIGINT did not cancel the context")
	}
	var sig cli.SignalError
	if !errors.As(context.Cause(ctx), &sig) || sig.Sig != syscall.SIGINT {
		t.Fatalf("cause %v, want SIGINT", context.Cause(ctx))
	}
	err := &train.InterruptedError{Iter: 7, Checkpoint: "out/x/checkpoint.gob", Cause: context.Cause(ctx)}
	var stderr bytes.Buffer
	if code := program.ExitCode(fmt.Errorf("wrapped: %w", err), &stderr); code != 130 ||
		!strings.Contains(stderr.String(), "interrupted after iteration 7") || !strings.Contains(stderr.String(), "go run ./examples/detr -checkpoint out/x/checkpoint.gob") {
		t.Errorf("exit %d, %q", code, stderr.String())
	}
}

func finalLine(stdout string) string {
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	return lines[len(lines)-1]
}
