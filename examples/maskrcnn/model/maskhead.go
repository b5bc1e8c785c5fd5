package model

import (
	"fmt"
	"hash"
	"hash/fnv"
	"slices"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/ops"
)

// The training graph's mask head runs on the step's foreground RoIs only,
// as torchvision's does. Their number changes from step to step, and a
// gorgonia graph has fixed shapes, so the training graph holds the head
// and its loss as one node, maskLossOp. Its run takes a small graph of the
// head and loss for this step's number of RoIs (headRows: rounded up to
// one of a few sizes where that cannot change the result; built the first
// time that size comes, then kept), runs its forward and backward passes, and
// keeps the gradients until the nodes G.Grad made for the op (maskGradOp)
// hand them on. The head's activations live only while the op runs, and
// take the memory of the RoIs there are, not of the most the sampler may
// pick: in the r50fpn preset's benchmark about 270 RoIs a step instead of
// 1024.

// maskHeadCache bounds how many head graphs, one per number of rows the
// head runs on (headRows), a training graph keeps.
const maskHeadCache = 32

// maskLossOp is the mask head and its loss over this step's mask RoIs:
// the first Net.step.maskRoIs rows of the sampler's [KM, 5] mask RoIs,
// whose targets and weights the sampler leaves in Net.maskTargets and
// Net.maskWeights. Its inputs are the pooled pyramid levels, the mask RoIs
// and the head's learnable tensors (names' order): the RoIs order the op
// after the sampler, and the levels and tensors are what G.Grad gives
// gradients to. Its output is the loss, a scalar where the levels live.
type maskLossOp struct {
	net    *Net
	levels []tensor.Shape
	rois   tensor.Shape
	names  []string
	shapes []tensor.Shape

	heads  map[int]*maskHeadGraph
	recent []int // heads' numbers of RoIs, least recently used first
	// grads holds the last run's gradient of each input (nil for the
	// RoIs) until maskGradOp takes it.
	grads []G.Value
}

// maskHeadGraph is the mask head and loss for one number of RoIs.
type maskHeadGraph struct {
	vm     G.VM
	levels []*G.Node // bound to the training graph's levels each run
	rois   *G.Node   // bound to a copy of the RoIs in use each run
	loss   *G.Node
	grads  G.Nodes // of levels, then of the head's tensors in names' order
}

// newMaskLoss makes the op for the graph b builds, and creates the head's
// tensors in Params (in the order a graph that builds the head in place
// would). It returns the op's inputs after the levels and RoIs: the
// head's tensors, as b's nodes.
func newMaskLoss(b *builder, levels []*G.Node, rois *G.Node) (*maskLossOp, G.Nodes, error) {
	n := b.net
	op := &maskLossOp{net: n, rois: rois.Shape().Clone(), heads: map[int]*maskHeadGraph{}}
	for _, l := range levels {
		op.levels = append(op.levels, l.Shape().Clone())
	}
	// A head of one RoI, never run, makes the tensors and tells their
	// names and shapes.
	proto := &builder{net: n.sub(), nodes: map[string]*G.Node{}}
	var protoLevels []*G.Node
	for l, s := range op.levels {
		protoLevels = append(protoLevels, G.NewTensor(proto.net.g, tensor.Float32, s.Dims(), G.WithShape(s...), G.WithName(fmt.Sprintf("level%d", l))))
	}
	protoRoIs := G.NewTensor(proto.net.g, tensor.Float32, 2, G.WithShape(1, 5), G.WithName("mask rois"))
	proto.maskLayers(proto.pool(protoLevels, protoRoIs, n.cfg.MaskPoolSize, false))
	if proto.err != nil {
		return nil, nil, proto.err
	}
	op.names = proto.order
	var params G.Nodes
	for _, name := range op.names {
		t := n.params.Value(name)
		op.shapes = append(op.shapes, t.Shape().Clone())
		params = append(params, b.bind(name, t))
	}
	return op, params, b.err
}

// sub is a Net for a graph of its own beside n's: the same configuration,
// device, mode and Params.
func (n *Net) sub() *Net {
	return &Net{cfg: n.cfg, dev: n.dev, mode: n.mode, batch: n.batch, params: n.params, g: G.NewGraph(), hostTimes: n.hostTimes}
}

// head returns the graph for rows RoIs, building it with levels and rois
// bound (the placement of its nodes is worked out from them).
func (op *maskLossOp) head(rows int, levels []G.Value, rois *tensor.Dense) (*maskHeadGraph, error) {
	if h, ok := op.heads[rows]; ok {
		i := slices.Index(op.recent, rows)
		op.recent = append(slices.Delete(op.recent, i, i+1), rows)
		return h, nil
	}
	n, cfg := op.net, op.net.cfg
	b := &builder{net: n.sub(), nodes: map[string]*G.Node{}}
	g := b.net.g
	h := &maskHeadGraph{}
	for l, s := range op.levels {
		h.levels = append(h.levels, G.NewTensor(g, tensor.Float32, s.Dims(), G.WithShape(s...), G.WithName(fmt.Sprintf("level%d", l)), G.WithValue(levels[l])))
	}
	h.rois = G.NewTensor(g, tensor.Float32, 2, G.WithShape(rows, 5), G.WithName("mask rois"), G.WithValue(rois))
	// The sampler writes the targets and weights of the RoIs in use at
	// the start of its buffers: the inputs read them there.
	shape := []int{rows, cfg.NumClasses, cfg.MaskSize(), cfg.MaskSize()}
	size := tensor.Shape(shape).TotalSize()
	target := func(name string, buf []float32) *G.Node {
		v := tensor.New(tensor.WithShape(shape...), tensor.WithBacking(buf[:size]))
		return b.toDevice(G.NewTensor(g, tensor.Float32, 4, G.WithShape(shape...), G.WithName(name), G.WithValue(v)))
	}
	logits := b.maskLayers(b.pool(h.levels, h.rois, cfg.MaskPoolSize, false))
	h.loss = b.check(ops.SigmoidBCE(logits, target("mask targets", n.maskTargets), target("mask weights", n.maskWeights)))
	if b.err != nil {
		return nil, fmt.Errorf("model: mask head of %d RoIs: %w", rows, b.err)
	}
	if !slices.Equal(b.order, op.names) {
		return nil, fmt.Errorf("model: mask head of %d RoIs has tensors %v, the training graph %v", rows, b.order, op.names)
	}
	var err error
	if h.grads, err = G.Grad(h.loss, append(slices.Clone(h.levels), b.params...)...); err != nil {
		return nil, fmt.Errorf("model: mask head of %d RoIs: gradients: %w", rows, err)
	}
	var opts []G.VMOpt
	if n.dev != nil {
		opts = append(opts, G.WithEngine(n.dev.Engine()))
	}
	if h.vm, err = ops.NewTapeMachine(g, opts...); err != nil {
		return nil, fmt.Errorf("model: mask head of %d RoIs: %w", rows, err)
	}
	for _, bn := range b.bns {
		bn.Training = true
	}
	if len(op.recent) == maskHeadCache {
		old := op.recent[0]
		op.recent = op.recent[1:]
		err = op.heads[old].vm.Close()
		delete(op.heads, old)
	}
	op.heads[rows] = h
	op.recent = append(op.recent, rows)
	return h, err
}

// Close releases the heads' machines.
func (op *maskLossOp) Close() error {
	var err error
	for _, h := range op.heads {
		if e := h.vm.Close(); err == nil {
			err = e
		}
	}
	clear(op.heads)
	op.recent = nil
	return err
}

func (op *maskLossOp) Arity() int { return len(op.levels) + 1 + len(op.names) }

func (op *maskLossOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	var ts []hm.Type
	for _, s := range op.levels {
		ts = append(ts, G.TensorType{Dims: s.Dims(), Of: a})
	}
	ts = append(ts, G.TensorType{Dims: 2, Of: a})
	for _, s := range op.shapes {
		ts = append(ts, G.TensorType{Dims: s.Dims(), Of: a})
	}
	return hm.NewFnType(append(ts, a)...)
}

func (op *maskLossOp) InferShape(...G.DimSizer) (tensor.Shape, error) {
	return tensor.ScalarShape(), nil
}
func (op *maskLossOp) ReturnsPtr() bool     { return false }
func (op *maskLossOp) CallsExtern() bool    { return false }
func (op *maskLossOp) OverwritesInput() int { return -1 }

// String names the op and its identity: gorgonia must not merge it with
// another graph's.
func (op *maskLossOp) String() string        { return fmt.Sprintf("MaskHeadLoss@%p", op) }
func (op *maskLossOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op *maskLossOp) Hashcode() uint32      { return hashString(op.String()) }

// RunsOnDevice tells ops.CheckPlacement that the op takes device values
// and leaves its loss (and its gradients) on their device.
func (op *maskLossOp) RunsOnDevice() bool { return true }

// DiffWRT: the levels and the head's tensors; the RoIs are data.
func (op *maskLossOp) DiffWRT(inputs int) []bool {
	d := make([]bool, inputs)
	for i := range d {
		d[i] = i != len(op.levels)
	}
	return d
}

func (op *maskLossOp) SymDiff(in G.Nodes, out, grad *G.Node) (G.Nodes, error) {
	if len(in) != op.Arity() {
		return nil, fmt.Errorf("model: mask head loss: %d inputs, want %d", len(in), op.Arity())
	}
	grads := make(G.Nodes, len(in))
	for i, x := range in {
		if i == len(op.levels) {
			continue
		}
		var err error
		if grads[i], err = G.ApplyOp(&maskGradOp{loss: op, input: i, shape: x.Shape().Clone()}, out, grad); err != nil {
			return nil, fmt.Errorf("model: mask head loss: gradient of input %d: %w", i, err)
		}
	}
	return grads, nil
}

func (op *maskLossOp) Do(in ...G.Value) (G.Value, error) {
	if len(in) != op.Arity() {
		return nil, fmt.Errorf("model: mask head loss: %d inputs, want %d", len(in), op.Arity())
	}
	rois, ok := in[len(op.levels)].(*tensor.Dense)
	if !ok || !rois.Shape().Eq(op.rois) || rois.Dtype() != tensor.Float32 || rois.IsView() {
		return nil, fmt.Errorf("model: mask head loss: the mask RoIs must be a float32 tensor of shape %v, got %T %v", op.rois, in[len(op.levels)], in[len(op.levels)].Shape())
	}
	rows := op.net.step.maskRoIs
	if rows < 0 || rows > op.rois[0] {
		return nil, fmt.Errorf("model: mask head loss: the sampler picked %d mask RoIs of at most %d", rows, op.rois[0])
	}
	op.grads = make([]G.Value, len(in))
	if rows == 0 {
		// No foreground RoI in the batch: no mask loss, as torchvision's.
		return op.zeros(in)
	}
	run := op.headRows(rows)
	// Rows past the step's RoIs weigh nothing; the sampler leaves their
	// RoIs zero.
	block := op.net.cfg.NumClasses * op.net.cfg.MaskSize() * op.net.cfg.MaskSize()
	clear(op.net.maskTargets[rows*block : run*block])
	clear(op.net.maskWeights[rows*block : run*block])
	used, err := op.firstRows(rois, run)
	if err != nil {
		return nil, err
	}
	h, err := op.head(run, in[:len(op.levels)], used)
	if err != nil {
		return nil, err
	}
	for l, v := range in[:len(op.levels)] {
		if err := G.Let(h.levels[l], v); err != nil {
			return nil, fmt.Errorf("model: mask head loss: level %d: %w", l, err)
		}
	}
	if err := G.Let(h.rois, used); err != nil {
		return nil, fmt.Errorf("model: mask head loss: RoIs: %w", err)
	}
	h.vm.Reset()
	if err := h.vm.RunAll(); err != nil {
		return nil, fmt.Errorf("model: mask head of %d RoIs: %w", rows, err)
	}
	for i, gr := range h.grads {
		j := i
		if i >= len(op.levels) {
			j++ // past the RoIs
		}
		op.grads[j] = gr.Value()
	}
	return h.loss.Value(), nil
}

// headRows is how many rows the head runs on for rows RoIs. A head with
// BatchNorm runs on the RoIs alone: padding would change its statistics.
// Any other takes rows rounded up to 8 to 15 times a power of two (at
// most an eighth more, at most the sampler's KM), padded with rows that
// weigh nothing, so that its steps come in few sizes: the graphs built
// for them, and the device memory of those sizes, serve many steps, and
// the device's cache holds blocks of a few sizes, not one of every
// number of RoIs a run meets.
func (op *maskLossOp) headRows(rows int) int {
	cfg := op.net.cfg
	if !cfg.MaskConvBias && cfg.MaskConvs > 0 {
		return rows
	}
	step := 1
	for rows > 15*step {
		step *= 2
	}
	return min((rows+step-1)/step*step, op.rois[0])
}

// firstRows copies the first rows rows of the [KM, 5] RoIs into a tensor of
// their own, where the RoIs live.
func (op *maskLossOp) firstRows(rois *tensor.Dense, rows int) (*tensor.Dense, error) {
	dev := op.net.dev
	if dev == nil {
		return tensor.New(tensor.WithShape(rows, 5), tensor.WithBacking(slices.Clone(rois.Float32s()[:5*rows]))), nil
	}
	used, err := dev.NewDense(tensor.Float32, rows, 5)
	if err != nil {
		return nil, fmt.Errorf("model: mask head loss: %w", err)
	}
	src, err := dev.Ptr(rois)
	if err != nil {
		return nil, fmt.Errorf("model: mask head loss: %w", err)
	}
	bytes := int64(5 * rows * 4)
	if err := dev.Engine().Memcpy(used, backend.Memory{Ptr: src, Size: bytes}); err != nil {
		return nil, fmt.Errorf("model: mask head loss: %w", err)
	}
	return used, nil
}

// zeros is a run without RoIs: a zero loss and zero gradients.
func (op *maskLossOp) zeros(in []G.Value) (G.Value, error) {
	dev := op.net.dev
	zero := func(shape tensor.Shape) (*tensor.Dense, error) {
		if dev == nil {
			return tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(shape...)), nil
		}
		t, err := dev.NewDense(tensor.Float32, shape...)
		if err == nil {
			err = dev.Zero(t)
		}
		if err != nil {
			return nil, fmt.Errorf("model: mask head loss: %w", err)
		}
		return t, nil
	}
	for i, v := range in {
		if i == len(op.levels) {
			continue
		}
		var err error
		if op.grads[i], err = zero(v.Shape()); err != nil {
			return nil, err
		}
	}
	if dev == nil {
		return G.NewF32(0), nil
	}
	return zero(tensor.ScalarShape())
}

// maskGradOp hands on the gradient of one input of a maskLossOp that the
// op's last run computed, scaled by the loss's gradient (a scalar on the
// host, as gorgonia passes a scalar op's). Its first input is the op's
// loss: it orders the gradient after the op, and places it on the loss's
// device.
type maskGradOp struct {
	loss  *maskLossOp
	input int
	shape tensor.Shape
}

func (op *maskGradOp) Arity() int { return 2 }

func (op *maskGradOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a, G.TensorType{Dims: op.shape.Dims(), Of: a})
}

func (op *maskGradOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.shape.Clone(), nil }
func (op *maskGradOp) ReturnsPtr() bool                               { return false }
func (op *maskGradOp) CallsExtern() bool                              { return false }
func (op *maskGradOp) OverwritesInput() int                           { return -1 }
func (op *maskGradOp) String() string {
	return fmt.Sprintf("MaskHeadLossGrad[%d]@%p", op.input, op.loss)
}
func (op *maskGradOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op *maskGradOp) Hashcode() uint32      { return hashString(op.String()) }
func (op *maskGradOp) RunsOnDevice() bool    { return true }

// The gradients are constants of the graph: nothing differentiates them.
func (op *maskGradOp) DiffWRT(inputs int) []bool { return make([]bool, inputs) }
func (op *maskGradOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("model: %v is not differentiable", op)
}

func (op *maskGradOp) Do(in ...G.Value) (G.Value, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("model: %v: %d inputs, want 2", op, len(in))
	}
	var scale float64
	switch s := in[1].(type) {
	case *G.F32:
		scale = float64(*s)
	case *G.F64:
		scale = float64(*s)
	default:
		return nil, fmt.Errorf("model: %v: the loss's gradient must be a scalar on the host, got %T", op, in[1])
	}
	if op.input >= len(op.loss.grads) || op.loss.grads[op.input] == nil {
		return nil, fmt.Errorf("model: %v: no gradient: the mask head loss has not run since it was last taken", op)
	}
	g, ok := op.loss.grads[op.input].(*tensor.Dense)
	op.loss.grads[op.input] = nil
	if !ok || !g.Shape().Eq(op.shape) {
		return nil, fmt.Errorf("model: %v: the gradient is %T %v, want shape %v", op, g, g.Shape(), op.shape)
	}
	if scale == 1 {
		return g, nil
	}
	if dev := op.loss.net.dev; dev != nil {
		// g += (scale-1) g
		if err := dev.Axpy(scale-1, g, g); err != nil {
			return nil, fmt.Errorf("model: %v: %w", op, err)
		}
		return g, nil
	}
	for i, v := range g.Float32s() {
		g.Float32s()[i] = float32(float64(v) * scale)
	}
	return g, nil
}

func hashString(s string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32()
}
