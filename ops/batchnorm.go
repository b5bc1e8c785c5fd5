package ops

import (
	"fmt"
	"math"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/backend"
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
//
// The running statistics live in host memory (NewBatchNorm's) or on the GPU
// that runs the layer: RunningStatsToDevice moves them there, where
// training updates them without a wait, RunningStatsToHost moves them back,
// and CopyRunningStats reads them wherever they are.
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
// cores unless the device's GemmMath is GemmExact), which the convolution's
// two GEMMs read as it is. The ReLU's mask
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
	// z is the convolution's [z | statistics], which the BatchNorm ops
	// take as it is: the statistics flow to the constants through the
	// graph. dz reaches the convolution's backward GEMMs ready to read
	// (rounded to TF32 by BatchNorm's backward pass on a GPU whose
	// convolutions multiply in TF32), z being this layer's alone.
	s.convStats, s.gemmDz = true, true
	z, err := G.ApplyOp(convOp(convShape{p: p, dt: dt, bn: bn, gradReady: true, noDx: cfg.NoInputGrad}), x, w)
	if err != nil {
		return nil, err
	}
	coef, err := G.ApplyOp(bnCoefOp(s), z, bn.Gamma, bn.Beta)
	if err != nil {
		return nil, err
	}
	inputs := G.Nodes{z, bn.Gamma, bn.Beta, coef}
	if residual != nil {
		inputs = append(inputs, residual)
	}
	return G.ApplyOp(bnOp(s), inputs...)
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
		return s, fmt.Errorf("ops: ConvBN: %w", err)
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
	// convStats says that z comes as the layer's convolution's output
	// [z | statistics] (convStatsOf): the ops read z, its first N*C*H*W
	// elements, where it lies, and in training on a GPU bnCoefOp works
	// the constants out from the statistics, not from another read of z.
	// Without it z is a plain tensor, and bnCoefOp reduces it itself.
	convStats bool
	// gemmDz says that dz feeds only the layer's convolution's backward
	// GEMMs: on a GPU whose float32 convolutions multiply in TF32
	// (convTF32), bnGradApplyOp stores it rounded to TF32, the precision
	// they read it in, so that they take no pass of their own over it.
	gemmDz bool
}

func (s bnShape) zShape() tensor.Shape { return tensor.Shape{s.n, s.c, s.h, s.w} }
func (s bnShape) cShape() tensor.Shape { return tensor.Shape{s.c} }

// stats is the layout of the convolution's [z | statistics].
func (s bnShape) stats() convStatsLayout { return convStatsOf(s.dt, s.n, s.c, s.h*s.w) }

// zInShape is the shape in which the ops take z (and bnGradApplyOp gives
// its gradient): plain, or the convolution's [z | statistics].
func (s bnShape) zInShape() tensor.Shape {
	if s.convStats {
		return tensor.Shape{s.stats().size}
	}
	return s.zShape()
}

// coefShape is the shape of bnCoefOp's output: kernels.BNCoefStride
// constants a channel.
func (s bnShape) coefShape() tensor.Shape { return tensor.Shape{s.c * kernels.BNCoefStride} }

// String names every parameter and the BatchNorm's identity: two layers
// applied to the same input are different nodes, and merging them would
// share (and double-update) one set of running statistics.
func (s bnShape) String() string {
	return fmt.Sprintf("bn=%p,z=%v,%v,eps=%v,momentum=%v,residual=%t,act=%v,gemmDz=%t,convStats=%t",
		s.bn, s.zShape(), s.dt, s.eps, s.momentum, s.residual, s.act, s.gemmDz, s.convStats)
}

func (s bnShape) params(training bool) kernels.BatchNormParams {
	return kernels.BatchNormParams{
		N: s.n, C: s.c, HW: s.h * s.w,
		Eps: s.eps, Momentum: s.momentum,
		Training: training, ReLU: s.act == ActReLU,
	}
}

// The inputs the BatchNorm ops share.
func (s bnShape) zArg() argSpec    { return argSpec{name: "conv output", shape: s.zInShape()} }
func (s bnShape) coefArg() argSpec { return argSpec{name: "BatchNorm constants", shape: s.coefShape()} }
func (s bnShape) gradArg() argSpec { return argSpec{name: "grad", shape: s.zShape()} }
func (s bnShape) cArg(name string) argSpec {
	return argSpec{name: name, shape: s.cShape()}
}

// withResidual returns in, and the residual of a layer that has one.
func (s bnShape) withResidual(in ...argSpec) []argSpec {
	if s.residual {
		in = append(in, argSpec{name: "residual", shape: s.zShape()})
	}
	return in
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
		return nil, fmt.Errorf("bn.%s is nil, want a [%d] tensor", name, s.c)
	case d.Dtype() != s.dt:
		return nil, fmt.Errorf("bn.%s has dtype %v, want %v like x", name, d.Dtype(), s.dt)
	case !d.Shape().Eq(s.cShape()):
		return nil, fmt.Errorf("bn.%s must have shape [%d], got %v", name, s.c, d.Shape())
	case d.IsView() || !d.DataOrder().IsRowMajor():
		// An update would land in a copy.
		return nil, fmt.Errorf("bn.%s must be a contiguous tensor, not a view", name)
	}
	return d, nil
}

// mode reads the layer's mode and running statistics as the constants op
// runs: a training batch with one value per channel, whose variance is
// undefined, is an error, and so are running statistics the kernels cannot
// update in place.
func (s bnShape) mode() (training bool, mean, variance *tensor.Dense, err error) {
	training = s.bn.Training
	if training && s.n*s.h*s.w <= 1 {
		return training, nil, nil, fmt.Errorf("training needs more than one value per channel, got N*OutH*OutW = %d", s.n*s.h*s.w)
	}
	mean, variance, err = s.runningStats()
	return training, mean, variance, err
}

// bnCoefOp works out the forward pass's per-channel constants: (z, gamma,
// beta) -> coef, kernels.BNCoefStride a channel (see kernels.BatchNormCoef).
// In training mode they come from the batch's statistics, and it updates
// bn's running statistics; in inference mode, from the running ones. It is
// not differentiated: bnOp, which reads coef, also takes gamma and beta and
// gives the whole gradient of the layer, the statistics' part included.
func bnCoefOp(s bnShape) *specOp {
	return newOp(&opSpec{
		name: "ConvBN", kind: "BatchNormCoef", config: s.String(),
		inputs: []argSpec{s.zArg(), s.cArg("bn.Gamma"), s.cArg("bn.Beta")},
		out:    s.coefShape(), dtype: s.dt,
		cpu:    floatTwin(s, bnCoef[float32], bnCoef[float64]),
		device: s.coefDevice,
		grad: func(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
			return nil, fmt.Errorf("ops: ConvBN: the BatchNorm constants are not differentiated (the BatchNorm op's gradient covers them)")
		},
	})
}

func bnCoef[T kernels.Float](s bnShape, in [][]T, coef []T) error {
	training, rm, rv, err := s.mode()
	if err != nil {
		return err
	}
	if backend.IsDevice(rm) || backend.IsDevice(rv) {
		// The CPU twin would read device memory.
		return fmt.Errorf("bn.RunningMean and bn.RunningVar are on a GPU but the layer's inputs are in host memory")
	}
	run := floatsOf[T]([]*tensor.Dense{rm, rv})
	kernels.BatchNormCoef(s.params(training), in[0][:s.n*s.c*s.h*s.w], in[1], in[2], run[0], run[1], coef)
	return nil
}

// bnOp is the forward op: (z, gamma, beta, coef[, residual]) -> y, from
// bnCoefOp's constants. gamma and beta are inputs for the gradient, which
// bnOp gives for z, gamma, beta and the residual; the values it computes
// with are in coef (not differentiated: its part of the gradient is in
// z's, gamma's and beta's).
func bnOp(s bnShape) *specOp {
	in := s.withResidual(s.zArg(), s.cArg("bn.Gamma"), s.cArg("bn.Beta"), s.coefArg())
	return newOp(&opSpec{
		name: "ConvBN", kind: "BatchNorm", config: s.String(),
		inputs: in, out: s.zShape(), dtype: s.dt,
		cpu:     floatTwin(s, bnApply[float32], bnApply[float64]),
		device:  s.applyDevice,
		diffWRT: []bool{true, true, true, false, true}[:len(in)],
		grad:    s.backward,
	})
}

func bnApply[T kernels.Float](s bnShape, in [][]T, y []T) error {
	kernels.BatchNormApply(s.params(s.bn.Training), in[0][:len(y)], in[3], optional(in, 4), y)
	return nil
}

// backward is bnOp's SymDiff.
func (s bnShape) backward(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	// Two passes over z and dy (and the residual, for the ReLU's mask):
	// the reduction (dgamma, dbeta and the constants of dz), then dz,
	// which the convolution's GEMMs read as it is. The second is the only
	// pass of the layer's backward that writes a full tensor, but for the
	// residual's gradient of a layer with a residual and a ReLU (dy
	// masked: a tensor of its own, for another op).
	z, gamma, coef := inputs[0], inputs[1], inputs[3]
	statsIn := G.Nodes{z, gamma, coef, grad}
	applyIn := G.Nodes{z, coef, grad, nil}
	if s.residual {
		statsIn = append(statsIn, inputs[4])
	}
	stats, err := G.ApplyOp(bnGradStatsOp(s), statsIn...)
	if err != nil {
		return nil, fmt.Errorf("ops: ConvBN backward: %w", err)
	}
	applyIn[3] = stats
	if s.residual {
		applyIn = append(applyIn, inputs[4])
	}
	dz, err := G.ApplyOp(bnGradApplyOp(s), applyIn...)
	if err != nil {
		return nil, fmt.Errorf("ops: ConvBN backward: %w", err)
	}
	dgb, err := autograd.UnpackAt(stats, 0, s.cShape(), s.cShape())
	if err != nil {
		return nil, fmt.Errorf("ops: ConvBN backward: %w", err)
	}
	parts := G.Nodes{dz, dgb[0], dgb[1], nil}
	if !s.residual {
		return parts, nil
	}
	// The residual is added before the activation: its gradient is dy
	// through the activation's mask.
	dres := grad
	if s.act == ActReLU {
		if dres, err = G.ApplyOp(reluMaskOp(s.zShape(), s.dt), output, grad); err != nil {
			return nil, fmt.Errorf("ops: ConvBN backward: %w", err)
		}
	}
	return append(parts, dres), nil
}

// statsShape is the shape of bnGradStatsOp's output: [dgamma | dbeta | bcoef].
func (s bnShape) statsShape() tensor.Shape { return tensor.Shape{s.c * (2 + kernels.BNCoefStride)} }

// bnGradStatsOp is the backward pass's reduction: (z, gamma, coef, dy[,
// residual]) -> [dgamma | dbeta | bcoef], packed into one vector, where
// coef holds the forward's constants (bnCoefOp) and bcoef the per-channel
// constants of dz (kernels.BNCoefStride a channel; see
// kernels.BatchNormBackwardStats) for bnGradApplyOp. It masks dy by the
// forward's y > 0, recomputed from z (and the residual) with coef, when the
// layer ends in a ReLU. Its output is small: autograd.UnpackAt carves dgamma
// and dbeta out of it, and bnGradApplyOp reads bcoef where it lies.
//
// Its DiffWRT claims the differentiable inputs so that a second derivative
// reaches SymDiff and its error, rather than gorgonia's report of a
// non-differentiable path.
func bnGradStatsOp(s bnShape) *specOp {
	in := s.withResidual(s.zArg(), s.cArg("bn.Gamma"), s.coefArg(), s.gradArg())
	return newOp(&opSpec{
		name: "ConvBN backward", kind: "BatchNormGradStats", config: s.String(),
		inputs: in, out: s.statsShape(), dtype: s.dt,
		cpu:     floatTwin(s, bnGradStats[float32], bnGradStats[float64]),
		device:  s.gradStatsDevice,
		diffWRT: []bool{true, true, false, true, true}[:len(in)],
		grad:    noSecondDerivative("ConvBN"),
	})
}

func bnGradStats[T kernels.Float](s bnShape, in [][]T, out []T) error {
	c, nz := s.c, s.n*s.c*s.h*s.w
	kernels.BatchNormBackwardStats(s.params(s.bn.Training), in[0][:nz], in[1], in[2], optional(in, 4), in[3],
		out[:c], out[c:2*c], out[2*c:])
	return nil
}

// bnGradApplyOp is the backward pass's second read: (z, coef, dy, stats[,
// residual]) -> dz, with the forward's constants (coef) for the ReLU's mask
// as bnGradStatsOp makes it and bnGradStatsOp's constants (stats). With
// gemmDz (a ConvBN layer), dz is stored rounded to TF32 on a GPU whose
// float32 convolutions multiply in TF32 (convTF32): it is the operand of the
// convolution's TF32 backward GEMMs, which read it as it is; elsewhere
// (float64, a device in GemmExact, the CPU) it is exact. With convStats dz comes
// shaped as z does, [dz | zeros]: the statistics are not differentiated.
func bnGradApplyOp(s bnShape) *specOp {
	in := s.withResidual(s.zArg(), s.coefArg(), s.gradArg(), argSpec{name: "statistics", shape: s.statsShape()})
	return newOp(&opSpec{
		name: "ConvBN backward", kind: "BatchNormGradApply", config: s.String(),
		inputs: in, out: s.zInShape(), dtype: s.dt,
		cpu:     floatTwin(s, bnGradApply[float32], bnGradApply[float64]),
		device:  s.gradApplyDevice,
		diffWRT: []bool{true, false, true, true, true}[:len(in)],
		grad:    noSecondDerivative("ConvBN"),
	})
}

func bnGradApply[T kernels.Float](s bnShape, in [][]T, dz []T) error {
	nz := s.n * s.c * s.h * s.w
	kernels.BatchNormBackwardApply(s.params(s.bn.Training), in[0][:nz], in[1], optional(in, 4), in[2], in[3][2*s.c:], dz[:nz])
	clear(dz[nz:])
	return nil
}

// reluMaskOp is (y, dy) -> dy masked by y > 0: the gradient of a ReLU's
// input from its output and the output's gradient. It is linear in dy, so
// its own gradient with respect to dy is itself.
func reluMaskOp(shape tensor.Shape, dt tensor.Dtype) *specOp {
	return newOp(&opSpec{
		name: "ReLU backward", kind: "ReLUMask", config: fmt.Sprintf("%v,%v", shape, dt),
		inputs: []argSpec{{name: "y", shape: shape}, {name: "grad", shape: shape}},
		out:    shape, dtype: dt,
		cpu:     floatTwin(struct{}{}, reluMask[float32], reluMask[float64]),
		device:  reluMaskDevice,
		diffWRT: []bool{false, true},
		grad: func(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			d, err := G.ApplyOp(reluMaskOp(shape, dt), in[0], grad)
			if err != nil {
				return nil, fmt.Errorf("ops: ReLU mask second derivative: %w", err)
			}
			return G.Nodes{nil, d}, nil
		},
	})
}

func reluMask[T kernels.Float](_ struct{}, in [][]T, dx []T) error {
	kernels.MaskReLU(in[0], in[1], dx)
	return nil
}
