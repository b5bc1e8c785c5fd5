//go:build stheno_cuda

package kernels

import "embed"

// Modules holds the compiled CUDA kernels: one fatbin, and so one CUDA
// module, per kernels/*.cu file, at build/<name>.fatbin (build/roialign.fatbin
// for roialign.cu), and for each kernels/*_sm90a.cu its PTX for sm_90a at
// build/<name>.ptx, which the driver compiles when the module is loaded.
// `make kernels` writes them; package backend loads a module the first time
// one of its kernels is asked for.
//
// The fatbins are build outputs (kernels/build is not committed), so this
// file exists only in the stheno_cuda build, whose Makefile targets build
// them first; the default build embeds nothing.
//
//go:embed build/*.fatbin build/*.ptx
var Modules embed.FS
