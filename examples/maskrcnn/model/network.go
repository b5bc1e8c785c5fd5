package model

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
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
	// Train builds the training graph: losses and their gradients with
	// respect to every parameter; BatchNorm normalises with the batch's
	// statistics and updates the running ones.
	Train Mode = iota
	// Infer builds the inference graph: detections and their masks;
	// BatchNorm uses the running statistics.
	Infer
)

// Input normalisation: pixels in [0, 1] are centred and scaled to roughly
// unit variance before the stem.
const pixelMean, pixelStd = 0.5, 0.25

// LossNames name the entries of Losses.
var LossNames = [...]string{"total", "rpn_obj", "rpn_box", "cls", "box", "mask"}

// Losses are one training step's losses, in LossNames' order.
type Losses [len(LossNames)]float64

// Net is one graph of the model for a fixed batch size, bound to a Params,
// with the machine that runs it.
//
// # Devices
//
// A Net runs where its Params live: on the host, or on one GPU. On a GPU
// every layer, loss and gradient runs on the device, and so do the
// optimiser's steps and BatchNorm's running statistics; what crosses is
// small: the images and the RPN's targets go to the device each step, the
// RPN's outputs come to the host for the sampling of RoIs (the proposals,
// NMS and the heads' targets are host steps, see the package's
// documentation), the sampled RoIs and targets go back, and the losses come
// to the host once per step, in one copy. Inference likewise brings the
// RPN's and the box head's outputs to the host for the proposals and the
// detections, and the masks of the detections.
//
// A training step on a GPU runs in a backend.Scope of its own, which gives
// its memory back to the device's cache when it ends: the device memory a
// run holds stays flat after the first steps.
type Net struct {
	cfg     Config
	dev     *backend.Device // nil: the host
	mode    Mode
	batch   int
	params  *Params
	anchors [][]Box

	g       *G.ExprGraph
	vm      G.VM
	images  *tensor.Dense
	imageIn *G.Node

	// Training.
	rpnT     [][4]*tensor.Dense // per level: obj, objW, delta, deltaW
	rpnIn    [][4]*G.Node
	step     *stepState
	lossVals []G.Value // the losses, in LossNames' order, on the host
	names    []string
	learn    []G.ValueGrad // learnable tensors of this graph with their gradients, in names' order
	opt      *ops.AdamW
	bns      []*ops.BatchNorm
	// maskScratch: per image, sampleHeads' buffers for the mask targets.
	maskScratch []maskScratch
	// maskLoss is the mask head and its loss (see maskLossOp), whose
	// targets and weights, [KM, NumClasses, M, M] with the step's RoIs
	// first, sampleHeads writes into maskTargets and maskWeights.
	maskLoss                 *maskLossOp
	maskTargets, maskWeights []float32

	// Inference.
	detVal, maskVal G.Value

	hostTimes map[string]time.Duration // HostTimes
}

// timed wraps a host step so that HostTimes counts its time under name.
func (n *Net) timed(name string, run func(in [][]float32, out []float32) error) func(in [][]float32, out []float32) error {
	return func(in [][]float32, out []float32) error {
		start := time.Now()
		err := run(in, out)
		n.hostTimes[name] += time.Since(start)
		return err
	}
}

// HostTimes returns the time the net's runs have spent in each of its host
// steps (the RPN's targets, sampling RoIs, proposals, detections), since
// Build or the last ResetHostTimes: what a step's breakdown needs.
func (n *Net) HostTimes() map[string]time.Duration { return maps.Clone(n.hostTimes) }

// ResetHostTimes sets HostTimes' counts to zero.
func (n *Net) ResetHostTimes() { clear(n.hostTimes) }

// stepState is what the host ops of a training graph see of the current
// step: the ground truth and the random stream of the sampling.
type stepState struct {
	targets []Target
	rng     *rand.Rand
	// maskRoIs is how many mask RoIs sampleHeads picked: the first rows
	// of its mask RoIs, targets and weights.
	maskRoIs int
}

// Build makes the graph of the given mode for batches of batch images and
// its machine, on the device params live on (nil: the host). Parameters
// and BatchNorm statistics are taken from params, created on first use.
// Build must not run inside a backend.Scope.
func Build(cfg Config, params *Params, mode Mode, batch int) (*Net, error) {
	return build(cfg, params, mode, batch, params.Device(), true)
}

// build is Build for a graph on dev, compiled into a machine or not. dev
// differs from params' device only in tests of the graph's placement,
// which build a device graph on host parameters (each moved to the device
// by an ops.ToDevice node) without running it.
func build(cfg Config, params *Params, mode Mode, batch int, dev *backend.Device, compile bool) (*Net, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if batch < 1 || (mode == Train && batch < 2) {
		// BatchNorm's statistics at the coarsest level need more than one
		// value per channel: 2 images of 4x4 at least.
		return nil, fmt.Errorf("model: Build: batch must be at least %d, got %d", map[Mode]int{Train: 2, Infer: 1}[mode], batch)
	}
	n := &Net{cfg: cfg, dev: dev, mode: mode, batch: batch, params: params, anchors: Anchors(cfg), g: G.NewGraph(),
		hostTimes: map[string]time.Duration{}}
	b := &builder{net: n, nodes: map[string]*G.Node{}}
	s := cfg.ImageSize
	n.images = tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(batch, 3, s, s))
	n.imageIn = G.NewTensor(n.g, tensor.Float32, 4, G.WithShape(batch, 3, s, s), G.WithName("images"), G.WithValue(n.images))

	pyramid := b.fpn(b.backbone(b.toDevice(n.imageIn)))
	obj, del := b.rpnHead(pyramid)
	if b.err != nil {
		return nil, b.err
	}
	var err error
	if mode == Train {
		err = n.buildTraining(b, pyramid, obj, del)
	} else {
		err = n.buildInference(b, pyramid, obj, del)
	}
	if err != nil {
		return nil, err
	}
	if !compile {
		return n, nil
	}
	var opts []G.VMOpt
	if n.dev != nil {
		opts = append(opts, G.WithEngine(n.dev.Engine()))
	}
	if n.vm, err = ops.NewTapeMachine(n.g, opts...); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	return n, nil
}

// Close releases the machine and the optimiser's state.
func (n *Net) Close() error {
	err := n.vm.Close()
	if n.maskLoss != nil {
		err = errors.Join(err, n.maskLoss.Close())
	}
	if n.opt != nil {
		err = errors.Join(err, n.opt.Free())
	}
	return err
}

// Device is where the Net runs (nil: the host).
func (n *Net) Device() *backend.Device { return n.dev }

// Batch is the number of images the graph takes.
func (n *Net) Batch() int { return n.batch }

// Config is the network's configuration.
func (n *Net) Config() Config { return n.cfg }

// rpnLevelShapes are the shapes of level l's objectness and deltas.
func (n *Net) rpnLevelShapes(l int) (obj, del tensor.Shape) {
	a, h := n.cfg.NumAnchors(), n.cfg.LevelSize(l)
	return tensor.Shape{n.batch, a, h, h}, tensor.Shape{n.batch, 4 * a, h, h}
}

func (n *Net) rpnOutputs(in [][]float32) rpnOutputs {
	levels := len(n.anchors)
	return rpnOutputs{obj: in[:levels], delta: in[levels : 2*levels]}
}

// headTargetShapes are the shapes of the parts of the sampler's packed
// output, in sampleHeads' order.
func (n *Net) headTargetShapes() []tensor.Shape {
	k, km := n.batch*n.cfg.RoIsPerImage, n.batch*n.cfg.MaskRoIsPerImage
	nc := n.cfg.NumClasses
	return []tensor.Shape{
		{k, 5}, {k}, {k}, {1, 4 * nc, k, 1}, {1, 4 * nc, k, 1},
		{km, 5},
	}
}

func (n *Net) buildTraining(b *builder, pyramid, obj, del []*G.Node) error {
	cfg, g := n.cfg, n.g
	n.step = &stepState{}
	var rpnObjs, rpnBoxes []*G.Node
	for l := range n.anchors {
		os, ds := n.rpnLevelShapes(l)
		var ts [4]*tensor.Dense
		var in [4]*G.Node
		for i, sh := range []tensor.Shape{os, os, ds, ds} {
			ts[i] = tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(sh...))
			in[i] = G.NewTensor(g, tensor.Float32, 4, G.WithShape(sh...), G.WithValue(ts[i]),
				G.WithName(fmt.Sprintf("rpn%d.%s", l, [...]string{"obj", "objW", "delta", "deltaW"}[i])))
		}
		n.rpnT, n.rpnIn = append(n.rpnT, ts), append(n.rpnIn, in)
		rpnObjs = append(rpnObjs, b.check(ops.SigmoidBCE(obj[l], b.toDevice(in[0]), b.toDevice(in[1]))))
		rpnBoxes = append(rpnBoxes, b.check(ops.SmoothL1(del[l], b.toDevice(in[2]), b.toDevice(in[3]), 1.0/9)))
	}
	rpnObj := b.sumLosses(rpnObjs...)
	rpnBox := b.sumLosses(rpnBoxes...)

	// The sampler: proposals from this step's RPN outputs, RoIs and the
	// heads' targets.
	k, nc := n.batch*cfg.RoIsPerImage, cfg.NumClasses
	shapes := n.headTargetShapes()
	// sampleHeads writes its whole output every run (clearing what it
	// leaves unset): the op keeps the output's memory.
	sampler := &hostop.Op[float32]{Name: "sample RoIs", Size: autograd.PackedSize(shapes...), Run: n.timed("sample RoIs", n.sampleHeads), Reuse: true}
	for l := range n.anchors {
		os, _ := n.rpnLevelShapes(l)
		sampler.In = append(sampler.In, os)
	}
	for l := range n.anchors {
		_, ds := n.rpnLevelShapes(l)
		sampler.In = append(sampler.In, ds)
	}
	packed := b.toDevice(b.check(G.ApplyOp(sampler, b.toHostAll(append(append(G.Nodes{}, obj...), del...))...)))
	if b.err != nil {
		return b.err
	}
	parts, err := autograd.Unpack(packed, shapes...)
	if err != nil {
		return err
	}
	rois, labels, clsW, boxT, boxW, maskRois := parts[0], parts[1], parts[2], parts[3], parts[4], parts[5]

	cls, reg := b.boxHead(pyramid, rois)
	logits := b.check(ops.Reshape(cls, nc+1, k))
	logits = b.check(ops.Permute(logits, 1, 0))
	clsLoss := b.check(ops.SoftmaxCrossEntropy(logits, labels, clsW))
	boxLoss := b.check(ops.SmoothL1(reg, boxT, boxW, 1.0/9))
	if b.err != nil {
		return b.err
	}
	km, m := n.batch*cfg.MaskRoIsPerImage, cfg.MaskSize()
	n.maskTargets, n.maskWeights = make([]float32, km*nc*m*m), make([]float32, km*nc*m*m)
	levels := pyramid[:cfg.PoolLevels()]
	var maskParams G.Nodes
	if n.maskLoss, maskParams, err = newMaskLoss(b, levels, maskRois); err != nil {
		return err
	}
	maskLoss := b.check(G.ApplyOp(n.maskLoss, append(append(slices.Clone(levels), maskRois), maskParams...)...))
	total := b.sumLosses(rpnObj, rpnBox, clsLoss, boxLoss, maskLoss)
	b.readLosses(total, rpnObj, rpnBox, clsLoss, boxLoss, maskLoss)
	if b.err != nil {
		return b.err
	}
	grads, err := G.Grad(total, b.params...)
	if err != nil {
		return fmt.Errorf("model: gradients: %w", err)
	}
	n.names, n.bns = b.order, b.bns
	if n.learn, err = ops.ParamsWithGrads(b.params, grads); err != nil {
		return fmt.Errorf("model: %w", err)
	}
	return nil
}

func (n *Net) buildInference(b *builder, pyramid, obj, del []*G.Node) error {
	cfg := n.cfg
	rt, d := cfg.RPNPostNMSTest, cfg.MaxDetections
	k := n.batch * rt
	props := &hostop.Op[float32]{Name: "proposals", Size: 6 * k, Run: n.timed("proposals", n.inferProposals)}
	for l := range n.anchors {
		os, _ := n.rpnLevelShapes(l)
		props.In = append(props.In, os)
	}
	for l := range n.anchors {
		_, ds := n.rpnLevelShapes(l)
		props.In = append(props.In, ds)
	}
	propPacked := b.check(G.ApplyOp(props, b.toHostAll(append(append(G.Nodes{}, obj...), del...))...))
	if b.err != nil {
		return b.err
	}
	parts, err := autograd.Unpack(b.toDevice(propPacked), tensor.Shape{k, 5}, tensor.Shape{k})
	if err != nil {
		return err
	}
	cls, reg := b.boxHead(pyramid, parts[0])
	if b.err != nil {
		return b.err
	}
	kd := n.batch * d
	det := &hostop.Op[float32]{Name: "detections", Size: 8 * kd, Run: n.timed("detections", n.inferDetections),
		In: []tensor.Shape{{6 * k}, cls.Shape().Clone(), reg.Shape().Clone()}}
	detPacked := b.check(G.ApplyOp(det, propPacked, b.toHost(cls), b.toHost(reg)))
	if b.err != nil {
		return b.err
	}
	dparts, err := autograd.Unpack(b.toDevice(detPacked), tensor.Shape{kd, 5}, tensor.Shape{3 * kd})
	if err != nil {
		return err
	}
	masks := b.toHost(b.maskHead(pyramid, dparts[0]))
	if b.err != nil {
		return b.err
	}
	G.Read(detPacked, &n.detVal)
	G.Read(masks, &n.maskVal)
	n.names, n.bns = b.order, b.bns
	return nil
}

// setImages copies a batch of images (planar RGB in [0, 1], ImageSize
// square) into the graph's input, normalised.
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
	// An image per goroutine: at the r50fpn preset's size the batch is
	// millions of values, and the GPU waits for them.
	dst := n.images.Float32s()
	var wg sync.WaitGroup
	for i, p := range pix {
		wg.Go(func() {
			for j, v := range p {
				dst[i*size+j] = (v - pixelMean) / pixelStd
			}
		})
	}
	wg.Wait()
	return nil
}

// NewOptimizer gives a training graph its optimiser: AdamW (ops.AdamW,
// PyTorch's) with decoupled weight decay on the weights only (Params.Decays),
// the gradients' global norm clipped to clipNorm (0: no clipping) and the
// state where the parameters live. TrainStep steps it.
func (n *Net) NewOptimizer(weightDecay, clipNorm float64) error {
	if n.mode != Train {
		return fmt.Errorf("model: NewOptimizer on an inference graph")
	}
	if n.opt != nil {
		return fmt.Errorf("model: the graph has an optimiser already")
	}
	var decay, rest []G.ValueGrad
	for i, p := range n.learn {
		if n.params.Decays(n.names[i]) {
			decay = append(decay, p)
		} else {
			rest = append(rest, p)
		}
	}
	cfg := ops.DefaultAdamWConfig()
	cfg.MaxGradNorm = clipNorm
	// Every run computes the gradients afresh: zeroing them is work for
	// nothing.
	cfg.KeepGrads = true
	var err error
	n.opt, err = ops.NewAdamW([]ops.ParamGroup{{Params: decay, WeightDecay: weightDecay}, {Params: rest}}, cfg)
	if err != nil {
		return fmt.Errorf("model: %w", err)
	}
	return nil
}

// Step is one training iteration's batch, with the RPN's targets that
// Prepare assigns in the background.
type Step struct {
	pix     [][]float32
	targets []Target
	rng     *rand.Rand
	done    chan struct{}
	rpn     RPNTargets
	took    time.Duration
}

// Prepare starts the host work of a training iteration that does not
// depend on the network: assigning the batch's anchors (the RPN's
// targets, from the ground truth alone), in a goroutine, drawing from rng
// first. A training loop prepares the next iteration before it runs the
// current one (TrainPrepared), so that the assignment overlaps the step;
// the iteration then samples its RoIs from the same rng, which gives the
// numbers TrainStep would.
func (n *Net) Prepare(pix [][]float32, targets []Target, rng *rand.Rand) *Step {
	s := &Step{pix: pix, targets: targets, rng: rng, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		start := time.Now()
		s.rpn = AssignRPN(n.cfg, n.anchors, targets, rng)
		s.took = time.Since(start)
	}()
	return s
}

// TrainStep runs one training iteration on a batch: images (planar RGB in
// [0, 1]) and their ground truth, forward and backward, then an AdamW step
// of learning rate lr (NewOptimizer makes the optimiser). rng drives the
// sampling of anchors and RoIs. It returns the losses; a step whose total
// loss is not a finite number updates nothing. It is TrainPrepared of
// Prepare's step.
func (n *Net) TrainStep(pix [][]float32, targets []Target, rng *rand.Rand, lr float64) (Losses, error) {
	return n.TrainPrepared(n.Prepare(pix, targets, rng), lr)
}

// TrainPrepared runs the training iteration s (see Prepare and TrainStep).
func (n *Net) TrainPrepared(s *Step, lr float64) (out Losses, err error) {
	if n.mode != Train {
		return out, fmt.Errorf("model: TrainStep on an inference graph")
	}
	if n.opt == nil {
		return out, fmt.Errorf("model: TrainStep before NewOptimizer")
	}
	pix, targets, rng := s.pix, s.targets, s.rng
	if err := n.setImages(pix); err != nil {
		return out, err
	}
	<-s.done
	n.hostTimes["RPN targets"] += s.took
	rt := s.rpn
	for l := range n.anchors {
		for i, src := range [][]float32{rt.Obj[l], rt.ObjW[l], rt.Delta[l], rt.DeltaW[l]} {
			copy(n.rpnT[l][i].Float32s(), src)
		}
	}
	n.step.targets, n.step.rng = targets, rng
	for _, bn := range n.bns {
		bn.Training = true
	}
	end, err := n.beginStep()
	if err != nil {
		return out, err
	}
	defer func() { err = errors.Join(err, end()) }()
	if err := n.vm.RunAll(); err != nil {
		return out, err
	}
	if out, err = n.losses(); err != nil || !finite(out[0]) {
		return out, err
	}
	for g := range 2 {
		if err := n.opt.SetLR(g, lr); err != nil {
			return out, fmt.Errorf("model: %w", err)
		}
	}
	if err := n.opt.Step(n.learn); err != nil {
		return out, fmt.Errorf("model: %w", err)
	}
	return out, nil
}

// beginStep opens a step: on a device, a backend.Scope for the step's
// memory. end closes it and resets the machine.
func (n *Net) beginStep() (end func() error, err error) {
	return trainstep.Begin(n.dev, func() { n.vm.Reset() })
}

// losses reads the last run's losses.
func (n *Net) losses() (Losses, error) {
	var out Losses
	for i, v := range n.lossVals {
		var f float32
		switch v := v.(type) {
		case *G.F32:
			f = float32(*v)
		case *tensor.Dense:
			if v.Dtype() != tensor.Float32 || v.Shape().TotalSize() != 1 {
				return out, fmt.Errorf("model: loss %s is %v %v, want a float32 scalar", LossNames[i], v.Dtype(), v.Shape())
			}
			f = v.Float32s()[0]
		default:
			return out, fmt.Errorf("model: loss %s is %T, want a float32 scalar", LossNames[i], v)
		}
		out[i] = float64(f)
	}
	return out, nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// ParamNames lists the learnable tensors of the graph, in the order of
// Params.Names' subset the graph uses.
func (n *Net) ParamNames() []string { return n.names }

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

// Predict runs the inference graph on a batch of images (planar RGB in [0,
// 1]) and returns, per image, its detections (best first) and their masks,
// image-sized.
func (n *Net) Predict(pix [][]float32) (dets [][]Detection, masks [][]*MaskOut, err error) {
	if n.mode != Infer {
		return nil, nil, fmt.Errorf("model: Predict on a training graph")
	}
	if err := n.setImages(pix); err != nil {
		return nil, nil, err
	}
	for _, bn := range n.bns {
		bn.Training = false
	}
	end, err := n.beginStep()
	if err != nil {
		return nil, nil, err
	}
	defer func() { err = errors.Join(err, end()) }()
	if err := n.vm.RunAll(); err != nil {
		return nil, nil, err
	}
	cfg := n.cfg
	d, nc, m := cfg.MaxDetections, cfg.NumClasses, cfg.MaskSize()
	kd := n.batch * d
	// The detection step's packing (see inferDetections).
	c := carver{buf: n.detVal.(*tensor.Dense).Float32s()}
	rois, scores, classes, valid := c.take(5*kd), c.take(kd), c.take(kd), c.take(kd)
	logits := n.maskVal.(*tensor.Dense).Float32s()
	dets = make([][]Detection, n.batch)
	masks = make([][]*MaskOut, n.batch)
	for img := range n.batch {
		for j := range d {
			r := img*d + j
			if valid[r] == 0 {
				continue
			}
			det := Detection{
				Box:   Box{float64(rois[5*r+1]), float64(rois[5*r+2]), float64(rois[5*r+3]), float64(rois[5*r+4])},
				Score: float64(scores[r]),
				Class: int(classes[r]),
			}
			probs := make([]float32, m*m)
			for i, v := range logits[(r*nc+det.Class)*m*m:][:m*m] {
				probs[i] = sigmoid32(v)
			}
			dets[img] = append(dets[img], det)
			masks[img] = append(masks[img], &MaskOut{Probs: probs, Size: m})
		}
	}
	return dets, masks, nil
}

// MaskOut is a predicted mask: Size x Size probabilities over the
// detection's box, row-major. PasteMask places it in an image.
type MaskOut struct {
	Probs []float32
	Size  int
}

func sigmoid32(v float32) float32 { return float32(1 / (1 + math.Exp(-float64(v)))) }
