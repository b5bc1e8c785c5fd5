package ops

import (
	"fmt"
	"math"

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
	return G.ApplyOp(lossOp(s), x, t, w)
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
	return G.ApplyOp(lossOp(s), x, t, w)
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
	return G.ApplyOp(lossOp(s), logits, labels, weights)
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
	return fmt.Sprintf("x=%v,t=%v,%v,beta=%v", s.x, s.t, s.dt, s.beta)
}

func (s lossShape) inputs() []argSpec {
	return []argSpec{{name: "x", shape: s.x}, {name: "targets", shape: s.t}, {name: "weights", shape: s.t}}
}

// lossOp is the forward op: (x, t, w) -> scalar loss.
func lossOp(s lossShape) *specOp {
	return newOp(&opSpec{
		name: s.kind.String(), config: s.String(),
		inputs: s.inputs(), out: tensor.ScalarShape(), dtype: s.dt,
		cpu:     floatTwin(s, lossForward[float32], lossForward[float64]),
		diffWRT: []bool{true, false, false},
		grad: func(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			dx, err := G.ApplyOp(lossGradOp(s), in[0], in[1], in[2], grad)
			if err != nil {
				return nil, fmt.Errorf("ops: %v backward: %w", s.kind, err)
			}
			return G.Nodes{dx, nil, nil}, nil
		},
	})
}

// lossGradOp is the backward op: (x, t, w, dloss) -> dx. dloss is the
// scalar gradient of the loss, on the host.
func lossGradOp(s lossShape) *specOp {
	return newOp(&opSpec{
		name: s.kind.String() + " backward", config: s.String(),
		inputs: append(s.inputs(), argSpec{name: "grad", shape: tensor.ScalarShape()}),
		out:    s.x, dtype: s.dt,
		cpu: floatTwin(s, lossBackward[float32], lossBackward[float64]),
		// diffWRT claims x so that a second derivative reaches grad and its
		// error, rather than gorgonia's report of a non-differentiable path.
		diffWRT: []bool{true, false, false, false},
		grad: func(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
			return nil, errNoSecondDerivative(s.kind.String())
		},
	})
}

// lossForward writes the loss of (x, t, w) = in to out[0]. It sums in
// float64: the sums run over up to millions of terms (every anchor of every
// image), far past float32's 24 bits.
func lossForward[T kernels.Float](s lossShape, in [][]T, out []T) error {
	x, t, w := in[0], in[1], in[2]
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
				return fmt.Errorf("row %d: %w", k, err)
			}
			if w[k] == 0 {
				continue
			}
			row := x[k*c : (k+1)*c]
			sum += float64(w[k]) * (lossLogSumExp(row) - float64(row[label]))
		}
	}
	out[0] = T(sum)
	return nil
}

// lossBackward writes dx = g * d(loss)/dx, where (x, t, w, g) = in.
func lossBackward[T kernels.Float](s lossShape, in [][]T, dx []T) error {
	x, t, w, g := in[0], in[1], in[2], in[3][0]
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
				return fmt.Errorf("row %d: %w", k, err)
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
