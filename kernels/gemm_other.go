//go:build !amd64

package kernels

// cpuOffers returns the choices of CPUKernelsEnv: other architectures than
// x86-64 run the pure-Go micro-kernel only.
func cpuOffers() []string { return []string{"portable"} }

// kernelNamed returns the pure-Go micro-kernel, the only one here.
func kernelNamed[T Float](string) microKernel[T] { return goKernel[T]() }

func gateVec[T Float](dst, src, gate []T) int { return 0 }
func addVec[T Float](dst, src []T) int        { return 0 }

func affineVec[T Float](dst, src, res []T, mu, sc, sh T, relu bool) int { return 0 }
