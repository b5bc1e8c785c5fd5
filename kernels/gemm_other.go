//go:build !amd64

package kernels

// platformKernels returns no assembly micro-kernel: other architectures use
// the pure-Go one.
func platformKernels[T Float]() []microKernel[T] { return nil }

func gateVec[T Float](dst, src, gate []T) int { return 0 }
func addVec[T Float](dst, src []T) int        { return 0 }

func affineVec[T Float](dst, src, res []T, mu, sc, sh T, relu bool) int { return 0 }
