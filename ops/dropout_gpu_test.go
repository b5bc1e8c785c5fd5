package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
)

// dropoutGPUShape returns a Dropout node's shape for x of the given shape,
// stream and p, on a DropoutRNG of seed at step.
func dropoutGPUShape(x []int, p float64, seed uint64, stream uint32, step uint64, dt tensor.Dtype) dropoutShape {
	r := NewDropoutRNG(seed)
	r.SetStep(step)
	return dropoutShape{x: tensor.Shape(x).Clone(), p: p, rng: r, stream: stream, dt: dt}
}

// Dropout's forward and backward ops on the GPU against their CPU twins,
// bit for bit (the design's promise, kernels/dropout.cu: the same mask
// from the same counter, and one rounded product per element): DETR's
// encoder tokens, lengths that are not a multiple of four, steps above
// 2^32, several streams and p, NaN and infinities in x, and outside
// training (the identity).
func TestGPUDropoutParity(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(26, 80))
	for _, c := range []struct {
		x      []int
		p      float64
		stream uint32
		step   uint64
		eval   bool
	}{
		{x: []int{2, 20000, 256}, p: 0.1},
		{x: []int{2, 300, 256}, p: 0.1, stream: 5, step: 17},
		{x: []int{7}, p: 0.5},
		{x: []int{3, 5, 7}, p: 0.9, step: 1<<32 + 3},
		{x: []int{1021}, p: 0.3, stream: 1<<32 - 1, step: math.MaxUint64},
		{x: []int{64, 33}, p: 0.5, eval: true},
	} {
		for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
			name := fmt.Sprintf("%v/x=%v/p=%v/stream=%d/step=%d/eval=%t", dt, c.x, c.p, c.stream, c.step, c.eval)
			t.Run(name, func(t *testing.T) {
				s := dropoutGPUShape(c.x, c.p, 0x5eed, c.stream, c.step, dt)
				s.rng.SetTraining(!c.eval)
				x := randTensor(rng, dt, -1, 1, c.x...)
				xs := toFloat64s(t, x)
				for i := 0; i < len(xs); i += 97 {
					xs[i] = [...]float64{math.NaN(), math.Inf(1), math.Inf(-1)}[i%3]
				}
				x = fromFloat64s(dt, xs, c.x...)
				for _, op := range []*specOp{dropoutOp(s, false), dropoutOp(s, true)} {
					t.Run(op.kindName(), func(t *testing.T) {
						parityBy(t, dev, op, []segment{{tol: autograd.Tolerance{}}}, x)
					})
				}
			})
		}
	}
}

// BenchmarkGPUDropout times Dropout (p = 0.1, float32) on DETR's encoder
// tokens, [2, 20000, 256]: fwd the forward op, bwd the backward (the same
// kernel on dy). CUDA events around each call, the median of b.N (run
// with -test.benchtime 30x), GB/s of the compulsory bytes: x (dy) read and
// y (dx) written; the mask is drawn, never read.
// kernels/bench/anchors_dropout.py times PyTorch's F.dropout on the same
// shape and prints the two side by side.
func BenchmarkGPUDropout(b *testing.B) {
	shape := []int{2, 20000, 256}
	dt := tensor.Float32
	rng := rand.New(rand.NewPCG(26, 81))
	s := dropoutGPUShape(shape, 0.1, 1, 0, 0, dt)
	x := randTensor(rng, dt, -1, 1, shape...)
	bytes := float64(2 * x.Shape().TotalSize() * int(dt.Size()))
	for i, pass := range []string{"fwd", "bwd"} {
		b.Run(fmt.Sprintf("impl=cuda/dtype=%v/case=detr_encoder_2x20000x256/pass=%s", dt, pass), func(b *testing.B) {
			runCase(b, "cuda", dropoutOp(s, i == 1), []*tensor.Dense{x}, bytes)
		})
	}
}
