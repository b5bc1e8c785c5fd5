package kernels

import (
	"fmt"
	"math"
)

// PointwiseOp is an elementwise function of pointwise.cu: out = f(a) for
// the unary ops, f(a, b) for the binary ones, alpha a constant of the op.
// The values are the kernels' opcodes.
type PointwiseOp int32

const (
	PointwiseScale          PointwiseOp = iota // a * alpha
	PointwiseReLU                              // a <= 0 ? 0 : a; NaN stays NaN
	PointwiseSigmoid                           // 1 / (1 + exp(-a))
	PointwiseInverseSigmoid                    // log(max(c, eps) / max(1 - c, eps)), c = clamp(a, 0, 1), eps = alpha
	PointwiseExp
	PointwiseLog
	PointwiseSqrt
	PointwiseSquare // a * a
	PointwiseFill   // alpha, reading nothing
	PointwiseAdd
	PointwiseSub
	PointwiseMul
	PointwiseDiv
	PointwiseNegDiv             // -(a / b)
	PointwiseReLUGrad           // a = y, b = dy: y <= 0 ? 0 : dy
	PointwiseSigmoidGrad        // a = y, b = dy: dy * (1 - y) * y
	PointwiseSqrtGrad           // a = y, b = dy: dy / (2 * y)
	PointwiseSquareGrad         // a = x, b = dy: dy * (2 * x)
	PointwiseInverseSigmoidGrad // a = x, b = dy, eps = alpha: PyTorch's autograd of InverseSigmoid
	PointwiseOps                // the number of ops
)

// PointwiseMaxDims is the most dims of a broadcast's collapsed output
// shape (pointwise.cu's kMaxDims).
const PointwiseMaxDims = 6

var pointwiseNames = [...]string{
	"Scale", "ReLU", "Sigmoid", "InverseSigmoid", "Exp", "Log", "Sqrt", "Square", "Fill",
	"Add", "Sub", "Mul", "Div", "NegDiv", "ReLUGrad", "SigmoidGrad", "SqrtGrad", "SquareGrad", "InverseSigmoidGrad",
}

func (op PointwiseOp) String() string {
	if op >= 0 && op < PointwiseOps {
		return pointwiseNames[op]
	}
	return fmt.Sprintf("PointwiseOp(%d)", int32(op))
}

// Arity is the number of operands op reads: 0 (Fill), 1 or 2.
func (op PointwiseOp) Arity() int {
	switch {
	case op == PointwiseFill:
		return 0
	case op < PointwiseAdd:
		return 1
	}
	return 2
}

// pointwiseGrain is the fewest elements a goroutine is given.
const pointwiseGrain = 1 << 15

// PointwiseMap writes out[i] = op(a[i], b[i]) for operands of out's length
// (b unused by unary ops, a by Fill): pointwise.cu's map kernels.
func PointwiseMap[T Float](op PointwiseOp, alpha float64, a, b, out []T) {
	f := pointwiseFunc[T](op, alpha)
	parallelFor(len(out), pointwiseGrain, func(lo, hi int) {
		var x, y T
		for i := lo; i < hi; i++ {
			if a != nil {
				x = a[i]
			}
			if b != nil {
				y = b[i]
			}
			out[i] = f(x, y)
		}
	})
}

// BroadcastParams is a broadcast as the bcast kernels see it: the output's
// shape collapsed to Rank dims (innermost last), and each operand's element
// stride along each (0 where it is broadcast).
type BroadcastParams struct {
	N                       int // the output's elements
	Rank                    int
	Shape, StrideA, StrideB [PointwiseMaxDims]int
}

// NewBroadcastParams collapses the broadcast of operands of shapes a and b
// (b nil for one operand) to out, which must be their broadcast shape:
// each operand's dims align with out's trailing ones and are out's or 1.
// Dims of one are dropped, and neighbours that every operand steps
// through alike are merged. It fails when more than PointwiseMaxDims dims
// are left.
func NewBroadcastParams(out, a, b []int) (BroadcastParams, error) {
	var p BroadcastParams
	n := 1
	for _, d := range out {
		n *= d
	}
	p.N = n
	strides := func(s []int) []int {
		st := make([]int, len(out))
		if s == nil {
			return st
		}
		acc := 1
		for i := len(s) - 1; i >= 0; i-- {
			j := len(out) - len(s) + i
			if s[i] != 1 {
				st[j] = acc
			}
			acc *= s[i]
		}
		return st
	}
	sa, sb := strides(a), strides(b)
	// Collapse from the innermost dim outwards.
	var shape, stA, stB []int
	for i := len(out) - 1; i >= 0; i-- {
		if out[i] == 1 {
			continue
		}
		if k := len(shape) - 1; k >= 0 && sa[i] == stA[k]*shape[k] && sb[i] == stB[k]*shape[k] {
			shape[k] *= out[i]
			continue
		}
		shape, stA, stB = append(shape, out[i]), append(stA, sa[i]), append(stB, sb[i])
	}
	if len(shape) == 0 {
		shape, stA, stB = []int{1}, []int{0}, []int{0}
		if a != nil {
			stA[0] = 1
		}
		if b != nil {
			stB[0] = 1
		}
	}
	if len(shape) > PointwiseMaxDims {
		return p, fmt.Errorf("the broadcast of %v and %v to %v has %d dims after merging neighbours, more than the kernels' %d", a, b, out, len(shape), PointwiseMaxDims)
	}
	p.Rank = len(shape)
	for k := range shape { // innermost last
		j := len(shape) - 1 - k
		p.Shape[j], p.StrideA[j], p.StrideB[j] = shape[k], stA[k], stB[k]
	}
	return p, nil
}

// VectorOK reports whether the bcast kernels may take v outputs at once
// (v dividing the innermost dim; each operand's innermost stride 0, or 1
// with every stride a multiple of v) given that the pointers are aligned
// to v elements; operands absent or unread do not count.
func (p BroadcastParams) VectorOK(v int, readA, readB bool) bool {
	if p.Shape[p.Rank-1]%v != 0 {
		return false
	}
	ok := func(st [PointwiseMaxDims]int) bool {
		switch st[p.Rank-1] {
		case 0:
			return true
		case 1:
			for _, s := range st[:p.Rank-1] {
				if s%v != 0 {
					return false
				}
			}
			return true
		}
		return false
	}
	return (!readA || ok(p.StrideA)) && (!readB || ok(p.StrideB))
}

// PointwiseBroadcast writes out = op(a, b) over the broadcast p
// (NewBroadcastParams): pointwise.cu's bcast kernels.
func PointwiseBroadcast[T Float](op PointwiseOp, alpha float64, p BroadcastParams, a, b, out []T) {
	f := pointwiseFunc[T](op, alpha)
	inner := p.Shape[p.Rank-1]
	rows := p.N / inner
	ia, ib := p.StrideA[p.Rank-1], p.StrideB[p.Rank-1]
	parallelFor(rows, max(1, pointwiseGrain/inner), func(lo, hi int) {
		var x, y T
		for row := lo; row < hi; row++ {
			// The operands' offsets of the row's first element.
			oa, ob, rem := 0, 0, row
			for d := p.Rank - 2; d >= 0; d-- {
				c := rem % p.Shape[d]
				rem /= p.Shape[d]
				oa += c * p.StrideA[d]
				ob += c * p.StrideB[d]
			}
			o := out[row*inner : (row+1)*inner]
			for j := range o {
				if a != nil {
					x = a[oa+j*ia]
				}
				if b != nil {
					y = b[ob+j*ib]
				}
				o[j] = f(x, y)
			}
		}
	})
}

// pointwiseFunc returns op as a function of two elements, alpha bound.
// Each operation rounds to T as the kernels' do; exp, log and sqrt are
// computed in float64 and rounded once (within an ulp or two of CUDA's
// float32 functions).
func pointwiseFunc[T Float](op PointwiseOp, alpha float64) func(a, b T) T {
	al := T(alpha)
	switch op {
	case PointwiseScale:
		return func(a, _ T) T { return a * al }
	case PointwiseReLU:
		return func(a, _ T) T {
			if a <= 0 {
				return 0
			}
			return a
		}
	case PointwiseSigmoid:
		return func(a, _ T) T { return 1 / (1 + expOf(-a)) }
	case PointwiseInverseSigmoid:
		return func(a, _ T) T {
			c := upperTo(lowerTo(a, 0), 1)
			return logOf(lowerTo(c, al) / lowerTo(1-c, al))
		}
	case PointwiseExp:
		return func(a, _ T) T { return expOf(a) }
	case PointwiseLog:
		return func(a, _ T) T { return logOf(a) }
	case PointwiseSqrt:
		return func(a, _ T) T { return T(math.Sqrt(float64(a))) }
	case PointwiseSquare:
		return func(a, _ T) T { return a * a }
	case PointwiseFill:
		return func(_, _ T) T { return al }
	case PointwiseAdd:
		return func(a, b T) T { return a + b }
	case PointwiseSub:
		return func(a, b T) T { return a - b }
	case PointwiseMul:
		return func(a, b T) T { return a * b }
	case PointwiseDiv:
		return func(a, b T) T { return a / b }
	case PointwiseNegDiv:
		return func(a, b T) T { return -(a / b) }
	case PointwiseReLUGrad:
		return func(y, dy T) T {
			if y <= 0 {
				return 0
			}
			return dy
		}
	case PointwiseSigmoidGrad:
		return func(y, dy T) T { return dy * (1 - y) * y }
	case PointwiseSqrtGrad:
		return func(y, dy T) T { return dy / (2 * y) }
	case PointwiseSquareGrad:
		return func(x, dy T) T { return dy * (2 * x) }
	case PointwiseInverseSigmoidGrad:
		return func(x, dy T) T { return inverseSigmoidGrad(x, dy, al) }
	}
	panic(fmt.Sprintf("kernels: unknown %v", op))
}

// inverseSigmoidGrad is PyTorch's autograd of inverse_sigmoid, step by
// step (pointwise.cu's kInverseSigmoidGrad): c = clamp(x, 0, 1), x1 =
// clamp(c, min=eps), x2 = clamp(1 - c, min=eps), q = x1 / x2, y = log(q).
// A clamp passes the gradient where its input lies within its bounds, ends
// included; nowhere for NaN.
func inverseSigmoidGrad[T Float](x, dy, eps T) T {
	c := upperTo(lowerTo(x, 0), 1)
	x1, x2 := lowerTo(c, eps), lowerTo(1-c, eps)
	q := x1 / x2
	gq := dy / q
	g1 := gq / x2
	g2 := -gq * (q / x2)
	var gc1, gc2 T
	if c >= eps {
		gc1 = g1
	}
	if 1-c >= eps {
		gc2 = g2
	}
	if x >= 0 && x <= 1 {
		return gc1 - gc2
	}
	return 0
}

// lowerTo and upperTo clamp v from below and from above, keeping a NaN v
// (PyTorch's clamp).
func lowerTo[T Float](v, lo T) T {
	if v < lo {
		return lo
	}
	return v
}

func upperTo[T Float](v, hi T) T {
	if v > hi {
		return hi
	}
	return v
}
