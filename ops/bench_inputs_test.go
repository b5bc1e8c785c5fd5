package ops

// Inputs of the benchmarks, drawn as ../shared/TARGETS.md describes.

import (
	"math"
	"math/rand/v2"

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
