package cuda

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
)

// Kernel names an extern "C" __global__ function of kernels/<module>.cu
// that takes a P by value, as "module.function". The generated constants
// are the kernels the modules hold.
type Kernel[P any] string

// Module returns the kernel's module: kernels/<module>.cu, one fatbin (or,
// for the _sm90a files, PTX).
func (k Kernel[P]) Module() string {
	m, _, _ := strings.Cut(string(k), ".")
	return m
}

// Name returns the kernel's function name.
func (k Kernel[P]) Name() string {
	_, n, _ := strings.Cut(string(k), ".")
	return n
}

// ErrVariantNotBuilt is the error Load and Launch wrap for a kernel variant
// that the embedded modules leave out (KernelInfo.Built).
var ErrVariantNotBuilt = errors.New("a kernel variant, which this build's modules leave out (make kernels VARIANTS=1)")

// Load returns the kernel on d (its module loaded the first time), for
// what Launch does not do itself: Kernel.SetMaxDynamicSharedMemory. A
// variant the build leaves out is refused without asking the driver.
func (k Kernel[P]) Load(d *backend.Device) (*backend.Kernel, error) {
	info, _ := Lookup(string(k))
	return k.load(d, info)
}

// load is Load with k's table entry (zero for a kernel not in the table,
// which the driver then answers for).
func (k Kernel[P]) load(d *backend.Device, info KernelInfo) (*backend.Kernel, error) {
	if !info.Built() {
		return nil, fmt.Errorf("cuda: kernel %s: %w", string(k), ErrVariantNotBuilt)
	}
	return d.Kernel(k.Module(), k.Name())
}

// Launch queues the kernel on d's stream with cfg and params p (see
// backend.Launch). A block larger than the kernel's __launch_bounds__ is
// refused here, naming the bound, rather than by the driver.
func (k Kernel[P]) Launch(d *backend.Device, cfg backend.LaunchConfig, p P) error {
	info, _ := Lookup(string(k))
	if info.MaxThreads > 0 {
		b := cfg.Block
		if threads := int64(b.X) * int64(b.Y) * int64(b.Z); threads > int64(info.MaxThreads) {
			return fmt.Errorf("cuda: kernel %s: %d threads per block; its __launch_bounds__ allow %d", string(k), threads, info.MaxThreads)
		}
	}
	kk, err := k.load(d, info)
	if err != nil {
		return err
	}
	return backend.Launch(kk, cfg, p)
}

// KernelInfo describes a kernel as its declaration does.
type KernelInfo struct {
	Module, Name string
	Params       string // the params struct's name, in C++ and in Go
	ParamsSize   int    // its size in bytes
	// MaxThreads and MinBlocks are its __launch_bounds__ (0: none).
	MaxThreads, MinBlocks int
	// Variant marks a kernel inside #if STHENO_KERNEL_VARIANTS: one that
	// package ops never chooses, kept for experiments (benchmarks, and
	// tests against the default kernels). The shipped modules leave it
	// out; `make kernels VARIANTS=1` builds it in.
	Variant bool
}

// Built reports whether the embedded modules hold the kernel: every kernel
// but the variants, and those too when kernels.VariantsBuilt. Callers that
// would try a variant ask this first rather than the driver, whose
// not-found answer compute-sanitizer reports as an error.
func (k KernelInfo) Built() bool { return !k.Variant || kernels.VariantsBuilt() }

// Kernels returns every kernel of every module, module by module, in
// source order.
func Kernels() []KernelInfo { return slices.Clone(kernelTable[:]) }

// kernelIndex finds kernelTable's entries by "module.function".
var kernelIndex = func() map[string]int {
	m := make(map[string]int, len(kernelTable))
	for i, k := range kernelTable {
		m[k.Module+"."+k.Name] = i
	}
	return m
}()

// Lookup returns the kernel named "module.function".
func Lookup(name string) (KernelInfo, bool) {
	i, ok := kernelIndex[name]
	if !ok {
		return KernelInfo{}, false
	}
	return kernelTable[i], true
}

// byDtype returns f32 or f64 for dt.
func byDtype[P any](dt tensor.Dtype, family string, f32, f64 Kernel[P]) (Kernel[P], error) {
	switch dt {
	case tensor.Float32:
		return f32, nil
	case tensor.Float64:
		return f64, nil
	}
	return "", fmt.Errorf("cuda: %s has kernels for float32 and float64, not %v", family, dt)
}
