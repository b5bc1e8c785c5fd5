package kernels

import (
	"fmt"
	"os"
	"slices"
	"strings"
)

// CPUKernelsEnv is the environment variable that chooses the micro-kernels
// of the CPU twins' matrix products (Gemm and the convolutions), read once
// when the program starts:
//
//	avx512    the AVX-512 micro-kernels (x86-64 with AVX-512F)
//	avx2      the AVX2 micro-kernels (x86-64 with AVX2 and FMA)
//	portable  the pure-Go micro-kernel, and no assembly at all
//
// Unset or empty, the CPU's best is used: the first of CPUKernelChoices.
// Every element of a product is the same chain of fused multiply-adds with
// avx512 and avx2, so the two give the same bits; portable multiplies and
// adds, rounding twice, where Go does not fuse them (on x86-64), and gives
// other bits there (README: Reproducibility).
const CPUKernelsEnv = "STHENO_CPU_KERNELS"

// cpuKernelNames are the values CPUKernelsEnv takes, best first.
var cpuKernelNames = []string{"avx512", "avx2", "portable"}

// What this CPU offers, the choice made once from CPUKernelsEnv, and the
// refusal of a value it cannot take.
var (
	cpuOffered              = cpuOffers()
	cpuChoice, cpuChoiceErr = chooseCPUKernels(os.Getenv(CPUKernelsEnv), cpuOffered)
)

// chooseCPUKernels picks the micro-kernels for the value of CPUKernelsEnv
// among those the CPU offers (best first). A value that names no kernels,
// or kernels the CPU cannot run, is refused with an error, and the best
// offered is returned with it.
func chooseCPUKernels(value string, offered []string) (string, error) {
	switch {
	case value == "":
		return offered[0], nil
	case !slices.Contains(cpuKernelNames, value):
		return offered[0], fmt.Errorf("kernels: %s=%q names no micro-kernels: the choices are %s; this CPU runs %s",
			CPUKernelsEnv, value, strings.Join(cpuKernelNames, ", "), strings.Join(offered, " or "))
	case !slices.Contains(offered, value):
		return offered[0], fmt.Errorf("kernels: %s=%s: this CPU cannot run the %s micro-kernels; it runs %s",
			CPUKernelsEnv, value, value, strings.Join(offered, " or "))
	}
	return value, nil
}

// CPUKernels returns the micro-kernels the CPU twins use: "avx512", "avx2"
// or "portable". The error is non-nil when CPUKernelsEnv holds a value
// that names no micro-kernels or ones this CPU cannot run; the twins then
// use the CPU's best, and ops.NewTapeMachine returns the error rather than
// a machine, so that a program does not run on kernels it did not ask for.
func CPUKernels() (string, error) { return cpuChoice, cpuChoiceErr }

// CPUKernelChoices returns the values of CPUKernelsEnv this CPU can run,
// best first; the first is the default.
func CPUKernelChoices() []string { return slices.Clone(cpuOffered) }
