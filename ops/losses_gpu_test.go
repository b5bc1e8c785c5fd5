package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
)

// lossGPUCase is one loss at one shape: its lossShape and inputs.
type lossGPUCase struct {
	name     string
	s        lossShape
	x, tg, w *tensor.Dense
}

// newLossGPUCase draws the inputs of a loss of kind at shape x (rows of
// logits or boxes for cross-entropy and GIoU): logits in [-6, 6],
// targets in [0, 1] (binary for focal), boxes of sides in [0.5, 3], class
// labels, weights in [0, 2] of which a fifth are 0 and hold garbage in x
// (inf, NaN), as padding does.
func newLossGPUCase(t testing.TB, rng *rand.Rand, name string, kind lossKind, dt tensor.Dtype, x tensor.Shape, beta, alpha, gamma float64) lossGPUCase {
	s := lossShape{kind: kind, x: x, t: x, w: x, dt: dt, beta: beta, alpha: alpha, gamma: gamma}
	c := lossGPUCase{name: name, s: s}
	switch kind {
	case lossSoftmaxCE:
		s.t, s.w = x[:1], x[:1]
		labels := make([]float64, x[0])
		for i := range labels {
			labels[i] = float64(rng.IntN(x[1]))
		}
		c.tg = fromFloat64s(dt, labels, x[0])
		c.x = randTensor(rng, dt, -6, 6, x...)
	case lossGIoU:
		s.w = x[:1]
		c.x = cast(t, randBoxes(rng, x[0]), dt)
		c.tg = cast(t, randBoxes(rng, x[0]), dt)
	default:
		c.x = randTensor(rng, dt, -6, 6, x...)
		c.tg = randTensor(rng, dt, 0, 1, x...)
		if kind == lossSigmoidFocal {
			v := toFloat64s(t, c.tg)
			for i := range v {
				v[i] = math.Round(v[i])
			}
			c.tg = fromFloat64s(dt, v, x...)
		}
	}
	c.s = s
	w := toFloat64s(t, randTensor(rng, tensor.Float64, 0, 2, s.w...))
	xv := toFloat64s(t, c.x)
	per := len(xv) / len(w)
	for i := 0; i < len(w); i += 5 {
		w[i] = 0
		xv[i*per] = []float64{math.Inf(1), math.NaN(), math.Inf(-1)}[i/5%3]
	}
	c.w = fromFloat64s(dt, w, s.w...)
	c.x = fromFloat64s(dt, xv, x...)
	return c
}

// lossGPUCases are the shapes the parity tests run: small and odd ones,
// and the detectors' (DETR's focal loss on [2, 300, 91] logits and L1 and
// GIoU on 600 boxes; Mask R-CNN's mask BCE on [512, 28, 28], its RPN's
// objectness BCE and box smooth-L1 on ~360,000 anchors an image, whose
// forward grid-strides, and its box head's cross-entropy on 1,024 RoIs of
// 91 classes).
func lossGPUCases(t testing.TB, rng *rand.Rand, dt tensor.Dtype) []lossGPUCase {
	var cs []lossGPUCase
	add := func(name string, kind lossKind, x tensor.Shape, beta, alpha, gamma float64) {
		cs = append(cs, newLossGPUCase(t, rng, name, kind, dt, x, beta, alpha, gamma))
	}
	for _, x := range []tensor.Shape{{7, 13}, {2, 300, 91}} {
		add("bce", lossSigmoidBCE, x, 0, 0, 0)
		add("smoothl1", lossSmoothL1, x, 1.0/9, 0, 0)
		add("l1", lossL1, x, 0, 0, 0)
		add("focal", lossSigmoidFocal, x, 0, DefaultFocalAlpha, DefaultFocalGamma)
		add("focal_alpha=-1_gamma=1.5", lossSigmoidFocal, x, 0, -1, 1.5)
		add("focal_gamma=0", lossSigmoidFocal, x, 0, 0.75, 0)
	}
	add("bce_mask", lossSigmoidBCE, tensor.Shape{512, 28, 28}, 0, 0, 0)
	add("bce_rpn", lossSigmoidBCE, tensor.Shape{2, 360000}, 0, 0, 0)
	add("smoothl1_rpn", lossSmoothL1, tensor.Shape{720000, 4}, 1.0/9, 0, 0)
	add("ce", lossSoftmaxCE, tensor.Shape{5, 3}, 0, 0, 0)
	add("ce_roi", lossSoftmaxCE, tensor.Shape{1024, 91}, 0, 0, 0)
	add("giou", lossGIoU, tensor.Shape{10, 4}, 0, 0, 0)
	add("giou_detr", lossGIoU, tensor.Shape{600, 4}, 0, 0, 0)
	add("l1_detr", lossL1, tensor.Shape{600, 4}, 0, 0, 0)
	return cs
}

// The losses on the GPU against their CPU twins, float64 to TolParity64
// and float32 to TolParity32: the forward (all inputs on the device, the
// scalar loss on the device), and the backward with the loss's gradient a
// host scalar (as gorgonia seeds it) next to device inputs, whose padding
// (weight 0, x inf or NaN) must come out 0.
func TestGPULossesParity(t *testing.T) {
	dev := gpu(t)
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		rng := rand.New(rand.NewPCG(26, 5))
		for _, c := range lossGPUCases(t, rng, dt) {
			t.Run(fmt.Sprintf("%s/%v/%v", c.name, c.s.x, dt), func(t *testing.T) {
				tol := []segment{{tol: parityTol(dt)}}
				parityBy(t, dev, lossOp(c.s), tol, c.x, c.tg, c.w)
				lossGradParity(t, dev, c.s, c.x, c.tg, c.w)
			})
		}
	}
}

// lossGradParity compares lossGradOp on the GPU (x, t and w on the
// device, the gradient 0.75 a host *G.F32 or *G.F64, either whatever the
// dtype) with the CPU's, then runs it again into a NaN-poisoned buffer.
func lossGradParity(t *testing.T, dev *backend.Device, s lossShape, x, tg, w *tensor.Dense) {
	t.Helper()
	op := lossGradOp(s)
	for _, g := range []G.Value{G.NewF32(0.75), G.NewF64(0.75)} {
		want, err := op.Do(x, tg, w, g)
		if err != nil {
			t.Fatalf("CPU: %v", err)
		}
		onDev := []G.Value{toDev(t, dev, x), toDev(t, dev, tg), toDev(t, dev, w), g}
		got, err := op.Do(onDev...)
		if err != nil {
			t.Fatalf("GPU: %v", err)
		}
		wantF := toFloat64s(t, want)
		if err := parityTol(s.dt).Compare(fromDev(t, dev, got), wantF); err != nil {
			t.Errorf("%v, grad %T: GPU vs CPU: %v", op, g, err)
		}
		poison := toDev(t, dev, fromFloat64s(s.dt, filled(len(wantF), math.NaN()), s.x...))
		again, err := op.UsePreallocDo(poison, onDev...)
		if err != nil {
			t.Fatalf("GPU, reused buffer: %v", err)
		}
		if err := parityTol(s.dt).Compare(fromDev(t, dev, again), wantF); err != nil {
			t.Errorf("%v: GPU with a reused buffer vs CPU: %v", op, err)
		}
	}
}

// The box conversions and their backward ops on the GPU against the CPU:
// the same bits (each output is one or two roundings of the same
// operations).
func TestGPUBoxConvertParity(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(26, 6))
	for _, shape := range []tensor.Shape{{600, 4}, {2, 300, 4}, {3, 4}} {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			for mode := kernels.BoxCxCyWHToXYXY; mode <= kernels.BoxXYXYToCxCyWHGrad; mode++ {
				s := boxShape{mode: mode, shape: shape, dt: dt}
				t.Run(fmt.Sprintf("%s/%v/%v", s.name(), shape, dt), func(t *testing.T) {
					x := randTensor(rng, dt, -8, 8, shape...)
					gpuOut, cpuOut := parity(t, dev, boxOp(s), dt, x)
					if !equalFloats(gpuOut, cpuOut) {
						t.Errorf("GPU %v, CPU %v: not the same bits", gpuOut[:4], cpuOut[:4])
					}
				})
			}
		}
	}
}

// A training graph on the device: inputs moved with ToDevice, DETR's
// losses (focal on the logits; L1 and GIoU on the boxes, GIoU through
// BoxCxCyWHToXYXY) and the box head's cross-entropy, their sum
// (SumLosses) differentiated by G.Grad, whose seed is gorgonia's host
// constant one.
// The loss (a device scalar) and the gradients must match the same graph
// on the host.
func TestGPULossesGraph(t *testing.T) {
	dev := gpu(t)
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		rng := rand.New(rand.NewPCG(26, 7))
		logits := randTensor(rng, dt, -4, 4, 2, 30, 9)
		onehot := toFloat64s(t, randTensor(rng, tensor.Float64, 0, 1, 2, 30, 9))
		for i := range onehot {
			onehot[i] = math.Floor(onehot[i] * 1.2)
		}
		targets := fromFloat64s(dt, onehot, 2, 30, 9)
		lw := randTensor(rng, dt, 0, 1, 2, 30, 9)
		// (cx, cy, w, h) with positive sizes
		pred := randTensor(rng, dt, 1, 3, 60, 4)
		tbox := cast(t, randBoxes(rng, 60), dt)
		bw := randTensor(rng, dt, 0, 1, 60)
		ceX := randTensor(rng, dt, -3, 3, 16, 5)
		ceL := fromFloat64s(dt, []float64{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0}, 16)
		ceW := randTensor(rng, dt, 0, 1, 16)
		l1w := randTensor(rng, dt, 0, 1, 60, 4)
		inputs := []*tensor.Dense{logits, targets, lw, pred, tbox, bw, ceX, ceL, ceW, l1w}
		run := func(onDev bool) (float64, [][]float64) {
			g := G.NewGraph()
			nodes := make(G.Nodes, len(inputs))
			placed := make(G.Nodes, len(inputs))
			for i, d := range inputs {
				nodes[i] = G.NodeFromAny(g, d, G.WithName(fmt.Sprintf("in%d", i)))
				placed[i] = nodes[i]
				if onDev {
					var err error
					if placed[i], err = ToDevice(nodes[i], dev); err != nil {
						t.Fatal(err)
					}
				}
			}
			focal := G.Must(SigmoidFocalLoss(placed[0], placed[1], placed[2], DefaultFocalAlpha, DefaultFocalGamma))
			xyxy := G.Must(BoxCxCyWHToXYXY(placed[3]))
			l1 := G.Must(L1Loss(placed[3], G.Must(BoxXYXYToCxCyWH(placed[4])), placed[9]))
			giou := G.Must(GIoULoss(xyxy, placed[4], placed[5]))
			ce := G.Must(SoftmaxCrossEntropy(placed[6], placed[7], placed[8]))
			total := G.Must(SumLosses(focal, l1, giou, ce))
			wrt := G.Nodes{nodes[0], nodes[3], nodes[6]}
			grads, err := G.Grad(total, wrt...)
			if err != nil {
				t.Fatal(err)
			}
			gv := make([]G.Value, len(grads))
			for i := range grads {
				G.Read(grads[i], &gv[i])
			}
			var opts []G.VMOpt
			if onDev {
				opts = append(opts, G.WithEngine(dev.Engine()))
			}
			// NewTapeMachine checks the placement first: every op here
			// takes device values.
			m, err := NewTapeMachine(g, opts...)
			if err != nil {
				t.Fatalf("device=%t: %v", onDev, err)
			}
			defer m.Close()
			if err := m.RunAll(); err != nil {
				t.Fatalf("device=%t: %v", onDev, err)
			}
			var loss float64
			if onDev {
				loss = fromDev(t, dev, total.Value())[0]
			} else {
				loss = toFloat64s(t, total.Value())[0]
			}
			out := make([][]float64, len(gv))
			for i, v := range gv {
				out[i] = toFloat64s(t, v)
			}
			return loss, out
		}
		wantLoss, wantGrads := run(false)
		gotLoss, gotGrads := run(true)
		tol := parityTol(dt)
		if err := tol.Compare([]float64{gotLoss}, []float64{wantLoss}); err != nil {
			t.Errorf("%v: loss: %v", dt, err)
		}
		for i := range wantGrads {
			if err := tol.Compare(gotGrads[i], wantGrads[i]); err != nil {
				t.Errorf("%v: gradient %d: %v", dt, i, err)
			}
		}
	}
}

// The focal gradient at saturated logits for 0 < gamma < 1 is NaN on the
// GPU too, where the CPU's is (TestFocalSaturatedGradient).
func TestGPUFocalSaturatedGradient(t *testing.T) {
	dev := gpu(t)
	s := lossShape{kind: lossSigmoidFocal, x: tensor.Shape{3}, t: tensor.Shape{3}, w: tensor.Shape{3}, dt: tensor.Float32, alpha: 0.25, gamma: 0.5}
	x := fromFloat64s(tensor.Float32, []float64{20, -20, 3}, 3)
	tg := fromFloat64s(tensor.Float32, []float64{1, 0, 1}, 3)
	w := fromFloat64s(tensor.Float32, []float64{1, 1, 1}, 3)
	lossGradParity(t, dev, s, x, tg, w)
}

// A label out of range makes the device's loss NaN, and its row of the
// gradient (the CPU twin returns an error instead); other rows stay.
func TestGPUSoftmaxCrossEntropyBadLabelIsNaN(t *testing.T) {
	dev := gpu(t)
	s := lossShape{kind: lossSoftmaxCE, x: tensor.Shape{2, 3}, t: tensor.Shape{2}, w: tensor.Shape{2}, dt: tensor.Float32}
	x := fromFloat64s(tensor.Float32, []float64{1, 2, 3, 4, 5, 6}, 2, 3)
	in := []G.Value{toDev(t, dev, x), toDev(t, dev, fromFloat64s(tensor.Float32, []float64{0, 3}, 2)), toDev(t, dev, fromFloat64s(tensor.Float32, []float64{1, 0}, 2))}
	loss, err := lossOp(s).Do(in...)
	if err != nil {
		t.Fatal(err)
	}
	if v := fromDev(t, dev, loss); !math.IsNaN(v[0]) {
		t.Errorf("loss %v, want NaN", v)
	}
	dx, err := lossGradOp(s).Do(append(in, G.NewF32(1))...)
	if err != nil {
		t.Fatal(err)
	}
	d := fromDev(t, dev, dx)
	if math.IsNaN(d[0]) || !math.IsNaN(d[3]) || !math.IsNaN(d[5]) {
		t.Errorf("dx %v, want row 0 numbers and row 1 NaN", d)
	}
}

// The forward's sum runs in one order: the same bits on every run, at a
// shape whose grid strides (RPN's objectness).
func TestGPULossesDeterministic(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(26, 8))
	c := newLossGPUCase(t, rng, "bce_rpn", lossSigmoidBCE, tensor.Float32, tensor.Shape{2, 360000}, 0, 0, 0)
	in := []G.Value{toDev(t, dev, c.x), toDev(t, dev, c.tg), toDev(t, dev, c.w)}
	var first float64
	for i := range 5 {
		out, err := lossOp(c.s).Do(in...)
		if err != nil {
			t.Fatal(err)
		}
		v := fromDev(t, dev, out)[0]
		if i == 0 {
			first = v
		} else if math.Float64bits(v) != math.Float64bits(first) {
			t.Fatalf("run %d: %v, run 0: %v", i, v, first)
		}
	}
}

// lossBenchCases are the shapes BenchmarkGPULosses times, float32:
// Deformable-DETR's focal loss on [2, 300, 91] logits, its L1 and GIoU
// losses on 2x300 boxes; Mask R-CNN's mask BCE on [512, 28, 28] logits, its
// RPN's objectness BCE on 2 images of ~120,000 anchors x 3 ratios and the
// anchors' box smooth-L1 (beta 1/9), and its box head's cross-entropy on
// 2x512 RoIs of 91 classes. kernels/bench/anchors_losses.py times PyTorch
// on the same.
var lossBenchCases = []struct {
	name  string
	kind  lossKind
	x     tensor.Shape
	beta  float64
	alpha float64
	gamma float64
}{
	{"focal_2x300x91", lossSigmoidFocal, tensor.Shape{2, 300, 91}, 0, DefaultFocalAlpha, DefaultFocalGamma},
	{"l1_600x4", lossL1, tensor.Shape{600, 4}, 0, 0, 0},
	{"giou_600x4", lossGIoU, tensor.Shape{600, 4}, 0, 0, 0},
	{"bce_mask_512x28x28", lossSigmoidBCE, tensor.Shape{512, 28, 28}, 0, 0, 0},
	{"bce_rpn_2x360000", lossSigmoidBCE, tensor.Shape{2, 360000}, 0, 0, 0},
	{"smoothl1_rpn_720000x4", lossSmoothL1, tensor.Shape{720000, 4}, 1.0 / 9, 0, 0},
	{"ce_roi_1024x91", lossSoftmaxCE, tensor.Shape{1024, 91}, 0, 0, 0},
}

// BenchmarkGPULosses times the losses on the GPU at lossBenchCases,
// float32, forward (both kernels) and backward: CUDA events around each of
// b.N calls after 5 untimed ones, reporting the median (ms), the
// compulsory bytes over it (GB/s: forward x, t and w; backward those and
// dx) and its share of the device's copy bandwidth (%copy), as runCase
// does. The backward's gradient is a host scalar, as in a graph.
func BenchmarkGPULosses(b *testing.B) {
	for _, c := range lossBenchCases {
		rng := rand.New(rand.NewPCG(1, 1))
		lc := newLossGPUCase(b, rng, c.name, c.kind, tensor.Float32, c.x, c.beta, c.alpha, c.gamma)
		in := []*tensor.Dense{lc.x, lc.tg, lc.w}
		var bytes float64
		for _, d := range in {
			bytes += float64(4 * d.Shape().TotalSize())
		}
		dxBytes := float64(4 * c.x.TotalSize())
		b.Run(fmt.Sprintf("impl=cuda/case=%s/pass=fwd", c.name), func(b *testing.B) {
			runLossCase(b, lossOp(lc.s), in, nil, bytes)
		})
		b.Run(fmt.Sprintf("impl=cuda/case=%s/pass=bwd", c.name), func(b *testing.B) {
			runLossCase(b, lossGradOp(lc.s), in, G.NewF32(1), bytes+dxBytes)
		})
	}
}

// runLossCase is runCase for an op whose inputs are on the device but for
// a host scalar, grad (nil: none), last.
func runLossCase(b *testing.B, op *specOp, inputs []*tensor.Dense, grad G.Value, bytes float64) {
	dev := gpu(b)
	vals := make([]G.Value, 0, len(inputs)+1)
	for _, d := range inputs {
		vals = append(vals, toDev(b, dev, d))
	}
	defer func() {
		for _, v := range vals {
			dev.FreeDense(v.(*tensor.Dense))
		}
	}()
	if grad != nil {
		vals = append(vals, grad)
	}
	var out G.Value
	var err error
	med := timeSteps(b, dev, func() error {
		out, err = op.UsePreallocDo(out, vals...)
		return err
	})
	if grad != nil {
		vals = vals[:len(vals)-1]
	}
	if d, ok := out.(*tensor.Dense); ok {
		dev.FreeDense(d)
	}
	reportBandwidth(b, dev, med, bytes)
}

// Gradient checks of the losses and box conversions on the GPU, float64:
// inputs and the cost on the host, ToDevice around the op; a loss is
// reshaped to [1] to be moved back (ToHost takes tensors), so its backward
// takes its gradient on the device, through the kernels' dgrad.
func TestGPULossesGradCheck(t *testing.T) {
	dev := gpu(t)
	engine := G.WithEngine(dev.Engine())
	rng := rand.New(rand.NewPCG(26, 9))
	x := randTensor(rng, tensor.Float64, -3, 3, 4, 5)
	tg := randTensor(rng, tensor.Float64, 0, 1, 4, 5)
	w := randTensor(rng, tensor.Float64, 0, 2, 4, 5)
	boxes, tboxes := randBoxes(rng, 12), randBoxes(rng, 12)
	bw := randTensor(rng, tensor.Float64, 0, 2, 12)
	ce := randTensor(rng, tensor.Float64, -3, 3, 4, 5)
	labels, rowW := vec(0, 4, 2, 1), randTensor(rng, tensor.Float64, 0, 2, 4)
	for i, c := range []struct {
		name     string
		f        lossFunc
		x, tg, w *tensor.Dense
	}{
		{"bce", SigmoidBCE, x, tg, w},
		{"smoothl1", smoothL1With(0.5), x, tg, w},
		{"l1", L1Loss, x, tg, w},
		{"focal", focalWith(0.25, 2), x, tg, w},
		{"ce", SoftmaxCrossEntropy, ce, labels, rowW},
		{"giou", GIoULoss, boxes, tboxes, bw},
	} {
		inputs := []autograd.Input{
			{Name: "x", Value: c.x},
			{Name: "t", Value: c.tg, NoGrad: true},
			{Name: "w", Value: c.w, NoGrad: true},
		}
		_, err := autograd.CheckGrad(func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
			onDev := make(G.Nodes, len(in))
			for i, n := range in {
				var err error
				if onDev[i], err = ToDevice(n, dev); err != nil {
					return nil, err
				}
			}
			loss, err := c.f(onDev[0], onDev[1], onDev[2])
			if err != nil {
				return nil, err
			}
			one, err := G.Reshape(loss, tensor.Shape{1})
			if err != nil {
				return nil, err
			}
			return ToHost(one)
		}, inputs, uint64(i), engine)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	for i, f := range []func(*G.Node) (*G.Node, error){BoxCxCyWHToXYXY, BoxXYXYToCxCyWH} {
		in := []autograd.Input{{Name: "boxes", Value: randTensor(rng, tensor.Float64, -2, 2, 3, 4)}}
		_, err := autograd.CheckGrad(func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
			b, err := ToDevice(in[0], dev)
			if err != nil {
				return nil, err
			}
			y, err := f(b)
			if err != nil {
				return nil, err
			}
			return ToHost(y)
		}, in, uint64(i), engine)
		if err != nil {
			t.Errorf("box conversion %d: %v", i, err)
		}
	}
}
