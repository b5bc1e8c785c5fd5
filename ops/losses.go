package ops

import (
	"fmt"
	"math"
	"slices"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
)

// The detection losses. Each reduces its inputs to one weighted sum, a scalar
// node that G.Grad can start from, and takes a weight per element (per row
// for SoftmaxCrossEntropy and GIoULoss). Detectors built on static graphs pad their
// sampled anchors, RoIs and masks to fixed counts; a zero weight removes a
// padding entry from the loss and from every gradient, and the weights also
// carry the normalisation (1/number of samples), so no separate mean or
// masking op is needed. Targets and weights are data, not parameters: the
// losses are differentiable with respect to their first argument only.

// lossKind selects the loss a lossOp computes: the kernels' kind, named.
type lossKind = kernels.LossKind

const (
	lossSigmoidBCE   = kernels.LossBCE
	lossSmoothL1     = kernels.LossSmoothL1
	lossL1           = kernels.LossL1
	lossSigmoidFocal = kernels.LossFocal
	lossSoftmaxCE    = kernels.LossCE
	lossGIoU         = kernels.LossGIoU
)

// lossName is the name of a loss in errors and in its ops' String.
func lossName(k lossKind) string {
	switch k {
	case lossSigmoidBCE:
		return "SigmoidBCE"
	case lossSmoothL1:
		return "SmoothL1"
	case lossL1:
		return "L1Loss"
	case lossSigmoidFocal:
		return "SigmoidFocalLoss"
	case lossSoftmaxCE:
		return "SoftmaxCrossEntropy"
	case lossGIoU:
		return "GIoULoss"
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

// L1Loss returns the weighted L1 distance of x from t, as PyTorch's
// l1_loss with reduction="sum" and per-element weights:
//
//	sum_i w_i * |x_i - t_i|
//
// Its gradient with respect to x is w*sign(x - t), 0 where x = t (torch's
// sign). The same as SmoothL1 with beta = 0, under its own name (DETR's box
// loss). x, t and w have the same shape and dtype. Returns a scalar.
func L1Loss(x, t, w *G.Node) (*G.Node, error) {
	s, err := newElementwiseLoss(lossL1, x, t, w)
	if err != nil {
		return nil, err
	}
	return G.ApplyOp(lossOp(s), x, t, w)
}

// DefaultFocalAlpha and DefaultFocalGamma are torchvision's
// sigmoid_focal_loss's defaults (RetinaNet's, and Deformable-DETR's).
const (
	DefaultFocalAlpha = 0.25
	DefaultFocalGamma = 2
)

// SigmoidFocalLoss returns the weighted focal loss of logits x against
// targets t, as torchvision's sigmoid_focal_loss with reduction="sum" and
// per-element weights:
//
//	sum_i w_i * alpha_t * bce(x_i, t_i) * (1 - p_t)^gamma
//
// with p = sigmoid(x), p_t = p*t + (1-p)*(1-t), alpha_t = alpha*t +
// (1-alpha)*(1-t), and bce SigmoidBCE's term. alpha in [0, 1] weighs the
// positives against the negatives; a negative alpha (torchvision's -1)
// weighs neither. gamma >= 0 (DefaultFocalGamma: 2) discounts the easy
// examples; gamma = 0 gives alpha-weighted SigmoidBCE. reduction="mean" is
// weights of 1/N. x, t and w have the same shape and dtype. Returns a
// scalar; differentiable with respect to x, as PyTorch's autograd of
// torchvision's function: the gradient of (1-p_t)^gamma is 0 at gamma = 0,
// and for 0 < gamma < 1 the gradient at a logit so large that p_t rounds
// to 1 (|x| > 17 in float32) is NaN, (1-p_t)^(gamma-1) being infinite
// there, as in PyTorch.
func SigmoidFocalLoss(x, t, w *G.Node, alpha, gamma float64) (*G.Node, error) {
	const op = "SigmoidFocalLoss"
	if math.IsNaN(alpha) || alpha > 1 {
		return nil, fmt.Errorf("ops: %s: alpha must be in [0, 1], or negative for no weighting, got %v", op, alpha)
	}
	if !(gamma >= 0) || math.IsInf(gamma, 1) {
		return nil, fmt.Errorf("ops: %s: gamma must be non-negative and finite, got %v", op, gamma)
	}
	s, err := newElementwiseLoss(lossSigmoidFocal, x, t, w)
	if err != nil {
		return nil, err
	}
	s.alpha, s.gamma = alpha, gamma
	return G.ApplyOp(lossOp(s), x, t, w)
}

// GIoULoss returns the weighted generalized-IoU loss of boxes against
// target boxes, as torchvision's generalized_box_iou_loss (eps 1e-7) with
// reduction="sum" and per-box weights:
//
//	sum_k w_k * (1 - GIoU(boxes_k, targets_k))
//
// boxes and targets: [N, 4] in (x1, y1, x2, y2); weights: [N]. The boxes'
// order is not checked, as torchvision does not: a box with x2 < x1 has a
// negative area and gives what torchvision's arithmetic gives; empty boxes
// give finite losses through eps. Returns a scalar; differentiable with
// respect to boxes, as PyTorch's autograd of torchvision's function (where
// a coordinate ties with the target's in a max or min, half the gradient
// goes through, as PyTorch splits it). DETR feeds it BoxCxCyWHToXYXY of
// its predictions.
func GIoULoss(boxes, targets, weights *G.Node) (*G.Node, error) {
	const op = "GIoULoss"
	if err := checkRank(op, "boxes", boxes, 2, "[N 4]"); err != nil {
		return nil, err
	}
	bs := boxes.Shape()
	if bs[1] != 4 {
		return nil, fmt.Errorf("ops: %s: boxes must have shape [N 4], got %v", op, bs)
	}
	if err := checkRank(op, "targets", targets, 2, fmt.Sprintf("[%d 4]", bs[0])); err != nil {
		return nil, err
	}
	if !targets.Shape().Eq(bs) {
		return nil, fmt.Errorf("ops: %s: targets must have shape %v like boxes, got %v", op, bs, targets.Shape())
	}
	want := fmt.Sprintf("[%d]", bs[0])
	if err := checkRank(op, "weights", weights, 1, want); err != nil {
		return nil, err
	}
	if weights.Shape()[0] != bs[0] {
		return nil, fmt.Errorf("ops: %s: weights must have shape %s, one per box, got %v", op, want, weights.Shape())
	}
	dt, err := floatDtype(op, "boxes", boxes)
	if err != nil {
		return nil, err
	}
	if err := sameDtype(op, dt, map[string]*G.Node{"targets": targets, "weights": weights}); err != nil {
		return nil, err
	}
	if err := checkWeights(op, weights); err != nil {
		return nil, err
	}
	s := lossShape{kind: lossGIoU, x: bs.Clone(), t: bs.Clone(), w: weights.Shape().Clone(), dt: dt}
	return G.ApplyOp(lossOp(s), boxes, targets, weights)
}

// SoftmaxCrossEntropy returns the weighted cross-entropy of rows of logits
// against class labels, as PyTorch's cross_entropy with reduction="sum" and
// per-row weights:
//
//	sum_k w_k * (logsumexp(x_k) - x_k[label_k])
//
// logits: [K, C]; labels: [K] class indices stored as floats of the logits'
// dtype (the graph stays in one dtype); weights: [K]. A label that is not an
// integer in [0, C) makes the graph's run fail with an error on the host,
// whatever its weight; on a GPU it makes the loss NaN (and its row of the
// gradient), the device having no way to report it without a round trip.
// Returns a scalar; its gradient with respect to row k of the logits is
// w_k*(softmax(x_k) - onehot(label_k)).
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
	if err := checkWeights(op, weights); err != nil {
		return nil, err
	}
	s := lossShape{kind: lossSoftmaxCE, x: ls.Clone(), t: labels.Shape().Clone(), w: labels.Shape().Clone(), dt: dt}
	return G.ApplyOp(lossOp(s), logits, labels, weights)
}

// SumLosses returns the sum of scalar losses (of one dtype) where they
// live: on the host, or on one device. A graph whose losses are on a
// device sums them with this op: gorgonia's Add of two scalars reads host
// values only. The gradient of the sum reaches every loss unchanged (the
// backward of each loss takes it as its host scalar). Scale a loss through
// its weights.
func SumLosses(losses ...*G.Node) (*G.Node, error) {
	const op = "SumLosses"
	if len(losses) == 0 {
		return nil, fmt.Errorf("ops: %s: no losses", op)
	}
	var dt tensor.Dtype
	for i, l := range losses {
		arg := fmt.Sprintf("losses[%d]", i)
		if l == nil {
			return nil, fmt.Errorf("ops: %s: %s is nil", op, arg)
		}
		if l.Shape().Dims() != 0 {
			return nil, fmt.Errorf("ops: %s: %s must be a scalar, got shape %v", op, arg, l.Shape())
		}
		d, err := floatDtype(op, arg, l)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			dt = d
		} else if d != dt {
			return nil, fmt.Errorf("ops: %s: %s has dtype %v, losses[0] %v", op, arg, d, dt)
		}
	}
	sum := losses[0]
	for _, l := range losses[1:] {
		var err error
		if sum, err = G.ApplyOp(lossAddOp(dt), sum, l); err != nil {
			return nil, fmt.Errorf("ops: %s: %w", op, err)
		}
	}
	return sum, nil
}

// lossAddOp adds two scalars where they live (SumLosses). It places its
// output itself (opSpec.run): a spec's scalar inputs are host values, and
// these may be device ones.
func lossAddOp(dt tensor.Dtype) *specOp {
	const name = "SumLosses"
	scalar := tensor.ScalarShape()
	return newOp(&opSpec{
		name: name, config: dt.String(),
		inputs: []argSpec{{name: "a", shape: scalar}, {name: "b", shape: scalar}}, out: scalar, dtype: dt,
		run: func(in []G.Value, prealloc G.Value) (G.Value, error) {
			return addLosses(name, dt, in[0], in[1], prealloc)
		},
		// The sum lives where b (and a) does: CheckPlacement reads that
		// from moveLike.
		moveLike: true,
		diffWRT:  []bool{true, true},
		grad: func(_ G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			return G.Nodes{grad, grad}, nil
		},
	})
}

// addLosses is lossAddOp's run: a + b, on the host or on the device that
// holds both.
func addLosses(op string, dt tensor.Dtype, a, b G.Value, prealloc G.Value) (G.Value, error) {
	dev, err := inputsDevice(op, []string{"a", "b"}, []G.Value{a, b})
	if err != nil {
		return nil, err
	}
	if dev != nil {
		return addLossesDevice(op, dev, dt, a, b, prealloc)
	}
	av, err := hostScalar(op, "a", a, dt)
	if err != nil {
		return nil, err
	}
	bv, err := hostScalar(op, "b", b, dt)
	if err != nil {
		return nil, err
	}
	if dt == tensor.Float32 {
		return G.NewF32(av.Float32s()[0] + bv.Float32s()[0]), nil
	}
	return G.NewF64(av.Float64s()[0] + bv.Float64s()[0]), nil
}

// newElementwiseLoss checks the three same-shaped inputs of an elementwise
// loss.
func newElementwiseLoss(kind lossKind, x, t, w *G.Node) (lossShape, error) {
	op := lossName(kind)
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
	if err := checkWeights(op, w); err != nil {
		return s, err
	}
	return lossShape{kind: kind, x: xs.Clone(), t: xs.Clone(), w: xs.Clone(), dt: dt}, nil
}

// checkWeights refuses weights that hold a NaN when they are known at
// graph-build time (a constant node). Weights fed later are checked when
// the graph runs on the host; on a GPU a NaN weight makes the loss NaN.
func checkWeights(op string, w *G.Node) error {
	d, ok := w.Value().(*tensor.Dense)
	if !ok || backend.IsDevice(d) {
		return nil
	}
	var nan = -1
	switch v := d.Data().(type) {
	case []float32:
		nan = slices.IndexFunc(v, func(f float32) bool { return f != f })
	case []float64:
		nan = slices.IndexFunc(v, math.IsNaN)
	}
	if nan >= 0 {
		return fmt.Errorf("ops: %s: weights must be numbers, got NaN at element %d", op, nan)
	}
	return nil
}

// lossShape is what the loss ops know at graph-build time: the shapes of
// x, of the targets and of the weights, the loss's parameters and dtype.
type lossShape struct {
	kind               lossKind
	x, t, w            tensor.Shape
	beta, alpha, gamma float64
	dt                 tensor.Dtype
}

func (s lossShape) String() string {
	return fmt.Sprintf("x=%v,t=%v,w=%v,%v,beta=%v,alpha=%v,gamma=%v", s.x, s.t, s.w, s.dt, s.beta, s.alpha, s.gamma)
}

func (s lossShape) inputs() []argSpec {
	return []argSpec{{name: "x", shape: s.x}, {name: "targets", shape: s.t}, {name: "weights", shape: s.w}}
}

// params is the loss as the kernels see it: items are elements, or rows
// of the logits or boxes.
func (s lossShape) params() kernels.LossParams {
	p := kernels.LossParams{Kind: s.kind, N: s.w.TotalSize(), Beta: s.beta, Alpha: s.alpha, Gamma: s.gamma}
	if s.kind == lossSoftmaxCE {
		p.C = s.x[1]
	}
	return p
}

// lossOp is the forward op: (x, t, w) -> scalar loss.
func lossOp(s lossShape) *specOp {
	name := lossName(s.kind)
	return newOp(&opSpec{
		name: name, config: s.String(),
		inputs: s.inputs(), out: tensor.ScalarShape(), dtype: s.dt,
		cpu:     floatTwin(s, lossForward[float32], lossForward[float64]),
		device:  s.forwardDevice,
		diffWRT: []bool{true, false, false},
		grad: func(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			dx, err := G.ApplyOp(lossGradOp(s), in[0], in[1], in[2], grad)
			if err != nil {
				return nil, fmt.Errorf("ops: %v backward: %w", name, err)
			}
			return G.Nodes{dx, nil, nil}, nil
		},
	})
}

// lossGradOp is the backward op: (x, t, w, dloss) -> dx. dloss is the
// scalar gradient of the loss: usually on the host (gorgonia seeds a
// backward pass with a host constant even when everything else is on a
// device), and then on a device its value travels in the kernel's
// parameters; or a one-element tensor on x's device (a loss reshaped and
// moved to the host on its way to the cost), which the kernel reads there.
func lossGradOp(s lossShape) *specOp {
	name := lossName(s.kind)
	plain := &opSpec{
		name: name + " backward", config: s.String(),
		inputs: append(s.inputs(), argSpec{name: "grad", shape: tensor.ScalarShape()}),
		out:    s.x, dtype: s.dt,
		cpu:    floatTwin(s, lossBackward[float32], lossBackward[float64]),
		device: func(a *deviceArgs) (*tensor.Dense, error) { return s.backwardDevice(a, 0) },
		// diffWRT claims x so that a second derivative reaches grad and its
		// error, rather than gorgonia's report of a non-differentiable path.
		diffWRT: []bool{true, false, false, false},
		grad: func(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
			return nil, errNoSecondDerivative(name)
		},
	}
	op := *plain
	// dx lives where x does, and so do the targets: CheckPlacement reads
	// that from moveLike.
	op.moveLike = true
	op.run = func(in []G.Value, prealloc G.Value) (G.Value, error) {
		if !backend.IsDevice(in[3]) {
			return newOp(plain).UsePreallocDo(prealloc, in...)
		}
		return s.backwardDeviceGrad(plain, in, prealloc)
	}
	return newOp(&op)
}

// lossForward writes the loss of (x, t, w) = in to out[0].
func lossForward[T kernels.Float](s lossShape, in [][]T, out []T) error {
	sum, err := kernels.LossForward(s.params(), in[0], in[1], in[2])
	out[0] = T(sum)
	return err
}

// lossBackward writes dx = g * d(loss)/dx, where (x, t, w, g) = in.
func lossBackward[T kernels.Float](s lossShape, in [][]T, dx []T) error {
	return kernels.LossBackward(s.params(), in[0], in[1], in[2], in[3][0], dx)
}
