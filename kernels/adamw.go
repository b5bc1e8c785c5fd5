package kernels

import "math"

// The geometry of adamw.cu, as it states it (ops checks that kernels/cuda's
// generated constants agree).
const (
	// AdamWChunkElems is the elements of a chunk, a block's work: tensors
	// are cut into chunks from their first element, the last one short.
	AdamWChunkElems = 16384
	// AdamWThreads is the threads of every block of the kernels.
	AdamWThreads = 256
	// AdamWMaxGroups is the parameter groups a step may have.
	AdamWMaxGroups = 16
	// AdamWTensorWords is the int64 words of a tensor's row of the
	// device table (AdamWTable).
	AdamWTensorWords = 6
)

// AdamWScalars holds the scalars of one AdamW step (torch.optim.AdamW) on
// the tensors of one parameter group, worked out in float64 from the
// hyperparameters and the step count t (NewAdamWScalars); the update
// rounds each to the element type once, as the kernels do.
type AdamWScalars struct {
	Beta1, OneMinusBeta1 float64
	Beta2, OneMinusBeta2 float64
	Eps                  float64
	// BC2Sqrt is sqrt(1 - Beta2^t).
	BC2Sqrt float64
	// Decay is 1 - lr*wd, the decoupled weight decay of the group.
	Decay float64
	// StepSize is lr / (1 - Beta1^t).
	StepSize float64
}

// NewAdamWScalars returns the scalars of step t (counted from 1) of AdamW
// with betas beta1, beta2, epsilon eps, learning rate lr and weight decay
// wd.
func NewAdamWScalars(beta1, beta2, eps, lr, wd float64, t int) AdamWScalars {
	return AdamWScalars{
		Beta1: beta1, OneMinusBeta1: 1 - beta1,
		Beta2: beta2, OneMinusBeta2: 1 - beta2,
		Eps:      eps,
		BC2Sqrt:  math.Sqrt(1 - math.Pow(beta2, float64(t))),
		Decay:    1 - lr*wd,
		StepSize: lr / (1 - math.Pow(beta1, float64(t))),
	}
}

// AdamWUpdate makes step s on one tensor: param, its gradient grad and its
// moments m and v, all of one length. With clip the gradient is scaled by
// coef first (AdamWClipCoef); with zeroGrad it is overwritten with zeros
// once read. Per element, in T, each operation rounded as adamw.cu rounds
// it (its header gives the formulas), so the kernels' bits:
//
//	g = grad*coef
//	p = p*Decay
//	m = Beta1*m + OneMinusBeta1*g
//	v = Beta2*v + (OneMinusBeta2*g)*g
//	p = p - (StepSize*m) / (sqrt(v)/BC2Sqrt + Eps)
func AdamWUpdate[T Float](s AdamWScalars, coef float64, clip, zeroGrad bool, param, grad, m, v []T) {
	decay, stepSize := T(s.Decay), T(s.StepSize)
	beta1, omb1 := T(s.Beta1), T(s.OneMinusBeta1)
	beta2, omb2 := T(s.Beta2), T(s.OneMinusBeta2)
	eps, bc2 := T(s.Eps), T(s.BC2Sqrt)
	c := T(coef)
	parallelFor(len(param), 1<<14, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			g := grad[i]
			if clip {
				g = T(g * c)
			}
			x := T(param[i] * decay)
			mi := T(beta1*m[i]) + T(omb1*g)
			vi := T(beta2*v[i]) + T(T(omb2*g)*g)
			denom := T(sqrtT(vi)/bc2) + eps
			param[i] = x - T(T(stepSize*mi)/denom)
			m[i], v[i] = mi, vi
			if zeroGrad {
				grad[i] = 0
			}
		}
	})
}

// sqrtT is the correctly rounded square root in T (for float32, the
// float64 root rounded once: exact enough to round correctly).
func sqrtT[T Float](x T) T { return T(math.Sqrt(float64(x))) }

// AdamWClipCoef returns torch.nn.utils.clip_grad_norm_'s coefficient for a
// total norm and a threshold maxNorm: min(maxNorm/(norm + 1e-6), 1). A NaN
// norm gives NaN (torch's clamp lets it through), an infinite one 0.
func AdamWClipCoef(norm, maxNorm float64) float64 {
	coef := maxNorm / (norm + 1e-6)
	if coef > 1 {
		coef = 1
	}
	return coef
}

// AdamWChunks returns the chunks of tensors of the given lengths in the
// kernels' order, tensor after tensor, each as (chunk index in the tensor
// << 32) | tensor index: the chunk words of the device table. A tensor of
// no elements has none.
func AdamWChunks(lengths []int) []int64 {
	var out []int64
	for t, n := range lengths {
		for c := 0; c*AdamWChunkElems < n; c++ {
			out = append(out, int64(c)<<32|int64(t))
		}
	}
	return out
}

// AdamWNorm returns the 2-norm of all the gradients together as the kernels
// work it out: the sum of squares of each chunk (AdamWChunks) in float64,
// each thread of its block adding its 16-byte units t, t+AdamWThreads, ...
// in order, then the block's butterflies (threadSum); then the chunks' sums
// added alike by one block, thread t the chunks t, t+AdamWThreads, ...; its
// square root.
func AdamWNorm[T Float](grads [][]T) float64 {
	lengths := make([]int, len(grads))
	for i, g := range grads {
		lengths[i] = len(g)
	}
	chunks := AdamWChunks(lengths)
	partial := make([]float64, len(chunks))
	vec := 16 / int(sizeOf[T]())
	parallelFor(len(chunks), 16, func(lo, hi int) {
		part := make([]float64, AdamWThreads)
		for b := lo; b < hi; b++ {
			w := chunks[b]
			g := grads[w&0xffffffff]
			start := int(w>>32) * AdamWChunkElems
			g = g[start:min(start+AdamWChunkElems, len(g))]
			for t := range AdamWThreads {
				var s float64
				for u := t * vec; u < len(g); u += AdamWThreads * vec {
					for _, x := range g[u:min(u+vec, len(g))] {
						d := float64(x)
						s += float64(d * d)
					}
				}
				part[t] = s
			}
			partial[b] = threadSum(part)
		}
	})
	part := make([]float64, AdamWThreads)
	for t := range AdamWThreads {
		var s float64
		for i := t; i < len(partial); i += AdamWThreads {
			s += partial[i]
		}
		part[t] = s
	}
	return math.Sqrt(threadSum(part))
}

// sizeOf returns the bytes of a T.
func sizeOf[T Float]() uintptr {
	var x T
	switch any(x).(type) {
	case float32:
		return 4
	}
	return 8
}

// AdamWTable returns the device table of adamw.cu for tensors given by
// their rows (param, grad, m and v addresses, length and group, as int64
// words; AdamWTensorWords each): the rows, then the chunk words of
// AdamWChunks. It also returns the number of chunks.
func AdamWTable(rows [][AdamWTensorWords]int64) ([]int64, int) {
	lengths := make([]int, len(rows))
	table := make([]int64, 0, len(rows)*AdamWTensorWords)
	for i, r := range rows {
		lengths[i] = int(r[4])
		table = append(table, r[:]...)
	}
	chunks := AdamWChunks(lengths)
	return append(table, chunks...), len(chunks)
}
