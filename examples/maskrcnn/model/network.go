package model

import (
	"fmt"
	"math"
	"math/rand/v2"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
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
// Build takes the device to run on; only the host (nil) is supported now.
// Conv, ConvBN, UpsampleNearest, MultiLevelRoIAlign and ConvTranspose
// have device kernels already. What a GPU run still needs: device kernels
// for the losses; BatchNorm's running statistics moved to
// the device (ops.BatchNorm.RunningStatsToDevice, and CopyRunningStats for
// the checkpoint); ops.ToDevice after the image and target inputs and
// ops.ToHost before the host ops (the RPN's outputs are small) and after
// the box head's outputs; gorgonia's Add, Reshape and Transpose on device
// values (the backend's engine does Add; the other two are views and a
// 1K-element copy, which could move to the host); and an optimiser that
// updates device parameters in place (the Adam of package train reads
// gradients from host tensors; on the GPU it would be one elementwise
// kernel, as gorgonia's solvers cannot touch device memory).
type Net struct {
	cfg     Config
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
	lossVals [len(LossNames)]G.Value
	names    []string // learnable tensors of this graph, in order
	grads    []*tensor.Dense
	bns      []*ops.BatchNorm

	// Inference.
	detVal, maskVal G.Value
}

// stepState is what the host ops of a training graph see of the current
// step: the ground truth and the random stream of the sampling.
type stepState struct {
	targets []Target
	rng     *rand.Rand
}

// Build makes the graph of the given mode for batches of batch images and
// its machine. Parameters and BatchNorm statistics are taken from params,
// created on first use. dev must be nil (the host) for now.
func Build(cfg Config, params *Params, mode Mode, batch int, dev *backend.Device) (*Net, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if dev != nil {
		return nil, fmt.Errorf("model: Build: running on %v is not supported yet: the model runs on the host (see Net's documentation)", dev)
	}
	if batch < 1 || (mode == Train && batch < 2) {
		// BatchNorm's statistics at the coarsest level need more than one
		// value per channel: 2 images of 4x4 at least.
		return nil, fmt.Errorf("model: Build: batch must be at least %d, got %d", map[Mode]int{Train: 2, Infer: 1}[mode], batch)
	}
	n := &Net{cfg: cfg, mode: mode, batch: batch, params: params, anchors: Anchors(cfg), g: G.NewGraph()}
	b := &builder{net: n, nodes: map[string]*G.Node{}}
	s := cfg.ImageSize
	n.images = tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(batch, 3, s, s))
	n.imageIn = G.NewTensor(n.g, tensor.Float32, 4, G.WithShape(batch, 3, s, s), G.WithName("images"), G.WithValue(n.images))

	pyramid := b.fpn(b.backbone(n.imageIn))
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
	if n.vm, err = newMachine(n.g); err != nil {
		return nil, err
	}
	return n, nil
}

// newMachine wraps G.NewTapeMachine, which panics on compile errors. Like
// ops.NewTapeMachine, it refuses to run on other CPU kernels than the
// environment's STHENO_CPU_KERNELS asked for.
func newMachine(g *G.ExprGraph) (m G.VM, err error) {
	if _, err := kernels.CPUKernels(); err != nil {
		return nil, err
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("model: compiling the graph: %v", r)
		}
	}()
	return G.NewTapeMachine(g), nil
}

// Close releases the machine.
func (n *Net) Close() error { return n.vm.Close() }

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
	levels := len(Strides)
	return rpnOutputs{obj: in[:levels], delta: in[levels : 2*levels]}
}

func (n *Net) buildTraining(b *builder, pyramid, obj, del []*G.Node) error {
	cfg, g := n.cfg, n.g
	n.step = &stepState{}
	var rpnObj, rpnBox *G.Node
	for l := range Strides {
		os, ds := n.rpnLevelShapes(l)
		var ts [4]*tensor.Dense
		var in [4]*G.Node
		for i, sh := range []tensor.Shape{os, os, ds, ds} {
			ts[i] = tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(sh...))
			in[i] = G.NewTensor(g, tensor.Float32, 4, G.WithShape(sh...), G.WithValue(ts[i]),
				G.WithName(fmt.Sprintf("rpn%d.%s", l, [...]string{"obj", "objW", "delta", "deltaW"}[i])))
		}
		n.rpnT, n.rpnIn = append(n.rpnT, ts), append(n.rpnIn, in)
		rpnObj = b.add(rpnObj, b.check(ops.SigmoidBCE(obj[l], in[0], in[1])))
		rpnBox = b.add(rpnBox, b.check(ops.SmoothL1(del[l], in[2], in[3], 1.0/9)))
	}

	// The sampler: proposals from this step's RPN outputs, RoIs and the
	// heads' targets.
	k, km := n.batch*cfg.RoIsPerImage, n.batch*cfg.MaskRoIsPerImage
	nc, m := cfg.NumClasses, cfg.MaskSize()
	shapes := []tensor.Shape{
		{k, 5}, {k}, {k}, {1, 4 * nc, k, 1}, {1, 4 * nc, k, 1},
		{km, 5}, {km, nc, m, m}, {km, nc, m, m},
	}
	sampler := &hostOp{name: "sample RoIs", size: autograd.PackedSize(shapes...), run: n.sampleHeads}
	for l := range Strides {
		os, _ := n.rpnLevelShapes(l)
		sampler.in = append(sampler.in, os)
	}
	for l := range Strides {
		_, ds := n.rpnLevelShapes(l)
		sampler.in = append(sampler.in, ds)
	}
	packed := b.check(G.ApplyOp(sampler, append(append(G.Nodes{}, obj...), del...)...))
	if b.err != nil {
		return b.err
	}
	parts, err := autograd.Unpack(packed, shapes...)
	if err != nil {
		return err
	}
	rois, labels, clsW, boxT, boxW := parts[0], parts[1], parts[2], parts[3], parts[4]
	maskRois, maskT, maskW := parts[5], parts[6], parts[7]

	cls, reg := b.boxHead(pyramid, rois)
	logits := b.check(G.Reshape(cls, tensor.Shape{nc + 1, k}))
	logits = b.check(G.Transpose(logits, 1, 0))
	clsLoss := b.check(ops.SoftmaxCrossEntropy(logits, labels, clsW))
	boxLoss := b.check(ops.SmoothL1(reg, boxT, boxW, 1.0/9))
	maskLoss := b.check(ops.SigmoidBCE(b.maskHead(pyramid, maskRois), maskT, maskW))
	total := b.add(b.add(b.add(b.add(rpnObj, rpnBox), clsLoss), boxLoss), maskLoss)
	if b.err != nil {
		return b.err
	}
	for i, l := range []*G.Node{total, rpnObj, rpnBox, clsLoss, boxLoss, maskLoss} {
		G.Read(l, &n.lossVals[i])
	}
	grads, err := G.Grad(total, b.params...)
	if err != nil {
		return fmt.Errorf("model: gradients: %w", err)
	}
	n.names, n.bns = b.order, b.bns
	n.grads = make([]*tensor.Dense, len(grads))
	for i, gr := range grads {
		// G.Read copies into a value it is handed: the gradients land in
		// these tensors, allocated once.
		n.grads[i] = tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(b.params[i].Shape()...))
		v := G.Value(n.grads[i])
		G.Read(gr, &v)
	}
	return nil
}

func (n *Net) buildInference(b *builder, pyramid, obj, del []*G.Node) error {
	cfg := n.cfg
	rt, d := cfg.RPNPostNMSTest, cfg.MaxDetections
	k := n.batch * rt
	props := &hostOp{name: "proposals", size: 6 * k, run: n.inferProposals}
	for l := range Strides {
		os, _ := n.rpnLevelShapes(l)
		props.in = append(props.in, os)
	}
	for l := range Strides {
		_, ds := n.rpnLevelShapes(l)
		props.in = append(props.in, ds)
	}
	propPacked := b.check(G.ApplyOp(props, append(append(G.Nodes{}, obj...), del...)...))
	if b.err != nil {
		return b.err
	}
	parts, err := autograd.Unpack(propPacked, tensor.Shape{k, 5}, tensor.Shape{k})
	if err != nil {
		return err
	}
	cls, reg := b.boxHead(pyramid, parts[0])
	if b.err != nil {
		return b.err
	}
	kd := n.batch * d
	det := &hostOp{name: "detections", size: 8 * kd, run: n.inferDetections,
		in: []tensor.Shape{{6 * k}, cls.Shape().Clone(), reg.Shape().Clone()}}
	detPacked := b.check(G.ApplyOp(det, propPacked, cls, reg))
	if b.err != nil {
		return b.err
	}
	dparts, err := autograd.Unpack(detPacked, tensor.Shape{kd, 5}, tensor.Shape{3 * kd})
	if err != nil {
		return err
	}
	masks := b.maskHead(pyramid, dparts[0])
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
	dst := n.images.Float32s()
	for i, p := range pix {
		if len(p) != size {
			return fmt.Errorf("model: image %d has %d values, want 3x%dx%d", i, len(p), n.cfg.ImageSize, n.cfg.ImageSize)
		}
		for j, v := range p {
			dst[i*size+j] = (v - pixelMean) / pixelStd
		}
	}
	return nil
}

// TrainStep runs the training graph on one batch: images (planar RGB in [0,
// 1]) and their ground truth. rng drives the sampling of anchors and RoIs.
// It returns the losses; the gradients are left in Grad.
func (n *Net) TrainStep(pix [][]float32, targets []Target, rng *rand.Rand) (Losses, error) {
	var out Losses
	if n.mode != Train {
		return out, fmt.Errorf("model: TrainStep on an inference graph")
	}
	if err := n.setImages(pix); err != nil {
		return out, err
	}
	rt := AssignRPN(n.cfg, n.anchors, targets, rng)
	for l := range Strides {
		for i, src := range [][]float32{rt.Obj[l], rt.ObjW[l], rt.Delta[l], rt.DeltaW[l]} {
			copy(n.rpnT[l][i].Float32s(), src)
		}
	}
	n.step.targets, n.step.rng = targets, rng
	for _, bn := range n.bns {
		bn.Training = true
	}
	defer n.vm.Reset()
	if err := n.vm.RunAll(); err != nil {
		return out, err
	}
	for i, v := range n.lossVals {
		f, ok := v.(*G.F32)
		if !ok {
			return out, fmt.Errorf("model: loss %s is %T, want a float32 scalar", LossNames[i], v)
		}
		out[i] = float64(*f)
	}
	return out, nil
}

// ParamNames lists the learnable tensors of the graph, in the order of
// Grads.
func (n *Net) ParamNames() []string { return n.names }

// Grads are the gradients of the last TrainStep's total loss, in
// ParamNames' order.
func (n *Net) Grads() []*tensor.Dense { return n.grads }

// Predict runs the inference graph on a batch of images (planar RGB in [0,
// 1]) and returns, per image, its detections (best first) and their masks,
// image-sized.
func (n *Net) Predict(pix [][]float32) ([][]Detection, [][]*MaskOut, error) {
	if n.mode != Infer {
		return nil, nil, fmt.Errorf("model: Predict on a training graph")
	}
	if err := n.setImages(pix); err != nil {
		return nil, nil, err
	}
	for _, bn := range n.bns {
		bn.Training = false
	}
	defer n.vm.Reset()
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
	dets := make([][]Detection, n.batch)
	masks := make([][]*MaskOut, n.batch)
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
