package model

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/examples/internal/hostop"
	"github.com/stheno-ml/stheno/examples/internal/trainstep"
	"github.com/stheno-ml/stheno/ops"
)

// Mode selects the graph Build makes.
type Mode int

const (
	// Train builds the training graph: the matching, the losses of every
	// decoder layer and their gradients with respect to every parameter;
	// BatchNorm normalises with the batch's statistics, dropout is on.
	Train Mode = iota
	// Infer builds the inference graph: the last decoder layer's
	// predictions; BatchNorm uses the running statistics, no dropout.
	Infer
)

// Input normalisation: pixels in [0, 1] are centred and scaled to roughly
// unit variance before the stem.
const pixelMean, pixelStd = 0.5, 0.25

// Losses are one training step's losses, weighted by the config's loss
// weights and summed over the decoder layers (the auxiliary losses
// included): Total is their sum, the loss the gradients are of.
type Losses struct {
	Total, Class, Box, GIoU float64
}

// Net is one graph of the model for a fixed batch size, bound to a Params,
// with the machine that runs it.
type Net struct {
	cfg    Config
	mode   Mode
	batch  int
	params *Params
	dev    *backend.Device // nil: the host
	drop   *ops.DropoutRNG
	consts []*tensor.Dense // the graph's constants on the device

	g       *G.ExprGraph
	vm      G.VM
	images  *tensor.Dense
	imageIn *G.Node

	names   []string
	inputs  G.Nodes // parameter input nodes, in names' order
	grads   G.Nodes // Train: their gradient nodes
	bns     []*ops.BatchNorm
	bnNames []string

	// Train: the step's targets, seen by the matching op, and what it made
	// of them on the last run.
	targets       []Target
	lastTargets   *lossTargets
	lastProposals []float64                  // TwoStage: the top-k op's output on the last run
	losses        [4]func() (float64, error) // Total, Class, Box, GIoU
	total         *G.Node
	opt           *ops.AdamW
	learn         []G.ValueGrad // the parameters with their gradients, in names' order
	groupMults    []float64     // each optimiser group's multiple of the learning rate

	// Infer: the last layer's predictions, read after a run.
	logits, boxes func() ([]float64, error)

	hostTimes map[string]time.Duration // HostTimes
}

// hostRun is a host op's function (hostop.Op's Run) in the graph's
// dtype: the op then reads its inputs and writes its output in place, with
// no conversion of either.
type hostRun[F hostop.Float] = func(in [][]F, out []F) error

// HostTimes returns the time the net's runs have spent in its host steps
// (the Hungarian matching of a training graph, the top-k proposals under
// TwoStage), by name, since Build or
// the last ResetHostTimes: what a step's breakdown needs.
func (n *Net) HostTimes() map[string]time.Duration { return maps.Clone(n.hostTimes) }

// ResetHostTimes sets HostTimes' counts to zero.
func (n *Net) ResetHostTimes() { clear(n.hostTimes) }

// timed wraps a host step so that HostTimes counts its time under name.
func timed[F hostop.Float](n *Net, name string, run hostRun[F]) hostRun[F] {
	return func(in [][]F, out []F) error {
		start := time.Now()
		err := run(in, out)
		n.hostTimes[name] += time.Since(start)
		return err
	}
}

// hostOps makes the graph's host ops, each a hostop.Op of the graph's
// dtype whose run HostTimes times.
type hostOps struct {
	n  *Net
	dt tensor.Dtype
}

// op returns a host op named name, timed under timer, of inputs in and an
// output of size values, running run32 or run64 by the dtype. Both of the
// model's host steps write their whole output every run: the op keeps its
// memory (hostop.Op.Reuse).
func (h hostOps) op(name, timer string, in []tensor.Shape, size int, run32 hostRun[float32], run64 hostRun[float64]) G.Op {
	if h.dt == tensor.Float32 {
		return &hostop.Op[float32]{Name: name, In: in, Size: size, Run: timed(h.n, timer, run32), Reuse: true}
	}
	return &hostop.Op[float64]{Name: name, In: in, Size: size, Run: timed(h.n, timer, run64), Reuse: true}
}

// buildOpts are Build's options that tests reach: see builder.
type buildOpts struct {
	bind  map[string]*G.Node
	fixed *lossTargets // Train: constant targets instead of the matching op
	// fixedProposals: under TwoStage, the top-k op's output as a constant
	// (with fixed, the gradient check's constants).
	fixedProposals []float64
	g              *G.ExprGraph
	noVM           bool // no machine
	noGrad         bool // Train: no gradients (the caller takes them)
}

// Build makes the graph of the given mode for batches of batch images and
// its machine (ops.NewTapeMachine), on the device params live on (nil: the
// host). Parameters and BatchNorm statistics are taken from params,
// created on first use. Build must not run inside a backend.Scope.
//
// On a device the graph binds the parameters' and the running statistics'
// device tensors, and its constants are copied there once; each batch of
// images moves in with ops.ToDevice, the predictions reach the matching op
// through ops.ToHost, and its targets go back through ops.ToDevice and
// autograd.Unpack, so every layer runs on the device.
func Build(cfg Config, params *Params, mode Mode, batch int) (*Net, error) {
	if params == nil {
		return nil, fmt.Errorf("model: Build: params is nil")
	}
	return build(cfg, params, mode, batch, params.Device(), buildOpts{})
}

// build is Build for a graph on dev. dev differs from params' device only
// in tests of the graph's placement, which build a device graph on host
// parameters (each moved by an ops.ToDevice node) without running it.
func build(cfg Config, params *Params, mode Mode, batch int, dev *backend.Device, opts buildOpts) (*Net, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if params == nil {
		return nil, fmt.Errorf("model: Build: params is nil")
	}
	if mode != Train && mode != Infer {
		return nil, fmt.Errorf("model: Build: mode must be Train or Infer, got %d", mode)
	}
	if batch < 1 {
		return nil, fmt.Errorf("model: Build: batch must be at least 1, got %d", batch)
	}
	n := &Net{cfg: cfg, mode: mode, batch: batch, params: params, dev: dev, drop: ops.NewDropoutRNG(params.seed ^ dropoutSeed), g: opts.g,
		hostTimes: map[string]time.Duration{}}
	if n.g == nil {
		n.g = G.NewGraph()
	}
	if dev != nil && params.Device() != nil && params.Device() != dev {
		return nil, fmt.Errorf("model: Build: params live on %v, the graph is for %v", params.Device(), dev)
	}
	if dev == nil && params.Device() != nil {
		return nil, fmt.Errorf("model: Build: params live on %v, the graph is for the host", params.Device())
	}
	b := &builder{cfg: cfg, mode: mode, batch: batch, dt: params.Dtype(), g: n.g, params: params, dev: dev, drop: n.drop,
		bind: opts.bind, reads: map[string]*G.Node{}, fixedProposals: opts.fixedProposals,
		hostOps: hostOps{n: n, dt: params.Dtype()}, recordProposals: func(out []float64) { n.lastProposals = out }}
	ok := false
	defer func() {
		if !ok {
			n.freeConsts(b.devConsts)
		}
	}()
	s := cfg.ImageSize
	n.images = denseOf(params.Dtype(), make([]float64, batch*3*s*s), batch, 3, s, s)
	var x *G.Node
	n.imageIn, x = b.data("images", n.images)

	outs, enc := b.transformer(b.inputProj(b.backbone(x)), mode == Train)
	if b.err != nil {
		return nil, b.err
	}
	if mode == Train {
		if err := n.buildLosses(b, outs, enc, opts.fixed, !opts.noGrad); err != nil {
			return nil, err
		}
	} else {
		last := outs[len(outs)-1]
		n.logits, n.boxes = n.reader(b, last.logits), n.reader(b, last.boxes)
	}
	if b.err != nil {
		return nil, b.err
	}
	n.names, n.inputs, n.bns, n.bnNames = b.names, b.inputs, b.bns, b.bnNames
	if opts.noVM {
		ok = true
		n.consts = b.devConsts
		return n, nil
	}
	var err error
	var vmOpts []G.VMOpt
	if dev != nil {
		vmOpts = append(vmOpts, G.WithEngine(dev.Engine()))
	}
	if n.vm, err = ops.NewTapeMachine(n.g, vmOpts...); err != nil {
		return nil, err
	}
	ok = true
	n.consts = b.devConsts
	return n, nil
}

// dropoutSeed keeps the dropout masks' key apart from the initialisation's
// stream of the same seed.
const dropoutSeed = 0xd40f

// freeConsts gives the device memory of the graph's constants back.
func (n *Net) freeConsts(ts []*tensor.Dense) error {
	var errs []error
	for _, t := range ts {
		errs = append(errs, n.dev.FreeDense(t))
	}
	return errors.Join(errs...)
}

// reader returns how to read node x's values after a run: through G.Read
// on the host; on a device, through an ops.ToHost node that no op reads.
func (n *Net) reader(b *builder, x *G.Node) func() ([]float64, error) {
	if b.err != nil {
		return nil
	}
	if n.dev != nil {
		if x.IsScalar() {
			// A loss: ToHost moves tensors; gorgonia's Reshape runs on
			// device values (it changes only the shape).
			x = b.check(G.Reshape(x, tensor.Shape{1}))
		}
		h := b.check(ops.ToHost(x))
		return func() ([]float64, error) { return valueFloats(h.Value()) }
	}
	v := new(G.Value)
	G.Read(x, v)
	return func() ([]float64, error) { return valueFloats(*v) }
}

// valueFloats reads a host value: a scalar or a tensor.
func valueFloats(v G.Value) ([]float64, error) {
	switch v := v.(type) {
	case *G.F32:
		return []float64{float64(*v)}, nil
	case *G.F64:
		return []float64{float64(*v)}, nil
	case *tensor.Dense:
		return float64sOf(v)
	}
	return nil, fmt.Errorf("model: cannot read a %T", v)
}

// buildLosses adds the matching op (or the fixed targets) and the losses
// of every decoder layer and, under TwoStage, of the encoder's proposals
// enc, and the gradients of their sum.
func (n *Net) buildLosses(b *builder, outs []layerOutput, enc layerOutput, fixed *lossTargets, grads bool) error {
	cfg := n.cfg
	bq, c, nl := n.batch*cfg.Queries, cfg.NumClasses, len(outs)
	lg := tensor.Shape{n.batch, cfg.Queries, c}
	bx := tensor.Shape{n.batch, cfg.Queries, 4}
	shapes := []tensor.Shape{lg}
	for range nl {
		shapes = append(shapes, lg, bx, bx, tensor.Shape{bq, 4}, tensor.Shape{bq})
	}
	bs := n.batch * cfg.Tokens()
	encLg := tensor.Shape{n.batch, cfg.Tokens(), 1}
	encBx := tensor.Shape{n.batch, cfg.Tokens(), 4}
	if cfg.TwoStage {
		shapes = append(shapes, tensor.Shape{1}, encLg, encBx, encBx, tensor.Shape{bs, 4}, tensor.Shape{bs})
	}
	var parts G.Nodes
	if fixed != nil {
		if len(fixed.layers) != nl || (fixed.enc != nil) != cfg.TwoStage {
			return fmt.Errorf("model: fixed targets for %d layers (proposals: %v), the graph has %d (%v)", len(fixed.layers), fixed.enc != nil, nl, cfg.TwoStage)
		}
		packed := make([]float64, autograd.PackedSize(shapes...))
		packTargets(fixed, packed)
		k := 0
		for i, s := range shapes {
			parts = append(parts, b.constant(fmt.Sprintf("target%d", i), packed[k:k+s.TotalSize()], s...))
			k += s.TotalSize()
		}
	} else {
		var in G.Nodes
		var inShapes []tensor.Shape
		add := func(x *G.Node, s tensor.Shape) {
			if n.dev != nil {
				x = b.check(ops.ToHost(x))
			}
			in = append(in, x)
			inShapes = append(inShapes, s)
		}
		for _, o := range outs {
			add(o.logits, lg)
		}
		for _, o := range outs {
			add(o.boxes, bx)
		}
		if cfg.TwoStage {
			// The proposals' objects are all class 0: only that logit
			// reaches the host.
			add(b.check(ops.Slice(enc.logits, 2, 0, 1)), encLg)
			add(enc.boxes, encBx)
		}
		if b.err != nil {
			return b.err
		}
		matcher := b.hostOps.op("Hungarian matching", "matching", inShapes, autograd.PackedSize(shapes...), matchRun[float32](n), matchRun[float64](n))
		packed := b.check(G.ApplyOp(matcher, in...))
		if n.dev != nil {
			packed = b.check(ops.ToDevice(packed, n.dev))
		}
		if b.err != nil {
			return b.err
		}
		var err error
		if parts, err = autograd.Unpack(packed, shapes...); err != nil {
			return err
		}
	}
	focalW := parts[0]
	var all, cls, l1, giou G.Nodes
	for l, o := range outs {
		p := parts[1+5*l : 6+5*l]
		ce := b.check(ops.SigmoidFocalLoss(o.logits, p[0], focalW, cfg.FocalAlpha, cfg.FocalGamma))
		box := b.check(ops.L1Loss(o.boxes, p[1], p[2]))
		xy := b.reshape(b.check(ops.BoxCxCyWHToXYXY(o.boxes)), bq, 4)
		if b.err != nil {
			return b.err
		}
		gi := b.check(ops.GIoULoss(xy, p[3], p[4]))
		cls, l1, giou = append(cls, ce), append(l1, box), append(giou, gi)
		all = append(all, ce, box, gi)
	}
	if cfg.TwoStage {
		ce, box, gi := b.proposalLosses(enc, parts[1+5*nl:])
		cls, l1, giou = append(cls, ce), append(l1, box), append(giou, gi)
		all = append(all, ce, box, gi)
	}
	total := b.check(ops.SumLosses(all...))
	for i, group := range []G.Nodes{nil, cls, l1, giou} {
		x := total
		if group != nil {
			x = b.check(ops.SumLosses(group...))
		}
		if b.err != nil {
			return b.err
		}
		read := n.reader(b, x)
		n.losses[i] = func() (float64, error) {
			v, err := read()
			if err != nil {
				return 0, err
			}
			return v[0], nil
		}
	}
	if b.err != nil {
		return b.err
	}
	n.total = total
	if !grads {
		return nil
	}
	gs, err := G.Grad(total, b.inputs...)
	if err != nil {
		return fmt.Errorf("model: gradients: %w", err)
	}
	n.grads = gs
	if n.learn, err = ops.ParamsWithGrads(b.inputs, gs); err != nil {
		return fmt.Errorf("model: %w", err)
	}
	return nil
}

// matchRun is the matching op's run: in holds every layer's logits, then
// every layer's boxes, then under TwoStage the proposals' first-class
// logits and boxes.
func matchRun[F hostop.Float](n *Net) hostRun[F] {
	return func(in [][]F, out []F) error {
		if n.targets == nil {
			return fmt.Errorf("no targets: run the graph through TrainStep")
		}
		nl := n.cfg.DecLayers
		var encLogits, encBoxes []F
		if n.cfg.TwoStage {
			encLogits, encBoxes = in[2*nl], in[2*nl+1]
		}
		lt, err := buildTargets(n.cfg, in[:nl], in[nl:2*nl], encLogits, encBoxes, n.targets, n.lastTargets)
		if err != nil {
			return err
		}
		packTargets(lt, out)
		n.lastTargets = lt
		return nil
	}
}

// Close releases the machine, the optimiser's state and the graph's
// constants on the device. The parameters are the Params' (Params.Free).
func (n *Net) Close() error {
	var errs []error
	if n.vm != nil {
		errs = append(errs, n.vm.Close())
		n.vm = nil
	}
	if n.opt != nil {
		errs = append(errs, n.opt.Free())
		n.opt = nil
	}
	if n.dev != nil && n.params.Device() != nil {
		errs = append(errs, n.freeConsts(n.consts))
	}
	n.consts = nil
	return errors.Join(errs...)
}

// Device is where the Net runs (nil: the host).
func (n *Net) Device() *backend.Device { return n.dev }

// Batch is the number of images the graph takes.
func (n *Net) Batch() int { return n.batch }

// Config is the network's configuration.
func (n *Net) Config() Config { return n.cfg }

// Dropout is the graph's dropout state, keyed by the Params' seed;
// TrainStep sets its step to the iteration's, so that a run's masks
// depend only on the seed and the iteration.
func (n *Net) Dropout() *ops.DropoutRNG { return n.drop }

// Graph is the graph, for inspection (ops.CheckPlacement, say).
func (n *Net) Graph() *G.ExprGraph { return n.g }

// ParamNames lists the graph's learnable tensors, in creation order.
func (n *Net) ParamNames() []string { return slices.Clone(n.names) }

// ParamNodes are the graph's parameter nodes, in ParamNames' order.
func (n *Net) ParamNodes() G.Nodes { return slices.Clone(n.inputs) }

// ParamGroups pairs a training graph's parameters with their gradients
// (ops.ParamsWithGrads) and groups them as the reference's optimiser:
// the transformer at lr, the backbone at lr*BackboneLRMult, the sampling
// offsets and reference points at lr*LinearProjLRMult, all with weight
// decay wd (the reference's 2e-4, 2e-5, 2e-5 and 1e-4). Groups with no
// parameter are left out. Hand the groups to ops.NewAdamW and the pairs
// to its Step.
func (n *Net) ParamGroups(lr, wd float64) ([]ops.ParamGroup, []G.ValueGrad, error) {
	return n.paramGroups(lr, wd, BackboneLRMult, LinearProjLRMult)
}

// paramGroups is ParamGroups with the backbone's and the linear
// projections' rates at the given multiples of lr.
func (n *Net) paramGroups(lr, wd, backboneMult, linearProjMult float64) ([]ops.ParamGroup, []G.ValueGrad, error) {
	if n.mode != Train {
		return nil, nil, fmt.Errorf("model: ParamGroups on an inference graph (it has no gradients)")
	}
	pairs := n.learn
	rates := map[Group]float64{GroupTransformer: lr, GroupBackbone: lr * backboneMult, GroupLinearProj: lr * linearProjMult}
	var groups []ops.ParamGroup
	for _, grp := range []Group{GroupTransformer, GroupBackbone, GroupLinearProj} {
		pg := ops.ParamGroup{LR: rates[grp], WeightDecay: wd}
		for i, name := range n.names {
			if n.params.Group(name) == grp {
				pg.Params = append(pg.Params, pairs[i])
			}
		}
		if len(pg.Params) > 0 {
			groups = append(groups, pg)
		}
	}
	return groups, pairs, nil
}

// OptimizerConfig is the training's AdamW: decoupled weight decay on every
// parameter (as the reference's), the gradients' global norm clipped to
// ClipNorm (0: no clipping), and the learning rates of the backbone and of
// the linear projections that make sampling locations (every deformable
// attention's sampling offsets, the decoder's reference points) as
// multiples of the transformer's.
type OptimizerConfig struct {
	WeightDecay, ClipNorm            float64
	BackboneLRMult, LinearProjLRMult float64
}

// ReferenceOptimizer is the reference's: weight decay 1e-4, clipping at
// 0.1, the backbone and the linear projections at a tenth of the rate
// (lr 2e-4, lr_backbone 2e-5, lr_linear_proj_mult 0.1).
func ReferenceOptimizer() OptimizerConfig {
	return OptimizerConfig{WeightDecay: 1e-4, ClipNorm: 0.1, BackboneLRMult: BackboneLRMult, LinearProjLRMult: LinearProjLRMult}
}

// NewOptimizer gives a training graph its optimiser: AdamW (ops.AdamW,
// PyTorch's) over the groups of ParamGroups, at oc's rates and decay, its
// state where the parameters live. TrainStep steps it at the rate it is
// given.
func (n *Net) NewOptimizer(oc OptimizerConfig) error {
	if n.mode != Train {
		return fmt.Errorf("model: NewOptimizer on an inference graph")
	}
	if n.opt != nil {
		return fmt.Errorf("model: the graph has an optimiser already")
	}
	groups, _, err := n.paramGroups(1, oc.WeightDecay, oc.BackboneLRMult, oc.LinearProjLRMult)
	if err != nil {
		return err
	}
	n.groupMults = n.groupMults[:0]
	for _, g := range groups {
		n.groupMults = append(n.groupMults, g.LR)
	}
	cfg := ops.DefaultAdamWConfig()
	cfg.MaxGradNorm = oc.ClipNorm
	// Every run computes the gradients afresh: zeroing them is work for
	// nothing.
	cfg.KeepGrads = true
	if n.opt, err = ops.NewAdamW(groups, cfg); err != nil {
		return fmt.Errorf("model: %w", err)
	}
	return nil
}

// Optimizer is the training graph's AdamW (nil before NewOptimizer).
func (n *Net) Optimizer() *ops.AdamW { return n.opt }

// OptimizerState returns the optimiser's step count and, by parameter
// name, its moments in host memory (copies of them on a GPU): what a
// checkpoint keeps.
func (n *Net) OptimizerState() (steps int, moments map[string][2]*tensor.Dense, err error) {
	if n.opt == nil {
		return 0, nil, fmt.Errorf("model: OptimizerState before NewOptimizer")
	}
	return trainstep.State(n.opt, n.dev, n.names, n.learn)
}

// SetOptimizerState restores the optimiser from OptimizerState's values
// (a checkpoint's), which must hold every parameter of the graph.
func (n *Net) SetOptimizerState(steps int, moments map[string][2]*tensor.Dense) error {
	if n.opt == nil {
		return fmt.Errorf("model: SetOptimizerState before NewOptimizer")
	}
	return trainstep.SetState(n.opt, n.names, n.learn, steps, moments)
}

// setImages copies a batch of images (planar RGB in [0, 1], ImageSize
// square) into the graph's input, normalised, in place and an image per
// goroutine: at the GPU preset's size the batch is millions of values, and
// the GPU waits for them.
func (n *Net) setImages(pix [][]float32) error {
	if len(pix) != n.batch {
		return fmt.Errorf("model: got %d images for a batch of %d", len(pix), n.batch)
	}
	size := 3 * n.cfg.ImageSize * n.cfg.ImageSize
	for i, p := range pix {
		if len(p) != size {
			return fmt.Errorf("model: image %d has %d values, want 3x%dx%d", i, len(p), n.cfg.ImageSize, n.cfg.ImageSize)
		}
	}
	var wg sync.WaitGroup
	for i, p := range pix {
		wg.Go(func() {
			switch n.params.Dtype() {
			case tensor.Float64:
				normalize(n.images.Float64s()[i*size:(i+1)*size], p)
			default:
				normalize(n.images.Float32s()[i*size:(i+1)*size], p)
			}
		})
	}
	wg.Wait()
	return nil
}

// normalize writes (pix - pixelMean) / pixelStd into dst. Both constants
// are powers of two, so float32 arithmetic rounds once, as float64
// arithmetic converted to float32 does.
func normalize[T float32 | float64](dst []T, pix []float32) {
	for j, v := range pix {
		dst[j] = (T(v) - pixelMean) / pixelStd
	}
}

// TrainStep runs one training iteration on a batch: images (planar RGB in
// [0, 1]) and their ground truth, forward and backward, then an AdamW step
// at learning rate lr (the transformer's; the other groups take their
// multiple of it). step is the iteration's number: the dropout masks are
// drawn for it (Dropout), so that a run's masks depend only on the seed
// and the iteration, and a resumed run continues as the uninterrupted one.
// It returns the losses; a step whose total loss is not a finite number
// updates nothing. On a device the step runs inside a backend.Scope, which
// gives its memory back at the end.
func (n *Net) TrainStep(pix [][]float32, targets []Target, step int, lr float64) (out Losses, err error) {
	if n.opt == nil {
		return out, fmt.Errorf("model: TrainStep before NewOptimizer")
	}
	if step < 0 {
		return out, fmt.Errorf("model: TrainStep: step must be at least 0, got %d", step)
	}
	n.drop.SetStep(uint64(step))
	end, err := n.beginStep()
	if err != nil {
		return out, err
	}
	defer func() { err = errors.Join(err, end()) }()
	if out, err = n.forward(pix, targets); err != nil || !finite(out.Total) {
		return out, err
	}
	for g, mult := range n.groupMults {
		if err := n.opt.SetLR(g, lr*mult); err != nil {
			return out, fmt.Errorf("model: %w", err)
		}
	}
	if err := n.opt.Step(n.learn); err != nil {
		return out, fmt.Errorf("model: %w", err)
	}
	return out, nil
}

// forward runs the training graph, forward and backward, on one batch and
// returns its losses; the gradients are left in the gradient nodes. The
// caller resets the machine.
func (n *Net) forward(pix [][]float32, targets []Target) (Losses, error) {
	var out Losses
	if n.mode != Train {
		return out, fmt.Errorf("model: TrainStep on an inference graph")
	}
	if err := checkTargets(targets, n.batch, n.cfg.NumClasses); err != nil {
		return out, err
	}
	if err := n.setImages(pix); err != nil {
		return out, err
	}
	n.targets = targets
	for _, bn := range n.bns {
		bn.Training = true
	}
	n.drop.SetTraining(true)
	if err := n.vm.RunAll(); err != nil {
		return out, err
	}
	for i, dst := range []*float64{&out.Total, &out.Class, &out.Box, &out.GIoU} {
		v, err := n.losses[i]()
		if err != nil {
			return out, err
		}
		*dst = v
	}
	return out, nil
}

// beginStep opens a run: on a device, a backend.Scope for the run's
// memory. end closes it and resets the machine.
func (n *Net) beginStep() (end func() error, err error) {
	return trainstep.Begin(n.dev, func() { n.vm.Reset() })
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// Predict runs the inference graph on a batch of images (planar RGB in [0,
// 1]) and returns, per image, its MaxDetections best (query, class) pairs
// of the last decoder layer (PostProcess), boxes in pixels.
func (n *Net) Predict(pix [][]float32) (dets [][]Detection, err error) {
	if n.mode != Infer {
		return nil, fmt.Errorf("model: Predict on a training graph")
	}
	if err := n.setImages(pix); err != nil {
		return nil, err
	}
	for _, bn := range n.bns {
		bn.Training = false
	}
	end, err := n.beginStep()
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, end()) }()
	if err := n.vm.RunAll(); err != nil {
		return nil, err
	}
	logits, err := n.logits()
	if err != nil {
		return nil, err
	}
	boxes, err := n.boxes()
	if err != nil {
		return nil, err
	}
	q, c, s := n.cfg.Queries, n.cfg.NumClasses, float64(n.cfg.ImageSize)
	dets = make([][]Detection, n.batch)
	for img := range n.batch {
		dets[img] = PostProcess(logits[img*q*c:(img+1)*q*c], boxes[img*q*4:(img+1)*q*4], q, c, n.cfg.MaxDetections, s, s)
	}
	return dets, nil
}
