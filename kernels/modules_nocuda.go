//go:build !stheno_cuda

package kernels

// VariantsBuilt reports whether the embedded modules hold the kernel
// variants (see the stheno_cuda build's). The default build embeds no
// modules, and so no variants.
func VariantsBuilt() bool { return false }
