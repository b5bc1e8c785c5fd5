package ops

// Every kernel variant of msdeform.cu and msdeform_sm90a.cu against the CPU
// twin, not just the ones msDeformKernelFor picks: the benchmarks time them
// all, and any of them may become the default. Like gpu_test.go, it needs a
// binary built with -tags stheno_cuda and a GPU, and skips visibly anywhere
// else; the variants also need modules built with them (make kernels
// VARIANTS=1).

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// msDeformBackwardVariants lists the backward kernels of msdeform.cu (and,
// the _red4 ones, of msdeform_sm90a.cu: compute capability 9.0 only, D % 4
// == 0) for each dtype, defaults and variants.
var msDeformBackwardVariants = map[tensor.Dtype][]msDeformKernel{
	tensor.Float32: {
		{k: cuda.MSDeformBwdAtomicC1ButterflyF32, vec: 1},
		{k: cuda.MSDeformBwdAtomicC1SharedTapsButterflyF32, vec: 1},
		{k: cuda.MSDeformBwdAtomicC1Rs4Occ3F32, vec: 1},
		{k: cuda.MSDeformBwdAtomicC1Rs8Occ3F32, vec: 1},
		{k: cuda.MSDeformBwdAtomicC1Rs16Occ3F32, vec: 1},
		{k: cuda.MSDeformBwdAtomicC2Rs16Occ3F32, vec: 2},
		{k: cuda.MSDeformBwdAtomicC4Rs4Occ2F32, vec: 4},
		{k: cuda.MSDeformBwdAtomicC4Rs4Occ3F32, vec: 4},
		{k: cuda.MSDeformBwdAtomicC4Rs8F32, vec: 4},
		{k: cuda.MSDeformBwdAtomicC4Rs8QFastF32, vec: 4},
		{k: cuda.MSDeformBwdRed4Rs4Occ2F32, vec: 4},
		{k: cuda.MSDeformBwdRed4Rs4Occ3F32, vec: 4},
		{k: cuda.MSDeformBwdRed4Rs4Occ4F32, vec: 4},
		{k: cuda.MSDeformBwdRed4Rs8Occ3F32, vec: 4},
	},
	tensor.Float64: {
		{k: cuda.MSDeformBwdAtomicC1ButterflyF64, vec: 1},
		{k: cuda.MSDeformBwdAtomicC1Rs4F64, vec: 1},
		{k: cuda.MSDeformBwdAtomicC1Rs8F64, vec: 1},
		{k: cuda.MSDeformBwdAtomicC1Rs16F64, vec: 1},
		{k: cuda.MSDeformBwdAtomicC2Rs16F64, vec: 2},
		{k: cuda.MSDeformBwdAtomicC4Rs4F64, vec: 4},
		{k: cuda.MSDeformBwdAtomicC4Rs8F64, vec: 4},
		{k: cuda.MSDeformBwdAtomicC4Rs8QFastF64, vec: 4},
	},
}

// skipUnrunnableMSDeform skips tb when dev cannot run k: one of
// msdeform_sm90a.cu's on a GPU that does not run them, or a variant this
// build leaves out (skipUnbuiltVariant). sm90aError is asked with the
// shipped kernel, whose module's verdict it keeps for ops: a variant
// missing from the build must not turn the default off.
func skipUnrunnableMSDeform(tb testing.TB, dev *backend.Device, k msDeformKernel) {
	tb.Helper()
	if k.k.Module() == msDeformQuadBackward.Module() {
		if err := sm90aError(dev, msDeformQuadBackward.Module(), msDeformQuadBackward.Name()); err != nil {
			tb.Skipf("%s does not run here: %v", k.k.Name(), err)
		}
	}
	skipUnbuiltVariant(tb, k.k.Module(), k.k.Name())
}

func TestGPUMSDeformAttnBackwardVariants(t *testing.T) {
	dev := gpu(t)
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		// Only the backward op runs here; this forward kernel takes any D
		// and alignment.
		fwd, err := cuda.MSDeformFwdScalar(dt)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range msDeformBackwardVariants[dt] {
			tuning := msDeformTuning{kernel: func(backward bool, dt tensor.Dtype) msDeformKernel {
				if !backward {
					return msDeformKernel{k: fwd, vec: 1}
				}
				return k
			}}
			for i, c := range msDeformParityCases {
				t.Run(fmt.Sprintf("kernel=%s/%s", k.k.Name(), c.name), func(t *testing.T) {
					skipUnrunnableMSDeform(t, dev, k)
					sh, value, loc, weight, gy := c.inputs(t, rand.New(rand.NewPCG(uint64(i), 4)), dt)
					if k.k.Module() == msDeformQuadBackward.Module() && sh.d%4 != 0 {
						t.Skipf("D = %d: the red4 kernels need D %% 4 == 0", sh.d)
					}
					withMSDeformTuning(dev, tuning, func() {
						parity(t, dev, msDeformGradForParity(sh), dt, value, loc, weight, gy)
					})
				})
			}
		}
	}
}

// msDeformForwardVariants lists the float32 forward kernels of msdeform.cu
// that take 4 channels per lane (D % 4 == 0), defaults and variants; the
// scalar kernels run in TestGPUMSDeformAttnParity on the cases that need
// them.
var msDeformForwardVariants = []msDeformKernel{
	{k: cuda.MSDeformFwdV16bLaneTapsF32, vec: 4},
	{k: cuda.MSDeformFwdV16bF32, vec: 4},
	{k: cuda.MSDeformFwdV16bOcc5F32, vec: 4},
	{k: cuda.MSDeformFwdV16bSortedF32, vec: 4, sorted: true},
	{k: cuda.MSDeformFwdV16bOcc5SortedF32, vec: 4, sorted: true},
}

func TestGPUMSDeformAttnForwardVariants(t *testing.T) {
	dev := gpu(t)
	dt := tensor.Float32
	for _, k := range msDeformForwardVariants {
		tuning := msDeformTuning{kernel: func(bool, tensor.Dtype) msDeformKernel { return k }}
		for i, c := range msDeformParityCases {
			t.Run(fmt.Sprintf("kernel=%s/%s", k.k.Name(), c.name), func(t *testing.T) {
				skipUnrunnableMSDeform(t, dev, k)
				sh, value, loc, weight, _ := c.inputs(t, rand.New(rand.NewPCG(uint64(i), 4)), dt)
				if sh.d%4 != 0 {
					t.Skipf("D = %d: the v16b kernels need D %% 4 == 0", sh.d)
				}
				withMSDeformTuning(dev, tuning, func() { parity(t, dev, msDeformAttnOp(sh), dt, value, loc, weight) })
			})
		}
	}
}

// The forward with its queries sorted (msdeform_sort_cells) on every parity
// case, whatever their number of queries.
func TestGPUMSDeformAttnSortedParity(t *testing.T) {
	dev := gpu(t)
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for i, c := range msDeformParityCases {
			t.Run(fmt.Sprintf("%v/%s", dt, c.name), func(t *testing.T) {
				sh, value, loc, weight, _ := c.inputs(t, rand.New(rand.NewPCG(uint64(i), 4)), dt)
				withMSDeformTuning(dev, msDeformTuning{order: 1}, func() { parity(t, dev, msDeformAttnOp(sh), dt, value, loc, weight) })
			})
		}
	}
}

// On a case big enough for the forward to sort by default: the order is a
// permutation of each image's queries, sorted by cell, and the forward's
// output is bit for bit the one without sorting (each query's sum is its
// own, whichever position takes it).
func TestGPUMSDeformAttnQueryOrder(t *testing.T) {
	dev := gpu(t)
	c := msDeformParityCase{"seed-like", 2, msDeformOrderMin + 905, 2, 32, []Level{{23, 40}, {12, 20}}, 2, -0.1, 1.1, true}
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		t.Run(dt.String(), func(t *testing.T) {
			sh, value, loc, weight, _ := c.inputs(t, rand.New(rand.NewPCG(7, 4)), dt)
			if !sh.sortsQueries() {
				t.Fatalf("Lq %d: the forward does not sort by default", sh.lq)
			}
			locDev := toDev(t, dev, loc)
			locPtr, err := dev.Ptr(locDev)
			if err != nil {
				t.Fatal(err)
			}
			order, err := sh.queryOrder("test", dev, locPtr, msDeformOrderBandRows)
			if err != nil {
				t.Fatal(err)
			}
			defer dev.FreeDense(order)
			host, err := dev.ToHost(order)
			if err != nil {
				t.Fatal(err)
			}
			perm := host.Int32s()[:sh.n*sh.lq] // then the cells, scratch
			bands, cols := sh.orderGrid(msDeformOrderBandRows)
			lv := toFloat64s(t, loc)
			stride := sh.m * sh.l * sh.p * 2
			// The kernel's cell, in dt's arithmetic.
			cell := func(n, q int) int {
				x, y := lv[(n*sh.lq+q)*stride], lv[(n*sh.lq+q)*stride+1]
				if dt == tensor.Float32 {
					x, y = float64(float32(x)*float32(cols)), float64(float32(y)*float32(bands))
				} else {
					x, y = x*float64(cols), y*float64(bands)
				}
				b, c := 0, 0
				if y > 0 {
					b = int(math.Min(y, float64(bands-1)))
				}
				if x > 0 {
					c = int(math.Min(x, float64(cols-1)))
				}
				return b*cols + c
			}
			for n := range sh.n {
				seen := make([]bool, sh.lq)
				for i, q := range perm[n*sh.lq : (n+1)*sh.lq] {
					if q < 0 || int(q) >= sh.lq || seen[q] {
						t.Fatalf("image %d, position %d: query %d repeated or out of range", n, i, q)
					}
					seen[q] = true
					if prev := perm[n*sh.lq+max(i-1, 0)]; cell(n, int(prev)) > cell(n, int(q)) {
						t.Fatalf("image %d, position %d: cell %d after cell %d", n, i, cell(n, int(q)), cell(n, int(prev)))
					}
				}
			}
			run := func(order int) (got []float64) {
				withMSDeformTuning(dev, msDeformTuning{order: order}, func() {
					out, err := msDeformAttnOp(sh).Do(toDev(t, dev, value), locDev, toDev(t, dev, weight))
					if err != nil {
						t.Fatal(err)
					}
					got = fromDev(t, dev, out)
				})
				return got
			}
			sorted, unsorted := run(0), run(-1)
			for i := range sorted {
				if math.Float64bits(sorted[i]) != math.Float64bits(unsorted[i]) && !(math.IsNaN(sorted[i]) && math.IsNaN(unsorted[i])) {
					t.Fatalf("output %d: %v sorted, %v not", i, sorted[i], unsorted[i])
				}
			}
		})
	}
}

// A tuning picks the kernel on its Device only while withMSDeformTuning
// runs: a kernel that does not exist fails the op then, and the Device holds
// no tuning after.
func TestGPUMSDeformAttnTuning(t *testing.T) {
	dev := gpu(t)
	sh, value, loc, weight, _ := msDeformParityCases[0].inputs(t, rand.New(rand.NewPCG(1, 4)), tensor.Float32)
	in := []G.Value{toDev(t, dev, value), toDev(t, dev, loc), toDev(t, dev, weight)}
	const missing = "msdeform_fwd_missing_f32"
	tuning := msDeformTuning{kernel: func(bool, tensor.Dtype) msDeformKernel {
		return msDeformKernel{k: "msdeform." + missing, vec: 1}
	}}
	withMSDeformTuning(dev, tuning, func() {
		if _, err := msDeformAttnOp(sh).Do(in...); err == nil || !strings.Contains(err.Error(), missing) {
			t.Errorf("with the tuning: got error %v, want one naming %s", err, missing)
		}
	})
	if v := dev.Value(msDeformTuningKey{}); v != nil {
		t.Errorf("the Device still holds %v", v)
	}
	if _, err := msDeformAttnOp(sh).Do(in...); err != nil {
		t.Errorf("after the tuning: %v", err)
	}
}
