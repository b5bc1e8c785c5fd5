package ops

// Tests of the full-float32 convolutions: on a device whose GemmMath is
// GemmExact (convTF32), every float32 convolution GEMM runs on conv.cu's
// fma_m64_i64_f32 kernels with no operand rounded to TF32. Like the other
// GPU tests they need a binary built with -tags stheno_cuda and a GPU, and
// skip visibly anywhere else.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/backend"
)

// onDevice wraps build to run on dev: its inputs go to the device, its
// output comes back to the host.
func onDevice(dev *backend.Device, build convBuilder) convBuilder {
	return func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
		d := make(G.Nodes, len(in))
		for i, n := range in {
			var err error
			if d[i], err = ToDevice(n, dev); err != nil {
				return nil, err
			}
		}
		y, err := build(g, d)
		if err != nil {
			return nil, err
		}
		return ToHost(y)
	}
}

// maxAbsDiff is the largest |got - want| over the elements.
func maxAbsDiff(got, want []float64) float64 {
	d := 0.0
	for i := range min(len(got), len(want)) {
		d = max(d, math.Abs(got[i]-want[i]))
	}
	return d
}

// A graph of Conv, ConvBN or ConvTranspose, forward and backward (the
// gradients of sum(y ⊙ proj) with respect to every input) through a
// TapeMachine on the GPU in float32 with GemmExact, against the same graph
// in float64 on the CPU on the same values: TolGemm32 (float32
// accumulation) for the output and every gradient. The same graph with the
// device's default TF32 GEMMs must be further from the float64 result, in
// the output and the gradients of x and w (what the GEMMs compute), by at
// least 16 times (TF32 drops 13 of float32's 23 mantissa bits): the flag
// really changes the math. The cases cover each GEMM's paths in
// miniature: a bias and ReLU (dy masked by convGradOp), a stride (the
// strided dgrad GEMM), two row tiles and split-K wgrad, ConvBN in training
// with a residual and ReLU (dz from BatchNorm's backward pass) and in
// inference, ConvTranspose by depth to space and by the strided dgrad GEMM.
// Inputs in [-1, 1] and weights in [-0.5, 0.5] keep every result's natural
// size within TolGemm32's and TolTF32's regime (up to 5).
func TestGPUConvGemmExact(t *testing.T) {
	dev := gpu(t)
	defer dev.SetGemmMath(dev.GemmMath())
	type input struct {
		shape  []int
		lo, hi float64
	}
	bn := func(c int, training bool) bnLayer {
		rm, rv := make([]float64, c), make([]float64, c)
		for i := range c {
			rm[i], rv[i] = 0.1*float64(i%3)-0.1, 0.8+0.1*float64(i%4)
		}
		return bnLayer{rm: rm, rv: rv, momentum: 0.1, eps: 1e-5, training: training}
	}
	s2 := ConvTransposeConfig{Stride: [2]int{2, 2}, Act: ActReLU}
	for ci, c := range []struct {
		name  string
		in    []input
		build convBuilder
		path  convTPath // ConvTranspose's forward path, forced
	}{
		{"Conv/3x3 pad 1 bias relu", []input{{[]int{2, 5, 9, 11}, -1, 1}, {[]int{7, 5, 3, 3}, -0.5, 0.5}, {[]int{7}, -0.5, 0.5}},
			convWith(ConvConfig{Pad: [2]int{1, 1}, Act: ActReLU}), convTPathAuto},
		{"Conv/3x3 stride 2 pad 1", []input{{[]int{2, 4, 9, 10}, -1, 1}, {[]int{6, 4, 3, 3}, -0.5, 0.5}},
			convWith(ConvConfig{Stride: [2]int{2, 2}, Pad: [2]int{1, 1}}), convTPathAuto},
		{"Conv/3x3 70 channels bias relu", []input{{[]int{2, 12, 14, 14}, -1, 1}, {[]int{70, 12, 3, 3}, -0.25, 0.25}, {[]int{70}, -0.5, 0.5}},
			convWith(ConvConfig{Pad: [2]int{1, 1}, Act: ActReLU}), convTPathAuto},
		{"ConvBN/train stride 2 residual relu", []input{{[]int{2, 3, 9, 8}, -1, 1}, {[]int{6, 3, 3, 3}, -0.5, 0.5},
			{[]int{6}, 0.5, 1.5}, {[]int{6}, -0.5, 0.5}, {[]int{2, 6, 5, 4}, -1, 1}},
			convBNWith(ConvConfig{Stride: [2]int{2, 2}, Pad: [2]int{1, 1}, Act: ActReLU}, bn(6, true), nil), convTPathAuto},
		{"ConvBN/eval 1x1 relu", []input{{[]int{2, 6, 4, 5}, -1, 1}, {[]int{7, 6, 1, 1}, -0.5, 0.5},
			{[]int{7}, 0.5, 1.5}, {[]int{7}, -0.5, 0.5}},
			convBNWith(ConvConfig{Act: ActReLU}, bn(7, false), nil), convTPathAuto},
		{"ConvTranspose/2x2 stride 2 bias relu, depth to space", []input{{[]int{2, 6, 5, 5}, -1, 1}, {[]int{6, 4, 2, 2}, -0.5, 0.5}, {[]int{4}, -0.5, 0.5}},
			convTransposeWith(s2), convTPathD2S},
		{"ConvTranspose/2x2 stride 2 bias relu, strided dgrad", []input{{[]int{2, 6, 5, 5}, -1, 1}, {[]int{6, 4, 2, 2}, -0.5, 0.5}, {[]int{4}, -0.5, 0.5}},
			convTransposeWith(s2), convTPathDgrad},
		{"ConvTranspose/3x3 stride 2 pad 1 output pad 1", []input{{[]int{2, 5, 6, 7}, -1, 1}, {[]int{5, 3, 3, 3}, -0.5, 0.5}},
			convTransposeWith(ConvTransposeConfig{Stride: [2]int{2, 2}, Pad: [2]int{1, 1}, OutputPad: [2]int{1, 1}}), convTPathAuto},
	} {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(ci), 77))
			var in32, in64 []*tensor.Dense
			for _, d := range c.in {
				v := randTensor(rng, tensor.Float32, d.lo, d.hi, d.shape...)
				in32, in64 = append(in32, v), append(in64, cast(t, v, tensor.Float64))
			}
			_, yShape, err := runGraph(t, in64, c.build)
			if err != nil {
				t.Fatal(err)
			}
			proj32 := randTensor(rng, tensor.Float32, -1, 1, yShape...)
			want, wantGrads, err := runWithGrads(t, in64, cast(t, proj32, tensor.Float64), c.build)
			if err != nil {
				t.Fatal(err)
			}
			run := func(gm backend.GemmMath) ([]float64, [][]float64) {
				t.Helper()
				dev.SetGemmMath(gm)
				var y []float64
				var grads [][]float64
				withConvTPath(dev, c.path, func() {
					y, grads, err = runWithGrads(t, in32, proj32, onDevice(dev, c.build), G.WithEngine(dev.Engine()))
				})
				if err != nil {
					t.Fatalf("%v: %v", gm, err)
				}
				return y, grads
			}
			exactY, exactGrads := run(backend.GemmExact)
			tf32Y, tf32Grads := run(backend.GemmTF32)
			names := []string{"y", "dx", "dw", "dbias"}
			if strings.HasPrefix(c.name, "ConvBN") {
				names = []string{"y", "dx", "dw", "dgamma", "dbeta", "dresidual"}
			}
			got := append([][]float64{exactY}, exactGrads...)
			tf32 := append([][]float64{tf32Y}, tf32Grads...)
			for i, w := range append([][]float64{want}, wantGrads...) {
				if err := autograd.TolGemm32.Compare(got[i], w); err != nil {
					t.Errorf("%s, GemmExact vs float64: %v", names[i], err)
				}
				t.Logf("%s: GemmExact vs float64: the worst element at %.3g of TolGemm32; max |diff| %.3g, TF32's %.3g",
					names[i], autograd.TolGemm32.Worst(got[i], w), maxAbsDiff(got[i], w), maxAbsDiff(tf32[i], w))
				if i > 2 {
					continue // sums the GEMMs do not compute
				}
				if e, f := maxAbsDiff(got[i], w), maxAbsDiff(tf32[i], w); !(16*e <= f) {
					t.Errorf("%s: GemmExact is %.3g from float64, TF32 %.3g: want TF32 at least 16 times further", names[i], e, f)
				}
			}
		})
	}
}

// convTF32 decides for every float32 convolution on the device: TF32 by
// default and after SetGemmMath(GemmTF32), full float32 after
// SetGemmMath(GemmExact); float64 never TF32. convGPUOf follows it.
func TestGPUConvTF32FollowsGemmMath(t *testing.T) {
	dev := gpu(t)
	defer dev.SetGemmMath(dev.GemmMath())
	for _, c := range []struct {
		math backend.GemmMath
		tf32 bool
	}{{backend.GemmTF32, true}, {backend.GemmExact, false}} {
		dev.SetGemmMath(c.math)
		what := fmt.Sprintf("GemmMath %v", c.math)
		if got := convTF32(dev, tensor.Float32); got != c.tf32 {
			t.Errorf("%s: convTF32(float32) = %t, want %t", what, got, c.tf32)
		}
		if convTF32(dev, tensor.Float64) {
			t.Errorf("%s: convTF32(float64) = true", what)
		}
		if got := convGPUOf(dev).exact; got == c.tf32 {
			t.Errorf("%s: convGPUOf(dev).exact = %t", what, got)
		}
	}
}
