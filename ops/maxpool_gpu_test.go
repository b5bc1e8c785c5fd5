package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// maxPoolGPUCase is a MaxPool2d's x shape, config and inputs' character.
type maxPoolGPUCase struct {
	x       []int
	cfg     MaxPool2dConfig
	ties    bool // x of four values only: many ties
	special bool // NaN and -inf planted
}

func (c maxPoolGPUCase) String() string {
	return fmt.Sprintf("x=%v/k=%v/s=%v/p=%v/ties=%t/special=%t", c.x, c.cfg.Kernel, c.cfg.Stride, c.cfg.Pad, c.ties, c.special)
}

var (
	maxPoolStem = MaxPool2dConfig{Kernel: [2]int{3, 3}, Stride: [2]int{2, 2}, Pad: [2]int{1, 1}}
	maxPoolP6   = MaxPool2dConfig{Kernel: [2]int{1, 1}, Stride: [2]int{2, 2}}
)

// maxPoolGPUCases: the ResNet stem's pooling at Mask R-CNN's shape
// ([2, 64, 400, 608]), FPN's P6 on the coarsest level, overlapping,
// disjoint and rectangular windows, ties, NaN and -inf; both backward
// kernels (tiled, and one case too large for it).
var maxPoolGPUCases = []maxPoolGPUCase{
	{x: []int{2, 64, 400, 608}, cfg: maxPoolStem},
	{x: []int{2, 256, 25, 38}, cfg: maxPoolP6},
	{x: []int{2, 5, 37, 29}, cfg: maxPoolStem, ties: true},
	{x: []int{2, 5, 37, 29}, cfg: maxPoolStem, special: true},
	{x: []int{3, 4, 16, 17}, cfg: MaxPool2dConfig{Kernel: [2]int{2, 2}}, ties: true},
	{x: []int{1, 3, 11, 13}, cfg: MaxPool2dConfig{Kernel: [2]int{3, 3}, Stride: [2]int{1, 1}, Pad: [2]int{1, 1}}, ties: true, special: true},
	{x: []int{1, 2, 9, 14}, cfg: MaxPool2dConfig{Kernel: [2]int{3, 2}, Stride: [2]int{1, 3}, Pad: [2]int{1, 1}}, ties: true},
	{x: []int{2, 3, 70, 45}, cfg: MaxPool2dConfig{Kernel: [2]int{3, 3}, Stride: [2]int{1, 1}, Pad: [2]int{1, 1}}, special: true},
	{x: []int{1, 3, 70, 45}, cfg: maxPoolStem, ties: true, special: true},
	// Windows too many for a tile's shared memory: maxpool_bwd (and P6 above).
	{x: []int{1, 2, 30, 37}, cfg: MaxPool2dConfig{Kernel: [2]int{12, 12}, Stride: [2]int{1, 1}, Pad: [2]int{6, 6}}, ties: true},
}

// maxPoolGPUChecks returns the case's two ops with inputs drawn for them:
// the forward (x) and the backward (x, dy).
func maxPoolGPUChecks(t testing.TB, rng *rand.Rand, c maxPoolGPUCase, dt tensor.Dtype) (ops []*specOp, inputs [][]*tensor.Dense) {
	t.Helper()
	g := G.NewGraph()
	s, err := maxPoolShapeOf(G.NewTensor(g, dt, 4, G.WithShape(c.x...)), c.cfg)
	if err != nil {
		t.Fatal(err)
	}
	x := randTensor(rng, dt, -1, 1, c.x...)
	if c.ties || c.special {
		xs := toFloat64s(t, x)
		for i := range xs {
			if c.ties {
				xs[i] = float64(rng.IntN(4))
			}
			if c.special {
				switch rng.IntN(12) {
				case 0:
					xs[i] = math.NaN()
				case 1, 2, 3:
					xs[i] = math.Inf(-1)
				}
			}
		}
		x = fromFloat64s(dt, xs, c.x...)
	}
	dy := randTensor(rng, dt, -1, 1, s.y...)
	return []*specOp{maxPoolOp(s), maxPoolGradOp(s)}, [][]*tensor.Dense{{x}, {x, dy}}
}

// MaxPool2d's two ops on the GPU against their CPU twins, to TolParity32
// and TolParity64.
func TestGPUMaxPool2dParity(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(26, 60))
	for _, c := range maxPoolGPUCases {
		opsParity(t, dev, c.String(), []tensor.Dtype{tensor.Float32, tensor.Float64}, parityTol, func(t *testing.T, dt tensor.Dtype) ([]*specOp, [][]*tensor.Dense) {
			return maxPoolGPUChecks(t, rng, c, dt)
		})
	}
}

// The design's promise (kernels/maxpool.cu): the same winners as the CPU
// twins, and each dx the same sum in the same order: the twins' bits, NaN
// where they have NaN. A zero tolerance.
func TestGPUMaxPool2dBitForBit(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(26, 61))
	for _, c := range maxPoolGPUCases {
		opsParity(t, dev, c.String(), []tensor.Dtype{tensor.Float32, tensor.Float64}, exactTol, func(t *testing.T, dt tensor.Dtype) ([]*specOp, [][]*tensor.Dense) {
			return maxPoolGPUChecks(t, rng, c, dt)
		})
	}
}

// BenchmarkGPUMaxPool2d times MaxPool2d in float32 at Mask R-CNN's shapes:
// the ResNet-50 stem's pooling (kernel 3, stride 2, padding 1) of [2, 64,
// 400, 608] (two 800x1216 images after the stem's convolution) and FPN's
// P6 (kernel 1, stride 2) of [2, 256, 25, 38]. fwd is the forward op, bwd
// the backward (x and dy -> dx). CUDA events around each call, the median
// of b.N (run with -test.benchtime 30x), GB/s of the compulsory bytes: x
// read and y written (fwd); x and dy read and dx written (bwd).
// kernels/bench/anchors_maxpool.py times PyTorch's F.max_pool2d on the
// same shapes and prints the two side by side.
func BenchmarkGPUMaxPool2d(b *testing.B) {
	for _, c := range []struct {
		name string
		x    []int
		cfg  MaxPool2dConfig
	}{
		{"resnet_stem_2x64x400x608", []int{2, 64, 400, 608}, maxPoolStem},
		{"fpn_p6_2x256x25x38", []int{2, 256, 25, 38}, maxPoolP6},
	} {
		dt := tensor.Float32
		rng := rand.New(rand.NewPCG(26, 62))
		ops, inputs := maxPoolGPUChecks(b, rng, maxPoolGPUCase{x: c.x, cfg: c.cfg}, dt)
		xBytes := float64(inputs[0][0].Shape().TotalSize() * int(dt.Size()))
		yBytes := float64(inputs[1][1].Shape().TotalSize() * int(dt.Size()))
		name := func(pass string) string {
			return fmt.Sprintf("impl=cuda/dtype=%v/case=%s/pass=%s", dt, c.name, pass)
		}
		b.Run(name("fwd"), func(b *testing.B) {
			runCase(b, "cuda", ops[0], inputs[0], xBytes+yBytes)
		})
		b.Run(name("bwd"), func(b *testing.B) {
			runCase(b, "cuda", ops[1], inputs[1], 2*xBytes+yBytes)
		})
	}
}
