package ops

import (
	"fmt"
	"math"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/kernels"
)

// LayerNorm normalises x over its last dimension, as PyTorch's
// torch.nn.functional.layer_norm(x, [C], gamma, beta, eps): x [..., C] (one
// dimension or more) and, per row of C values with mean mean and biased
// variance var,
//
//	y = (x - mean) / sqrt(var + eps) * gamma + beta
//
// gamma and beta are [C], or nil: no scale, no shift. eps must be finite
// and positive; 0 stands for DefaultEps (1e-5, PyTorch's default, as for
// BatchNorm). Sums run in the dtype, float32 or float64, as PyTorch's CUDA
// kernels run them; a row holding a NaN gives a row of NaN (and NaN in
// gamma's gradient), as PyTorch's does.
//
// Differentiable with respect to x, gamma and beta: with g = dy*gamma and
// xhat = (x - mean)/sqrt(var + eps),
//
//	dx = (g - mean(g) - xhat*mean(g*xhat)) / sqrt(var + eps)   per row
//	dgamma = the sum over rows of dy*xhat,  dbeta = the sum of dy
//
// The backward pass is two ops, each reading x and dy once: dx, and the
// column sums of gamma and beta (when they are not nil). Neither keeps the
// forward's statistics: each works them out again from the row it reads,
// in the forward's own order, so they are the forward's bit for bit
// (kernels/layernorm.cu says why that beats saving them). Second
// derivatives are not implemented.
func LayerNorm(x, gamma, beta *G.Node, eps float64) (*G.Node, error) {
	s, err := layerNormShapeOf(x, gamma, beta, eps)
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
	return G.ApplyOp(layerNormOp(s), in...)
}

// layerNormShapeOf checks LayerNorm's arguments.
func layerNormShapeOf(x, gamma, beta *G.Node, eps float64) (layerNormShape, error) {
	const op = "LayerNorm"
	var s layerNormShape
	if x == nil {
		return s, fmt.Errorf("ops: %s: x is nil, want shape [... C]", op)
	}
	xs := x.Shape()
	if xs.Dims() < 1 {
		return s, fmt.Errorf("ops: %s: x must have shape [... C] (one dimension or more), got a scalar", op)
	}
	dt, err := floatDtype(op, "x", x)
	if err != nil {
		return s, err
	}
	if err := positiveSizes(op, "x", xs); err != nil {
		return s, err
	}
	c := xs[len(xs)-1]
	for _, a := range []struct {
		name string
		n    *G.Node
	}{{"gamma", gamma}, {"beta", beta}} {
		if a.n == nil {
			continue
		}
		if as := a.n.Shape(); as.Dims() != 1 || as[0] != c {
			return s, fmt.Errorf("ops: %s: %s must have shape [C] = [%d] like x's last dimension (or be nil), got %v", op, a.name, c, as)
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
	return layerNormShape{x: xs.Clone(), rows: xs.TotalSize() / c, c: c, gamma: gamma != nil, beta: beta != nil, eps: eps, dt: dt}, nil
}

// layerNormShape is a LayerNorm as its ops know it: x, seen as rows x c,
// whether it has gamma and beta, and eps.
type layerNormShape struct {
	x           tensor.Shape
	rows, c     int
	gamma, beta bool
	eps         float64
	dt          tensor.Dtype
}

func (s layerNormShape) String() string {
	return fmt.Sprintf("x=%v,gamma=%t,beta=%t,eps=%v,%v", s.x, s.gamma, s.beta, s.eps, s.dt)
}

// params is the normalisation with the launch geometry that fixes its
// order of summation, the same for the CPU twins and the kernels.
func (s layerNormShape) params() kernels.LayerNormParams {
	return kernels.NewLayerNormParams(s.rows, s.c, int(s.dt.Size()), s.eps)
}

// sums is the number of column sums of the backward's params op: one per
// gamma and beta present.
func (s layerNormShape) sums() int {
	n := 0
	if s.gamma {
		n++
	}
	if s.beta {
		n++
	}
	return n
}

func (s layerNormShape) cArg(name string) argSpec {
	return argSpec{name: name, shape: tensor.Shape{s.c}}
}

// layerNormOp is the forward op: (x[, gamma][, beta]) -> y, one read of x.
func layerNormOp(s layerNormShape) *specOp {
	in := []argSpec{{name: "x", shape: s.x}}
	if s.gamma {
		in = append(in, s.cArg("gamma"))
	}
	if s.beta {
		in = append(in, s.cArg("beta"))
	}
	diff := make([]bool, len(in))
	for i := range diff {
		diff[i] = true
	}
	return newOp(&opSpec{
		name: "LayerNorm", config: s.String(),
		inputs: in, out: s.x, dtype: s.dt,
		cpu:     floatTwin(s, layerNormForward[float32], layerNormForward[float64]),
		device:  s.forwardDevice,
		diffWRT: diff,
		grad:    s.backward,
	})
}

func layerNormForward[T kernels.Float](s layerNormShape, in [][]T, y []T) error {
	gamma, beta := affine(s.gamma, s.beta, in, 1)
	kernels.LayerNormForward(s.params(), in[0], gamma, beta, y)
	return nil
}

// backward is layerNormOp's SymDiff: dx from layerNormGradXOp, and the
// gradients of gamma and beta from layerNormGradParamsOp, packed when
// there are both.
func (s layerNormShape) backward(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
	const name = "LayerNorm backward"
	x := in[0]
	dxIn := G.Nodes{x}
	if s.gamma {
		dxIn = append(dxIn, in[1])
	}
	dx, err := G.ApplyOp(layerNormGradXOp(s), append(dxIn, grad)...)
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", name, err)
	}
	grads := G.Nodes{dx}
	if s.sums() == 0 {
		return grads, nil
	}
	var paramsIn G.Nodes
	if s.gamma {
		paramsIn = append(paramsIn, x)
	}
	packed, err := G.ApplyOp(layerNormGradParamsOp(s), append(paramsIn, grad)...)
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", name, err)
	}
	return appendAffineGrads(name, grads, packed, s.sums(), s.c)
}

// layerNormGradXOp is (x[, gamma], dy) -> dx: one read of x and dy, the
// statistics worked out again as the forward works them out.
//
// Its DiffWRT claims its inputs so that a second derivative reaches
// SymDiff and its error, rather than gorgonia's report of a
// non-differentiable path.
func layerNormGradXOp(s layerNormShape) *specOp {
	in := []argSpec{{name: "x", shape: s.x}}
	if s.gamma {
		in = append(in, s.cArg("gamma"))
	}
	in = append(in, argSpec{name: "grad", shape: s.x})
	diff := make([]bool, len(in))
	for i := range diff {
		diff[i] = true
	}
	return newOp(&opSpec{
		name: "LayerNorm backward", kind: "LayerNormGradX", config: s.String(),
		inputs: in, out: s.x, dtype: s.dt,
		cpu:     floatTwin(s, layerNormGradX[float32], layerNormGradX[float64]),
		device:  s.gradXDevice,
		diffWRT: diff,
		grad:    noSecondDerivative("LayerNorm"),
	})
}

func layerNormGradX[T kernels.Float](s layerNormShape, in [][]T, dx []T) error {
	var gamma []T
	if s.gamma {
		gamma = in[1]
	}
	kernels.LayerNormBackwardDX(s.params(), in[0], gamma, in[len(in)-1], dx)
	return nil
}

// layerNormGradParamsOp is ([x,] dy) -> [dgamma | dbeta], the column sums
// of dy*xhat and of dy over the rows, for the gamma and beta the layer has
// (x only with gamma: dbeta does not read it). One read of x and dy, per
// block partial sums and then their sum over the blocks, in a fixed order.
func layerNormGradParamsOp(s layerNormShape) *specOp {
	var in []argSpec
	if s.gamma {
		in = append(in, argSpec{name: "x", shape: s.x})
	}
	in = append(in, argSpec{name: "grad", shape: s.x})
	diff := make([]bool, len(in))
	for i := range diff {
		diff[i] = true
	}
	return newOp(&opSpec{
		name: "LayerNorm backward", kind: "LayerNormGradParams", config: s.String(),
		inputs: in, out: tensor.Shape{s.sums() * s.c}, dtype: s.dt,
		cpu:     floatTwin(s, layerNormGradParams[float32], layerNormGradParams[float64]),
		device:  s.gradParamsDevice,
		diffWRT: diff,
		grad:    noSecondDerivative("LayerNorm"),
	})
}

func layerNormGradParams[T kernels.Float](s layerNormShape, in [][]T, out []T) error {
	var x, dgamma, dbeta []T
	if s.gamma {
		x, dgamma = in[0], out[:s.c]
	}
	if s.beta {
		dbeta = out[len(out)-s.c:]
	}
	kernels.LayerNormBackwardParams(s.params(), x, in[len(in)-1], dgamma, dbeta)
	return nil
}
