package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// targetRoIs draws k boxes as TARGETS.md's RoIAlign cases do: log-uniform
// side 16..512 px, aspect ratio e^[-0.7,0.7], clipped to an imgH x imgW image.
func targetRoIs(rng *rand.Rand, dt tensor.Dtype, k, n int, imgH, imgW float64) *tensor.Dense {
	v := make([]float64, 0, 5*k)
	for range k {
		side := math.Exp(math.Log(16) + rng.Float64()*(math.Log(512)-math.Log(16)))
		aspect := math.Exp(-0.7 + 1.4*rng.Float64())
		w, h := side*math.Sqrt(aspect), side/math.Sqrt(aspect)
		cx, cy := rng.Float64()*imgW, rng.Float64()*imgH
		v = append(v, float64(rng.IntN(n)), math.Max(cx-w/2, 0), math.Max(cy-h/2, 0), math.Min(cx+w/2, imgW), math.Min(cy+h/2, imgH))
	}
	return fromFloat64s(dt, v, k, 5)
}

// deformLocations draws sampling locations as TARGETS.md describes
// Deformable-DETR producing them: per query a reference point (encoder: the
// centre of its own pixel, queries in level order; otherwise uniform), head
// m looking along angle 2*pi*m/M, point p at p+1 pixels along it (direction
// scaled so its largest component is 1), N(0,1) pixel noise, divided by the
// level's (W,H).
func deformLocations(rng *rand.Rand, dt tensor.Dtype, n, lq, m, p int, levels []Level, encoder bool) *tensor.Dense {
	l := len(levels)
	v := make([]float64, 0, n*lq*m*l*p*2)
	for range n {
		for q := range lq {
			rx, ry := rng.Float64(), rng.Float64()
			if encoder {
				rem := q
				for _, lv := range levels {
					if rem < lv.H*lv.W {
						rx = (float64(rem%lv.W) + 0.5) / float64(lv.W)
						ry = (float64(rem/lv.W) + 0.5) / float64(lv.H)
						break
					}
					rem -= lv.H * lv.W
				}
			}
			for h := range m {
				a := 2 * math.Pi * float64(h) / float64(m)
				dx, dy := math.Cos(a), math.Sin(a)
				s := math.Max(math.Abs(dx), math.Abs(dy))
				dx, dy = dx/s, dy/s
				for _, lv := range levels {
					for pt := range p {
						ox := dx*float64(pt+1) + rng.NormFloat64()
						oy := dy*float64(pt+1) + rng.NormFloat64()
						v = append(v, rx+ox/float64(lv.W), ry+oy/float64(lv.H))
					}
				}
			}
		}
	}
	return fromFloat64s(dt, v, n, lq, m, l, p, 2)
}

// softmaxWeights draws attention weights softmaxed over L*P, as the model
// produces them.
func softmaxWeights(rng *rand.Rand, dt tensor.Dtype, n, lq, m, l, p int) *tensor.Dense {
	v := make([]float64, n*lq*m*l*p)
	for i := 0; i < len(v); i += l * p {
		var sum float64
		for j := range l * p {
			v[i+j] = math.Exp(rng.NormFloat64())
			sum += v[i+j]
		}
		for j := range l * p {
			v[i+j] /= sum
		}
	}
	return fromFloat64s(dt, v, n, lq, m, l, p)
}

// benchGPU times op on device inputs: each iteration queues the op, and the
// timer stops only once the GPU is done.
func benchGPU(b *testing.B, op G.Op, inputs []*tensor.Dense) {
	dev := gpu(b)
	vals := make([]G.Value, len(inputs))
	for i, d := range inputs {
		vals[i] = toDev(b, dev, d)
	}
	pd := op.(G.UsePreallocDoer)
	out, err := op.Do(vals...)
	if err != nil {
		b.Fatal(err)
	}
	if err := dev.Synchronize(); err != nil {
		b.Fatal(err)
	}
	// A b.N loop rather than b.Loop: b.Loop stops the timer when it
	// returns, before the final Synchronize, and would time only the
	// launches.
	b.ResetTimer()
	for range b.N {
		if out, err = pd.UsePreallocDo(out, vals...); err != nil {
			b.Fatal(err)
		}
	}
	if err := dev.Synchronize(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1e3/float64(b.N), "ms/op")
}

func BenchmarkGPURoIAlign(b *testing.B) {
	cases := []struct {
		name          string
		n, c, h, w, k int
		pooled        int
		scale         float64
		sampling      int
		imgH, imgW    float64
	}{
		{"box_head_P2", 2, 256, 200, 336, 1024, 7, 0.25, 2, 800, 1344},
		{"mask_head_P2", 2, 256, 200, 336, 256, 14, 0.25, 2, 800, 1344},
		{"box_head_P2_adaptive", 2, 256, 200, 336, 1024, 7, 0.25, 0, 800, 1344},
		{"infer_1000_P3", 1, 256, 100, 168, 1000, 7, 0.125, 2, 800, 1344},
	}
	for _, c := range cases {
		rng := rand.New(rand.NewPCG(1, 1))
		dt := tensor.Float32
		s := roiAlignShape{cfg: RoIAlignConfig{c.pooled, c.pooled, c.scale, c.sampling, true}, n: c.n, c: c.c, h: c.h, w: c.w, k: c.k, dt: dt}
		x := randTensor(rng, dt, -1, 1, c.n, c.c, c.h, c.w)
		rois := targetRoIs(rng, dt, c.k, c.n, c.imgH, c.imgW)
		gy := randTensor(rng, dt, -1, 1, c.k, c.c, c.pooled, c.pooled)
		b.Run(fmt.Sprintf("impl=cuda/dtype=float32/case=%s/pass=fwd", c.name), func(b *testing.B) {
			benchGPU(b, &roiAlignOp{s}, []*tensor.Dense{x, rois})
		})
		b.Run(fmt.Sprintf("impl=cuda/dtype=float32/case=%s/pass=bwd", c.name), func(b *testing.B) {
			benchGPU(b, &roiAlignGradOp{s}, []*tensor.Dense{rois, gy})
		})
	}
}

func BenchmarkGPUMSDeformAttn(b *testing.B) {
	detr := []Level{{100, 167}, {50, 84}, {25, 42}, {13, 21}}
	seed := []Level{{92, 160}, {46, 80}, {23, 40}, {12, 20}}
	cases := []struct {
		name    string
		n, lq   int
		levels  []Level
		encoder bool
	}{
		{"detr_encoder", 2, 22223, detr, true},
		{"detr_decoder", 2, 300, detr, false},
		{"seed_full", 6, 15422, seed, false},
	}
	const m, d, p = 8, 32, 4
	for _, c := range cases {
		rng := rand.New(rand.NewPCG(2, 2))
		dt := tensor.Float32
		s := 0
		for _, lv := range c.levels {
			s += lv.H * lv.W
		}
		l := len(c.levels)
		sh := msDeformShape{n: c.n, s: s, m: m, d: d, lq: c.lq, l: l, p: p, levels: c.levels, dt: dt}
		value := randTensor(rng, dt, -1, 1, c.n, s, m, d)
		loc := deformLocations(rng, dt, c.n, c.lq, m, p, c.levels, c.encoder)
		weight := softmaxWeights(rng, dt, c.n, c.lq, m, l, p)
		gy := randTensor(rng, dt, -1, 1, c.n, c.lq, m*d)
		b.Run(fmt.Sprintf("impl=cuda/dtype=float32/case=%s/pass=fwd", c.name), func(b *testing.B) {
			benchGPU(b, &msDeformAttnOp{sh}, []*tensor.Dense{value, loc, weight})
		})
		b.Run(fmt.Sprintf("impl=cuda/dtype=float32/case=%s/pass=bwd", c.name), func(b *testing.B) {
			benchGPU(b, &msDeformAttnGradOp{sh}, []*tensor.Dense{value, loc, weight, gy})
		})
	}
}

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
	defer func() { msDeformKernelOverride = nil }()
	for _, v := range []msDeformKernel{{"msdeform_forward_f32_v4_u1", 4}, {"msdeform_forward_f32_v1_s", 1},
		{"msdeform_forward_f32_v4_s", 4}} {
		msDeformKernelOverride = func(bool, tensor.Dtype) msDeformKernel { return v }
		b.Run("impl=cuda/case=detr_encoder/kernel="+v.name, func(b *testing.B) {
			benchGPU(b, &msDeformAttnOp{sh}, []*tensor.Dense{value, loc, weight})
		})
	}
	for _, u := range []string{"u1_h", "s_h"} {
		name := "msdeform_backward_f32_" + u
		msDeformKernelOverride = func(bool, tensor.Dtype) msDeformKernel { return msDeformKernel{name, 1} }
		b.Run("impl=cuda/case=detr_encoder/kernel="+name, func(b *testing.B) {
			benchGPU(b, &msDeformAttnGradOp{sh}, []*tensor.Dense{value, loc, weight, gy})
		})
	}
}
