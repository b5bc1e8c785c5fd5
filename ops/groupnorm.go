package ops

import (
	"fmt"
	"math"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/kernels"
)

// GroupNorm normalises x over groups of its channels, as PyTorch's
// torch.nn.functional.group_norm(x, groups, gamma, beta, eps): x [N, C,
// ...] (two dimensions or more, channels at dimension 1; NCHW for images),
// its C channels split into groups groups of C/groups consecutive
// channels, and per sample and group, with the mean and the biased
// variance var of the group's values,
//
//	y = (x - mean) / sqrt(var + eps) * gamma[ch] + beta[ch]
//
// groups must divide C. gamma and beta are [C], or nil: no scale, no
// shift. eps must be finite and positive; 0 stands for DefaultEps (1e-5,
// PyTorch's default). Sums and the arithmetic on the statistics run in
// float64 for float32 and float64 alike, in an order fixed by the shape
// (kernels/groupnorm.cu says how, and why the GPU can afford it), so the
// GPU's results are the CPU's bit for bit; a group holding a NaN gives a
// group of NaN (and NaN in gamma's gradient), as PyTorch's does.
//
// Differentiable with respect to x, gamma and beta: with g = dy*gamma[ch]
// and xhat = (x - mean)/sqrt(var + eps),
//
//	dx = (g - mean(g) - xhat*mean(g*xhat)) / sqrt(var + eps)   per sample and group
//	dgamma[ch] = the sum over samples and positions of dy*xhat,  dbeta[ch] = of dy
//
// The backward pass is three ops: one reads x and dy once for every sum the
// gradients need (the statistics, worked out again in the forward's order
// and so the forward's bit for bit, and per sample and channel sum(dy) and
// sum(dy*xhat)), one reads x and dy again for dx, and a small one adds the
// channels' sums over the samples for dgamma and dbeta. Second derivatives
// are not implemented.
func GroupNorm(x *G.Node, groups int, gamma, beta *G.Node, eps float64) (*G.Node, error) {
	s, err := groupNormShapeOf(x, groups, gamma, beta, eps)
	if err != nil {
		return nil, err
	}
	in := G.Nodes{x}
	if gamma != nil {
		in = append(in, gamma)
	}
	if beta != nil {
		in = append(in, beta)
	}
	return G.ApplyOp(groupNormOp(s), in...)
}

// groupNormShapeOf checks GroupNorm's arguments.
func groupNormShapeOf(x *G.Node, groups int, gamma, beta *G.Node, eps float64) (groupNormShape, error) {
	const op = "GroupNorm"
	var s groupNormShape
	if x == nil {
		return s, fmt.Errorf("ops: %s: x is nil, want shape [N C ...]", op)
	}
	xs := x.Shape()
	if xs.Dims() < 2 {
		return s, fmt.Errorf("ops: %s: x must have shape [N C ...] (two dimensions or more), got %v", op, xs)
	}
	dt, err := floatDtype(op, "x", x)
	if err != nil {
		return s, err
	}
	if err := positiveSizes(op, "x", xs); err != nil {
		return s, err
	}
	c := xs[1]
	if groups < 1 || c%groups != 0 {
		return s, fmt.Errorf("ops: %s: groups must be positive and divide C = %d (x's dimension 1), got %d", op, c, groups)
	}
	for _, a := range []struct {
		name string
		n    *G.Node
	}{{"gamma", gamma}, {"beta", beta}} {
		if a.n == nil {
			continue
		}
		if as := a.n.Shape(); as.Dims() != 1 || as[0] != c {
			return s, fmt.Errorf("ops: %s: %s must have shape [C] = [%d] like x's dimension 1 (or be nil), got %v", op, a.name, c, as)
		}
		if err := sameDtype(op, dt, map[string]*G.Node{a.name: a.n}); err != nil {
			return s, err
		}
	}
	if eps == 0 {
		eps = DefaultEps
	}
	if !(eps > 0) || math.IsInf(eps, 1) {
		return s, fmt.Errorf("ops: %s: eps must be finite and positive (0 for DefaultEps), got %v", op, eps)
	}
	return groupNormShape{
		x: xs.Clone(), n: xs[0], c: c, hw: xs.TotalSize() / (xs[0] * c), groups: groups,
		gamma: gamma != nil, beta: beta != nil, eps: eps, dt: dt,
	}, nil
}

// groupNormShape is a GroupNorm as its ops know it: x, seen as [n, c, hw],
// its groups, whether it has gamma and beta, and eps.
type groupNormShape struct {
	x           tensor.Shape
	n, c, hw    int
	groups      int
	gamma, beta bool
	eps         float64
	dt          tensor.Dtype
}

func (s groupNormShape) String() string {
	return fmt.Sprintf("x=%v,groups=%d,gamma=%t,beta=%t,eps=%v,%v", s.x, s.groups, s.gamma, s.beta, s.eps, s.dt)
}

// params is the normalisation with the tile geometry that fixes its order
// of summation, the same for the CPU twins and the kernels.
func (s groupNormShape) params() kernels.GroupNormParams {
	return kernels.NewGroupNormParams(s.n, s.c, s.groups, s.hw, int(s.dt.Size()), s.eps)
}

// sums is the number of channel sums of the backward's params op: one per
// gamma and beta present.
func (s groupNormShape) sums() int {
	n := 0
	if s.gamma {
		n++
	}
	if s.beta {
		n++
	}
	return n
}

func (s groupNormShape) cArg(name string) argSpec {
	return argSpec{name: name, shape: tensor.Shape{s.c}}
}

// sumsArg is the backward's sums, groupNormGradSumsOp's output.
func (s groupNormShape) sumsArg() argSpec {
	return argSpec{name: "sums", shape: tensor.Shape{s.params().SumsLen()}}
}

// groupNormDiffWRT says each of n inputs differentiable.
func groupNormDiffWRT(n int) []bool {
	b := make([]bool, n)
	for i := range b {
		b[i] = true
	}
	return b
}

// groupNormOp is the forward op: (x[, gamma][, beta]) -> y.
func groupNormOp(s groupNormShape) *specOp {
	in := []argSpec{{name: "x", shape: s.x}}
	if s.gamma {
		in = append(in, s.cArg("gamma"))
	}
	if s.beta {
		in = append(in, s.cArg("beta"))
	}
	return newOp(&opSpec{
		name: "GroupNorm", config: s.String(),
		inputs: in, out: s.x, dtype: s.dt,
		cpu:     floatTwin(s, groupNormForward[float32], groupNormForward[float64]),
		device:  s.forwardDevice,
		diffWRT: groupNormDiffWRT(len(in)),
		grad:    s.backward,
	})
}

func groupNormForward[T kernels.Float](s groupNormShape, in [][]T, y []T) error {
	gamma, beta := affine(s.gamma, s.beta, in, 1)
	kernels.GroupNormForward(s.params(), in[0], gamma, beta, y)
	return nil
}

// backward is groupNormOp's SymDiff: the sums of groupNormGradSumsOp feed
// dx (groupNormGradXOp) and the gradients of gamma and beta
// (groupNormGradParamsOp), packed when there are both.
func (s groupNormShape) backward(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
	const name = "GroupNorm backward"
	x := in[0]
	xg := G.Nodes{x}
	if s.gamma {
		xg = append(xg, in[1])
	}
	sums, err := G.ApplyOp(groupNormGradSumsOp(s), append(xg, grad)...)
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", name, err)
	}
	dx, err := G.ApplyOp(groupNormGradXOp(s), append(xg, grad, sums)...)
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", name, err)
	}
	grads := G.Nodes{dx}
	if s.sums() == 0 {
		return grads, nil
	}
	packed, err := G.ApplyOp(groupNormGradParamsOp(s), sums)
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", name, err)
	}
	return appendAffineGrads(name, grads, packed, s.sums(), s.c)
}

// groupNormGradSumsOp is (x[, gamma], dy) -> sums: one read of x and dy
// for the statistics, mean(g) and mean(g*xhat) per sample and group, and
// sum(dy), sum(dy*xhat) per sample and channel (kernels.GroupNormBackwardSums
// gives the layout).
//
// The backward ops' DiffWRT claims their inputs so that a second derivative
// reaches SymDiff and its error, rather than gorgonia's report of a
// non-differentiable path.
func groupNormGradSumsOp(s groupNormShape) *specOp {
	in := []argSpec{{name: "x", shape: s.x}}
	if s.gamma {
		in = append(in, s.cArg("gamma"))
	}
	in = append(in, argSpec{name: "grad", shape: s.x})
	return newOp(&opSpec{
		name: "GroupNorm backward", kind: "GroupNormGradSums", config: s.String(),
		inputs: in, out: s.sumsArg().shape, dtype: s.dt,
		cpu:     floatTwin(s, groupNormGradSums[float32], groupNormGradSums[float64]),
		device:  s.gradSumsDevice,
		diffWRT: groupNormDiffWRT(len(in)),
		grad:    noSecondDerivative("GroupNorm"),
	})
}

func groupNormGradSums[T kernels.Float](s groupNormShape, in [][]T, sums []T) error {
	var gamma []T
	if s.gamma {
		gamma = in[1]
	}
	kernels.GroupNormBackwardSums(s.params(), in[0], gamma, in[len(in)-1], sums)
	return nil
}

// groupNormGradXOp is (x[, gamma], dy, sums) -> dx: one read of x and dy.
func groupNormGradXOp(s groupNormShape) *specOp {
	in := []argSpec{{name: "x", shape: s.x}}
	if s.gamma {
		in = append(in, s.cArg("gamma"))
	}
	in = append(in, argSpec{name: "grad", shape: s.x}, s.sumsArg())
	return newOp(&opSpec{
		name: "GroupNorm backward", kind: "GroupNormGradX", config: s.String(),
		inputs: in, out: s.x, dtype: s.dt,
		cpu:     floatTwin(s, groupNormGradX[float32], groupNormGradX[float64]),
		device:  s.gradXDevice,
		diffWRT: groupNormDiffWRT(len(in)),
		grad:    noSecondDerivative("GroupNorm"),
	})
}

func groupNormGradX[T kernels.Float](s groupNormShape, in [][]T, dx []T) error {
	var gamma []T
	if s.gamma {
		gamma = in[1]
	}
	kernels.GroupNormBackwardDX(s.params(), in[0], gamma, in[len(in)-2], in[len(in)-1], dx)
	return nil
}

// groupNormGradParamsOp is (sums) -> [dgamma | dbeta], for the gamma and
// beta the layer has: the channels' sums added over the samples.
func groupNormGradParamsOp(s groupNormShape) *specOp {
	return newOp(&opSpec{
		name: "GroupNorm backward", kind: "GroupNormGradParams", config: s.String(),
		inputs: []argSpec{s.sumsArg()}, out: tensor.Shape{s.sums() * s.c}, dtype: s.dt,
		cpu:     floatTwin(s, groupNormGradParams[float32], groupNormGradParams[float64]),
		device:  s.gradParamsDevice,
		diffWRT: []bool{true},
		grad:    noSecondDerivative("GroupNorm"),
	})
}

func groupNormGradParams[T kernels.Float](s groupNormShape, in [][]T, out []T) error {
	var dgamma, dbeta []T
	if s.gamma {
		dgamma = out[:s.c]
	}
	if s.beta {
		dbeta = out[len(out)-s.c:]
	}
	kernels.GroupNormBackwardParams(s.params(), in[0], dgamma, dbeta)
	return nil
}
