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

// pointwiseTestOp returns the elementwise op of opcode op on operands of
// shapes a and b (b nil for a unary op), broadcast to their broadcast
// shape.
func pointwiseTestOp(t testing.TB, op kernels.PointwiseOp, a, b []int, alpha float64, dt tensor.Dtype) *specOp {
	t.Helper()
	out := tensor.Shape(a).Clone()
	if b != nil {
		var err error
		if out, err = broadcastShape(op.String(), a, b); err != nil {
			t.Fatal(err)
		}
	}
	s, err := newPointwiseShape(pointwiseShape{name: op.String(), op: op, argA: "a", argB: "b", a: a, b: b, out: out, alpha: alpha, dt: dt})
	if err != nil {
		t.Fatal(err)
	}
	return pointwiseOp(s)
}

// pointwiseOperands draws operands the op is defined and smooth on: a in
// (0, 1) for logs, roots and sigmoid's inverse (with some on its clamps),
// signed elsewhere; b away from 0. With special, a's first elements are
// NaN, +inf, -inf, -0, 0 and 1.
func pointwiseOperands(rng *rand.Rand, op kernels.PointwiseOp, a, b []int, dt tensor.Dtype, special bool) []*tensor.Dense {
	lo, hi := -3.0, 3.0
	switch op {
	case kernels.PointwiseLog, kernels.PointwiseSqrt, kernels.PointwiseSqrtGrad, kernels.PointwiseSigmoidGrad:
		lo, hi = 0.05, 1.1
	case kernels.PointwiseInverseSigmoid, kernels.PointwiseInverseSigmoidGrad:
		lo, hi = -0.1, 1.1 // some below 0 and above 1: the clamps
	}
	draw := func(shape []int, lo, hi float64, signed bool) []float64 {
		v := make([]float64, tensor.Shape(shape).TotalSize())
		for i := range v {
			v[i] = lo + (hi-lo)*rng.Float64()
			if signed && rng.IntN(2) == 0 {
				v[i] = -v[i]
			}
		}
		return v
	}
	var in []*tensor.Dense
	if op.Arity() >= 1 {
		v := draw(a, lo, hi, false)
		if special {
			for i, s := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), math.Copysign(0, -1), 0, 1} {
				if i < len(v) {
					v[i] = s
				}
			}
		}
		in = append(in, fromFloat64s(dt, v, a...))
	}
	if op.Arity() >= 2 {
		in = append(in, fromFloat64s(dt, draw(b, 0.5, 2, true), b...))
	}
	return in
}

// pointwiseGPUShapes are the operand shapes of TestGPUPointwiseParity:
// same shapes (DETR's tokens cut down, an odd size with a tail of n % 4),
// a bias broadcast over rows (v16b), ones on either side, an outer
// product of odd sizes (by element), a one-element operand, and a mask
// over attention's heads.
var pointwiseGPUShapes = []struct {
	name string
	a, b []int
}{
	{"same_2x300x256", []int{2, 300, 256}, []int{2, 300, 256}},
	{"same_odd", []int{37, 301}, []int{37, 301}},
	{"bias_2x300x256", []int{2, 300, 256}, []int{256}},
	{"ones_both_sides", []int{4, 1, 8}, []int{1, 5, 1}},
	{"outer_odd", []int{33, 1}, []int{1, 17}},
	{"one_element", []int{3, 1, 5}, []int{1}},
	{"heads_mask", []int{2, 8, 30, 300}, []int{2, 1, 30, 300}},
	{"channels", []int{2, 64, 10, 12}, []int{1, 64, 1, 1}},
}

// Every elementwise opcode on the GPU against the CPU twin, float64 to
// TolParity64 and float32 to TolParity32, same-shape and broadcast
// (binary opcodes) on pointwiseGPUShapes, with NaN, ±inf and -0 among the
// operands of the same-shape cases (NaN must come out where the CPU's is).
// Fill, which reads no operand, runs as the gradient of a sum to a scalar
// (TestGPUReduceParity).
func TestGPUPointwiseParity(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(26, 40))
	for op := kernels.PointwiseOp(0); op < kernels.PointwiseOps; op++ {
		if op == kernels.PointwiseFill {
			continue
		}
		for _, c := range pointwiseGPUShapes {
			if op.Arity() < 2 && !tensor.Shape(c.a).Eq(tensor.Shape(c.b)) {
				continue
			}
			var b []int
			if op.Arity() >= 2 {
				b = c.b
			}
			alpha := -1.5
			if op == kernels.PointwiseInverseSigmoid || op == kernels.PointwiseInverseSigmoidGrad {
				alpha = DefaultInverseSigmoidEps
			}
			for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
				t.Run(fmt.Sprintf("%v/%s/%v", op, c.name, dt), func(t *testing.T) {
					in := pointwiseOperands(rng, op, c.a, b, dt, tensor.Shape(c.a).Eq(tensor.Shape(c.b)))
					parityBy(t, dev, pointwiseTestOp(t, op, c.a, b, alpha, dt), []segment{{tol: parityTol(dt)}}, in...)
				})
			}
		}
	}
}

// reduceGPUCases are the sums of TestGPUReduceParity: every pass design
// and their sequences, at detector shapes cut down and whole.
var reduceGPUCases = []struct {
	name  string
	shape []int
	axes  []int
	keep  bool
}{
	{"attn_rows", []int{2, 8, 300, 300}, []int{-1}, false},        // rows warp
	{"short_rows", []int{50, 7}, []int{1}, true},                  // rows warp, 8 lanes
	{"long_rows", []int{6, 20000}, []int{1}, false},               // rows block, v16b
	{"long_odd_rows", []int{5, 4099}, []int{1}, false},            // rows block by element, parts
	{"everything", []int{2, 20000, 256}, nil, false},              // parts, then warp; a scalar
	{"bias_grad", []int{2, 20000, 256}, []int{0, 1}, false},       // cols with parts, then cols
	{"channel_sums", []int{2, 256, 50, 60}, []int{0, 2, 3}, true}, // rows, then cols
	{"narrow_cols", []int{3, 5000, 7}, []int{1}, false},           // cols, bx 8
	{"middle", []int{4, 300, 33}, []int{1}, false},                // cols, odd columns
	{"axis_of_one", []int{4, 1, 33}, []int{1}, false},             // a copy
}

func reduceTestOp(t testing.TB, shape, axes []int, keep, mean bool, dt tensor.Dtype) *specOp {
	t.Helper()
	g := G.NewGraph()
	x := G.NewTensor(g, dt, len(shape), G.WithShape(shape...), G.WithName("x"))
	build := Sum
	if mean {
		build = Mean
	}
	y, err := build(x, axes, keep)
	if err != nil {
		t.Fatal(err)
	}
	return y.Op().(*specOp)
}

// Sum and Mean on the GPU against the CPU twin, to TolParity64 and
// TolParity32, on every pass design, and their backward ops (the
// broadcast of dy back over x).
func TestGPUReduceParity(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(26, 41))
	for _, c := range reduceGPUCases {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			for _, mean := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%v/mean=%t", c.name, dt, mean), func(t *testing.T) {
					op := reduceTestOp(t, c.shape, c.axes, c.keep, mean, dt)
					x := randTensor(rng, dt, -1, 1, c.shape...)
					parityBy(t, dev, op, []segment{{tol: parityTol(dt)}}, x)
					s := op.opSpec
					if s.out.Dims() == 0 {
						scalarGradParity(t, dev, op, x)
						return
					}
					dy := randTensor(rng, dt, -1, 1, s.out...)
					grad := reduceGradTestOp(t, op, dt)
					parityBy(t, dev, grad, []segment{{tol: parityTol(dt)}}, dy)
				})
			}
		}
	}
}

// scalarGradParity checks the gradient of a sum to a scalar on the GPU:
// gorgonia hands it dy as a host scalar, which it spreads (times 1/count
// for a mean) over x's shape on x's device.
func scalarGradParity(t *testing.T, dev *backend.Device, op *specOp, x *tensor.Dense) {
	t.Helper()
	dt := x.Dtype()
	grad := reduceGradTestOp(t, op, dt)
	var dy G.Value = G.NewF64(0.75)
	if dt == tensor.Float32 {
		dy = G.NewF32(0.75)
	}
	want, err := grad.Do(x, dy)
	if err != nil {
		t.Fatalf("CPU: %v", err)
	}
	xd := toDev(t, dev, x)
	defer dev.FreeDense(xd)
	got, err := grad.Do(xd, dy)
	if err != nil {
		t.Fatalf("GPU: %v", err)
	}
	if err := autograd.TolParity64.Compare(fromDev(t, dev, got), toFloat64s(t, want)); err != nil {
		t.Errorf("%v: GPU vs CPU: %v", grad, err)
	}
}

// reduceGradTestOp is the backward op of the sum op: dy -> dx, or (x, dy)
// -> dx for a sum to a scalar.
func reduceGradTestOp(t testing.TB, op *specOp, dt tensor.Dtype) *specOp {
	t.Helper()
	g := G.NewGraph()
	x := G.NewTensor(g, dt, op.inputs[0].shape.Dims(), G.WithShape(op.inputs[0].shape...), G.WithName("x"))
	y, err := G.ApplyOp(op, x)
	if err != nil {
		t.Fatal(err)
	}
	dy := G.NewScalar(g, dt, G.WithName("dy"))
	if y.Shape().Dims() > 0 {
		dy = G.NewTensor(g, dt, y.Shape().Dims(), G.WithShape(y.Shape()...), G.WithName("dy"))
	}
	grads, err := op.SymDiff(G.Nodes{x}, y, dy)
	if err != nil {
		t.Fatal(err)
	}
	return grads[0].Op().(*specOp)
}

// The sums' promise (kernels/pointwise.cu, kernels/reduce.go): the kernels
// add in the twin's order, so they give its bits. A zero tolerance.
func TestGPUReduceBitForBit(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(26, 42))
	for _, c := range reduceGPUCases {
		for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
			t.Run(fmt.Sprintf("%s/%v", c.name, dt), func(t *testing.T) {
				op := reduceTestOp(t, c.shape, c.axes, c.keep, true, dt)
				parityBy(t, dev, op, []segment{{tol: autograd.Tolerance{}}}, randTensor(rng, dt, -1, 1, c.shape...))
			})
		}
	}
}

// Gradient checks on the GPU, float64, of a graph of the elementwise ops
// and the sums: inputs and the loss on the host, ToDevice and ToHost
// around the ops; x feeds two ops, so gorgonia adds its gradients on the
// device.
func TestGPUPointwiseGradCheck(t *testing.T) {
	dev := gpu(t)
	engine := G.WithEngine(dev.Engine())
	rng := rand.New(rand.NewPCG(26, 43))
	inputs := []autograd.Input{
		{Name: "x", Value: randTensor(rng, tensor.Float64, 0.1, 0.9, 2, 3, 4)},
		{Name: "bias", Value: randTensor(rng, tensor.Float64, -1, 1, 4)},
		{Name: "scale", Value: randTensor(rng, tensor.Float64, 0.5, 2, 3, 1)},
	}
	_, err := autograd.CheckGrad(func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
		var d G.Nodes
		for _, n := range in {
			v, err := ToDevice(n, dev)
			if err != nil {
				return nil, err
			}
			d = append(d, v)
		}
		x, bias, scale := d[0], d[1], d[2]
		h := G.Must(Add(x, bias))                            // [2 3 4] + [4]
		h = G.Must(Mul(G.Must(Sigmoid(h)), scale))           // * [3 1]
		h = G.Must(Div(h, G.Must(Sqrt(G.Must(Exp(scale)))))) // / [3 1]
		u := G.Must(InverseSigmoid(x, 0))
		h = G.Must(Sub(h, G.Must(Square(G.Must(Scale(u, 0.5))))))
		h = G.Must(Add(G.Must(ReLU(h)), G.Must(Log(x))))
		y := G.Must(Mean(h, []int{0, 2}, true)) // [1 3 1]
		return ToHost(y)
	}, inputs, 7, engine)
	if err != nil {
		t.Error(err)
	}
}

// BenchmarkGPUPointwise times the elementwise ops at DETR's shapes,
// float32: the encoder's tokens [2, 20000, 256] (same-shape Add, Sub and
// Div, a bias [256] broadcast over them, Scale, ReLU, Sigmoid,
// InverseSigmoid, Log, Sqrt, Square, the ReLU backward) and
// attention's scores [2, 8, 300, 300] (Exp, and a mask [2, 1, 300, 300]
// broadcast over the heads). CUDA events around each call, the median of
// b.N (run with -test.benchtime 30x), GB/s of the compulsory bytes (each
// operand read once, the output written once) and its share of the
// measured copy bandwidth (%copy). kernels/bench/anchors_pointwise.py
// times PyTorch eager on the same shapes and prints both side by side.
func BenchmarkGPUPointwise(b *testing.B) {
	dt := tensor.Float32
	for _, c := range pointwiseBenchCases {
		rng := rand.New(rand.NewPCG(1, 1))
		op := pointwiseTestOp(b, c.op, c.a, c.b, c.alpha, dt)
		in := pointwiseOperands(rng, c.op, c.a, c.b, dt, false)
		bytes := 0.0
		for _, d := range in {
			bytes += float64(4 * d.Shape().TotalSize())
		}
		bytes += float64(4 * op.out.TotalSize())
		b.Run(fmt.Sprintf("impl=cuda/dtype=%v/case=%s", dt, c.name), func(b *testing.B) {
			runCase(b, "cuda", op, in, bytes)
		})
	}
}

// pointwiseBenchCases are BenchmarkGPUPointwise's cases (and
// anchors_pointwise.py's).
var pointwiseBenchCases = []struct {
	name  string
	op    kernels.PointwiseOp
	a, b  []int
	alpha float64 // Scale's factor, InverseSigmoid's eps
}{
	{"add_2x20000x256", kernels.PointwiseAdd, []int{2, 20000, 256}, []int{2, 20000, 256}, 0},
	{"add_bias_2x20000x256+256", kernels.PointwiseAdd, []int{2, 20000, 256}, []int{256}, 0},
	{"sub_2x20000x256", kernels.PointwiseSub, []int{2, 20000, 256}, []int{2, 20000, 256}, 0},
	{"div_2x20000x256", kernels.PointwiseDiv, []int{2, 20000, 256}, []int{2, 20000, 256}, 0},
	{"scale_2x20000x256", kernels.PointwiseScale, []int{2, 20000, 256}, nil, 0.5},
	{"relu_2x20000x256", kernels.PointwiseReLU, []int{2, 20000, 256}, nil, 0},
	{"sigmoid_2x20000x256", kernels.PointwiseSigmoid, []int{2, 20000, 256}, nil, 0},
	{"inverse_sigmoid_2x20000x256", kernels.PointwiseInverseSigmoid, []int{2, 20000, 256}, nil, 1e-5},
	{"log_2x20000x256", kernels.PointwiseLog, []int{2, 20000, 256}, nil, 0},
	{"sqrt_2x20000x256", kernels.PointwiseSqrt, []int{2, 20000, 256}, nil, 0},
	{"square_2x20000x256", kernels.PointwiseSquare, []int{2, 20000, 256}, nil, 0},
	{"relu_bwd_2x20000x256", kernels.PointwiseReLUGrad, []int{2, 20000, 256}, []int{2, 20000, 256}, 0},
	{"exp_2x8x300x300", kernels.PointwiseExp, []int{2, 8, 300, 300}, nil, 0},
	{"mul_2x8x300x300", kernels.PointwiseMul, []int{2, 8, 300, 300}, []int{2, 8, 300, 300}, 0},
	{"add_mask_2x8x300x300+2x1x300x300", kernels.PointwiseAdd, []int{2, 8, 300, 300}, []int{2, 1, 300, 300}, 0},
}

// BenchmarkGPUReduce times the sums at detector shapes, float32: DETR's
// bias gradient (the column sums of [2, 20000, 256] over its 40,000 rows),
// attention's row sums (the last axis of [2, 8, 300, 300]), everything of
// the tokens to a scalar, and the channel sums of an FPN map [2, 256, 100,
// 152] over N, H and W (BatchNorm's), and the mean of the tokens over
// each image (Mean). GB/s of x read once and the sums written; the timing
// as BenchmarkGPUPointwise's. anchors_pointwise.py times torch.sum and
// torch.mean on the same.
func BenchmarkGPUReduce(b *testing.B) {
	dt := tensor.Float32
	for _, c := range reduceBenchCases {
		rng := rand.New(rand.NewPCG(1, 2))
		op := reduceTestOp(b, c.shape, c.axes, false, c.mean, dt)
		x := randTensor(rng, dt, -1, 1, c.shape...)
		bytes := float64(4 * (tensor.Shape(c.shape).TotalSize() + op.out.TotalSize()))
		b.Run(fmt.Sprintf("impl=cuda/dtype=%v/case=%s", dt, c.name), func(b *testing.B) {
			runCase(b, "cuda", op, []*tensor.Dense{x}, bytes)
		})
	}
}

// reduceBenchCases are BenchmarkGPUReduce's cases (and
// anchors_pointwise.py's).
var reduceBenchCases = []struct {
	name  string
	shape []int
	axes  []int
	mean  bool
}{
	{"bias_grad_2x20000x256", []int{2, 20000, 256}, []int{0, 1}, false},
	{"rows_2x8x300x300", []int{2, 8, 300, 300}, []int{-1}, false},
	{"all_2x20000x256", []int{2, 20000, 256}, nil, false},
	{"channels_2x256x100x152", []int{2, 256, 100, 152}, []int{0, 2, 3}, false},
	{"mean_tokens_2x20000x256", []int{2, 20000, 256}, []int{1}, true},
}
