// Package kernels holds the math of stheno's ops: the CUDA kernels (*.cu,
// compiled into embedded fatbins, and *_sm90a.cu into embedded PTX that the
// driver compiles for Hopper, under the stheno_cuda build tag) and their Go CPU
// twins, written loop for loop like the CUDA code so that a reader can hold
// the two side by side and tests can compare them.
//
// Kernels assume valid input: shapes, strides and configs are checked by the
// ops package before a kernel runs. The only checks done here are the ones
// that depend on data (a RoI's batch index, for instance), which the caller
// cannot do without reading the data itself.
//
// Every CPU kernel is generic over float32 and float64 and runs in parallel
// over GOMAXPROCS goroutines. The arithmetic is done in the element type, as
// the CUDA kernels and PyTorch's CPU kernels do, so float32 results match
// theirs to rounding, not only to a tolerance. Every sum runs in an order
// fixed by the shapes alone, never by the number of goroutines, so a kernel
// gives the same bits on every run and with any GOMAXPROCS.
//
// The matrix products (Gemm and the convolutions) run on register-tiled
// micro-kernels: on x86-64, AVX-512 or AVX2 assembly where the CPU has it,
// else, and on other architectures, a portable Go one. The environment
// variable STHENO_CPU_KERNELS (CPUKernelsEnv) forces one; CPUKernels says
// which runs.
package kernels
