// Package backend runs stheno's kernels on NVIDIA GPUs: devices, device
// memory, the stream kernels run on, and the loading and launching of the
// kernels compiled from kernels/*.cu. It knows nothing of any one op.
//
// # Build tag
//
// The GPU code is behind the build tag stheno_cuda:
//
//	make gpu-vet                      # go vet -tags stheno_cuda ./...
//	make gpu-bins                     # test binaries for a GPU machine
//
// Without the tag the package builds as plain Go: Open returns an error
// wrapping ErrNoDevice, and the default build never links or loads CUDA.
// The tag is not called cuda because that tag also switches on gorgonia's
// own CUDA files, which need cuDNN headers and link cuBLAS and cuDNN. The
// tagged build links libcuda (the driver API) and libdl, and opens the
// CUDA libraries it uses (cuBLAS) at run time by soname, so a binary built
// against CUDA 11.8 runs where only CUDA 13's libraries are installed. It
// does not import gorgonia.org/cu, whose package init exits the process on a
// machine without a GPU. It embeds the fatbins `make kernels` writes to
// kernels/build (one CUDA module per .cu file; see kernels.Modules), so
// `make kernels` must run before a tagged build; the Makefile's GPU
// targets do that.
//
// # Devices, streams and threads
//
// Open(ordinal) makes a Device: the GPU's primary context, one stream, a
// caching allocator, and an Engine for Gorgonia. All work of a Device runs
// in order on its one stream; calls return before the GPU is done, and the
// host waits only when it reads a value (ToHost) or calls Synchronize.
// Gorgonia runs ops on goroutines that are not locked to an OS thread, while
// a CUDA context is current per thread; every driver call here therefore
// makes the context current inside the same cgo call, so any goroutine may
// use a Device at any time. Library code returns errors, never panics or
// exits on a CUDA error; errors name the GPU, and for kernels the module
// and kernel, and wrap the driver's *DriverError.
//
// # Kernels
//
// Device.Kernel(module, name) finds an extern "C" __global__ function of
// kernels/<module>.cu, loading the module on first use; Launch queues it
// with a LaunchConfig and one params struct, passed by value, that mirrors
// the kernel's C++ struct field for field (int32 for a C int, int64 for an
// index, DevicePtr for a pointer). Launch checks once per type that the
// struct holds only such numbers, so no Go pointer reaches C.
//
// # Debugging: STHENO_CUDA_SYNC
//
// A kernel that fails while running (an illegal address, say) is reported
// by the next call that waits for the stream, which cannot tell which
// kernel it was. With STHENO_CUDA_SYNC=1 in the environment when a Device
// is opened, every Launch waits for its kernel and returns its error,
// naming the kernel. It is slow; use it to find a failing kernel. (A fault
// leaves the CUDA context unusable: close the Device.)
//
// # Replaying steps as CUDA graphs: STHENO_CUDA_GRAPHS
//
// A Device holds its stream work back (kernel launches, cuBLAS products,
// memsets and copies between device buffers) until something needs it
// issued: a copy to or from the host, a wait, timing events, the next
// Scope, or a run of 32 to 256 calls. A stretch of work that repeats the
// one at its place in the step before (a step begins with BeginScope) is
// captured once as a CUDA graph and then replayed with one launch, after
// the kernels' arguments that changed (AdamW's step count, an address)
// are written into the graph. It is on unless STHENO_CUDA_GRAPHS=0 is in
// the environment when the Device is opened; GraphStats counts what
// became of the stretches, and Flush issues them without waiting.
// GraphsEnv says more.
//
// # Memory
//
// Device memory comes from a caching allocator: freed blocks are kept by
// size class and handed out again, so a training step that repeats the
// same sizes calls neither cuMemAlloc nor cuMemFree after its first run.
// A size class hands out its lowest free block first, so a step that asks
// for the same sizes in the same order gets the same addresses every time.
// MemStats reports bytes in use, cached, reserved from the driver and at
// peak, and the driver calls made; ReleaseCached and Close give memory
// back to the driver, and so does Scope.End for cached blocks no request
// has taken in the last 100 Scopes. Gorgonia
// never frees values, so device tensors are freed explicitly: FreeDense for
// one tensor, or a Scope for everything a training step made.
//
// # Matrix products (cuBLAS)
//
// Device.Gemm queues C = Alpha*op(A)*op(B) + Beta*C for one or a batch of
// row-major float32 or float64 matrices on the Device's stream, through
// cuBLAS. It checks every argument, and every operand against the device
// memory in use, before cuBLAS sees it. float32 multiplies in TF32 on
// tensor cores unless SetGemmMath(GemmExact). cuBLAS is not linked: the
// first Gemm opens it with dlopen, trying libcublas.so.13, .12, .11 and
// libcublas.so through the loader's search and then in the toolkits under
// /usr/local, or only what STHENO_CUBLAS names; if none opens, Gemm returns
// a *LoadError listing every name tried and why, and everything else keeps
// working. Each Device has one cuBLAS handle on its stream, with a
// workspace from the caching allocator; Close destroys it.
//
// # Device tensors and Gorgonia
//
// A device tensor is a *tensor.Dense whose memory is device memory and
// whose engine is the Device's Engine; NewDense, ToDevice and Engine.Add
// make them, ToHost copies one back. Run a graph on them with a TapeMachine
// built with G.WithEngine(dev.Engine()). The TapeMachine gives that engine
// to every value, host values too: Engine serves host values exactly as
// gorgonia's StandardEngine does, runs Add (gorgonia's add op and the
// gradient sums Backpropagate inserts) on the device, and refuses device
// tensors everywhere else with an error. Ops dispatch with IsDevice and
// DeviceOf: device inputs run the kernels, host inputs the CPU path.
//
// tensor.Dense does not know its memory is on a device: its metadata
// methods are safe, but Data, the typed accessors, Get, Set, Zero, Eq and
// the encoders read the memory on the host and crash the process (dense.go
// lists which methods are safe, refused or unsafe). What works and what
// does not in a TapeMachine:
//
//   - Works: device inputs bound with G.Let or G.WithValue; ops that
//     dispatch on IsDevice; gorgonia's Add, including gradient accumulation
//     when one value feeds several ops; Backpropagate and Grad graphs made
//     of such ops.
//   - Refused with an error: gorgonia's other ops on device values (they
//     run on the CPU engine); BindDualValues (gorgonia keeps gradients in
//     host memory it clones from the values).
//   - Crashes: gorgonia's solvers (they call Zero and read Data) and its
//     NaN/Inf watchers; update parameters with ops.AdamW or Axpy instead.
//     A TapeMachine built without G.WithEngine(dev.Engine()) hands device
//     values gorgonia's StandardEngine, some of whose methods read them on
//     the host.
package backend
