package train

import (
	"fmt"
	"math"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/examples/maskrcnn/model"
)

// Adam is AdamW (Adam with decoupled weight decay, Loshchilov & Hutter),
// with its state kept by parameter name so that checkpoints can save and
// restore it. Gradients whose global norm exceeds ClipNorm (when positive)
// are scaled down to it first: early steps of a detector from scratch can
// be violent.
type Adam struct {
	Beta1, Beta2, Eps float64
	WeightDecay       float64
	ClipNorm          float64
	Step              int // updates made
	M, V              map[string][]float32
}

// NewAdam returns AdamW with PyTorch's default betas and epsilon.
func NewAdam(weightDecay, clipNorm float64) *Adam {
	return &Adam{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: weightDecay, ClipNorm: clipNorm,
		M: map[string][]float32{}, V: map[string][]float32{}}
}

// Update applies one step of learning rate lr to the named parameters of
// params from their gradients (in the same order) and returns the
// gradients' global norm before clipping.
func (a *Adam) Update(params *model.Params, names []string, grads []*tensor.Dense, lr float64) (float64, error) {
	if len(names) != len(grads) {
		return 0, fmt.Errorf("train: Adam: %d names for %d gradients", len(names), len(grads))
	}
	var sq float64
	for _, g := range grads {
		for _, v := range g.Float32s() {
			sq += float64(v) * float64(v)
		}
	}
	norm := math.Sqrt(sq)
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		return norm, fmt.Errorf("train: the gradient is not finite (norm %v)", norm)
	}
	scale := 1.0
	if a.ClipNorm > 0 && norm > a.ClipNorm {
		scale = a.ClipNorm / norm
	}
	a.Step++
	c1 := 1 - math.Pow(a.Beta1, float64(a.Step))
	c2 := 1 - math.Pow(a.Beta2, float64(a.Step))
	b1, b2 := float32(a.Beta1), float32(a.Beta2)
	for i, name := range names {
		w := params.Value(name)
		if w == nil {
			return norm, fmt.Errorf("train: Adam: no parameter %s", name)
		}
		wd, gd := w.Float32s(), grads[i].Float32s()
		m, v := a.M[name], a.V[name]
		if m == nil {
			m, v = make([]float32, len(wd)), make([]float32, len(wd))
			a.M[name], a.V[name] = m, v
		}
		decay := float32(1)
		if params.Decays(name) {
			decay = float32(1 - lr*a.WeightDecay)
		}
		step := float32(lr / c1)
		sc, corr2, eps := float32(scale), float32(c2), float32(a.Eps)
		for j, g := range gd {
			g *= sc
			m[j] = b1*m[j] + (1-b1)*g
			v[j] = b2*v[j] + (1-b2)*g*g
			wd[j] = wd[j]*decay - step*m[j]/(sqrt32(v[j]/corr2)+eps)
		}
	}
	return norm, nil
}

func sqrt32(x float32) float32 { return float32(math.Sqrt(float64(x))) }
