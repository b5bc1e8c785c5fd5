package ops

import (
	"fmt"
	"math"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/kernels"
)

// The elementwise ops: Add, Sub, Mul and Div of two tensors broadcast as
// PyTorch broadcasts them, Scale by a constant, and ReLU, Sigmoid,
// InverseSigmoid, Exp, Log, Sqrt and Square. Each runs where its inputs
// live (kernels/pointwise.cu on a GPU, kernels/pointwise.go on the host),
// computes as PyTorch's kernels do (NaN and infinities included) and is
// differentiable; the gradients are ops of this file and of reduce.go, so
// a backward pass stays on the device too.

// Add returns a + b, broadcast as PyTorch broadcasts: the shapes align at
// their last dims, and each pair of dims must be equal or one of them 1
// (a missing dim counts as 1); the output takes the larger of each pair.
// a and b have the same dtype, float32 or float64, and a dim or more.
// Broadcasting takes up to PointwiseMaxDims output dims (tensors of the
// same shape may have more). The gradient of each operand is the output's
// gradient summed over the dims it was broadcast along (Sum's kernels).
func Add(a, b *G.Node) (*G.Node, error) { return binaryOp("Add", kernels.PointwiseAdd, a, b) }

// Sub returns a - b, broadcast as Add.
func Sub(a, b *G.Node) (*G.Node, error) { return binaryOp("Sub", kernels.PointwiseSub, a, b) }

// Mul returns a * b elementwise, broadcast as Add.
func Mul(a, b *G.Node) (*G.Node, error) { return binaryOp("Mul", kernels.PointwiseMul, a, b) }

// Div returns a / b elementwise, broadcast as Add: x/0 is ±inf, 0/0 NaN.
// The gradient of b is -dy * ((a/b) / b), as PyTorch's autograd has it.
func Div(a, b *G.Node) (*G.Node, error) { return binaryOp("Div", kernels.PointwiseDiv, a, b) }

// PointwiseMaxDims is the most dims of a broadcast's output (Add, Sub, Mul
// and Div of tensors of different shapes).
const PointwiseMaxDims = kernels.PointwiseMaxDims

// Scale returns x * c, c a constant of the op (rounded to x's dtype).
func Scale(x *G.Node, c float64) (*G.Node, error) {
	return unaryOp("Scale", kernels.PointwiseScale, x, c)
}

// ReLU returns max(x, 0) elementwise, NaN staying NaN; its gradient is 0
// where the output is 0 (at 0 too, as PyTorch's).
func ReLU(x *G.Node) (*G.Node, error) { return unaryOp("ReLU", kernels.PointwiseReLU, x, 0) }

// Sigmoid returns 1 / (1 + exp(-x)) elementwise; its gradient is dy * (1 -
// y) * y from the output y.
func Sigmoid(x *G.Node) (*G.Node, error) { return unaryOp("Sigmoid", kernels.PointwiseSigmoid, x, 0) }

// DefaultInverseSigmoidEps is InverseSigmoid's eps when it is given 0:
// Deformable-DETR's inverse_sigmoid's default.
const DefaultInverseSigmoidEps = 1e-5

// InverseSigmoid is Deformable-DETR's inverse_sigmoid (util/misc.py): with
// c = x clamped to [0, 1],
//
//	y = log(max(c, eps) / max(1 - c, eps))
//
// elementwise, so that y stays finite at 0 and 1. eps must be in (0, 0.5);
// 0 stands for DefaultInverseSigmoidEps. Its gradient is PyTorch's
// autograd of that expression, clamp for clamp (a clamp passes the
// gradient where its input lies within its bounds, ends included): dy /
// (x(1-x)) where neither clamp to eps acts; where one does (x below eps,
// or 1 - x below eps) only the other's share, dy/(1-x) or dy/x; 0 outside
// [0, 1] and at NaN.
func InverseSigmoid(x *G.Node, eps float64) (*G.Node, error) {
	if eps == 0 {
		eps = DefaultInverseSigmoidEps
	}
	if !(eps > 0 && eps < 0.5) {
		return nil, fmt.Errorf("ops: InverseSigmoid: eps must be in (0, 0.5) (0 for DefaultInverseSigmoidEps), got %v", eps)
	}
	return unaryOp("InverseSigmoid", kernels.PointwiseInverseSigmoid, x, eps)
}

// Exp returns exp(x) elementwise; its gradient is dy * y.
func Exp(x *G.Node) (*G.Node, error) { return unaryOp("Exp", kernels.PointwiseExp, x, 0) }

// Log returns the natural logarithm of x elementwise (-inf at 0, NaN below);
// its gradient is dy / x.
func Log(x *G.Node) (*G.Node, error) { return unaryOp("Log", kernels.PointwiseLog, x, 0) }

// Sqrt returns the square root of x elementwise (NaN below 0); its
// gradient is dy / (2y).
func Sqrt(x *G.Node) (*G.Node, error) { return unaryOp("Sqrt", kernels.PointwiseSqrt, x, 0) }

// Square returns x * x elementwise; its gradient is dy * (2x).
func Square(x *G.Node) (*G.Node, error) { return unaryOp("Square", kernels.PointwiseSquare, x, 0) }

// pointwiseShape is one elementwise op as its kernels see it: the opcode,
// its operands' shapes (b nil for one, both for Fill), their views for
// broadcasting (aView, bView: the shapes aligned with out's dims, which
// differ from a's and b's only for the gradient of a sum) and the output.
type pointwiseShape struct {
	name         string // in errors: "Add", "ReLU backward"
	op           kernels.PointwiseOp
	argA, argB   string // the operands' names in errors
	a, b         tensor.Shape
	aView, bView tensor.Shape
	out          tensor.Shape
	alpha        float64
	dt           tensor.Dtype
	same         bool // every operand has out's shape: the map kernels
	bp           kernels.BroadcastParams
}

func (s pointwiseShape) String() string {
	return fmt.Sprintf("op=%v,a=%v,b=%v,aview=%v,bview=%v,out=%v,alpha=%v,%v", s.op, s.a, s.b, s.aView, s.bView, s.out, s.alpha, s.dt)
}

// newPointwiseShape checks and completes s: views default to the shapes,
// and the broadcast of the views to out is worked out.
func newPointwiseShape(s pointwiseShape) (pointwiseShape, error) {
	if s.aView == nil {
		s.aView = s.a
	}
	if s.bView == nil {
		s.bView = s.b
	}
	s.same = (s.op.Arity() < 1 || s.aView.Eq(s.out)) && (s.op.Arity() < 2 || s.bView.Eq(s.out))
	if s.same {
		return s, nil
	}
	if s.out.Dims() > PointwiseMaxDims {
		return s, fmt.Errorf("ops: %s: broadcasting takes up to %d dims, got %s %v and %s %v (%d dims)", s.name, PointwiseMaxDims, s.argA, s.a, s.argB, s.b, s.out.Dims())
	}
	var av, bv []int
	if s.op.Arity() >= 1 {
		av = s.aView
	}
	if s.op.Arity() >= 2 {
		bv = s.bView
	}
	bp, err := kernels.NewBroadcastParams(s.out, av, bv)
	if err != nil {
		return s, fmt.Errorf("ops: %s: %w", s.name, err)
	}
	s.bp = bp
	return s, nil
}

// broadcastShape returns the shape a and b broadcast to, or an error
// naming the first pair of dims that differ with neither 1.
func broadcastShape(op string, a, b tensor.Shape) (tensor.Shape, error) {
	n := max(a.Dims(), b.Dims())
	out := make(tensor.Shape, n)
	for i := range n {
		da, db := 1, 1
		if j := a.Dims() - n + i; j >= 0 {
			da = a[j]
		}
		if j := b.Dims() - n + i; j >= 0 {
			db = b[j]
		}
		switch {
		case da == db || db == 1:
			out[i] = da
		case da == 1:
			out[i] = db
		default:
			return nil, fmt.Errorf("ops: %s: a %v and b %v do not broadcast: dim %d (from the end) is %d and %d; each pair must be equal or one of them 1", op, a, b, i-n, da, db)
		}
	}
	return out, nil
}

// tensorOperand checks an operand of an elementwise op: a float tensor of
// a dim or more, of positive sizes.
func tensorOperand(op, arg string, n *G.Node) (tensor.Dtype, error) {
	if n == nil {
		return tensor.Dtype{}, fmt.Errorf("ops: %s: %s is nil", op, arg)
	}
	dt, err := floatDtype(op, arg, n)
	if err != nil {
		return dt, err
	}
	if n.Shape().Dims() < 1 {
		return dt, fmt.Errorf("ops: %s: %s must have a dim or more, got a scalar (use Scale for a constant, or a tensor of shape [1])", op, arg)
	}
	return dt, positiveSizes(op, arg, n.Shape())
}

func binaryOp(name string, op kernels.PointwiseOp, a, b *G.Node) (*G.Node, error) {
	dt, err := tensorOperand(name, "a", a)
	if err != nil {
		return nil, err
	}
	dtb, err := tensorOperand(name, "b", b)
	if err != nil {
		return nil, err
	}
	if dtb != dt {
		return nil, fmt.Errorf("ops: %s: b has dtype %v, want %v like a", name, dtb, dt)
	}
	out, err := broadcastShape(name, a.Shape(), b.Shape())
	if err != nil {
		return nil, err
	}
	s, err := newPointwiseShape(pointwiseShape{name: name, op: op, argA: "a", argB: "b", a: a.Shape().Clone(), b: b.Shape().Clone(), out: out, dt: dt})
	if err != nil {
		return nil, err
	}
	return G.ApplyOp(pointwiseOp(s), a, b)
}

func unaryOp(name string, op kernels.PointwiseOp, x *G.Node, alpha float64) (*G.Node, error) {
	dt, err := tensorOperand(name, "x", x)
	if err != nil {
		return nil, err
	}
	if math.IsNaN(alpha) || math.IsInf(alpha, 0) {
		return nil, fmt.Errorf("ops: %s: the constant must be finite, got %v", name, alpha)
	}
	s, err := newPointwiseShape(pointwiseShape{name: name, op: op, argA: "x", a: x.Shape().Clone(), out: x.Shape().Clone(), alpha: alpha, dt: dt})
	if err != nil {
		return nil, err
	}
	return G.ApplyOp(pointwiseOp(s), x)
}

// applyPointwise applies the op of s to in (s's operands), for gradients:
// the names are those of the op whose backward it is part of.
func applyPointwise(s pointwiseShape, in ...*G.Node) (*G.Node, error) {
	s, err := newPointwiseShape(s)
	if err != nil {
		return nil, err
	}
	return G.ApplyOp(pointwiseOp(s), in...)
}

// pointwiseOp is the op of s: its operands -> out.
func pointwiseOp(s pointwiseShape) *specOp {
	var in []argSpec
	if s.op.Arity() >= 1 {
		in = append(in, argSpec{name: s.argA, shape: s.a})
	}
	if s.op.Arity() >= 2 {
		in = append(in, argSpec{name: s.argB, shape: s.b})
	}
	spec := &opSpec{
		name: s.name, kind: "Pointwise", config: s.String(),
		inputs: in, out: s.out, dtype: s.dt,
		cpu:    floatTwin(s, pointwiseRun[float32], pointwiseRun[float64]),
		device: s.device,
	}
	if g := s.gradient(); g != nil {
		spec.diffWRT = make([]bool, len(in))
		for i := range spec.diffWRT {
			spec.diffWRT[i] = true
		}
		spec.grad = g
	}
	return newOp(spec)
}

func pointwiseRun[T kernels.Float](s pointwiseShape, in [][]T, out []T) error {
	var a, b []T
	if s.op.Arity() >= 1 {
		a = in[0]
	}
	if s.op.Arity() >= 2 {
		b = in[1]
	}
	if s.same {
		kernels.PointwiseMap(s.op, s.alpha, a, b, out)
	} else {
		kernels.PointwiseBroadcast(s.op, s.alpha, s.bp, a, b, out)
	}
	return nil
}

// gradient returns the SymDiff of s's op: PyTorch's formulas as ops of
// this package (whose errors name the backward pass). The backward-only ops (ReLUGrad and the like) are not
// differentiable again; Fill is not differentiable.
func (s pointwiseShape) gradient() func(in G.Nodes, out, grad *G.Node) (G.Nodes, error) {
	bwd := s.name + " backward"
	// same applies a same-shape op of out's shape to (u, v).
	same := func(op kernels.PointwiseOp, argA, argB string, u, v *G.Node) (*G.Node, error) {
		return applyPointwise(pointwiseShape{name: bwd, op: op, argA: argA, argB: argB, a: s.out, b: s.out, out: s.out, alpha: s.alpha, dt: s.dt}, u, v)
	}
	// mixed applies op to grad (out's shape) and an operand of shape sh.
	mixed := func(op kernels.PointwiseOp, u *G.Node, sh tensor.Shape, argB string, v *G.Node) (*G.Node, error) {
		return applyPointwise(pointwiseShape{name: bwd, op: op, argA: "grad", argB: argB, a: u.Shape().Clone(), b: sh, out: s.out, dt: s.dt}, u, v)
	}
	switch s.op {
	case kernels.PointwiseAdd, kernels.PointwiseSub, kernels.PointwiseMul, kernels.PointwiseDiv:
		return func(in G.Nodes, out, grad *G.Node) (G.Nodes, error) {
			a, b := in[0], in[1]
			var ga, gb *G.Node
			var err error
			switch s.op {
			case kernels.PointwiseAdd, kernels.PointwiseSub:
				ga, gb = grad, grad
			case kernels.PointwiseMul:
				if ga, err = mixed(kernels.PointwiseMul, grad, s.b, "b", b); err != nil {
					return nil, err
				}
				if gb, err = mixed(kernels.PointwiseMul, grad, s.a, "a", a); err != nil {
					return nil, err
				}
			case kernels.PointwiseDiv:
				if ga, err = mixed(kernels.PointwiseDiv, grad, s.b, "b", b); err != nil {
					return nil, err
				}
				// -dy * ((a/b) / b): (a/b)/b negated, then times dy.
				r, err := applyPointwise(pointwiseShape{name: bwd, op: kernels.PointwiseNegDiv, argA: "y", argB: "b", a: s.out, b: s.b, out: s.out, dt: s.dt}, out, b)
				if err != nil {
					return nil, err
				}
				if gb, err = same(kernels.PointwiseMul, "grad", "-y/b", grad, r); err != nil {
					return nil, err
				}
			}
			if ga, err = sumTo(bwd, ga, s.aView, s.a); err != nil {
				return nil, err
			}
			if gb, err = sumTo(bwd, gb, s.bView, s.b); err != nil {
				return nil, err
			}
			if s.op == kernels.PointwiseSub {
				if gb, err = applyPointwise(pointwiseShape{name: bwd, op: kernels.PointwiseScale, argA: "grad", a: s.b, out: s.b, alpha: -1, dt: s.dt}, gb); err != nil {
					return nil, err
				}
			}
			return G.Nodes{ga, gb}, nil
		}
	case kernels.PointwiseScale:
		// A Scale that broadcasts (the gradient of a sum) sums back.
		return func(_ G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			g, err := applyPointwise(pointwiseShape{name: bwd, op: kernels.PointwiseScale, argA: "grad", a: s.out, out: s.out, alpha: s.alpha, dt: s.dt}, grad)
			if err != nil {
				return nil, err
			}
			g, err = sumTo(bwd, g, s.aView, s.a)
			return G.Nodes{g}, err
		}
	case kernels.PointwiseExp:
		return func(_ G.Nodes, out, grad *G.Node) (G.Nodes, error) {
			g, err := same(kernels.PointwiseMul, "grad", "y", grad, out)
			return G.Nodes{g}, err
		}
	case kernels.PointwiseLog:
		return func(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			g, err := same(kernels.PointwiseDiv, "grad", "x", grad, in[0])
			return G.Nodes{g}, err
		}
	case kernels.PointwiseReLU, kernels.PointwiseSigmoid, kernels.PointwiseSqrt:
		op := map[kernels.PointwiseOp]kernels.PointwiseOp{
			kernels.PointwiseReLU: kernels.PointwiseReLUGrad, kernels.PointwiseSigmoid: kernels.PointwiseSigmoidGrad, kernels.PointwiseSqrt: kernels.PointwiseSqrtGrad,
		}[s.op]
		return func(_ G.Nodes, out, grad *G.Node) (G.Nodes, error) {
			g, err := same(op, "y", "grad", out, grad)
			return G.Nodes{g}, err
		}
	case kernels.PointwiseSquare, kernels.PointwiseInverseSigmoid:
		op := kernels.PointwiseSquareGrad
		if s.op == kernels.PointwiseInverseSigmoid {
			op = kernels.PointwiseInverseSigmoidGrad
		}
		return func(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			g, err := same(op, "x", "grad", in[0], grad)
			return G.Nodes{g}, err
		}
	case kernels.PointwiseReLUGrad, kernels.PointwiseSigmoidGrad, kernels.PointwiseSqrtGrad,
		kernels.PointwiseSquareGrad, kernels.PointwiseInverseSigmoidGrad, kernels.PointwiseNegDiv:
		return noSecondDerivative(s.name)
	}
	return nil
}
