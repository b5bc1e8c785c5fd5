package kernels

import "math"

// SoftmaxParams describes softmax along one axis of a tensor seen as
// [Outer, N, Inner], N the axis's length: each of the Outer*Inner lines of
// N elements, Inner apart, is one softmax (Log: one log-softmax). The CUDA
// kernels (kernels/softmax.cu) take the same view.
type SoftmaxParams struct {
	Outer, N, Inner int
	Log             bool
}

// softmaxLanes is the number of partial sums of a line: element k goes to
// sum k % softmaxLanes, and the partial sums are added by a halving tree,
// as a warp's lanes and its butterfly add them on the GPU (each CUDA
// design splits a line between threads this way, in its own grouping).
// The sum of a long line so rounds like the GPU's, with an error bound
// that grows with n/32 rather than with n.
const softmaxLanes = 32

// softmaxGrain is the fewest elements a goroutine is given.
const softmaxGrain = 1 << 14

// SoftmaxForward writes y = softmax(x) along the axis of p, or log-softmax
// with p.Log, as PyTorch computes them:
//
//	y = exp(x - max) / sum exp(x - max)
//	log: y = (x - max) - log(sum exp(x - max))
//
// A NaN in a line makes the whole line NaN (the max keeps it), and so does
// a line of -inf only or one holding +inf, as in PyTorch. Each line takes
// three passes, as softmax.cu's kernels do: the max, the sum, the output
// (softmax keeps exp(x - max) in y from the second pass to the third, as
// the warp kernels keep it in registers).
func SoftmaxForward[T Float](p SoftmaxParams, x, y []T) {
	parallelFor(p.Outer*p.Inner, max(1, softmaxGrain/max(p.N, 1)), func(lo, hi int) {
		var lanes [softmaxLanes]T
		for line := lo; line < hi; line++ {
			first, st := softmaxLine(p, line)
			last := first + (p.N-1)*st
			m := T(math.Inf(-1))
			for i := first; i <= last; i += st {
				m = nanMax(m, x[i])
			}
			clear(lanes[:])
			if p.Log {
				for k, i := 0, first; i <= last; k, i = k+1, i+st {
					lanes[k%softmaxLanes] += expOf(x[i] - m)
				}
				ls := logOf(treeSum(&lanes))
				for i := first; i <= last; i += st {
					y[i] = (x[i] - m) - ls
				}
				continue
			}
			// exp(x - max) waits in y for the sum, as in the warp kernels'
			// registers: one exp per element.
			for k, i := 0, first; i <= last; k, i = k+1, i+st {
				e := expOf(x[i] - m)
				y[i] = e
				lanes[k%softmaxLanes] += e
			}
			sum := treeSum(&lanes)
			for i := first; i <= last; i += st {
				y[i] /= sum
			}
		}
	})
}

// SoftmaxBackward writes the gradient dx of softmax (log-softmax with
// p.Log) given its output y and the gradient dy of y:
//
//	dx = y * (dy - sum dy*y)
//	log: dx = dy - exp(y) * sum dy
//
// as PyTorch's backward computes them from the output.
func SoftmaxBackward[T Float](p SoftmaxParams, y, dy, dx []T) {
	parallelFor(p.Outer*p.Inner, max(1, softmaxGrain/max(p.N, 1)), func(lo, hi int) {
		var lanes [softmaxLanes]T
		for line := lo; line < hi; line++ {
			first, st := softmaxLine(p, line)
			last := first + (p.N-1)*st
			clear(lanes[:])
			for k, i := 0, first; i <= last; k, i = k+1, i+st {
				if p.Log {
					lanes[k%softmaxLanes] += dy[i]
				} else {
					lanes[k%softmaxLanes] += dy[i] * y[i]
				}
			}
			sum := treeSum(&lanes)
			for i := first; i <= last; i += st {
				if p.Log {
					dx[i] = dy[i] - expOf(y[i])*sum
				} else {
					dx[i] = y[i] * (dy[i] - sum)
				}
			}
		}
	})
}

// softmaxLine returns the index of line's first element and the stride of
// its elements: line = outer*Inner + inner, as the inner kernels number
// their threads' lines.
func softmaxLine(p SoftmaxParams, line int) (first, stride int) {
	o, i := line/p.Inner, line%p.Inner
	return o*p.N*p.Inner + i, p.Inner
}

// nanMax is max(a, b) keeping a NaN of either (softmax.cu's nan_max), so
// that the max of a line holding a NaN is NaN, and so is every x - max.
func nanMax[T Float](a, b T) T {
	if b > a || b != b {
		return b
	}
	return a
}

// expOf and logOf compute in float64 and round once to T: for float32 the
// correctly rounded result nearly always, within an ulp of CUDA's expf and
// logf (2 and 1 ulps at most).
func expOf[T Float](v T) T { return T(math.Exp(float64(v))) }
func logOf[T Float](v T) T { return T(math.Log(float64(v))) }

// treeSum adds the partial sums by halves (lane j + lane j+16, then j+8,
// ...), the order in which a warp's butterfly leaves them in lane 0.
func treeSum[T Float](lanes *[softmaxLanes]T) T {
	for off := softmaxLanes / 2; off > 0; off /= 2 {
		for j := range off {
			lanes[j] += lanes[j+off]
		}
	}
	return lanes[0]
}
