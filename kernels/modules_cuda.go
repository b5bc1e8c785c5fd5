//go:build stheno_cuda

package kernels

import (
	"embed"
	"io/fs"
)

// Modules holds the compiled CUDA kernels: one fatbin, and so one CUDA
// module, per kernels/*.cu file, at build/<name>.fatbin (build/roialign.fatbin
// for roialign.cu), and for each kernels/*_sm90a.cu its PTX for sm_90a at
// build/<name>.ptx, which the driver compiles when the module is loaded.
// `make kernels` writes them; package backend loads a module the first time
// one of its kernels is asked for. Beside them, build/variants-<N>.stamp
// records the VARIANTS=<N> they were compiled with (see VariantsBuilt).
//
// The fatbins are build outputs (kernels/build is not committed), so this
// file exists only in the stheno_cuda build, whose Makefile targets build
// them first; the default build embeds nothing.
//
//go:embed build/*.fatbin build/*.ptx build/variants-*.stamp
var Modules embed.FS

// VariantsBuilt reports whether the embedded modules hold the kernel
// variants, the kernels inside #if STHENO_KERNEL_VARIANTS (`make kernels
// VARIANTS=1`), which the shipped modules leave out. It reads the stamp the
// Makefile writes before it compiles the modules, and on which every module
// depends: a change of VARIANTS rebuilds them all. (Asking the driver for
// a kernel the modules lack would answer too, but as an error that
// compute-sanitizer reports.)
func VariantsBuilt() bool { return variantsBuilt }

var variantsBuilt = func() bool {
	stamps, _ := fs.Glob(Modules, "build/variants-*.stamp")
	for _, s := range stamps {
		if s != "build/variants-0.stamp" {
			return true
		}
	}
	return false
}()
