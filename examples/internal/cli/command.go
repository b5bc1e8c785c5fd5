package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/examples/internal/checkpoint"
	"github.com/stheno-ml/stheno/examples/internal/device"
)

// Program names a command in its messages.
type Program struct {
	Name string // "detr": the prefix of its messages
	Pkg  string // "./examples/detr": what go run takes
}

// InterruptContext is cancelled, with a SignalError as its cause, by the
// first SIGINT or SIGTERM; the next one kills the process as usual. stop
// stops listening.
func (p Program) InterruptContext() (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig, ok := <-sigs
		if !ok {
			return
		}
		signal.Reset(os.Interrupt, syscall.SIGTERM)
		fmt.Fprintf(os.Stderr, "\n%s: %v: finishing the iteration under way and saving the checkpoint (again to quit at once)\n", p.Name, sig)
		cancel(SignalError{sig.(syscall.Signal)})
	}()
	return ctx, func() { signal.Stop(sigs); close(sigs) }
}

// SignalError is the cause of an interrupted run.
type SignalError struct{ Sig syscall.Signal }

func (e SignalError) Error() string { return e.Sig.String() }

// ExitCode prints err (if any) and returns the process's exit status: 0,
// 128+n after signal n (as a shell reports it), 2 for bad usage, else 1.
// An interrupted run (a *checkpoint.InterruptedError) is told how to
// resume.
func (p Program) ExitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	var interrupted *checkpoint.InterruptedError
	if errors.As(err, &interrupted) {
		fmt.Fprintf(stderr, "%s: interrupted after iteration %d; the run is saved in %s. Resume it with\n\n\tgo run %s -checkpoint %s\n\n",
			p.Name, interrupted.Iter, interrupted.Checkpoint, p.Pkg, interrupted.Checkpoint)
		var sig SignalError
		if errors.As(err, &sig) {
			return 128 + int(sig.Sig)
		}
		return 1
	}
	var usage UsageError
	if errors.As(err, &usage) {
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintln(stderr, p.Name+":", line)
		}
		fmt.Fprintf(stderr, "run '%s -h' for the flags and their ranges\n", p.Name)
		return 2
	}
	fmt.Fprintln(stderr, p.Name+":", err)
	return 1
}

// UsageError is a bad command line: flags that do not parse, values out of
// range, flags that do not go together.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// Usagef is a UsageError of fmt.Errorf(format, args...).
func Usagef(format string, args ...any) error { return UsageError{fmt.Errorf(format, args...)} }

// Only refuses flags given (by name) that the mode does not take: allowed
// names the flags it does, the mode's own flag first.
func Only(given map[string]bool, mode string, allowed []string) error {
	var extra []string
	for name := range given {
		if !slices.Contains(allowed, name) {
			extra = append(extra, "-"+name)
		}
	}
	if len(extra) == 0 {
		return nil
	}
	slices.Sort(extra)
	return Usagef("%s does not go with %s (it takes only -%s)", strings.Join(extra, ", "), mode, strings.Join(allowed[1:], ", -"))
}

// OpenDevice opens the GPU spec names (nil for the CPU) with device.Open,
// its errors usage errors, and with cuBLAS's products and the convolutions
// in full float32 unless tf32 (backend.GemmExact). closeDev closes it (nothing for the CPU).
func (p Program) OpenDevice(spec string, tf32 bool) (dev *backend.Device, closeDev func(), err error) {
	dev, err = device.Open(spec, "go run "+p.Pkg)
	if err != nil {
		return nil, nil, UsageError{err}
	}
	if dev == nil {
		return nil, func() {}, nil
	}
	if !tf32 {
		dev.SetGemmMath(backend.GemmExact)
	}
	return dev, func() { dev.Close() }, nil
}

// ParseFloats reads a comma-separated list of numbers (empty entries are
// skipped).
func ParseFloats(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// JoinFloats writes v as ParseFloats reads it.
func JoinFloats(v []float64) string {
	s := make([]string, len(v))
	for i, f := range v {
		s[i] = strconv.FormatFloat(f, 'g', -1, 64)
	}
	return strings.Join(s, ",")
}
