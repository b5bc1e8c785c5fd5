package model

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/ops"
)

// builder assembles one graph. Its first error sticks: later calls do
// nothing and return nil, and Build reports the error once at the end, so
// that the architecture reads as a sequence of layers rather than a ladder
// of error checks.
type builder struct {
	cfg    Config
	mode   Mode
	batch  int
	dt     tensor.Dtype
	g      *G.ExprGraph
	params *Params
	dev    *backend.Device
	drop   *ops.DropoutRNG
	err    error

	// devConsts are the constants made on the device, which the Net frees
	// when it closes.
	devConsts []*tensor.Dense
	// bind, when set, gives the input node of each parameter (the gradient
	// check's), instead of making one.
	bind map[string]*G.Node
	// hostOps makes the graph's host ops (the Net's, timed).
	hostOps hostOps
	// fixedProposals, when set, is the two-stage top-k op's output to use
	// as a constant (the gradient check's); else recordProposals, when
	// set, sees the op's output of every float64 run (the Net's record of
	// it, for that check).
	fixedProposals  []float64
	recordProposals func(out []float64)

	reads   map[string]*G.Node // the node the graph reads each parameter from
	names   []string           // parameters in creation order
	inputs  G.Nodes            // their input nodes, in that order
	bns     []*ops.BatchNorm
	bnNames []string
	consts  int
}

// check records err and passes n through.
func (b *builder) check(n *G.Node, err error) *G.Node {
	if b.err == nil && err != nil {
		b.err = err
	}
	if b.err != nil {
		return nil
	}
	return n
}

// fail records an error made here.
func (b *builder) fail(format string, args ...any) *G.Node {
	return b.check(nil, fmt.Errorf("model: "+format, args...))
}

// param returns the node the graph reads the named learnable tensor from,
// making it on first use. A name used twice (shared heads) is one node.
func (b *builder) param(name string, shape []int, in initializer, group Group) *G.Node {
	if b.err != nil {
		return nil
	}
	if n, ok := b.reads[name]; ok {
		return n
	}
	t, err := b.params.tensorFor(name, shape, in, group)
	if err != nil {
		return b.check(nil, err)
	}
	var input *G.Node
	if b.bind != nil {
		if input = b.bind[name]; input == nil {
			return b.fail("no input node bound for parameter %s", name)
		}
	} else {
		input = G.NewTensor(b.g, b.dt, len(shape), G.WithShape(shape...), G.WithName(name), G.WithValue(t))
	}
	read := input
	if b.placementOnly() {
		read = b.check(ops.ToDevice(input, b.dev))
	}
	b.reads[name] = read
	b.names = append(b.names, name)
	b.inputs = append(b.inputs, input)
	return read
}

// data returns the node the graph reads a host value from: an input node
// bound to t, moved to the device when the graph runs on one.
func (b *builder) data(name string, t *tensor.Dense) (input, read *G.Node) {
	if b.err != nil {
		return nil, nil
	}
	input = G.NewTensor(b.g, b.dt, t.Dims(), G.WithShape(t.Shape()...), G.WithName(name), G.WithValue(t))
	read = input
	if b.dev != nil {
		read = b.check(ops.ToDevice(input, b.dev))
	}
	return input, read
}

// placementOnly reports a graph for a device on host parameters: a
// placement test's, with a Device that was never opened, whose parameters
// and constants are host nodes moved by ops.ToDevice (a graph that runs on
// a device binds its parameters' device tensors).
func (b *builder) placementOnly() bool { return b.dev != nil && b.params.Device() == nil }

// constant is a constant of the graph, where the graph runs: on a device,
// copied there once, when the graph is built.
func (b *builder) constant(name string, vs []float64, shape ...int) *G.Node {
	if b.err != nil {
		return nil
	}
	b.consts++
	name = fmt.Sprintf("%s#%d", name, b.consts)
	t := denseOf(b.dt, vs, shape...)
	if b.dev == nil || b.placementOnly() {
		_, read := b.data(name, t)
		return read
	}
	if b.dev.OpenScope() != nil {
		return b.fail("constant %s: building a graph inside a backend.Scope", name)
	}
	d, err := b.dev.ToDevice(t)
	if err != nil {
		return b.fail("constant %s to the device: %v", name, err)
	}
	b.devConsts = append(b.devConsts, d)
	return G.NewTensor(b.g, b.dt, len(shape), G.WithShape(shape...), G.WithName(name), G.WithValue(d))
}

// linear is x·wᵀ + bias over x's last dimension; bias nil: none.
func (b *builder) linear(x *G.Node, name string, out int, w, bias initializer, group Group) *G.Node {
	if b.err != nil {
		return nil
	}
	in := x.Shape()[x.Dims()-1]
	wt := b.param(name+".weight", []int{out, in}, w, group)
	var bt *G.Node
	if bias != nil {
		bt = b.param(name+".bias", []int{out}, bias, group)
	}
	if b.err != nil {
		return nil
	}
	return b.check(ops.Linear(x, wt, bt))
}

// layerNorm normalises x's last dimension (gamma 1, beta 0, eps 1e-5).
func (b *builder) layerNorm(x *G.Node, name string) *G.Node {
	if b.err != nil {
		return nil
	}
	d := x.Shape()[x.Dims()-1]
	gamma := b.param(name+".weight", []int{d}, constant(1), GroupTransformer)
	beta := b.param(name+".bias", []int{d}, zeros(), GroupTransformer)
	if b.err != nil {
		return nil
	}
	return b.check(ops.LayerNorm(x, gamma, beta, 1e-5))
}

// groupNorm is GroupNorm(NormGroups) of x [N, C, H, W].
func (b *builder) groupNorm(x *G.Node, name string) *G.Node {
	if b.err != nil {
		return nil
	}
	c := x.Shape()[1]
	gamma := b.param(name+".weight", []int{c}, constant(1), GroupTransformer)
	beta := b.param(name+".bias", []int{c}, zeros(), GroupTransformer)
	if b.err != nil {
		return nil
	}
	return b.check(ops.GroupNorm(x, b.cfg.NormGroups, gamma, beta, 1e-5))
}

// dropout is Dropout(cfg.Dropout) while training; the identity in an
// inference graph (no node).
func (b *builder) dropout(x *G.Node) *G.Node {
	if b.err != nil || b.mode != Train || b.cfg.Dropout == 0 {
		return x
	}
	return b.check(ops.Dropout(x, b.cfg.Dropout, b.drop))
}

func (b *builder) add(x, y *G.Node) *G.Node {
	if b.err != nil {
		return nil
	}
	return b.check(ops.Add(x, y))
}

func (b *builder) reshape(x *G.Node, shape ...int) *G.Node {
	if b.err != nil {
		return nil
	}
	return b.check(ops.Reshape(x, shape...))
}

// conv is a convolution with bias (input projections).
func (b *builder) conv(x *G.Node, name string, cout, k, stride int, w initializer, group Group) *G.Node {
	if b.err != nil {
		return nil
	}
	cin := x.Shape()[1]
	wt := b.param(name+".weight", []int{cout, cin, k, k}, w, group)
	bias := b.param(name+".bias", []int{cout}, zeros(), group)
	if b.err != nil {
		return nil
	}
	cfg := ops.ConvConfig{Stride: [2]int{stride, stride}, Pad: [2]int{k / 2, k / 2}}
	return b.check(ops.Conv(x, wt, bias, cfg))
}

// convBN is a bias-free convolution, BatchNorm, an optional residual and an
// optional ReLU, fused by ops.ConvBN: the backbone's layer.
func (b *builder) convBN(x *G.Node, name string, cout, k, stride int, act ops.Activation, residual *G.Node) *G.Node {
	if b.err != nil {
		return nil
	}
	cin := x.Shape()[1]
	wt := b.param(name+".weight", []int{cout, cin, k, k}, kaiming(cout*k*k), GroupBackbone)
	gamma := b.param(name+".bn.weight", []int{cout}, constant(1), GroupBackbone)
	beta := b.param(name+".bn.bias", []int{cout}, zeros(), GroupBackbone)
	mean, variance, err := b.params.StatsFor(name+".bn", cout)
	if err != nil {
		return b.check(nil, err)
	}
	if b.err != nil {
		return nil
	}
	bn := &ops.BatchNorm{Gamma: gamma, Beta: beta, RunningMean: mean, RunningVar: variance,
		Momentum: ops.DefaultMomentum, Eps: ops.DefaultEps, Training: b.mode == Train}
	b.bns = append(b.bns, bn)
	b.bnNames = append(b.bnNames, name+".bn")
	cfg := ops.ConvConfig{Stride: [2]int{stride, stride}, Pad: [2]int{k / 2, k / 2}, Act: act}
	return b.check(ops.ConvBN(x, wt, bn, residual, cfg))
}

// frozen returns the node the graph reads the named frozen tensor from
// (Params.Frozen), making it on first use: bound to the store's tensor
// like a parameter's, but no input of the gradients or the optimiser.
func (b *builder) frozen(name string, shape []int, in initializer) *G.Node {
	if b.err != nil {
		return nil
	}
	if n, ok := b.reads[name]; ok {
		return n
	}
	t, err := b.params.FrozenFor(name, shape, in)
	if err != nil {
		return b.check(nil, err)
	}
	read := G.NewTensor(b.g, b.dt, len(shape), G.WithShape(shape...), G.WithName(name), G.WithValue(t))
	if b.placementOnly() {
		read = b.check(ops.ToDevice(read, b.dev))
	}
	b.reads[name] = read
	return read
}

// frozenBNConvBN is convBN with the reference's FrozenBatchNorm2d: the
// BatchNorm always in inference mode (its running statistics, never
// updated), its weight and bias frozen tensors. The convolution's weight
// is learnable (GroupBackbone) when trainable, frozen otherwise; noInputGrad
// says that x needs no gradient (ops.ConvConfig.NoInputGrad).
func (b *builder) frozenBNConvBN(x *G.Node, name string, cout, k, stride int, act ops.Activation, residual *G.Node, trainable, noInputGrad bool) *G.Node {
	if b.err != nil {
		return nil
	}
	cin := x.Shape()[1]
	shape, in := []int{cout, cin, k, k}, kaiming(cout*k*k)
	var wt *G.Node
	if trainable {
		wt = b.param(name+".weight", shape, in, GroupBackbone)
	} else {
		wt = b.frozen(name+".weight", shape, in)
	}
	gamma := b.frozen(name+".bn.weight", []int{cout}, constant(1))
	beta := b.frozen(name+".bn.bias", []int{cout}, zeros())
	mean, variance, err := b.params.StatsFor(name+".bn", cout)
	if err != nil {
		return b.check(nil, err)
	}
	if b.err != nil {
		return nil
	}
	// Not among b.bns: a training step never switches it to the batch's
	// statistics.
	bn := &ops.BatchNorm{Gamma: gamma, Beta: beta, RunningMean: mean, RunningVar: variance,
		Momentum: ops.DefaultMomentum, Eps: ops.DefaultEps, Training: false}
	cfg := ops.ConvConfig{Stride: [2]int{stride, stride}, Pad: [2]int{k / 2, k / 2}, Act: act, NoInputGrad: noInputGrad}
	return b.check(ops.ConvBN(x, wt, bn, residual, cfg))
}
