package ops

import (
	"fmt"
	"hash"
	"math"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/kernels"
)

// The detection losses. Each reduces its inputs to one weighted sum, a scalar
// node that G.Grad can start from, and takes a weight per element (per row
// for SoftmaxCrossEntropy). Detectors built on static graphs pad their
// sampled anchors, RoIs and masks to fixed counts; a zero weight removes a
// padding entry from the loss and from every gradient, and the weights also
// carry the normalisation (1/number of samples), so no separate mean or
// masking op is needed. Targets and weights are data, not parameters: the
// losses are differentiable with respect to their first argument only.

// lossKind selects the loss a lossOp computes.
type lossKind int

const (
	lossSigmoidBCE lossKind = iota
	lossSmoothL1
	lossSoftmaxCE
)

func (k lossKind) String() string {
	switch k {
	case lossSigmoidBCE:
		return "SigmoidBCE"
	case lossSmoothL1:
		return "SmoothL1"
	case lossSoftmaxCE:
		return "SoftmaxCrossEntropy"
	}
	return fmt.Sprintf("lossKind(%d)", int(k))
}

// SigmoidBCE returns the weighted binary cross-entropy of logits x against
// targets t, as PyTorch's binary_cross_entropy_with_logits with
// reduction="sum" and per-element weights:
//
//	sum_i w_i * (max(x_i, 0) - x_i*t_i + log(1 + exp(-|x_i|)))
//
// which is -w_i*(t_i*log(sigmoid(x_i)) + (1-t_i)*log(1-sigmoid(x_i))) written
// so that no exponential overflows. x, t and w have the same shape (any rank)
// and dtype; t is usually 0 or 1 but may be any value in [0, 1]. Returns a
// scalar; its gradient with respect to x is w*(sigmoid(x)-t).
func SigmoidBCE(x, t, w *G.Node) (*G.Node, error) {
	s, err := newElementwiseLoss(lossSigmoidBCE, x, t, w)
	if err != nil {
		return nil, err
	}
	return G.ApplyOp(&lossOp{s}, x, t, w)
}

// SmoothL1 returns the weighted smooth-L1 (Huber) distance of x from t, as
// PyTorch's smooth_l1_loss with reduction="sum" and per-element weights:
//
//	sum_i w_i * h(x_i - t_i),  h(d) = 0.5*d*d/beta if |d| < beta, |d| - 0.5*beta otherwise
//
// beta = 0 gives the L1 distance (with gradient 0 at d = 0, as PyTorch's).
// Detectron's box regression uses beta = 1/9. x, t and w have the same shape
// and dtype. Returns a scalar.
func SmoothL1(x, t, w *G.Node, beta float64) (*G.Node, error) {
	if !(beta >= 0) || math.IsInf(beta, 1) {
		return nil, fmt.Errorf("ops: SmoothL1: beta must be non-negative and finite, got %v", beta)
	}
	s, err := newElementwiseLoss(lossSmoothL1, x, t, w)
	if err != nil {
		return nil, err
	}
	s.beta = beta
	return G.ApplyOp(&lossOp{s}, x, t, w)
}

// SoftmaxCrossEntropy returns the weighted cross-entropy of rows of logits
// against class labels, as PyTorch's cross_entropy with reduction="sum" and
// per-row weights:
//
//	sum_k w_k * (logsumexp(x_k) - x_k[label_k])
//
// logits: [K, C]; labels: [K] class indices stored as floats of the logits'
// dtype (the graph stays in one dtype); weights: [K]. A label that is not an
// integer in [0, C) makes the graph's run fail with an error, whatever its
// weight. Returns a scalar; its gradient with respect to row k of the logits
// is w_k*(softmax(x_k) - onehot(label_k)).
func SoftmaxCrossEntropy(logits, labels, weights *G.Node) (*G.Node, error) {
	const op = "SoftmaxCrossEntropy"
	if err := checkRank(op, "logits", logits, 2, "[K C]"); err != nil {
		return nil, err
	}
	ls := logits.Shape()
	want := fmt.Sprintf("[%d]", ls[0])
	if err := checkRank(op, "labels", labels, 1, want); err != nil {
		return nil, err
	}
	if err := checkRank(op, "weights", weights, 1, want); err != nil {
		return nil, err
	}
	if ls[1] <= 0 {
		return nil, fmt.Errorf("ops: %s: logits must have at least one class, got shape %v", op, ls)
	}
	for name, n := range map[string]*G.Node{"labels": labels, "weights": weights} {
		if n.Shape()[0] != ls[0] {
			return nil, fmt.Errorf("ops: %s: %s must have shape %s like the rows of logits, got %v", op, name, want, n.Shape())
		}
	}
	dt, err := floatDtype(op, "logits", logits)
	if err != nil {
		return nil, err
	}
	if err := sameDtype(op, dt, map[string]*G.Node{"labels": labels, "weights": weights}); err != nil {
		return nil, err
	}
	s := lossShape{kind: lossSoftmaxCE, x: ls.Clone(), t: labels.Shape().Clone(), dt: dt}
	return G.ApplyOp(&lossOp{s}, logits, labels, weights)
}

// newElementwiseLoss checks the three same-shaped inputs of an elementwise
// loss.
func newElementwiseLoss(kind lossKind, x, t, w *G.Node) (lossShape, error) {
	op := kind.String()
	var s lossShape
	if x == nil || t == nil || w == nil {
		return s, fmt.Errorf("ops: %s: inputs must not be nil", op)
	}
	xs := x.Shape()
	if xs.Dims() == 0 {
		return s, fmt.Errorf("ops: %s: x must be a tensor, got a scalar", op)
	}
	for name, n := range map[string]*G.Node{"targets": t, "weights": w} {
		if !n.Shape().Eq(xs) {
			return s, fmt.Errorf("ops: %s: %s must have shape %v like x, got %v", op, name, xs, n.Shape())
		}
	}
	dt, err := floatDtype(op, "x", x)
	if err != nil {
		return s, err
	}
	if err := sameDtype(op, dt, map[string]*G.Node{"targets": t, "weights": w}); err != nil {
		return s, err
	}
	return lossShape{kind: kind, x: xs.Clone(), t: xs.Clone(), dt: dt}, nil
}

// lossShape is what the loss ops know at graph-build time. t is the shape of
// the targets, which is also the shape of the weights.
type lossShape struct {
	kind lossKind
	x, t tensor.Shape
	beta float64
	dt   tensor.Dtype
}

func (s lossShape) String() string {
	return fmt.Sprintf("%v(x=%v,t=%v,%v,beta=%v)", s.kind, s.x, s.t, s.dt, s.beta)
}

// typ is the hm type (x, t, w[, grad]) -> out, where grad and the loss
// are scalars of the dtype variable.
func (s lossShape) typ(withGrad bool, out hm.Type) hm.Type {
	a := hm.TypeVariable('a')
	ts := []hm.Type{tensorType(s.x.Dims()), tensorType(s.t.Dims()), tensorType(s.t.Dims())}
	if withGrad {
		ts = append(ts, a)
	}
	if out == nil {
		out = a
	}
	return hm.NewFnType(append(ts, out)...)
}

// inputs checks the values of (x, t, w) against the shapes.
func (s lossShape) inputs(op string, in []G.Value) (x, t, w *tensor.Dense, err error) {
	if x, err = dense(op, "x", in[0], s.dt, s.x); err != nil {
		return
	}
	if t, err = dense(op, "targets", in[1], s.dt, s.t); err != nil {
		return
	}
	w, err = dense(op, "weights", in[2], s.dt, s.t)
	return
}

// lossOp is the forward op: (x, t, w) -> scalar loss.
type lossOp struct{ lossShape }

func (op *lossOp) Arity() int            { return 3 }
func (op *lossOp) Type() hm.Type         { return op.typ(false, nil) }
func (op *lossOp) ReturnsPtr() bool      { return false }
func (op *lossOp) CallsExtern() bool     { return false }
func (op *lossOp) OverwritesInput() int  { return -1 }
func (op *lossOp) String() string        { return op.lossShape.String() }
func (op *lossOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *lossOp) Hashcode() uint32      { return hashOf(op) }

func (op *lossOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return tensor.ScalarShape(), nil }

func (op *lossOp) Do(in ...G.Value) (G.Value, error) {
	name := op.kind.String()
	if len(in) != 3 {
		return nil, fmt.Errorf("ops: %v: want 3 inputs, got %d", op, len(in))
	}
	if err := hostOnly(name, []string{"x", "targets", "weights"}, in); err != nil {
		return nil, err
	}
	x, t, w, err := op.inputs(name, in)
	if err != nil {
		return nil, err
	}
	var sum float64
	switch op.dt {
	case tensor.Float32:
		sum, err = lossForward(op.lossShape, x.Float32s(), t.Float32s(), w.Float32s())
		if err != nil {
			return nil, err
		}
		return G.NewF32(float32(sum)), nil
	default:
		sum, err = lossForward(op.lossShape, x.Float64s(), t.Float64s(), w.Float64s())
		if err != nil {
			return nil, err
		}
		return G.NewF64(sum), nil
	}
}

func (op *lossOp) DiffWRT(inputs int) []bool { return []bool{true, false, false} }

func (op *lossOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if len(inputs) != 3 {
		return nil, fmt.Errorf("ops: %v: want 3 inputs, got %d", op, len(inputs))
	}
	dx, err := G.ApplyOp(&lossGradOp{op.lossShape}, inputs[0], inputs[1], inputs[2], grad)
	if err != nil {
		return nil, fmt.Errorf("ops: %v backward: %w", op.kind, err)
	}
	return G.Nodes{dx, nil, nil}, nil
}

// lossGradOp is the backward op: (x, t, w, dloss) -> dx.
type lossGradOp struct{ lossShape }

func (op *lossGradOp) Arity() int            { return 4 }
func (op *lossGradOp) Type() hm.Type         { return op.typ(true, tensorType(op.x.Dims())) }
func (op *lossGradOp) ReturnsPtr() bool      { return false }
func (op *lossGradOp) CallsExtern() bool     { return false }
func (op *lossGradOp) OverwritesInput() int  { return -1 }
func (op *lossGradOp) String() string        { return op.lossShape.String() + "Grad" }
func (op *lossGradOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *lossGradOp) Hashcode() uint32      { return hashOf(op) }

func (op *lossGradOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.x.Clone(), nil }

func (op *lossGradOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

func (op *lossGradOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	name := op.kind.String() + " backward"
	if len(in) != 4 {
		return nil, fmt.Errorf("ops: %v: want 4 inputs, got %d", op, len(in))
	}
	if err := hostOnly(name, []string{"x", "targets", "weights", "grad"}, in); err != nil {
		return nil, err
	}
	x, t, w, err := op.inputs(name, in)
	if err != nil {
		return nil, err
	}
	g, err := lossGradScalar(name, in[3])
	if err != nil {
		return nil, err
	}
	dx := output(prealloc, op.dt, op.x)
	switch op.dt {
	case tensor.Float32:
		err = lossBackward(op.lossShape, x.Float32s(), t.Float32s(), w.Float32s(), float32(g), dx.Float32s())
	default:
		err = lossBackward(op.lossShape, x.Float64s(), t.Float64s(), w.Float64s(), g, dx.Float64s())
	}
	if err != nil {
		return nil, err
	}
	return dx, nil
}

// DiffWRT claims x so that a second derivative reaches SymDiff and its
// error, rather than gorgonia's report of a non-differentiable path.
func (op *lossGradOp) DiffWRT(inputs int) []bool { return []bool{true, false, false, false} }

func (op *lossGradOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, errNoSecondDerivative(op.kind.String())
}

// lossGradScalar reads the scalar gradient gorgonia hands a backward op: a
// *G.F32 or *G.F64, or a tensor of one element.
func lossGradScalar(op string, v G.Value) (float64, error) {
	switch s := v.(type) {
	case *G.F64:
		return float64(*s), nil
	case *G.F32:
		return float64(*s), nil
	case *tensor.Dense:
		if s.Shape().TotalSize() == 1 {
			switch d := s.Data().(type) {
			case float64:
				return d, nil
			case float32:
				return float64(d), nil
			case []float64:
				return d[0], nil
			case []float32:
				return float64(d[0]), nil
			}
		}
	}
	return 0, fmt.Errorf("ops: %s: the loss gradient must be a float scalar, got %T", op, v)
}

// lossForward sums the loss in float64: the sums run over up to millions of
// terms (every anchor of every image), far past float32's 24 bits.
func lossForward[T kernels.Float](s lossShape, x, t, w []T) (float64, error) {
	var sum float64
	switch s.kind {
	case lossSigmoidBCE:
		for i, xi := range x {
			if w[i] == 0 {
				continue // padding: also skips the log of a padded logit
			}
			v := float64(xi)
			// max(x,0) - x*t + log1p(exp(-|x|)): exp never overflows, and
			// log1p keeps the precision when exp(-|x|) is tiny.
			l := math.Max(v, 0) - v*float64(t[i]) + math.Log1p(math.Exp(-math.Abs(v)))
			sum += float64(w[i]) * l
		}
	case lossSmoothL1:
		for i, xi := range x {
			if w[i] == 0 {
				continue
			}
			d := math.Abs(float64(xi) - float64(t[i]))
			var l float64
			if d < s.beta {
				l = 0.5 * d * d / s.beta
			} else {
				l = d - 0.5*s.beta
			}
			sum += float64(w[i]) * l
		}
	case lossSoftmaxCE:
		c := s.x[1]
		for k := range s.x[0] {
			label, err := lossClassLabel(t[k], c)
			if err != nil {
				return 0, fmt.Errorf("ops: SoftmaxCrossEntropy: row %d: %w", k, err)
			}
			if w[k] == 0 {
				continue
			}
			row := x[k*c : (k+1)*c]
			sum += float64(w[k]) * (lossLogSumExp(row) - float64(row[label]))
		}
	}
	return sum, nil
}

// lossBackward writes dx = g * d(loss)/dx.
func lossBackward[T kernels.Float](s lossShape, x, t, w []T, g T, dx []T) error {
	switch s.kind {
	case lossSigmoidBCE:
		for i, xi := range x {
			if w[i] == 0 {
				dx[i] = 0
				continue
			}
			sig := 1 / (1 + math.Exp(-float64(xi)))
			dx[i] = g * w[i] * T(sig-float64(t[i]))
		}
	case lossSmoothL1:
		for i, xi := range x {
			d := float64(xi) - float64(t[i])
			var gd float64
			switch {
			case math.Abs(d) < s.beta:
				gd = d / s.beta
			case d > 0:
				gd = 1
			case d < 0:
				gd = -1
			}
			dx[i] = g * w[i] * T(gd)
		}
	case lossSoftmaxCE:
		c := s.x[1]
		for k := range s.x[0] {
			label, err := lossClassLabel(t[k], c)
			if err != nil {
				return fmt.Errorf("ops: SoftmaxCrossEntropy backward: row %d: %w", k, err)
			}
			row, drow := x[k*c:(k+1)*c], dx[k*c:(k+1)*c]
			if w[k] == 0 {
				clear(drow)
				continue
			}
			lse := lossLogSumExp(row)
			scale := g * w[k]
			for j, v := range row {
				p := math.Exp(float64(v) - lse)
				if j == label {
					p--
				}
				drow[j] = scale * T(p)
			}
		}
	}
	return nil
}

// lossClassLabel converts a label stored as a float into a class index in
// [0, c). NaN fails the range test.
func lossClassLabel[T kernels.Float](v T, c int) (int, error) {
	f := float64(v)
	if !(f >= 0 && f < float64(c)) || f != math.Trunc(f) {
		return 0, fmt.Errorf("label %v is not a class index in [0, %d)", f, c)
	}
	return int(f), nil
}

// lossLogSumExp computes log(sum(exp(row))) in float64, shifted by the row's
// maximum so that no exponential overflows.
func lossLogSumExp[T kernels.Float](row []T) float64 {
	m := math.Inf(-1)
	for _, v := range row {
		m = math.Max(m, float64(v))
	}
	if math.IsInf(m, 0) {
		return m // all -Inf: the sum is 0; +Inf: it is +Inf
	}
	var s float64
	for _, v := range row {
		s += math.Exp(float64(v) - m)
	}
	return m + math.Log(s)
}
