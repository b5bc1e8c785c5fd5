package train

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stheno-ml/stheno/examples/maskrcnn/model"
	"github.com/stheno-ml/stheno/kernels"
)

var update = flag.Bool("update", false, "TestTrainingPinned: rewrite "+pinnedFile+" from this run")

// pinnedFile keeps the losses TestTrainingPinned pins.
const pinnedFile = "testdata/pinned_training.txt"

// pinnedIters is the length of the pinned run: the first iteration is the
// initial model's, the others follow AdamW steps.
const pinnedIters = 12

// pinnedOptions is the run `go run ./examples/maskrcnn` makes (model,
// image size, batch, schedule over the run's iterations, clipping, seed), on
// 64 training images, for pinnedIters iterations, without evaluation.
func pinnedOptions(dir string) Options {
	o := DefaultOptions()
	o.TrainImages, o.ValImages = 64, 0
	o.Iters, o.EvalEvery, o.LogEvery = pinnedIters, pinnedIters, 1
	o.Out, o.Log = dir, io.Discard
	return o
}

// trainedBits runs o and returns the losses of every iteration (LogEvery
// must be 1) and a digest of what the run ends with: the weights,
// BatchNorm's running statistics and AdamW's state.
func trainedBits(t *testing.T, o Options) ([]model.Losses, string) {
	t.Helper()
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	var losses []model.Losses
	for i, p := range res.History.Losses {
		if p.Iter != i+1 {
			t.Fatalf("loss point %d is iteration %d's: LogEvery must be 1", i, p.Iter)
		}
		losses = append(losses, p.values())
	}
	ckpt, err := LoadCheckpoint(filepath.Join(o.Out, "checkpoint.gob"))
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "adam step %d\n", ckpt.Adam.Step)
	for _, set := range [][]NamedTensor{ckpt.Params, ckpt.BNStats, ckpt.Adam.M, ckpt.Adam.V} {
		for _, nt := range set {
			fmt.Fprintf(h, "%s %v\n", nt.Name, nt.Shape)
			for _, v := range nt.Data {
				binary.Write(h, binary.LittleEndian, math.Float32bits(v))
			}
		}
	}
	return losses, fmt.Sprintf("%x", h.Sum(nil))
}

// mulAdd is a*b + c as this build compiles it: its operands arrive in
// registers, where Go fuses a multiply and an add into one rounding if it
// fuses any (arm64; x86-64 built for GOAMD64=v3 or later).
//
//go:noinline
func mulAdd(a, b, c float64) float64 { return a*b + c }

// goFuses reports whether this build fuses multiply-adds: with a = b =
// 1+2^-27 and c = -(1+2^-26), the product rounded to float64 cancels c
// exactly, the exact product leaves 2^-54.
func goFuses() bool { return mulAdd(1+0x1p-27, 1+0x1p-27, -(1+0x1p-26)) != 0 }

// otherBits says why this machine's training cannot give the pinned bits,
// or "" when it can: they are those of x86-64 with the avx2 or avx512
// micro-kernels, built for GOAMD64 v1 or v2 (Go's default), where Go
// rounds every multiply and every add (README: Reproducibility).
func otherBits() string {
	name, _ := kernels.CPUKernels()
	switch {
	case runtime.GOARCH != "amd64":
		return fmt.Sprintf("on %s, Go fuses multiply-adds and the pinned bits are x86-64's", runtime.GOARCH)
	case goFuses():
		return "this build fuses multiply-adds (GOAMD64=v3 or later); the pinned bits are those of GOAMD64 v1 or v2"
	case name != "avx2" && name != "avx512":
		return fmt.Sprintf("the %s micro-kernels round otherwise than the avx2 and avx512 ones, whose bits are pinned", name)
	}
	return ""
}

var lossNames = []string{"total", "rpn_objectness", "rpn_box", "classification", "box_regression", "mask"}

// A short run of the default model gives the losses kept in pinnedFile
// bit for bit, at every iteration, and ends in the state whose digest is
// kept there: any change to the training's arithmetic (a kernel's order of
// summation, a precision, an op, the data, the sampling or the optimiser)
// shows here when it is made, rather than as other AP numbers in README.
func TestTrainingPinned(t *testing.T) {
	if why := otherBits(); why != "" {
		t.Skipf("%s: not compared", why)
	}
	losses, state := trainedBits(t, pinnedOptions(t.TempDir()))
	for i, l := range losses {
		for k, v := range l {
			if !(v > 0) {
				t.Errorf("iteration %d: the %s loss is %v: the pinned run must exercise every loss", i+1, lossNames[k], v)
			}
		}
	}
	if *update {
		if err := writePinned(losses, state); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s: %d iterations, state %s", pinnedFile, len(losses), state)
		return
	}
	want, wantState, err := readPinned()
	if err != nil {
		t.Fatal(err)
	}
	var diffs []string
	for i := range max(len(losses), len(want)) {
		if i >= len(losses) || i >= len(want) {
			diffs = append(diffs, fmt.Sprintf("the run has %d iterations, %s %d", len(losses), pinnedFile, len(want)))
			break
		}
		for k := range losses[i] {
			if g, w := losses[i][k], want[i][k]; math.Float64bits(g) != math.Float64bits(w) {
				diffs = append(diffs, fmt.Sprintf("iteration %d: %s loss %.17g (bits %#016x), pinned %.17g (%#016x)",
					i+1, lossNames[k], g, math.Float64bits(g), w, math.Float64bits(w)))
			}
		}
	}
	if state != wantState {
		diffs = append(diffs, fmt.Sprintf("the final weights, BatchNorm statistics and AdamW state have the digest %s, pinned %s", state, wantState))
	}
	if len(diffs) > 0 {
		if len(diffs) > 8 {
			diffs = append(diffs[:8], fmt.Sprintf("... and %d more", len(diffs)-8))
		}
		t.Errorf("the training changed:\n  %s\n"+
			"If the change is intended, regenerate the pinned values with\n"+
			"  go test ./examples/maskrcnn/train -run TestTrainingPinned -update\n"+
			"and update README's numbers of the default run (go run ./examples/maskrcnn) in the same commit, saying why the training changed.",
			strings.Join(diffs, "\n  "))
	}
}

const pinnedHeader = `# TestTrainingPinned's values: the losses of each iteration of a short run of
# the default model (go run ./examples/maskrcnn's options on 64 training
# images, %d iterations, no evaluation) as float64 bits, then a digest of the
# weights, BatchNorm statistics and AdamW state the run ends with. The bits
# are those of x86-64 with the avx2 or avx512 micro-kernels (README:
# Reproducibility). Regenerate with
#
#	go test ./examples/maskrcnn/train -run TestTrainingPinned -update
#
# iteration, then total rpn_objectness rpn_box classification box_regression mask
`

func writePinned(losses []model.Losses, state string) error {
	var b strings.Builder
	fmt.Fprintf(&b, pinnedHeader, len(losses))
	for i, l := range losses {
		fmt.Fprintf(&b, "%d", i+1)
		for _, v := range l {
			fmt.Fprintf(&b, " %#016x", math.Float64bits(v))
		}
		b.WriteString(" #")
		for _, v := range l {
			fmt.Fprintf(&b, " %.9g", v)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "state %s\n", state)
	if err := os.MkdirAll(filepath.Dir(pinnedFile), 0o755); err != nil {
		return err
	}
	return os.WriteFile(pinnedFile, []byte(b.String()), 0o644)
}

func readPinned() ([]model.Losses, string, error) {
	raw, err := os.ReadFile(pinnedFile)
	if err != nil {
		return nil, "", fmt.Errorf("%w (write it with -update)", err)
	}
	var losses []model.Losses
	state := ""
	for n, line := range strings.Split(string(raw), "\n") {
		line, _, _ = strings.Cut(line, "#")
		f := strings.Fields(line)
		switch {
		case len(f) == 0:
		case f[0] == "state" && len(f) == 2:
			state = f[1]
		case len(f) == 1+len(lossNames) && f[0] == strconv.Itoa(len(losses)+1):
			var l model.Losses
			for k, s := range f[1:] {
				bits, err := strconv.ParseUint(s, 0, 64)
				if err != nil {
					return nil, "", fmt.Errorf("%s:%d: %w", pinnedFile, n+1, err)
				}
				l[k] = math.Float64frombits(bits)
			}
			losses = append(losses, l)
		default:
			return nil, "", fmt.Errorf("%s:%d: cannot read %q", pinnedFile, n+1, line)
		}
	}
	if state == "" || len(losses) == 0 {
		return nil, "", fmt.Errorf("%s: no losses or no state line", pinnedFile)
	}
	return losses, state, nil
}

// trainingChildEnv marks a child process of TestTrainingCPUKernels.
const trainingChildEnv = "STHENO_TEST_TRAINING_CHILD"

// kernelsTrainingOptions is a few iterations of the tiny model.
func kernelsTrainingOptions(dir string) Options {
	o := tinyOptions(dir)
	o.Iters, o.EvalEvery, o.LogEvery, o.ValImages = 4, 4, 1, 0
	return o
}

// A few training steps of a small model give the same bits with every
// GOMAXPROCS (1, 2, 7) and, on x86-64, with the avx2 and avx512
// micro-kernels, each chosen by STHENO_CPU_KERNELS in a process of its own.
// The portable kernel is compared across GOMAXPROCS; whether its bits are
// the others' depends on whether Go fuses its multiply-adds (it says).
func TestTrainingCPUKernels(t *testing.T) {
	if os.Getenv(trainingChildEnv) == "1" {
		name, err := kernels.CPUKernels()
		fmt.Printf("kernels %s %v\n", name, err)
		losses, state := trainedBits(t, kernelsTrainingOptions(t.TempDir()))
		for _, l := range losses {
			fmt.Print("losses")
			for _, v := range l {
				fmt.Printf(" %#016x", math.Float64bits(v))
			}
			fmt.Println()
		}
		fmt.Printf("state %s\n", state)
		return
	}
	results := map[string]string{}
	offered := kernels.CPUKernelChoices()
	for _, name := range []string{"avx512", "avx2", "portable"} {
		t.Run(name, func(t *testing.T) {
			if !slices.Contains(offered, name) {
				t.Skipf("this CPU cannot run the %s micro-kernels", name)
			}
			for _, procs := range []int{1, 2, 7} {
				cmd := exec.Command(os.Args[0], "-test.run=^TestTrainingCPUKernels$", "-test.count=1")
				cmd.Env = append(os.Environ(), trainingChildEnv+"=1", kernels.CPUKernelsEnv+"="+name, fmt.Sprintf("GOMAXPROCS=%d", procs))
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("GOMAXPROCS=%d: %v\n%s", procs, err, out)
				}
				var got []string
				sc := bufio.NewScanner(bytes.NewReader(out))
				for sc.Scan() {
					if f := strings.Fields(sc.Text()); len(f) > 0 && slices.Contains([]string{"kernels", "losses", "state"}, f[0]) {
						got = append(got, sc.Text())
					}
				}
				if len(got) != 2+kernelsTrainingOptions("").Iters || got[0] != "kernels "+name+" <nil>" {
					t.Fatalf("GOMAXPROCS=%d: the child printed\n%s", procs, out)
				}
				bits := strings.Join(got[1:], "\n")
				if procs == 1 {
					results[name] = bits
				} else if bits != results[name] {
					t.Errorf("GOMAXPROCS=%d trains otherwise than GOMAXPROCS=1:\n%s\nwant\n%s", procs, bits, results[name])
				}
			}
		})
	}
	if a, b := results["avx512"], results["avx2"]; a != "" && b != "" && a != b {
		t.Errorf("the avx512 and avx2 micro-kernels train otherwise:\n%s\nand\n%s", a, b)
	}
	if p, best := results["portable"], results[offered[0]]; offered[0] != "portable" && p != "" && best != "" {
		t.Logf("portable's training is %s's bit for bit: %t (Go fuses multiply-adds in this build: %t)", offered[0], p == best, goFuses())
	}
}
