package ops

// Every backward kernel variant of msdeform.cu against the CPU twin, not just
// the one msDeformKernelFor picks: the benchmarks time them all, and any of
// them may become the default. Like gpu_test.go, it needs a binary built
// with -tags stheno_cuda and a GPU, and skips visibly anywhere else.

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"gorgonia.org/tensor"
)

// msDeformBackwardVariants lists the backward kernels of msdeform.cu by
// suffix, for each dtype: msdeform_backward_<f32|f64>_<suffix>.
var msDeformBackwardVariants = map[tensor.Dtype][]string{
	tensor.Float32: {"u1_h", "s_h", "r4_h", "r8_h", "r16_h"},
	tensor.Float64: {"u1_h", "r4_h", "r8_h", "r16_h"},
}

func TestGPUMSDeformAttnBackwardVariants(t *testing.T) {
	dev := gpu(t)
	defer func() { msDeformKernelOverride = nil }()
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for _, v := range msDeformBackwardVariants[dt] {
			name := "msdeform_backward_" + dtypeSuffix(dt) + "_" + v
			msDeformKernelOverride = func(backward bool, dt tensor.Dtype) msDeformKernel {
				if !backward {
					// Only the backward op runs here; this forward kernel
					// takes any D and alignment.
					return msDeformKernel{"msdeform_forward_" + dtypeSuffix(dt) + "_v1_s", 1}
				}
				return msDeformKernel{name, 1}
			}
			for i, c := range msDeformParityCases {
				t.Run(fmt.Sprintf("kernel=%s/%s", name, c.name), func(t *testing.T) {
					sh, value, loc, weight, gy := c.inputs(t, rand.New(rand.NewPCG(uint64(i), 4)), dt)
					parity(t, dev, &msDeformAttnGradOp{sh}, dt, value, loc, weight, gy)
				})
			}
		}
	}
}
