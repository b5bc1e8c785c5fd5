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
// theirs to rounding, not only to a tolerance.
package kernels
