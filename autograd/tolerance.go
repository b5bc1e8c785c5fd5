package autograd

import (
	"fmt"
	"math"
)

// Tolerance bounds the error of a result against its reference element by
// element: |got - want| <= Abs + Rel*|want|.
type Tolerance struct {
	Abs, Rel float64
}

// The tolerance table. Every test in the project takes its bounds from here;
// none is ever loosened to make a test pass. The comment on each says where
// the remaining error comes from. The emulator's harnesses take a copy of it
// from kernels/emu/harness.h, which TestEmuHarnessTolerances keeps equal to it.
var (
	// TolForward64 compares a float64 kernel with a float64 reference that does
	// the same arithmetic in another order (hand-worked values, or the
	// generator script's PyTorch output): a few ulps of the result.
	TolForward64 = Tolerance{Abs: 1e-12, Rel: 1e-10}

	// TolForward32 compares a float32 kernel with a float64 reference. The
	// sums in these ops have at most a few thousand terms, each rounded to
	// float32 (2^-24 relative): a bound of 1e-5 relative plus 1e-6 absolute
	// leaves room for cancellation in sums of mixed-sign terms of order 1.
	TolForward32 = Tolerance{Abs: 1e-6, Rel: 1e-5}

	// TolGrad compares analytic float64 gradients with central differences
	// of step 1e-6: truncation error is O(1e-12)*f''' and rounding error
	// O(1e-16/1e-6) = 1e-10 per unit of loss. The relative term is measured
	// against the largest gradient entry of the input (see Result.MaxRel).
	TolGrad = Tolerance{Abs: 1e-8, Rel: 1e-6}

	// TolParity64 compares the GPU kernels with their CPU twins in float64.
	// The only difference is the order of atomic additions in backward
	// scatters and the GPU's fused multiply-adds: a few ulps.
	TolParity64 = Tolerance{Abs: 1e-12, Rel: 1e-10}

	// TolParity32 compares the GPU kernels with their CPU twins in float32:
	// fused multiply-adds and atomic ordering change the last bits of each
	// term; sums of up to a few thousand terms of order 1.
	//
	// MSDeformAttn's location gradients are compared in pixel units, divided
	// by their level's width or height: d/dloc = size * d/dpixel, and it is
	// the pixel-unit sum (channels x corners, terms of order 1) whose
	// rounding the two sides differ by, so its error grows with the map.
	// Rel bounds it alike in either unit; Abs is for the terms of order 1.
	// (Deformable-DETR's maps are up to 167 wide. On TARGETS.md's encoder,
	// GPU against CPU, the location gradients reach 3.25 times this bound in
	// raw units and 0.11 of it in pixel units.)
	TolParity32 = Tolerance{Abs: 1e-5, Rel: 1e-4}

	// TolTF32 compares a float32 kernel that multiplies on tensor cores in
	// TF32 (the convolutions on the GPU) with its CPU twin or a float64
	// reference. TF32 keeps 10 of float32's 23 mantissa bits: each operand
	// is rounded to nearest, off by up to 2^-11 (4.9e-4) of itself, so each
	// product is off by up to ~1e-3 of itself (~4e-4 rms), and a sum of K
	// products of rms size r by a random walk of ~4e-4*r*sqrt(K) (FP32
	// accumulation adds far less). Rel bounds sums whose terms share a
	// sign; Abs is five standard deviations of the walk for results of
	// natural size r*sqrt(K) up to 5, which the tests' shapes and input
	// ranges keep to.
	TolTF32 = Tolerance{Abs: 1e-2, Rel: 1e-3}

	// TolGemm32 compares a float32 GEMM that multiplies and accumulates in
	// full float32 (a convolution on a GPU whose GemmMath is GemmExact: a
	// chain of fused multiply-adds per output) with a float64 reference on
	// the same inputs. No product is rounded; each of the K additions
	// rounds the running sum, of size r*sqrt(k) after k products of rms
	// size r, by up to 2^-24 of itself (rms 3.4e-8): a walk whose standard
	// deviation, 2.4e-8*r*K = 2.4e-8*size*sqrt(K) for a result of natural
	// size r*sqrt(K), grows with the reduction's length, unlike TF32's.
	// Abs is five of them for natural sizes up to 5 and reductions of up
	// to 4096 products (a weight gradient's N*OutH*OutW; TolForward32's
	// 1e-6 holds only to size*sqrt(K) of about 8). Rel bounds sums whose
	// terms share a sign: five standard deviations, 2e-8*sqrt(K) of the
	// result each, at K = 4096. It is 250 times tighter than TolTF32 in
	// Abs and 100 times in Rel: TF32's operand rounding does not fit it.
	TolGemm32 = Tolerance{Abs: 4e-5, Rel: 1e-5}

	// TolTraining compares two training runs from the same weights and
	// data, one on the CPU and one on a GPU: the mean of each loss over
	// the iterations (examples/maskrcnn's first 200). Each step differs by
	// TF32 products and the order of atomic sums (TolTF32 and TolParity32
	// per kernel), and more by discrete choices those move: the RoIs a
	// step samples change when a proposal crosses an IoU threshold, so
	// from the first iterations on the two runs are two draws of the same
	// noisy training, single iterations' losses differ by up to a third,
	// and the means by their sampling noise: up to 2.8% apart in six GPU
	// runs on an H200, three in each precision (the means over 40
	// iterations, noisier, up to 14%). Abs is for the RPN's box loss, of
	// the order of 0.004.
	TolTraining = Tolerance{Abs: 1e-3, Rel: 0.1}
)

// TolTF32For is TolTF32 for TF32 sums of natural size size (the rms of the
// products times the square root of their count), which may exceed the 5
// that TolTF32's Abs is stated for (a weight gradient sums a product per
// pixel of the batch: 134,400 on FPN's P2). The rounding walk's standard
// deviation grows in proportion to the size, so Abs does too and stays
// five of them; Rel is TolTF32's. Up to 5 it is TolTF32 itself.
func TolTF32For(size float64) Tolerance {
	t := TolTF32
	if size > 5 {
		t.Abs *= size / 5
	}
	return t
}

// Worst returns the largest |got - want| / (Abs + Rel*|want|) over the
// elements where both are numbers: how much of the bound the closest call
// used (at most 1 when Compare passes). For logs that show a test's margin.
func (t Tolerance) Worst(got, want []float64) float64 {
	worst := 0.0
	for i := range min(len(got), len(want)) {
		g, w := got[i], want[i]
		if g == w || math.IsNaN(g) || math.IsNaN(w) {
			continue
		}
		worst = max(worst, math.Abs(g-w)/(t.Abs+t.Rel*math.Abs(w)))
	}
	return worst
}

// Compare checks got against want element by element. It returns an error
// naming the worst element when any is out of bounds, or when either holds a
// NaN that the other does not.
func (t Tolerance) Compare(got, want []float64) error {
	if len(got) != len(want) {
		return fmt.Errorf("got %d elements, want %d", len(got), len(want))
	}
	worst, worstExcess := -1, 0.0
	for i := range got {
		g, w := got[i], want[i]
		if math.IsNaN(w) || math.IsNaN(g) {
			if math.IsNaN(w) != math.IsNaN(g) {
				return fmt.Errorf("element %d: got %v, want %v", i, g, w)
			}
			continue
		}
		if g == w { // also equal infinities
			continue
		}
		bound := t.Abs + t.Rel*math.Abs(w)
		if excess := math.Abs(g-w) - bound; !(excess <= 0) && (worst < 0 || excess > worstExcess) {
			worst, worstExcess = i, excess
		}
	}
	if worst >= 0 {
		return fmt.Errorf("element %d: got %.17g, want %.17g (|diff| %.3g > %.3g + %.3g*|want|)",
			worst, got[worst], want[worst], math.Abs(got[worst]-want[worst]), t.Abs, t.Rel)
	}
	return nil
}
