package ops

// Every backward kernel variant of msdeform.cu against the CPU twin, not just
// the one msDeformKernelFor picks: the benchmarks time them all, and any of
// them may become the default. Like gpu_test.go, it needs a binary built
// with -tags stheno_cuda and a GPU, and skips visibly anywhere else.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// msDeformBackwardVariant is a backward kernel of msdeform.cu,
// msdeform_backward_<f32|f64>_<suffix>, taking vec channels per lane.
type msDeformBackwardVariant struct {
	suffix string
	vec    int
}

func (v msDeformBackwardVariant) kernel(dt tensor.Dtype) msDeformKernel {
	return msDeformKernel{"msdeform_backward_" + dtypeSuffix(dt) + "_" + v.suffix, v.vec}
}

// msDeformBackwardVariants lists the backward kernels of msdeform.cu (and,
// the _q4 ones, of msdeform_sm90a.cu: compute capability 9.0 only, D % 4 ==
// 0) for each dtype.
var msDeformBackwardVariants = map[tensor.Dtype][]msDeformBackwardVariant{
	tensor.Float32: {{"u1_h", 1}, {"s_h", 1}, {"r4_h", 1}, {"r8_h", 1}, {"r16_h", 1}, {"v2_r16_h", 2}, {"v4_r4_h", 4}, {"v4_r4_h_b3", 4}, {"v4_r8_h", 4}, {"v4_r8", 4},
		{"q4_r4_h", 4}, {"q4_r4_h_b3", 4}, {"q4_r4_h_b4", 4}, {"q4_r8_h_b3", 4}},
	tensor.Float64: {{"u1_h", 1}, {"r4_h", 1}, {"r8_h", 1}, {"r16_h", 1}, {"v2_r16_h", 2}, {"v4_r4_h", 4}, {"v4_r8_h", 4}, {"v4_r8", 4}},
}

func TestGPUMSDeformAttnBackwardVariants(t *testing.T) {
	dev := gpu(t)
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for _, v := range msDeformBackwardVariants[dt] {
			k := v.kernel(dt)
			tuning := msDeformTuning{kernel: func(backward bool, dt tensor.Dtype) msDeformKernel {
				if !backward {
					// Only the backward op runs here; this forward kernel
					// takes any D and alignment.
					return msDeformKernel{"msdeform_forward_" + dtypeSuffix(dt) + "_v1_s", 1}
				}
				return k
			}}
			quadErr := error(nil)
			if msDeformModule(k.name) != "msdeform" {
				quadErr = sm90aError(dev, msDeformModule(k.name), k.name)
			}
			for i, c := range msDeformParityCases {
				t.Run(fmt.Sprintf("kernel=%s/%s", k.name, c.name), func(t *testing.T) {
					if quadErr != nil {
						t.Skipf("%s does not run here: %v", k.name, quadErr)
					}
					sh, value, loc, weight, gy := c.inputs(t, rand.New(rand.NewPCG(uint64(i), 4)), dt)
					if msDeformModule(k.name) != "msdeform" && sh.d%4 != 0 {
						t.Skipf("D = %d: the q4 kernels need D %% 4 == 0", sh.d)
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
// that take 4 channels per lane (D % 4 == 0); the v1 kernels run in
// TestGPUMSDeformAttnParity on the cases that need them.
var msDeformForwardVariants = []msDeformKernel{{"msdeform_forward_f32_v4_u1", 4}, {"msdeform_forward_f32_v4_s", 4},
	{"msdeform_forward_f32_v4_s_b5", 4}, {"msdeform_forward_f32_v4_s_o", 4}, {"msdeform_forward_f32_v4_s_b5_o", 4}}

func TestGPUMSDeformAttnForwardVariants(t *testing.T) {
	dev := gpu(t)
	dt := tensor.Float32
	for _, k := range msDeformForwardVariants {
		tuning := msDeformTuning{kernel: func(bool, tensor.Dtype) msDeformKernel { return k }}
		for i, c := range msDeformParityCases {
			t.Run(fmt.Sprintf("kernel=%s/%s", k.name, c.name), func(t *testing.T) {
				sh, value, loc, weight, _ := c.inputs(t, rand.New(rand.NewPCG(uint64(i), 4)), dt)
				if sh.d%4 != 0 {
					t.Skipf("D = %d: the v4 kernels need D %% 4 == 0", sh.d)
				}
				withMSDeformTuning(dev, tuning, func() { parity(t, dev, msDeformAttnOp(sh), dt, value, loc, weight) })
			})
		}
	}
}

// The forward with its queries sorted (msdeform_query_cells) on every parity
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
	const missing = "msdeform_forward_f32_missing"
	tuning := msDeformTuning{kernel: func(bool, tensor.Dtype) msDeformKernel { return msDeformKernel{missing, 1} }}
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
