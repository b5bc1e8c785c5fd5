package kernels

import "math"

// Philox-4x32-10's constants (Salmon et al., "Parallel random numbers: as
// easy as 1, 2, 3", SC'11): the round multipliers and the Weyl increments
// of the key schedule.
const (
	philoxM0 = 0xD2511F53
	philoxM1 = 0xCD9E8D57
	philoxW0 = 0x9E3779B9
	philoxW1 = 0xBB67AE85
)

// Philox4x32 returns Philox-4x32-10 of counter c under key k: four 32-bit
// words that are a bijection of c for each k, and as random as the paper's
// tests can tell. dropout.cu's philox4x32_10 computes the same words.
func Philox4x32(c [4]uint32, k [2]uint32) [4]uint32 {
	for r := range 10 {
		if r > 0 {
			k[0] += philoxW0
			k[1] += philoxW1
		}
		p0 := uint64(philoxM0) * uint64(c[0])
		p1 := uint64(philoxM1) * uint64(c[2])
		c = [4]uint32{uint32(p1>>32) ^ c[1] ^ k[0], uint32(p1), uint32(p0>>32) ^ c[3] ^ k[1], uint32(p0)}
	}
	return c
}

// DropoutParams describes one dropout mask and its scale, as dropout.cu's
// kernel takes them. Element i of a tensor is kept when word i%4 of
//
//	Philox4x32((i/4, Stream, Step low, Step high), (Seed low, Seed high))
//
// is below Keep, and then multiplied by Scale; otherwise by 0. Stream
// tells apart the dropouts that share a seed and a step (the nodes of one
// graph), Step the training steps. The mask depends on nothing else: not
// on the dtype, the device or the launch.
type DropoutParams struct {
	N      int // elements, at most DropoutMaxElements
	Seed   uint64
	Stream uint32
	Step   uint64
	// Keep is the threshold of the words kept: (1-p)*2^32 rounded, so an
	// element is kept with probability 1-p to within 2^-33. DropoutKeepAll
	// (2^32) keeps every element and draws no numbers.
	Keep uint64
	// Scale is 1/(1-p) as PyTorch rounds it, in the element type:
	// DropoutScale. 1 with DropoutKeepAll.
	Scale float64
}

const (
	// DropoutKeepAll is DropoutParams.Keep for the identity: dropout with
	// p = 0, or outside training.
	DropoutKeepAll = 1 << 32
	// DropoutMaxElements bounds a tensor's elements: a group of four
	// elements is one 32-bit counter word.
	DropoutMaxElements = 4 << 32
)

// DropoutKeep returns DropoutParams.Keep for drop probability p, 0 <= p < 1.
func DropoutKeep(p float64) uint64 {
	if p <= 0 {
		return DropoutKeepAll
	}
	return min(uint64(math.Round((1-p)*(1<<32))), DropoutKeepAll-1)
}

// DropoutScale returns DropoutParams.Scale for drop probability p and
// elements of elemBytes bytes (4 or 8): 1/(1-p) as PyTorch computes it for
// the dtype, 1 divided by 1-p each in the element type.
func DropoutScale(p float64, elemBytes int) float64 {
	if elemBytes == 4 {
		return float64(float32(1) / float32(1-p))
	}
	return 1 / (1 - p)
}

// dropoutGrain is the fewest groups of four elements a goroutine is given.
const dropoutGrain = 1 << 12

// Dropout writes y = x * m, m = Scale where the mask keeps the element and
// 0 where it drops it (see DropoutParams). x times 0, as in PyTorch: a NaN
// or an infinity of x stays NaN where it is dropped. The backward pass is
// the same function of dy: dx = dy * m, the mask drawn again.
func Dropout[T Float](p DropoutParams, x, y []T) {
	scale := T(p.Scale)
	if p.Keep >= DropoutKeepAll {
		parallelFor(p.N, 4*dropoutGrain, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				y[i] = x[i] * scale
			}
		})
		return
	}
	key := [2]uint32{uint32(p.Seed), uint32(p.Seed >> 32)}
	parallelFor((p.N+3)/4, dropoutGrain, func(lo, hi int) {
		for g := lo; g < hi; g++ {
			r := Philox4x32([4]uint32{uint32(g), p.Stream, uint32(p.Step), uint32(p.Step >> 32)}, key)
			for j := range 4 {
				i := 4*g + j
				if i >= p.N {
					break
				}
				m := T(0)
				if uint64(r[j]) < p.Keep {
					m = scale
				}
				y[i] = x[i] * m
			}
		}
	})
}
