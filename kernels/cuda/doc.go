// Package cuda is the Go side of the CUDA kernels in kernels/*.cu,
// generated from their declarations by kernels/cuda/gen (`make kernels-go`).
// It needs no cgo, so package ops imports it in every build; without the
// stheno_cuda tag no device exists to launch on. It holds:
//
//   - for each kernel's params struct, a Go struct with the same fields in
//     the same order, in Go types of the same sizes (device addresses as
//     backend.DevicePtr), whose size, alignment and offsets are asserted at
//     compile time here and, through STHENO_PARAMS in kernels/params_gen.cuh,
//     by nvcc and the host emulator's g++;
//   - for each extern "C" __global__ kernel, a constant of type Kernel[P]
//     naming its module and function, P its params type, so that a launch
//     cannot be handed another struct;
//   - for the kernels one template instantiates for float32 and float64, a
//     function that picks one by dtype;
//   - the constants the .cu files mark with stheno:const (shared-memory
//     sizes, tiles, table limits), so the Go side copies none by hand.
//
// A launch, as ops writes it:
//
//	k, err := cuda.TransposePlanes(dt)
//	if err != nil {
//		return err
//	}
//	err = k.Launch(dev, cfg, cuda.TransposeParams{In: in, Out: out, A: int32(a), B: int32(b)})
//
// kernels/cuda/gen's tests fail when the generated files are stale.
package cuda

//go:generate go run ./gen
