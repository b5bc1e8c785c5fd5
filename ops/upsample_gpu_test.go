package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

// upsampleGPUCase is an UpsampleNearest's x shape and factor.
type upsampleGPUCase struct {
	x      []int
	factor int
}

func (c upsampleGPUCase) String() string { return fmt.Sprintf("x=%v/factor=%d", c.x, c.factor) }

// upsampleGPUCases: FPN's top-down steps at Mask R-CNN's shapes (factor 2,
// P5 to P4 and P3 to P2 of two 800x1216 images), odd and one-pixel widths,
// factor 1 (a copy), 3 and 4 (the generic kernels).
var upsampleGPUCases = []upsampleGPUCase{
	{x: []int{2, 256, 25, 38}, factor: 2},
	{x: []int{2, 256, 100, 152}, factor: 2},
	{x: []int{2, 3, 5, 7}, factor: 2},
	{x: []int{1, 4, 3, 1}, factor: 2},
	{x: []int{3, 2, 4, 5}, factor: 1},
	{x: []int{2, 3, 5, 7}, factor: 3},
	{x: []int{1, 2, 9, 13}, factor: 4},
}

// upsampleGPUChecks returns the case's two ops with inputs drawn for them:
// the forward (x) and the backward (dy). NaN and infinities are planted
// (a block's sum is NaN, or infinite, where the CPU's is).
func upsampleGPUChecks(t testing.TB, rng *rand.Rand, c upsampleGPUCase, dt tensor.Dtype) ([]*specOp, [][]*tensor.Dense) {
	t.Helper()
	s := upsampleShape{x: tensor.Shape(c.x).Clone(), factor: c.factor, dt: dt}
	x := randTensor(rng, dt, -1, 1, c.x...)
	dys := toFloat64s(t, randTensor(rng, dt, -1, 1, s.yShape()...))
	for i := range dys {
		switch rng.IntN(1000) {
		case 0:
			dys[i] = math.NaN()
		case 1:
			dys[i] = math.Inf(1)
		}
	}
	dy := fromFloat64s(dt, dys, s.yShape()...)
	return []*specOp{upsampleOp(s), upsampleGradOp(s)}, [][]*tensor.Dense{{x}, {dy}}
}

// UpsampleNearest's two ops on the GPU against their CPU twins, to
// TolParity32 and TolParity64.
func TestGPUUpsampleNearestParity(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(32, 1))
	for _, c := range upsampleGPUCases {
		opsParity(t, dev, c.String(), []tensor.Dtype{tensor.Float32, tensor.Float64}, parityTol, func(t *testing.T, dt tensor.Dtype) ([]*specOp, [][]*tensor.Dense) {
			return upsampleGPUChecks(t, rng, c, dt)
		})
	}
}

// The design's promise (kernels/upsample.cu): the forward copies, and each
// dx is the same sum in the same order as the CPU twin's: its bits. A zero
// tolerance.
func TestGPUUpsampleNearestBitForBit(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(32, 2))
	for _, c := range upsampleGPUCases {
		opsParity(t, dev, c.String(), []tensor.Dtype{tensor.Float32, tensor.Float64}, exactTol, func(t *testing.T, dt tensor.Dtype) ([]*specOp, [][]*tensor.Dense) {
			return upsampleGPUChecks(t, rng, c, dt)
		})
	}
}

// Factor 2 on tensors that do not start aligned for the _x2_vec2 kernels'
// vectors (an element past a buffer's start): the launcher takes the
// generic kernels, which give the CPU twin's bits too.
func TestGPUUpsampleNearestUnaligned(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(32, 3))
	c := upsampleGPUCase{x: []int{2, 3, 5, 7}, factor: 2}
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		t.Run(dt.String(), func(t *testing.T) {
			ops, inputs := upsampleGPUChecks(t, rng, c, dt)
			s := upsampleShape{x: tensor.Shape(c.x), factor: c.factor, dt: dt}
			for i, backward := range []bool{false, true} {
				in := inputs[i][0]
				want, err := ops[i].Do(in)
				if err != nil {
					t.Fatal(err)
				}
				n, m := in.Shape().TotalSize(), want.Shape().TotalSize()
				// in and the output one element into buffers one element longer.
				inBuf := toDev(t, dev, fromFloat64s(dt, append([]float64{0}, toFloat64s(t, in)...), n+1))
				outBuf := toDev(t, dev, fromFloat64s(dt, filled(m+1, math.NaN()), m+1))
				elem := backend.DevicePtr(dt.Size())
				inPtr, outPtr := devPtr(t, dev, inBuf)+elem, devPtr(t, dev, outBuf)+elem
				if err := s.launch("test", dev, backward, inPtr, outPtr); err != nil {
					t.Fatal(err)
				}
				got := fromDev(t, dev, outBuf)[1:]
				if err := exactTol(dt).Compare(got, toFloat64s(t, want)); err != nil {
					t.Errorf("backward=%t: GPU vs CPU: %v", backward, err)
				}
			}
		})
	}
}

// BenchmarkGPUUpsampleNearest times UpsampleNearest in float32 on FPN's
// top-down path at Mask R-CNN's shapes (two 800x1216 images, 256
// channels, factor 2): P5 [2, 256, 25, 38] to P4's size, P4 to P3's and P3
// [2, 256, 100, 152] to P2's. fwd is the forward op, bwd the backward (dy
// -> dx). CUDA events around each call, the median of b.N (run with
// -test.benchtime 30x), GB/s of the compulsory bytes: x read and y written
// (fwd), dy read and dx written (bwd), 5 times x's bytes either way.
func BenchmarkGPUUpsampleNearest(b *testing.B) {
	for _, c := range []struct {
		name string
		x    []int
	}{
		{"fpn_p5_2x256x25x38", []int{2, 256, 25, 38}},
		{"fpn_p4_2x256x50x76", []int{2, 256, 50, 76}},
		{"fpn_p3_2x256x100x152", []int{2, 256, 100, 152}},
	} {
		dt := tensor.Float32
		rng := rand.New(rand.NewPCG(32, 4))
		ops, inputs := upsampleGPUChecks(b, rng, upsampleGPUCase{x: c.x, factor: 2}, dt)
		bytes := 5 * float64(inputs[0][0].Shape().TotalSize()*int(dt.Size()))
		name := func(pass string) string {
			return fmt.Sprintf("impl=cuda/dtype=%v/case=%s/pass=%s", dt, c.name, pass)
		}
		b.Run(name("fwd"), func(b *testing.B) {
			runCase(b, "cuda", ops[0], inputs[0], bytes)
		})
		b.Run(name("bwd"), func(b *testing.B) {
			runCase(b, "cuda", ops[1], inputs[1], bytes)
		})
	}
}
