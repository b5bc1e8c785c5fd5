package ops

import (
	"math/rand/v2"
	"testing"

	"gorgonia.org/tensor"
)

// BenchmarkGPUMSDeformAttnVariants times every kernel variant of
// msdeform.cu on the encoder case, to choose msDeformKernelFor's defaults.
func BenchmarkGPUMSDeformAttnVariants(b *testing.B) {
	detr := []Level{{100, 167}, {50, 84}, {25, 42}, {13, 21}}
	const n, lq, m, d, p = 2, 22223, 8, 32, 4
	rng := rand.New(rand.NewPCG(2, 2))
	dt := tensor.Float32
	sh := msDeformShape{n: n, s: 22223, m: m, d: d, lq: lq, l: 4, p: p, levels: detr, dt: dt}
	value := randTensor(rng, dt, -1, 1, n, 22223, m, d)
	loc := deformLocations(rng, dt, n, lq, m, p, detr, true)
	weight := softmaxWeights(rng, dt, n, lq, m, 4, p)
	gy := randTensor(rng, dt, -1, 1, n, lq, m*d)
	vb, lb, ob := float64(4*n*22223*m*d), float64(4*n*lq*m*4*p*3), float64(4*n*lq*m*d)
	defer func() { msDeformKernelOverride = nil }()
	for _, v := range []msDeformKernel{{"msdeform_forward_f32_v4_u1", 4}, {"msdeform_forward_f32_v1_s", 1},
		{"msdeform_forward_f32_v4_s", 4}} {
		msDeformKernelOverride = func(bool, tensor.Dtype) msDeformKernel { return v }
		b.Run("impl=cuda/case=detr_encoder/kernel="+v.name, func(b *testing.B) {
			runCase(b, "cuda", &msDeformAttnOp{sh}, []*tensor.Dense{value, loc, weight}, vb+lb+ob)
		})
	}
	for _, v := range msDeformBackwardVariants[dt] {
		k := v.kernel(dt)
		msDeformKernelOverride = func(bool, tensor.Dtype) msDeformKernel { return k }
		b.Run("impl=cuda/case=detr_encoder/kernel="+k.name, func(b *testing.B) {
			runCase(b, "cuda", &msDeformAttnGradOp{sh}, []*tensor.Dense{value, loc, weight, gy}, 2*(vb+lb)+ob)
		})
	}
}
