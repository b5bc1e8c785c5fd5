package ops

import (
	"fmt"
	"hash"
	"math"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/kernels"
)

// PyTorch's BatchNorm2d defaults, which zero Momentum and Eps stand for.
const (
	DefaultMomentum = 0.1
	DefaultEps      = 1e-5
)

// BatchNorm is one BatchNorm2d layer: its learnable scale and shift, its
// running statistics and its mode, with PyTorch's conventions.
//
// Momentum and Eps are read when ConvBN builds the graph; zero means the
// defaults 0.1 and 1e-5. Training and the running statistics are read each
// time the graph runs, so one graph serves training and evaluation: flip
// Training between runs. In training mode each run normalises with the
// batch's statistics and moves the running ones toward them,
// running = (1-Momentum)*running + Momentum*batch (the unbiased batch
// variance for RunningVar); in inference mode it uses the running statistics.
type BatchNorm struct {
	Gamma, Beta             *G.Node       // [Cout]
	RunningMean, RunningVar *tensor.Dense // [Cout], updated in training mode
	Momentum, Eps           float64
	Training                bool
}

// NewBatchNorm returns a BatchNorm of the given number of channels as
// PyTorch initialises one: Gamma ones and Beta zeros (as nodes of g named
// name+".gamma" and name+".beta"), running mean 0 and variance 1, Momentum
// 0.1, Eps 1e-5, in training mode.
func NewBatchNorm(g *G.ExprGraph, dt tensor.Dtype, channels int, name string) (*BatchNorm, error) {
	if channels <= 0 {
		return nil, fmt.Errorf("ops: NewBatchNorm: channels must be positive, got %d", channels)
	}
	if dt != tensor.Float32 && dt != tensor.Float64 {
		return nil, fmt.Errorf("ops: NewBatchNorm: dtype must be float32 or float64, got %v", dt)
	}
	rv := tensor.New(tensor.Of(dt), tensor.WithShape(channels))
	var one any = 1.0
	if dt == tensor.Float32 {
		one = float32(1)
	}
	if err := rv.Memset(one); err != nil {
		return nil, fmt.Errorf("ops: NewBatchNorm: %w", err)
	}
	return &BatchNorm{
		Gamma:       G.NewVector(g, dt, G.WithShape(channels), G.WithName(name+".gamma"), G.WithInit(G.Ones())),
		Beta:        G.NewVector(g, dt, G.WithShape(channels), G.WithName(name+".beta"), G.WithInit(G.Zeroes())),
		RunningMean: tensor.New(tensor.Of(dt), tensor.WithShape(channels)),
		RunningVar:  rv,
		Momentum:    DefaultMomentum,
		Eps:         DefaultEps,
		Training:    true,
	}, nil
}

// ConvBN computes y = act(BN(conv2d(x, w)) + residual), a ResNet layer:
// the convolution (as Conv, without bias, which BN would cancel), a small op
// that works out each channel's constants (the batch statistics in
// training, which on a GPU come from the convolution's epilogue), and one op
// that normalises, scales and shifts each channel, adds the residual and
// applies the activation in a single pass over the convolution's output.
//
// x: [N,Cin,H,W]; w: [Cout,Cin,KH,KW]; bn: a BatchNorm of Cout channels with
// the dtype of x; residual: nil or a tensor of the output's shape
// [N,Cout,OutH,OutW]. cfg.Act applies after the residual is added.
// Differentiable with respect to x, w, bn.Gamma, bn.Beta and residual. In
// training mode N*OutH*OutW must exceed 1 (a variance needs two values), or
// the run fails, as PyTorch's does. The backward pass keeps the forward's
// statistics, as PyTorch's does, and reads z and dy twice (and the
// residual, for the ReLU's mask of a layer with both): once to reduce the
// gradients of Gamma and Beta and the constants of dz, once to write dz
// (masked by the ReLU and, on a GPU, in the TF32 precision of the tensor
// cores), which the convolution's two GEMMs read as it is. The ReLU's mask
// is recomputed from z with the forward's constants and expressions, so it
// is the forward's y > 0 bit for bit without a read of y.
func ConvBN(x, w *G.Node, bn *BatchNorm, residual *G.Node, cfg ConvConfig) (*G.Node, error) {
	p, dt, err := convParams("ConvBN", x, w, cfg)
	if err != nil {
		return nil, err
	}
	s, err := newBNShape(p, dt, bn, residual, cfg.Act)
	if err != nil {
		return nil, err
	}
	s.stats = &bnStatsLink{bn: bn}
	// dz reaches the convolution's backward GEMMs ready to read (rounded
	// to TF32 on a GPU by BatchNorm's backward pass), z being this
	// layer's alone.
	s.gemmDz = true
	z, err := G.ApplyOp(&convOp{convShape{p: p, dt: dt, stats: s.stats, gradReady: true}}, x, w)
	if err != nil {
		return nil, err
	}
	coef, err := G.ApplyOp(&bnCoefOp{s}, z, bn.Gamma, bn.Beta)
	if err != nil {
		return nil, err
	}
	inputs := G.Nodes{z, bn.Gamma, bn.Beta, coef}
	if residual != nil {
		inputs = append(inputs, residual)
	}
	return G.ApplyOp(&bnOp{s}, inputs...)
}

// newBNShape checks bn and residual against the convolution's output.
func newBNShape(p kernels.ConvParams, dt tensor.Dtype, bn *BatchNorm, residual *G.Node, act Activation) (bnShape, error) {
	s := bnShape{n: p.N, c: p.Cout, h: p.OutH, w: p.OutW, act: act, residual: residual != nil, dt: dt, bn: bn}
	if bn == nil {
		return s, fmt.Errorf("ops: ConvBN: bn is nil")
	}
	want := fmt.Sprintf("[%d]", s.c)
	for _, a := range []struct {
		name string
		n    *G.Node
	}{{"bn.Gamma", bn.Gamma}, {"bn.Beta", bn.Beta}} {
		if err := checkRank("ConvBN", a.name, a.n, 1, want); err != nil {
			return s, err
		}
		if a.n.Shape()[0] != s.c {
			return s, fmt.Errorf("ops: ConvBN: %s must have shape %s, got %v", a.name, want, a.n.Shape())
		}
		if err := sameDtype("ConvBN", dt, map[string]*G.Node{a.name: a.n}); err != nil {
			return s, err
		}
	}
	if _, _, err := s.runningStats(); err != nil {
		return s, err
	}
	s.momentum, s.eps = bn.Momentum, bn.Eps
	if s.momentum == 0 {
		s.momentum = DefaultMomentum
	}
	if s.eps == 0 {
		s.eps = DefaultEps
	}
	if !(s.momentum >= 0 && s.momentum <= 1) {
		return s, fmt.Errorf("ops: ConvBN: bn.Momentum must be in [0, 1], got %v", bn.Momentum)
	}
	if !(s.eps >= 0) || math.IsInf(s.eps, 1) {
		return s, fmt.Errorf("ops: ConvBN: bn.Eps must be non-negative and finite, got %v", bn.Eps)
	}
	if residual != nil {
		if err := checkRank("ConvBN", "residual", residual, 4, fmt.Sprintf("%v like the output", s.zShape())); err != nil {
			return s, err
		}
		if !residual.Shape().Eq(s.zShape()) {
			return s, fmt.Errorf("ops: ConvBN: residual must have shape %v like the output, got %v", s.zShape(), residual.Shape())
		}
		if err := sameDtype("ConvBN", dt, map[string]*G.Node{"residual": residual}); err != nil {
			return s, err
		}
	}
	return s, nil
}

// bnShape is what the BatchNorm ops know at graph-build time. The layer's
// mode and running statistics are read through bn when they run.
type bnShape struct {
	n, c, h, w    int
	eps, momentum float64
	act           Activation
	residual      bool
	dt            tensor.Dtype
	bn            *BatchNorm
	// stats brings the batch statistics from the layer's convolution (GPU).
	stats *bnStatsLink
	// gemmDz says that dz feeds only the layer's convolution's backward
	// GEMMs: on a GPU in float32, bnGradApplyOp stores it rounded to TF32,
	// the precision they read it in, so that they take no pass of their
	// own over it.
	gemmDz bool
}

func (s bnShape) zShape() tensor.Shape { return tensor.Shape{s.n, s.c, s.h, s.w} }
func (s bnShape) cShape() tensor.Shape { return tensor.Shape{s.c} }

// coefShape is the shape of bnCoefOp's output: kernels.BNCoefStride
// constants a channel.
func (s bnShape) coefShape() tensor.Shape { return tensor.Shape{s.c * kernels.BNCoefStride} }

// String names every parameter and the BatchNorm's identity: two layers
// applied to the same input are different nodes, and merging them would
// share (and double-update) one set of running statistics.
func (s bnShape) String() string {
	return fmt.Sprintf("bn=%p,z=%v,%v,eps=%v,momentum=%v,residual=%t,act=%v,gemmDz=%t",
		s.bn, s.zShape(), s.dt, s.eps, s.momentum, s.residual, s.act, s.gemmDz)
}

func (s bnShape) params(training bool) kernels.BatchNormParams {
	return kernels.BatchNormParams{
		N: s.n, C: s.c, HW: s.h * s.w,
		Eps: s.eps, Momentum: s.momentum,
		Training: training, ReLU: s.act == ActReLU,
	}
}

// runningStats returns bn's running statistics after checking that the
// kernels can update them in place.
func (s bnShape) runningStats() (mean, variance *tensor.Dense, err error) {
	if mean, err = s.runningStat("RunningMean", s.bn.RunningMean); err != nil {
		return nil, nil, err
	}
	if variance, err = s.runningStat("RunningVar", s.bn.RunningVar); err != nil {
		return nil, nil, err
	}
	return mean, variance, nil
}

func (s bnShape) runningStat(name string, d *tensor.Dense) (*tensor.Dense, error) {
	switch {
	case d == nil:
		return nil, fmt.Errorf("ops: ConvBN: bn.%s is nil, want a [%d] tensor", name, s.c)
	case d.Dtype() != s.dt:
		return nil, fmt.Errorf("ops: ConvBN: bn.%s has dtype %v, want %v like x", name, d.Dtype(), s.dt)
	case !d.Shape().Eq(s.cShape()):
		return nil, fmt.Errorf("ops: ConvBN: bn.%s must have shape [%d], got %v", name, s.c, d.Shape())
	case d.IsView() || !d.DataOrder().IsRowMajor():
		// An update would land in a copy.
		return nil, fmt.Errorf("ops: ConvBN: bn.%s must be a contiguous tensor, not a view", name)
	}
	return d, nil
}

// checkTraining reports the run-time error of a training batch with one
// value per channel, whose variance is undefined.
func (s bnShape) checkTraining(training bool) error {
	if training && s.n*s.h*s.w <= 1 {
		return fmt.Errorf("ops: ConvBN: training needs more than one value per channel, got N*OutH*OutW = %d", s.n*s.h*s.w)
	}
	return nil
}

// bnCoefOp works out the forward pass's per-channel constants: (z, gamma,
// beta) -> coef, kernels.BNCoefStride a channel (see kernels.BatchNormCoef).
// In training mode they come from the batch's statistics, and it updates
// bn's running statistics; in inference mode, from the running ones. It is
// not differentiated: bnOp, which reads coef, also takes gamma and beta and
// gives the whole gradient of the layer, the statistics' part included.
type bnCoefOp struct{ bnShape }

func (op *bnCoefOp) Arity() int            { return 3 }
func (op *bnCoefOp) Type() hm.Type         { return fnType(4, 1, 1, 1) }
func (op *bnCoefOp) ReturnsPtr() bool      { return false }
func (op *bnCoefOp) CallsExtern() bool     { return false }
func (op *bnCoefOp) OverwritesInput() int  { return -1 }
func (op *bnCoefOp) String() string        { return "BatchNormCoef(" + op.bnShape.String() + ")" }
func (op *bnCoefOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *bnCoefOp) Hashcode() uint32      { return hashOf(op) }

func (op *bnCoefOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.coefShape(), nil }

func (op *bnCoefOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

func (op *bnCoefOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	if len(in) != 3 {
		return nil, fmt.Errorf("ops: %v: want 3 inputs, got %d", op, len(in))
	}
	training := op.bn.Training
	if err := op.checkTraining(training); err != nil {
		return nil, err
	}
	rm, rv, err := op.runningStats()
	if err != nil {
		return nil, err
	}
	dev, err := inputsDevice("ConvBN", []string{"conv output", "bn.Gamma", "bn.Beta"}, in)
	if err != nil {
		return nil, err
	}
	if dev != nil {
		return op.doDevice(dev, prealloc, in, training, rm, rv)
	}
	if err := hostRunning("ConvBN", rm, rv); err != nil {
		return nil, err
	}
	z, err := dense("ConvBN", "conv output", in[0], op.dt, op.zShape())
	if err != nil {
		return nil, err
	}
	gamma, err := dense("ConvBN", "bn.Gamma", in[1], op.dt, op.cShape())
	if err != nil {
		return nil, err
	}
	beta, err := dense("ConvBN", "bn.Beta", in[2], op.dt, op.cShape())
	if err != nil {
		return nil, err
	}
	coef := output(prealloc, op.dt, op.coefShape())
	p := op.params(training)
	switch op.dt {
	case tensor.Float32:
		kernels.BatchNormCoef(p, z.Float32s(), gamma.Float32s(), beta.Float32s(), rm.Float32s(), rv.Float32s(), coef.Float32s())
	default:
		kernels.BatchNormCoef(p, z.Float64s(), gamma.Float64s(), beta.Float64s(), rm.Float64s(), rv.Float64s(), coef.Float64s())
	}
	return coef, nil
}

func (op *bnCoefOp) DiffWRT(inputs int) []bool { return make([]bool, inputs) }

func (op *bnCoefOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("ops: ConvBN: the BatchNorm constants are not differentiated (the BatchNorm op's gradient covers them)")
}

// bnOp is the forward op: (z, gamma, beta, coef[, residual]) -> y, from
// bnCoefOp's constants. gamma and beta are inputs for the gradient, which
// bnOp gives for z, gamma, beta and the residual; the values it computes
// with are in coef.
type bnOp struct{ bnShape }

func (op *bnOp) Arity() int {
	if op.residual {
		return 5
	}
	return 4
}

func (op *bnOp) Type() hm.Type {
	if op.residual {
		return fnType(4, 1, 1, 1, 4, 4)
	}
	return fnType(4, 1, 1, 1, 4)
}

func (op *bnOp) ReturnsPtr() bool      { return false }
func (op *bnOp) CallsExtern() bool     { return false }
func (op *bnOp) OverwritesInput() int  { return -1 }
func (op *bnOp) String() string        { return "BatchNorm(" + op.bnShape.String() + ")" }
func (op *bnOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *bnOp) Hashcode() uint32      { return hashOf(op) }

func (op *bnOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.zShape(), nil }

func (op *bnOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

// bnInputNames names the inputs of bnOp for errors.
var bnInputNames = []string{"conv output", "bn.Gamma", "bn.Beta", "BatchNorm constants", "residual"}

func (op *bnOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	if len(in) != op.Arity() {
		return nil, fmt.Errorf("ops: %v: want %d inputs, got %d", op, op.Arity(), len(in))
	}
	dev, err := inputsDevice("ConvBN", bnInputNames[:len(in)], in)
	if err != nil {
		return nil, err
	}
	if dev != nil {
		return op.doDevice(dev, prealloc, in)
	}
	z, err := dense("ConvBN", "conv output", in[0], op.dt, op.zShape())
	if err != nil {
		return nil, err
	}
	for i, sh := range []tensor.Shape{op.cShape(), op.cShape()} {
		if _, err := dense("ConvBN", bnInputNames[1+i], in[1+i], op.dt, sh); err != nil {
			return nil, err
		}
	}
	coef, err := dense("ConvBN", "BatchNorm constants", in[3], op.dt, op.coefShape())
	if err != nil {
		return nil, err
	}
	var res *tensor.Dense
	if op.residual {
		if res, err = dense("ConvBN", "residual", in[4], op.dt, op.zShape()); err != nil {
			return nil, err
		}
	}
	y := output(prealloc, op.dt, op.zShape())
	p := op.params(op.bn.Training)
	switch op.dt {
	case tensor.Float32:
		kernels.BatchNormApply(p, z.Float32s(), coef.Float32s(), f32sOrNil(res), y.Float32s())
	default:
		kernels.BatchNormApply(p, z.Float64s(), coef.Float64s(), f64sOrNil(res), y.Float64s())
	}
	return y, nil
}

func (op *bnOp) DiffWRT(inputs int) []bool {
	d := make([]bool, inputs)
	for i := range d {
		d[i] = i != 3 // not coef: its part of the gradient is in z's, gamma's and beta's
	}
	return d
}

func (op *bnOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if len(inputs) != op.Arity() {
		return nil, fmt.Errorf("ops: %v: want %d inputs, got %d", op, op.Arity(), len(inputs))
	}
	// Two passes over z and dy (and the residual, for the ReLU's mask):
	// the reduction (dgamma, dbeta and the constants of dz), then dz,
	// which the convolution's GEMMs read as it is. The second is the only
	// pass of the layer's backward that writes a full tensor, but for the
	// residual's gradient of a layer with a residual and a ReLU (dy
	// masked: a tensor of its own, for another op).
	z, gamma, coef := inputs[0], inputs[1], inputs[3]
	statsIn := G.Nodes{z, gamma, coef, grad}
	applyIn := G.Nodes{z, coef, grad, nil}
	if op.residual {
		statsIn = append(statsIn, inputs[4])
	}
	stats, err := G.ApplyOp(&bnGradStatsOp{op.bnShape}, statsIn...)
	if err != nil {
		return nil, fmt.Errorf("ops: ConvBN backward: %w", err)
	}
	applyIn[3] = stats
	if op.residual {
		applyIn = append(applyIn, inputs[4])
	}
	dz, err := G.ApplyOp(&bnGradApplyOp{op.bnShape}, applyIn...)
	if err != nil {
		return nil, fmt.Errorf("ops: ConvBN backward: %w", err)
	}
	dgb, err := autograd.UnpackAt(stats, 0, op.cShape(), op.cShape())
	if err != nil {
		return nil, fmt.Errorf("ops: ConvBN backward: %w", err)
	}
	parts := G.Nodes{dz, dgb[0], dgb[1], nil}
	if !op.residual {
		return parts, nil
	}
	// The residual is added before the activation: its gradient is dy
	// through the activation's mask.
	dres := grad
	if op.act == ActReLU {
		if dres, err = G.ApplyOp(&reluMaskOp{shape: op.zShape(), dt: op.dt}, output, grad); err != nil {
			return nil, fmt.Errorf("ops: ConvBN backward: %w", err)
		}
	}
	return append(parts, dres), nil
}

// bnGradStatsOp is the backward pass's reduction: (z, gamma, coef, dy[,
// residual]) -> [dgamma | dbeta | bcoef], packed into one vector, where
// coef holds the forward's constants (bnCoefOp) and bcoef the per-channel
// constants of dz (kernels.BNCoefStride a channel; see
// kernels.BatchNormBackwardStats) for bnGradApplyOp. It masks dy by the
// forward's y > 0, recomputed from z (and the residual) with coef, when the
// layer ends in a ReLU. Its output is small: autograd.UnpackAt carves dgamma
// and dbeta out of it, and bnGradApplyOp reads bcoef where it lies.
type bnGradStatsOp struct{ bnShape }

func (op *bnGradStatsOp) Arity() int {
	if op.residual {
		return 5
	}
	return 4
}

func (op *bnGradStatsOp) Type() hm.Type {
	if op.residual {
		return fnType(4, 1, 1, 4, 4, 1)
	}
	return fnType(4, 1, 1, 4, 1)
}

func (op *bnGradStatsOp) ReturnsPtr() bool      { return false }
func (op *bnGradStatsOp) CallsExtern() bool     { return false }
func (op *bnGradStatsOp) OverwritesInput() int  { return -1 }
func (op *bnGradStatsOp) String() string        { return "BatchNormGradStats(" + op.bnShape.String() + ")" }
func (op *bnGradStatsOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *bnGradStatsOp) Hashcode() uint32      { return hashOf(op) }

func (op *bnGradStatsOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.statsShape(), nil }

func (op *bnGradStatsOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

// statsShape is the shape of bnGradStatsOp's output: [dgamma | dbeta | bcoef].
func (s bnShape) statsShape() tensor.Shape { return tensor.Shape{s.c * (2 + kernels.BNCoefStride)} }

// bnGradStatsNames names the inputs of bnGradStatsOp for errors.
var bnGradStatsNames = []string{"conv output", "bn.Gamma", "BatchNorm constants", "grad", "residual"}

func (op *bnGradStatsOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	const name = "ConvBN backward"
	if len(in) != op.Arity() {
		return nil, fmt.Errorf("ops: %v: want %d inputs, got %d", op, op.Arity(), len(in))
	}
	dev, err := inputsDevice(name, bnGradStatsNames[:len(in)], in)
	if err != nil {
		return nil, err
	}
	if dev != nil {
		return op.doDevice(dev, prealloc, in)
	}
	shapes := []tensor.Shape{op.zShape(), op.cShape(), op.coefShape(), op.zShape(), op.zShape()}
	var d [5]*tensor.Dense
	for i := range in {
		if d[i], err = dense(name, bnGradStatsNames[i], in[i], op.dt, shapes[i]); err != nil {
			return nil, err
		}
	}
	out := output(prealloc, op.dt, op.statsShape())
	p := op.params(op.bn.Training)
	c := op.c
	switch op.dt {
	case tensor.Float32:
		o := out.Float32s()
		kernels.BatchNormBackwardStats(p, d[0].Float32s(), d[1].Float32s(), d[2].Float32s(), f32sOrNil(d[4]), d[3].Float32s(),
			o[:c], o[c:2*c], o[2*c:])
	default:
		o := out.Float64s()
		kernels.BatchNormBackwardStats(p, d[0].Float64s(), d[1].Float64s(), d[2].Float64s(), f64sOrNil(d[4]), d[3].Float64s(),
			o[:c], o[c:2*c], o[2*c:])
	}
	return out, nil
}

// DiffWRT claims the differentiable inputs so that a second derivative
// reaches SymDiff and its error, rather than gorgonia's report of a
// non-differentiable path.
func (op *bnGradStatsOp) DiffWRT(inputs int) []bool {
	return []bool{true, true, false, true, true}[:inputs]
}

func (op *bnGradStatsOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, errNoSecondDerivative("ConvBN")
}

// bnGradApplyOp is the backward pass's second read: (z, coef, dy, stats[,
// residual]) -> dz, with the forward's constants (coef) for the ReLU's mask
// as bnGradStatsOp makes it and bnGradStatsOp's constants (stats). With
// gemmDz (a ConvBN layer), dz is stored rounded to TF32 on a GPU in
// float32: it is the operand of the convolution's TF32 backward GEMMs,
// which read it as it is; elsewhere it is exact.
type bnGradApplyOp struct{ bnShape }

func (op *bnGradApplyOp) Arity() int {
	if op.residual {
		return 5
	}
	return 4
}

func (op *bnGradApplyOp) Type() hm.Type {
	if op.residual {
		return fnType(4, 1, 4, 1, 4, 4)
	}
	return fnType(4, 1, 4, 1, 4)
}

func (op *bnGradApplyOp) ReturnsPtr() bool      { return false }
func (op *bnGradApplyOp) CallsExtern() bool     { return false }
func (op *bnGradApplyOp) OverwritesInput() int  { return -1 }
func (op *bnGradApplyOp) String() string        { return "BatchNormGradApply(" + op.bnShape.String() + ")" }
func (op *bnGradApplyOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *bnGradApplyOp) Hashcode() uint32      { return hashOf(op) }

func (op *bnGradApplyOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.zShape(), nil }

func (op *bnGradApplyOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

// bnGradApplyNames names the inputs of bnGradApplyOp for errors.
var bnGradApplyNames = []string{"conv output", "BatchNorm constants", "grad", "statistics", "residual"}

func (op *bnGradApplyOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	const name = "ConvBN backward"
	if len(in) != op.Arity() {
		return nil, fmt.Errorf("ops: %v: want %d inputs, got %d", op, op.Arity(), len(in))
	}
	dev, err := inputsDevice(name, bnGradApplyNames[:len(in)], in)
	if err != nil {
		return nil, err
	}
	if dev != nil {
		return op.doDevice(dev, prealloc, in)
	}
	shapes := []tensor.Shape{op.zShape(), op.coefShape(), op.zShape(), op.statsShape(), op.zShape()}
	var d [5]*tensor.Dense
	for i := range in {
		if d[i], err = dense(name, bnGradApplyNames[i], in[i], op.dt, shapes[i]); err != nil {
			return nil, err
		}
	}
	dz := output(prealloc, op.dt, op.zShape())
	p := op.params(op.bn.Training)
	c := op.c
	switch op.dt {
	case tensor.Float32:
		kernels.BatchNormBackwardApply(p, d[0].Float32s(), d[1].Float32s(), f32sOrNil(d[4]), d[2].Float32s(), d[3].Float32s()[2*c:], dz.Float32s())
	default:
		kernels.BatchNormBackwardApply(p, d[0].Float64s(), d[1].Float64s(), f64sOrNil(d[4]), d[2].Float64s(), d[3].Float64s()[2*c:], dz.Float64s())
	}
	return dz, nil
}

func (op *bnGradApplyOp) DiffWRT(inputs int) []bool {
	return []bool{true, false, true, true, true}[:inputs]
}

func (op *bnGradApplyOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, errNoSecondDerivative("ConvBN")
}

// reluMaskOp is (y, dy) -> dy masked by y > 0: the gradient of a ReLU's
// input from its output and the output's gradient. It is linear in dy, so
// its own gradient with respect to dy is itself.
type reluMaskOp struct {
	shape tensor.Shape
	dt    tensor.Dtype
}

func (op *reluMaskOp) Arity() int { return 2 }
func (op *reluMaskOp) Type() hm.Type {
	r := op.shape.Dims()
	return fnType(r, r, r)
}
func (op *reluMaskOp) ReturnsPtr() bool      { return false }
func (op *reluMaskOp) CallsExtern() bool     { return false }
func (op *reluMaskOp) OverwritesInput() int  { return -1 }
func (op *reluMaskOp) String() string        { return fmt.Sprintf("ReLUMask(%v,%v)", op.shape, op.dt) }
func (op *reluMaskOp) WriteHash(h hash.Hash) { writeHash(h, op) }
func (op *reluMaskOp) Hashcode() uint32      { return hashOf(op) }

func (op *reluMaskOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.shape.Clone(), nil }

func (op *reluMaskOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

func (op *reluMaskOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("ops: %v: want 2 inputs, got %d", op, len(in))
	}
	dev, err := inputsDevice("ReLU backward", []string{"y", "grad"}, in)
	if err != nil {
		return nil, err
	}
	if dev != nil {
		return op.doDevice(dev, prealloc, in)
	}
	y, err := dense("ReLU backward", "y", in[0], op.dt, op.shape)
	if err != nil {
		return nil, err
	}
	dy, err := dense("ReLU backward", "grad", in[1], op.dt, op.shape)
	if err != nil {
		return nil, err
	}
	dx := output(prealloc, op.dt, op.shape)
	switch op.dt {
	case tensor.Float32:
		kernels.MaskReLU(y.Float32s(), dy.Float32s(), dx.Float32s())
	default:
		kernels.MaskReLU(y.Float64s(), dy.Float64s(), dx.Float64s())
	}
	return dx, nil
}

func (op *reluMaskOp) DiffWRT(inputs int) []bool { return []bool{false, true} }

func (op *reluMaskOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if len(inputs) != 2 {
		return nil, fmt.Errorf("ops: %v: want 2 inputs, got %d", op, len(inputs))
	}
	d, err := G.ApplyOp(op, inputs[0], grad)
	if err != nil {
		return nil, fmt.Errorf("ops: ReLU mask second derivative: %w", err)
	}
	return G.Nodes{nil, d}, nil
}
