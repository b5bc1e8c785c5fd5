package ops

// Tests of the GPU path: every op on the device against its CPU twin, with
// the tolerances of autograd's table. They need a binary built with
// -tags stheno_cuda (make gpu-bins) and a GPU; anywhere else they skip and
// say why.

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/backend"
)

var testDevice struct {
	once sync.Once
	dev  *backend.Device
	err  error
}

// gpu returns the test binary's device, or skips the test visibly.
func gpu(t testing.TB) *backend.Device {
	t.Helper()
	dev, err := gpuOrNil(t)
	if dev == nil {
		t.Skipf("no CUDA device: %v", err)
	}
	return dev
}

// gpuOrNil returns the test binary's device, or nil and why when there is
// none (for a caller that skips part of its work); other errors fail t.
func gpuOrNil(t testing.TB) (*backend.Device, error) {
	t.Helper()
	testDevice.once.Do(func() { testDevice.dev, testDevice.err = backend.Open(0) })
	if testDevice.err != nil {
		if errors.Is(testDevice.err, backend.ErrNoDevice) {
			return nil, testDevice.err
		}
		t.Fatalf("opening the GPU: %v", testDevice.err)
	}
	return testDevice.dev, nil
}

func toDev(t testing.TB, dev *backend.Device, d *tensor.Dense) *tensor.Dense {
	t.Helper()
	out, err := dev.ToDevice(d)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// fromDev copies a device value to the host and returns it as float64s.
func fromDev(t testing.TB, dev *backend.Device, v G.Value) []float64 {
	t.Helper()
	if !backend.IsDevice(v) {
		t.Fatalf("the op returned a host value (%T) for device inputs", v)
	}
	h, err := dev.ToHost(v.(*tensor.Dense))
	if err != nil {
		t.Fatal(err)
	}
	return toFloat64s(t, h)
}

func parityTol(dt tensor.Dtype) autograd.Tolerance {
	if dt == tensor.Float32 {
		return autograd.TolParity32
	}
	return autograd.TolParity64
}

// parity runs op on host inputs and on copies of them on the device, and
// compares the two results (in parityUnits); it returns them as they came,
// GPU first.
func parity(t *testing.T, dev *backend.Device, op G.Op, dt tensor.Dtype, inputs ...*tensor.Dense) (gpuOut, cpuOut []float64) {
	t.Helper()
	if s, ok := op.(*specOp); ok && s.name == msDeformGradName {
		t.Fatalf("%v: compare it as msDeformGradParity, which puts its location gradients in pixel units", op)
	}
	host := make([]G.Value, len(inputs))
	onDev := make([]G.Value, len(inputs))
	for i, d := range inputs {
		host[i] = d
		onDev[i] = toDev(t, dev, d)
	}
	want, err := op.Do(host...)
	if err != nil {
		t.Fatalf("CPU: %v", err)
	}
	got, err := op.Do(onDev...)
	if err != nil {
		t.Fatalf("GPU: %v", err)
	}
	gpuOut, cpuOut = fromDev(t, dev, got), toFloat64s(t, want)
	gotV, wantV := parityUnits(op, slices.Clone(gpuOut)), parityUnits(op, slices.Clone(cpuOut))
	if err := parityTol(dt).Compare(gotV, wantV); err != nil {
		t.Errorf("%v: GPU vs CPU: %v", op, err)
	}
	t.Logf("%v: GPU vs CPU: the worst element at %.3g of the bound", op, parityTol(dt).Worst(gotV, wantV))
	// A buffer handed back for reuse must be fully rewritten (or zeroed by
	// the op): poison it and run again.
	if pd, ok := op.(G.UsePreallocDoer); ok {
		poison := fromFloat64s(dt, filled(got.Shape().TotalSize(), math.NaN()), got.Shape()...)
		reuse := toDev(t, dev, poison)
		again, err := pd.UsePreallocDo(reuse, onDev...)
		if err != nil {
			t.Fatalf("GPU, reused buffer: %v", err)
		}
		if err := parityTol(dt).Compare(parityUnits(op, fromDev(t, dev, again)), wantV); err != nil {
			t.Errorf("%v: GPU with a reused buffer vs CPU: %v", op, err)
		}
	}
	return gpuOut, cpuOut
}

// parityUnits returns an op's outputs in the units in which the tolerance
// table states its bounds (see TolParity32). The one output it changes is
// MSDeformAttn's location gradient: d/dloc = size * d/dpixel, a sum over
// channels and corners of terms of order 1 in pixel units, times the level's
// width or height. The sum's rounding error is what the GPU and the CPU twin
// differ by (both round the pixel coordinate alike, so they take the same
// cell), and it scales with the terms; so the gradient is compared in pixel
// units.
// Rel bounds it alike in either unit; Abs, stated for terms of order 1,
// applies to the pixel-unit sum.
func parityUnits(op G.Op, v []float64) []float64 {
	if g, ok := op.(msDeformGradParity); ok {
		nv, nl := g.sh.valueShape().TotalSize(), g.sh.locShape().TotalSize()
		g.sh.locGradsInPixels(v[nv : nv+nl])
	}
	return v
}

// msDeformGradParity is MSDeformAttn's backward op as parity takes it: with
// its shape, by which parityUnits finds the location gradients.
type msDeformGradParity struct {
	*specOp
	sh msDeformShape
}

func msDeformGradForParity(sh msDeformShape) msDeformGradParity {
	return msDeformGradParity{msDeformAttnGradOp(sh), sh}
}

// locGradsInPixels divides each location gradient (x, y), laid out as the
// sampling locations [N, Lq, M, L, P, 2], by its level's width and height.
func (s msDeformShape) locGradsInPixels(gl []float64) {
	for i := 0; i < len(gl); i += 2 {
		lv := s.levels[(i/2/s.p)%s.l]
		gl[i] /= float64(lv.W)
		gl[i+1] /= float64(lv.H)
	}
}

func filled(n int, v float64) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = v
	}
	return s
}

func TestGPURoIAlignParity(t *testing.T) {
	dev := gpu(t)
	type rcase struct {
		name       string
		n, c, h, w int
		k          int
		cfg        RoIAlignConfig
		roiScale   float64 // image size / feature size, for drawing boxes
	}
	cases := []rcase{
		{"aligned/sampling=2", 2, 3, 9, 11, 25, RoIAlignConfig{3, 2, 0.25, 2, true}, 4},
		{"legacy/sampling=2", 2, 3, 9, 11, 25, RoIAlignConfig{3, 2, 0.25, 2, false}, 4},
		{"aligned/adaptive", 2, 5, 17, 13, 30, RoIAlignConfig{7, 7, 0.5, 0, true}, 2},
		{"legacy/adaptive", 2, 5, 17, 13, 30, RoIAlignConfig{7, 7, 0.5, 0, false}, 2},
		{"sampling=1/pooled=1x4", 1, 2, 6, 7, 9, RoIAlignConfig{1, 4, 0.125, 1, false}, 8},
		{"zero rois", 2, 3, 9, 11, 0, RoIAlignConfig{2, 2, 1, 2, true}, 1},
		// 70 channels: channel groups with a remainder; 300 RoIs: many blocks.
		{"channel groups", 2, 70, 20, 24, 300, RoIAlignConfig{7, 7, 0.25, 2, true}, 4},
		// C % 4 == 0, a last group of 4 channels, 9 samples a bin: on
		// compute capability 9.0 the float32 backward is a vector-
		// reduction kernel (roiAlignSepQuadBackward).
		{"channels % 4 == 0", 2, 36, 15, 17, 60, RoIAlignConfig{5, 4, 0.5, 3, true}, 2},
		// C % 4 == 0, 14x14 bins from far below a pixel to a few: taps of
		// a bin share pixels.
		{"channels % 4 == 0/14x14", 2, 40, 30, 34, 50, RoIAlignConfig{14, 14, 0.25, 2, true}, 4},
		{"channels % 4 == 0/adaptive", 2, 8, 17, 13, 30, RoIAlignConfig{7, 7, 0.5, 0, true}, 2},
		// Large boxes: bins with more adaptive samples than shared memory
		// holds take the on-the-fly path (with C % 4 == 0, also in the
		// vector-reduction kernels).
		{"huge adaptive bins", 1, 4, 64, 64, 5, RoIAlignConfig{1, 1, 1, 0, true}, 0.25},
		// Boxes whose bin size is an integer when roi*scale is rounded
		// before the offset is subtracted, as the CPU twin does, and just
		// above or below it when the two are fused into one multiply-add:
		// the adaptive sample count (its ceiling) must agree (boundaryRoIs).
		{"adaptive/bin size at an integer", 1, 8, 70, 70, 2, RoIAlignConfig{7, 7, 1.0 / 3, 0, true}, 3},
		// A box whose sample lies an ulp below -1 (dropped) when start +
		// b*bin is rounded in two steps, as the CPU twin does, and an ulp
		// above it (kept) when fused (edgeRoIs).
		{"sampling=2/sample an ulp from the edge", 1, 8, 20, 20, 1, RoIAlignConfig{7, 7, 0.25, 2, true}, 4},
	}
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for i, c := range cases {
			t.Run(fmt.Sprintf("%v/%s", dt, c.name), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(i), 3))
				x := randTensor(rng, dt, -1, 1, c.n, c.c, c.h, c.w)
				var rois *tensor.Dense
				if c.k == 0 {
					rois = tensor.New(tensor.Of(dt), tensor.WithShape(0, 5))
				} else {
					rois = randomRoIs(rng, dt, c.k, c.n, float64(c.h)*c.roiScale, float64(c.w)*c.roiScale)
				}
				if c.name == "huge adaptive bins" {
					rois = fromFloat64s(dt, []float64{0, 0, 0, 16, 16, 0, 2, 3, 15, 14, 0, -3, -3, 20, 20, 0, 0, 0, 1, 16, 0, 5, 5, 6, 6}, 5, 5)
				}
				if c.name == "adaptive/bin size at an integer" {
					rois = boundaryRoIs(t, dt, c.cfg)
				}
				if c.name == "sampling=2/sample an ulp from the edge" {
					rois = edgeRoIs(t, dt, c.cfg)
				}
				s := roiAlignShape{cfg: c.cfg, n: c.n, c: c.c, h: c.h, w: c.w, k: c.k, dt: dt}
				parity(t, dev, roiAlignOp(s), dt, x, rois)
				gy := randTensor(rng, dt, -1, 1, c.k, c.c, c.cfg.PooledH, c.cfg.PooledW)
				parity(t, dev, roiAlignGradOp(s), dt, rois, gy)
				// Every variant, not only the default.
				for _, kv := range roiAlignVariants(false, dt) {
					t.Run(kv.name, func(t *testing.T) {
						withRoIAlignKernel(dev, false, kv, func() { parity(t, dev, roiAlignOp(s), dt, x, rois) })
					})
				}
				for _, kv := range roiAlignVariants(true, dt) {
					t.Run(kv.name, func(t *testing.T) {
						withRoIAlignKernel(dev, true, kv, func() { parity(t, dev, roiAlignGradOp(s), dt, rois, gy) })
					})
				}
				for _, kv := range roiAlignColsVariants(s) {
					t.Run(kv.String(), func(t *testing.T) {
						if !s.colsFit() {
							t.Skip("roialign_forward_cols: needs a sampling ratio of 1 to 4 and PooledW*ratio <= 32")
						}
						withRoIAlignKernel(dev, false, kv, func() { parity(t, dev, roiAlignOp(s), dt, x, rois) })
					})
				}
				for _, kv := range roiAlignQuadForwards {
					t.Run(kv.String(), func(t *testing.T) {
						if dt != tensor.Float32 || c.c%4 != 0 {
							t.Skip("float32 with C % 4 == 0 only")
						}
						withRoIAlignKernel(dev, false, kv, func() { parity(t, dev, roiAlignOp(s), dt, x, rois) })
					})
				}
				for _, name := range []string{roiAlignQuadBackward, roiAlignSepQuadBackward} {
					t.Run(name, func(t *testing.T) {
						if why := roiAlignQuadSkip(dev, s); why != "" {
							t.Skip(why)
						}
						kv := roiAlignKernel{name: name}
						withRoIAlignKernel(dev, true, kv, func() { parity(t, dev, roiAlignGradOp(s), dt, rois, gy) })
					})
				}
			})
		}
	}
}

// roiAlignQuadSkip says why roialign_sm90a.cu's kernels do not apply to s
// on dev, or "" when they do.
func roiAlignQuadSkip(dev *backend.Device, s roiAlignShape) string {
	switch {
	case s.dt != tensor.Float32:
		return "float32 only"
	case s.c%4 != 0:
		return fmt.Sprintf("C = %d: needs C %% 4 == 0", s.c)
	}
	if err := sm90aError(dev, roiAlignModule(roiAlignSepQuadBackward), roiAlignSepQuadBackward); err != nil {
		return fmt.Sprintf("roialign_sm90a does not run here: %v", err)
	}
	return ""
}

// roiAlignVariants lists the forward or backward kernels of roialign.cu.
func roiAlignVariants(backward bool, dt tensor.Dtype) []roiAlignKernel {
	sfx := dtypeSuffix(dt)
	if backward {
		return []roiAlignKernel{{name: "roialign_backward_" + sfx}, {name: "roialign_backward_sep_" + sfx}}
	}
	vs := []roiAlignKernel{{name: "roialign_forward_" + sfx}, {name: "roialign_forward_sep_" + sfx}}
	for _, cpt := range []int{4, 8} {
		vs = append(vs, roiAlignKernel{name: fmt.Sprintf("roialign_forward_nchw%d_%s", cpt, sfx), cpt: cpt})
	}
	if dt == tensor.Float32 {
		vs = append(vs, roiAlignKernel{name: "roialign_forward_nchw4_b4_f32", cpt: 4})
	}
	return vs
}

// roiAlignColsVariants are the roialign_forward_cols kernels for s's
// sampling ratio, row-major and channel-major (_cm), with the channels in colsSlices' count or 4, 16 or 64
// slices.
func roiAlignColsVariants(s roiAlignShape) []roiAlignKernel {
	var kvs []roiAlignKernel
	for _, cm := range []bool{false, true} {
		for _, slices := range []int{0, 4, 16, 64} {
			kvs = append(kvs, roiAlignColsKernel(s, cm, slices))
		}
	}
	return kvs
}

// roiAlignQuadForwards are variants of the separable forward with 16-byte
// loads (float32, C % 4 == 0; roialign_forward_sep4 in roialign.cu):
// registers capped (_b4) or not; the bins in chunks of a tile (7x7 bins:
// 2 blocks a RoI), of 16 (4 blocks) or, with channel slices, of up to 64
// (one block); the channels in 1, 2, 4 or 8 slices.
var roiAlignQuadForwards = []roiAlignKernel{
	{name: "roialign_forward_sep4_f32"}, {name: "roialign_forward_sep4_f32", chunk: 16},
	{name: "roialign_forward_sep4_f32", slices: 2}, {name: "roialign_forward_sep4_f32", slices: 4},
	{name: "roialign_forward_sep4_f32", slices: 8},
	{name: "roialign_forward_sep4_f32", chunk: 64, slices: 4}, {name: "roialign_forward_sep4_f32", chunk: 64, slices: 8},
	{name: "roialign_forward_sep4_b4_f32", slices: 4}, {name: "roialign_forward_sep4_b4_f32", slices: 8},
	{name: "roialign_forward_sep4_b4_f32", chunk: 64, slices: 4}, {name: "roialign_forward_sep4_b4_f32", chunk: 64, slices: 8},
}

// withRoIAlignKernel runs f with kv as dev's kernel for its direction.
func withRoIAlignKernel(dev *backend.Device, backward bool, kv roiAlignKernel, f func()) {
	key := roiAlignKernelKey{backward}
	defer dev.SetValue(key, dev.Value(key))
	dev.SetValue(key, kv)
	f()
}

// Bad RoIs are reported by the next call that waits for the GPU, as any
// error of asynchronous GPU work; the Device stays usable.
func TestGPURoIAlignRunTimeErrors(t *testing.T) {
	dev := gpu(t)
	if err := dev.Synchronize(); err != nil {
		t.Fatal(err)
	}
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for _, c := range []struct {
			roi  []float64
			cfg  RoIAlignConfig
			want string
		}{
			{[]float64{0, 0, 0, 1, 1, 2, 0, 0, 1, 1}, RoIAlignConfig{1, 1, 1, 2, true}, "ops: RoIAlign: a RoI has a batch index outside [0, 2) or NaN"},
			{[]float64{0, 0, 0, 1, 1, math.NaN(), 0, 0, 1, 1}, RoIAlignConfig{1, 1, 1, 2, true}, "a RoI has a batch index outside [0, 2) or NaN"},
			{[]float64{0, 0, 0, 1e7, 1, 0, 0, 0, 1, 1}, RoIAlignConfig{1, 1, 1, 0, true}, "use a fixed SamplingRatio"},
		} {
			s := roiAlignShape{cfg: c.cfg, n: 2, c: 1, h: 4, w: 4, k: 2, dt: dt}
			rois := toDev(t, dev, fromFloat64s(dt, c.roi, 2, 5))
			x := toDev(t, dev, rampImages(dt))
			gy := toDev(t, dev, tensor.New(tensor.Of(dt), tensor.WithShape(2, 1, 1, 1)))
			for _, backward := range []bool{false, true} {
				for _, kv := range roiAlignVariants(backward, dt) {
					var err error
					withRoIAlignKernel(dev, backward, kv, func() {
						if backward {
							_, err = roiAlignGradOp(s).Do(rois, gy)
						} else {
							_, err = roiAlignOp(s).Do(x, rois)
						}
					})
					if err == nil {
						err = dev.Synchronize()
					}
					if err == nil || !strings.Contains(strings.ReplaceAll(err.Error(), "RoIAlign backward", "RoIAlign"), c.want) {
						t.Errorf("%v %s: error %v, want one containing %q", dt, kv.name, err, c.want)
					}
				}
			}
			// The error is reported once.
			if err := dev.Synchronize(); err != nil {
				t.Fatalf("%v: the next wait failed too: %v", dt, err)
			}
		}
	}
	// The device is still usable after a reported error.
	x := toDev(t, dev, rampImages(tensor.Float64))
	rois := toDev(t, dev, fromFloat64s(tensor.Float64, []float64{0, 0.5, 0.5, 2.5, 2.5}, 1, 5))
	s := roiAlignShape{cfg: RoIAlignConfig{1, 1, 1, 2, true}, n: 2, c: 1, h: 4, w: 4, k: 1, dt: tensor.Float64}
	out, err := roiAlignOp(s).Do(x, rois)
	if err != nil {
		t.Fatal(err)
	}
	if got := fromDev(t, dev, out); got[0] != 5 {
		t.Errorf("after errors: got %v, want 5", got)
	}
}

func TestGPUMixedPlacementIsAnError(t *testing.T) {
	dev := gpu(t)
	s := roiAlignShape{cfg: RoIAlignConfig{1, 1, 1, 2, true}, n: 2, c: 1, h: 4, w: 4, k: 1, dt: tensor.Float64}
	x := toDev(t, dev, rampImages(tensor.Float64))
	rois := fromFloat64s(tensor.Float64, []float64{0, 0.5, 0.5, 2.5, 2.5}, 1, 5)
	_, err := roiAlignOp(s).Do(x, rois)
	if err == nil || !strings.Contains(err.Error(), "rois is in host memory; move it with ops.ToDevice") {
		t.Errorf("got %v", err)
	}
}

// Ops without device kernels refuse device inputs and say how to run them
// on the host. The loss backward's scalar gradient is a host value (as
// gorgonia hands it over) and is no part of the placement check.
func TestGPUHostOnlyOpsAdvise(t *testing.T) {
	dev := gpu(t)
	dt := tensor.Float64
	v := toDev(t, dev, fromFloat64s(dt, []float64{0.5, -1}, 2))
	loss := lossShape{kind: lossSigmoidBCE, x: tensor.Shape{2}, t: tensor.Shape{2}, dt: dt}
	up := upsampleShape{x: tensor.Shape{1, 1, 1, 2}, factor: 2, dt: dt}
	img := toDev(t, dev, fromFloat64s(dt, []float64{1, 2}, 1, 1, 1, 2))
	for _, c := range []struct {
		name string
		op   *specOp
		in   []G.Value
	}{
		{"SigmoidBCE", lossOp(loss), []G.Value{v, v, v}},
		{"SigmoidBCE backward", lossGradOp(loss), []G.Value{v, v, v, G.NewF32(1)}},
		{"UpsampleNearest", upsampleOp(up), []G.Value{img}},
	} {
		_, err := c.op.Do(c.in...)
		if want := "ops: " + c.name + ": no GPU kernel yet; move its inputs to the host with ops.ToHost"; err == nil || err.Error() != want {
			t.Errorf("%s: got error %v, want %q", c.name, err, want)
		}
	}
}

// msDeformParityCase is one shape of the MSDeformAttn parity tests.
type msDeformParityCase struct {
	name         string
	n, lq, m, d  int
	levels       []Level
	p            int
	lo, hi       float64 // range of the sampling locations
	nanLocations bool
}

var msDeformParityCases = []msDeformParityCase{
	{"decoder-like", 2, 30, 8, 32, []Level{{10, 17}, {5, 9}, {3, 5}, {2, 3}}, 4, -0.1, 1.1, false},
	{"D=5 (groups of 8 lanes)", 1, 7, 3, 5, []Level{{6, 4}}, 3, 0, 1, false},
	{"D=48 (two channel passes)", 1, 5, 2, 48, []Level{{4, 4}, {2, 3}}, 2, -0.5, 1.5, false},
	// Two passes of 32 lanes x 4 channels (the v4 and q4 backward kernels).
	{"D=256 M2", 1, 4, 2, 256, []Level{{5, 6}, {3, 2}}, 2, -0.2, 1.2, false},
	{"D=1", 2, 3, 1, 1, []Level{{3, 3}}, 1, 0, 1, false},
	{"NaN locations", 1, 9, 2, 8, []Level{{5, 5}, {3, 2}}, 2, -0.2, 1.2, true},
	// More levels than travel with the launch: the table is uploaded.
	{"17 levels", 1, 4, 2, 4, manyLevels(msDeformInlineLevels + 1), 2, 0, 1, false},
	// D = 32, the Deformable-DETR head size, which the default kernels'
	// lanes cover in one pass: as many queries as pixels, as in an encoder
	// (the locations are uniform, not around each query's pixel); many
	// samples on few pixels (many atomics on the same addresses); NaN
	// locations.
	{"encoder-like D=32", 2, 321, 8, 32, []Level{{12, 20}, {6, 10}, {3, 5}, {2, 3}}, 4, -0.1, 1.1, false},
	{"crowded D=32", 1, 50, 4, 32, []Level{{2, 2}, {1, 3}}, 4, -0.3, 1.3, false},
	{"NaN locations D=32", 1, 13, 2, 32, []Level{{5, 5}, {3, 2}}, 2, -0.2, 1.2, true},
}

// inputs draws the case's shape and its value, sampling locations, attention
// weights and output gradient from rng.
func (c msDeformParityCase) inputs(t *testing.T, rng *rand.Rand, dt tensor.Dtype) (sh msDeformShape, value, loc, weight, gy *tensor.Dense) {
	s := 0
	for _, lv := range c.levels {
		s += lv.H * lv.W
	}
	l := len(c.levels)
	sh = msDeformShape{n: c.n, s: s, m: c.m, d: c.d, lq: c.lq, l: l, p: c.p, levels: c.levels, dt: dt}
	value = randTensor(rng, dt, -1, 1, c.n, s, c.m, c.d)
	loc = randTensor(rng, dt, c.lo, c.hi, c.n, c.lq, c.m, l, c.p, 2)
	if c.nanLocations {
		v := toFloat64s(t, loc)
		for j := 0; j < len(v); j += 7 {
			v[j] = math.NaN()
		}
		loc = fromFloat64s(dt, v, loc.Shape()...)
	}
	weight = randTensor(rng, dt, 0, 1, c.n, c.lq, c.m, l, c.p)
	gy = randTensor(rng, dt, -1, 1, c.n, c.lq, c.m*c.d)
	return sh, value, loc, weight, gy
}

// withMSDeformTuning runs f with tuning set on dev in place of msdeform's
// rules, then puts back what dev held before.
func withMSDeformTuning(dev *backend.Device, tuning msDeformTuning, f func()) {
	prev := dev.Value(msDeformTuningKey{})
	dev.SetValue(msDeformTuningKey{}, tuning)
	defer dev.SetValue(msDeformTuningKey{}, prev)
	f()
}

func TestGPUMSDeformAttnParity(t *testing.T) {
	dev := gpu(t)
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for i, c := range msDeformParityCases {
			t.Run(fmt.Sprintf("%v/%s", dt, c.name), func(t *testing.T) {
				sh, value, loc, weight, gy := c.inputs(t, rand.New(rand.NewPCG(uint64(i), 4)), dt)
				parity(t, dev, msDeformAttnOp(sh), dt, value, loc, weight)
				parity(t, dev, msDeformGradForParity(sh), dt, value, loc, weight, gy)
			})
		}
	}
}

// GPU against the CPU twin on the benchmark suite's own inputs, TARGETS.md's
// cases at full size, with the kernels ops picks for them: every RoIAlign and
// MSDeformAttn time the suite reports is for a result that this test checks,
// and so are the convolutions' and ConvBN's, with the provisos below. The small cases above
// reach the kernels' edge paths; these reach what only size brings (maps of
// 167 columns, where a coordinate lands an ulp from a cell's edge somewhere
// among 11 million; RoI footprints of 128 pixels; gradients summed from
// thousands of taps).
func TestGPUParityTargetCases(t *testing.T) {
	dev := gpu(t)
	for _, c := range msDeformPresets {
		t.Run("MSDeformAttn/"+c.name, func(t *testing.T) {
			sh, value, loc, weight, gy := msDeformBenchInputs(c)
			parity(t, dev, msDeformAttnOp(sh), sh.dt, value, loc, weight)
			got, want := parity(t, dev, msDeformGradForParity(sh), sh.dt, value, loc, weight, gy)
			// For the record: the location gradients in raw units, which
			// TolParity32 does not bound (its comment says why).
			nv, nl := sh.valueShape().TotalSize(), sh.locShape().TotalSize()
			t.Logf("location gradients in raw units: the worst element at %.3g of TolParity32",
				autograd.TolParity32.Worst(got[nv:nv+nl], want[nv:nv+nl]))
		})
	}
	for _, c := range roiPresets {
		t.Run("RoIAlign/"+c.name, func(t *testing.T) {
			s, x, rois, gy := roiBenchInputs(c)
			parity(t, dev, roiAlignOp(s), s.dt, x, rois)
			parity(t, dev, roiAlignGradOp(s), s.dt, rois, gy)
		})
	}
	// The convolutions, on inputs drawn as BenchmarkSuiteConv draws them:
	// the forward (bias and ReLU) and the data gradient to TolTF32 (sums of
	// K = 1024-2304 products of rms ~0.017, a natural size of 0.5-0.8); the
	// weight gradient, which sums N*OutH*OutW = 6272-134400 products of rms
	// ~0.24 (dy half masked), a natural size of 19-86, to TolTF32For it.
	for ci, c := range convTargetCases {
		t.Run("Conv/"+c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(ci), 11))
			s := c.shape(t, tensor.Float32, true, true)
			x, w := randTensor(rng, s.dt, -1, 1, s.xShape()...), randTensor(rng, s.dt, -0.05, 0.05, s.wShape()...)
			bias, dy := randTensor(rng, s.dt, -0.1, 0.1, s.bShape()...), randTensor(rng, s.dt, -1, 1, s.yShape()...)
			tf32 := []segment{{tol: autograd.TolTF32}}
			parityBy(t, dev, convOp(s), tf32, x, w, bias)
			// The data gradient masks dy by y > 0: the CPU's y on both
			// sides, so that they mask alike.
			y, err := convOp(s).Do(x, w, bias)
			if err != nil {
				t.Fatal(err)
			}
			parityBy(t, dev, convDgradOp(s), tf32, w, y.(*tensor.Dense), dy)
			// The weight gradient as Conv's SymDiff runs it: g (dy masked by
			// the CPU's y, rounded to TF32) read as it is on both sides. No
			// bias, whose gradient is a float32 sum, not a TF32 one.
			sb := c.shape(t, tensor.Float32, false, true)
			g, err := convGradOp(sb).Do(y, dy)
			if err != nil {
				t.Fatal(err)
			}
			gp := roundedTF32(g.(*tensor.Dense), s.yShape().TotalSize())
			back := sb
			back.p.ReLU, back.gradReady = false, true
			size := rms(t, x) * rms(t, gp) * math.Sqrt(float64(s.p.N*s.p.OutH*s.p.OutW))
			t.Logf("weight gradient: natural size %.3g", size)
			parityBy(t, dev, convWgradOp(back), []segment{{tol: autograd.TolTF32For(size)}}, x, y.(*tensor.Dense), gp)
		})
		// ConvBN with ReLU in training, as a graph: the GPU's statistics come
		// from the convolution's epilogue, one record per column tile (1050
		// per channel on fpn_p2), merged by bn_finalize. x and w are small
		// integers, which TF32 holds exactly, so that z is the same on both
		// sides: the backward recomputes the ReLU's mask from z, and with
		// random inputs z's TF32 rounding flips the mask of about one
		// element in a thousand, a couple in each input pixel's receptive
		// field, moving the gradient of x by up to 0.18 (measured): the
		// gradient of a different function, not a kernel's error. y and the
		// running statistics to TolParity32; the gradient of x, a TF32 sum
		// (the GPU rounds dz to TF32 for the GEMM), to TolTF32For its
		// natural size, which for sums of random-signed terms is their rms.
		// The other gradients are sums over the batch's pixels, checked at
		// these sizes above (the weight gradient) and at small sizes by
		// TestGPUConvBNGraphParity.
		t.Run("ConvBN/"+c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(ci), 12))
			cfg := c.cfg
			cfg.Act = ActReLU
			cout := c.ws[0]
			layer := bnLayer{rm: filled(cout, 0), rv: filled(cout, 1), momentum: DefaultMomentum, eps: DefaultEps, training: true}
			in := []*tensor.Dense{
				intTensor(rng, tensor.Float32, -2, 2, c.xs...), intTensor(rng, tensor.Float32, -1, 1, c.ws...),
				randTensor(rng, tensor.Float32, 0.5, 1.5, cout), randTensor(rng, tensor.Float32, -0.5, 0.5, cout),
			}
			s := c.shape(t, tensor.Float32, false, true)
			proj := randTensor(rng, tensor.Float32, -1, 1, s.yShape()...)
			var cpuBN *BatchNorm
			wantY, wantGrads, err := runWithGrads(t, in, proj, convBNWith(cfg, layer, &cpuBN))
			if err != nil {
				t.Fatal(err)
			}
			gpuBN := bnGPULayer(t, dev, fromFloat64s(tensor.Float32, layer.rm, cout), fromFloat64s(tensor.Float32, layer.rv, cout), true, true)
			gpuBN.Momentum, gpuBN.Eps = layer.momentum, layer.eps
			y, grads, handOffs := convBNGPUGraph(t, dev, in, proj, cfg, gpuBN)
			dxSize := rmsOf(wantGrads[0])
			t.Logf("gradient of x: natural size %.3g", dxSize)
			for _, cmp := range []struct {
				what      string
				got, want []float64
				tol       autograd.Tolerance
			}{
				{"y", y, wantY, autograd.TolParity32},
				{"gradient of x", grads[0], wantGrads[0], autograd.TolTF32For(dxSize)},
				{"running mean", runningOf(t, dev, gpuBN.RunningMean), toFloat64s(t, cpuBN.RunningMean), autograd.TolParity32},
				{"running variance", runningOf(t, dev, gpuBN.RunningVar), toFloat64s(t, cpuBN.RunningVar), autograd.TolParity32},
			} {
				if err := cmp.tol.Compare(cmp.got, cmp.want); err != nil {
					t.Errorf("%s: %v", cmp.what, err)
				}
				t.Logf("%s: GPU vs CPU: the worst element at %.3g of the bound", cmp.what, cmp.tol.Worst(cmp.got, cmp.want))
			}
			if handOffs != 1 {
				t.Errorf("the BatchNorm op took the convolution's statistics %d times, want 1", handOffs)
			}
		})
	}
}

// rms returns the root mean square of d's elements.
func rms(t testing.TB, d *tensor.Dense) float64 { return rmsOf(toFloat64s(t, d)) }

func rmsOf(v []float64) float64 {
	sum := 0.0
	for _, x := range v {
		sum += x * x
	}
	return math.Sqrt(sum / float64(len(v)))
}

// A location whose pixel coordinate loc*W - 0.5 is an integer when the
// product is rounded before the subtraction, as the CPU twin does, and
// falls just below it when the two are fused into one multiply-add: every
// kernel must round as the CPU does and pick the same cell, or its location
// gradient is a whole pixel step off (found on TARGETS.md's encoder
// locations, level 2: 0.773809493 * 42). Every point of every query sits
// on that coordinate; the other coordinate is inside a pixel.
func TestGPUMSDeformAttnCellBoundary(t *testing.T) {
	dev := gpu(t)
	const w = 42
	x := float32(0.773809493)
	if rounded, fused := float32(x*float32(w))-0.5, float32(math.FMA(float64(x), w, -0.5)); math.Floor(float64(rounded)) == math.Floor(float64(fused)) {
		t.Fatalf("%v*%d - 0.5: %v rounded twice, %v fused: the same cell, the test shows nothing", x, w, rounded, fused)
	}
	sh := msDeformShape{n: 1, s: 3 * w, m: 8, d: 32, lq: 5, l: 1, p: 2, levels: []Level{{3, w}}, dt: tensor.Float32}
	rng := rand.New(rand.NewPCG(3, 9))
	locs := make([]float64, sh.locShape().TotalSize())
	for i := 0; i < len(locs); i += 2 {
		locs[i], locs[i+1] = float64(x), 0.4
	}
	value := randTensor(rng, tensor.Float32, -1, 1, sh.valueShape()...)
	loc := fromFloat64s(tensor.Float32, locs, sh.locShape()...)
	weight := randTensor(rng, tensor.Float32, 0, 1, sh.weightShape()...)
	gy := randTensor(rng, tensor.Float32, -1, 1, sh.outShape()...)
	// The default (msdeform_sm90a.cu's on compute capability 9.0), then
	// msdeform.cu's float32 default.
	for _, name := range []string{"default", "msdeform_backward_f32_v4_r4_h_b3"} {
		t.Run("kernel="+name, func(t *testing.T) {
			var tuning msDeformTuning
			if name != "default" {
				tuning.kernel = func(bool, tensor.Dtype) msDeformKernel { return msDeformKernel{name, 4} }
			}
			withMSDeformTuning(dev, tuning, func() {
				parity(t, dev, msDeformGradForParity(sh), tensor.Float32, value, loc, weight, gy)
			})
		})
	}
}

// boundaryRoIs returns two boxes (found by a search) whose float32 adaptive
// sample count along one side is 5 or 2 with each product roi*scale rounded
// before the offset is subtracted, and 4 or 3 with the two fused; it fails
// t if that is no longer so.
func boundaryRoIs(t *testing.T, dt tensor.Dtype, cfg RoIAlignConfig) *tensor.Dense {
	t.Helper()
	boxes := []float64{0, 108.359375, 108.359375, 192.359375, 192.359375, 0, 7.234375, 172.3125, 49.234375, 193.3125}
	scale := float32(cfg.SpatialScale)
	grid := func(a, b float32, fused bool) float64 {
		start, end := float32(a*scale)-0.5, float32(b*scale)-0.5
		if fused {
			start = float32(math.FMA(float64(a), float64(scale), -0.5))
			end = float32(math.FMA(float64(b), float64(scale), -0.5))
		}
		return math.Ceil(float64((end - start) / float32(cfg.PooledW)))
	}
	for _, side := range [][2]int{{1, 3}, {6, 8}} {
		a, b := float32(boxes[side[0]]), float32(boxes[side[1]])
		if grid(a, b, false) == grid(a, b, true) {
			t.Fatalf("box side %v..%v: %v samples either way, the case shows nothing", a, b, grid(a, b, false))
		}
	}
	return fromFloat64s(dt, boxes, 2, 5)
}

// edgeRoIs returns a box (found by a search) one of whose float32 sample
// columns (bin 5, sample 0) falls below -1 with start + b*bin rounded in two
// steps and above it with the two fused; it fails t if that is no longer so.
func edgeRoIs(t *testing.T, dt tensor.Dtype, cfg RoIAlignConfig) *tensor.Dense {
	t.Helper()
	box := []float64{0, -21.640625, 10, 4.546875, 40}
	scale := float32(cfg.SpatialScale)
	start := float32(float32(box[1])*scale) - 0.5
	bin := (float32(float32(box[3])*scale) - 0.5 - start) / float32(cfg.PooledW)
	q := float32(0.5) * bin / float32(cfg.SamplingRatio)
	twice := start + float32(5*bin) + q
	fused := float32(math.FMA(5, float64(bin), float64(start))) + q
	if (twice >= -1) == (fused >= -1) {
		t.Fatalf("sample at %v rounded in two steps, %v fused: on the same side of -1, the case shows nothing", twice, fused)
	}
	return fromFloat64s(dt, box, 1, 5)
}

func manyLevels(n int) []Level {
	levels := make([]Level, n)
	for i := range levels {
		levels[i] = Level{H: 1 + i%3, W: 2 + i%2}
	}
	return levels
}

// Gradient checks with the ops on the GPU: inputs and the loss stay on the
// host, ToDevice and ToHost carry values and gradients across.
func TestGPUGradCheck(t *testing.T) {
	dev := gpu(t)
	engine := G.WithEngine(dev.Engine())
	for seed := uint64(1); seed <= 2; seed++ {
		t.Run(fmt.Sprintf("RoIAlign/seed=%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 21))
			for _, cfg := range []RoIAlignConfig{{2, 3, 0.5, 0, true}, {2, 2, 0.5, 2, false}} {
				inputs := []autograd.Input{
					{Name: "x", Value: randTensor(rng, tensor.Float64, -1, 1, 2, 3, 6, 7)},
					{Name: "rois", Value: randomRoIs(rng, tensor.Float64, 6, 2, 12, 14), NoGrad: true},
				}
				_, err := autograd.CheckGrad(func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
					x, err := ToDevice(in[0], dev)
					if err != nil {
						return nil, err
					}
					r, err := ToDevice(in[1], dev)
					if err != nil {
						return nil, err
					}
					y, err := RoIAlign(x, r, cfg)
					if err != nil {
						return nil, err
					}
					return ToHost(y)
				}, inputs, seed, engine)
				if err != nil {
					t.Fatalf("%+v: %v", cfg, err)
				}
			}
		})
		t.Run(fmt.Sprintf("MSDeformAttn/seed=%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 22))
			levels := []Level{{4, 5}, {2, 3}}
			inputs := []autograd.Input{
				{Name: "value", Value: randTensor(rng, tensor.Float64, -1, 1, 1, 26, 2, 3)},
				{Name: "loc", Value: awayFromPixels(randTensor(rng, tensor.Float64, -0.1, 1.1, 1, 3, 2, 2, 2, 2), levels)},
				{Name: "weight", Value: randTensor(rng, tensor.Float64, 0, 1, 1, 3, 2, 2, 2)},
			}
			_, err := autograd.CheckGrad(func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
				var d G.Nodes
				for _, n := range in {
					m, err := ToDevice(n, dev)
					if err != nil {
						return nil, err
					}
					d = append(d, m)
				}
				y, err := MSDeformAttn(d[0], d[1], d[2], levels)
				if err != nil {
					return nil, err
				}
				return ToHost(y)
			}, inputs, seed, engine)
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// awayFromPixels nudges sampling locations [.., L, P, 2] so that no pixel
// coordinate (loc*size - 0.5) lies within 0.05 of an integer, where bilinear
// interpolation has a kink and central differences are meaningless.
func awayFromPixels(loc *tensor.Dense, levels []Level) *tensor.Dense {
	v := loc.Float64s()
	s := loc.Shape()
	l, p := s[len(s)-3], s[len(s)-2]
	for i := 0; i < len(v); i += 2 {
		lv := levels[(i/2/p)%l]
		for j, size := range []int{lv.W, lv.H} {
			px := v[i+j]*float64(size) - 0.5
			if f := px - math.Floor(px); f < 0.05 || f > 0.95 {
				v[i+j] += 0.1 / float64(size)
			}
		}
	}
	return loc
}

// Training steps on the GPU leave device memory where it started: outputs
// and gradients of a step are freed with a Scope, and after the first step
// no step asks the driver for memory.
func TestGPUTrainingStepsDoNotLeak(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(8, 8))
	dt := tensor.Float32
	levels := []Level{{8, 8}, {4, 4}}
	feat := toDev(t, dev, randTensor(rng, dt, -1, 1, 2, 4, 8, 8))
	value := toDev(t, dev, randTensor(rng, dt, -1, 1, 2, 80, 2, 4))
	start := dev.MemStats()

	g := G.NewGraph()
	fx := G.NodeFromAny(g, feat, G.WithName("feat"))
	vx := G.NodeFromAny(g, value, G.WithName("value"))
	rois := G.NodeFromAny(g, randomRoIs(rng, dt, 16, 2, 16, 16), G.WithName("rois"))
	loc := G.NodeFromAny(g, randTensor(rng, dt, 0, 1, 2, 10, 2, 2, 3, 2), G.WithName("loc"))
	wgt := G.NodeFromAny(g, randTensor(rng, dt, 0, 1, 2, 10, 2, 2, 3), G.WithName("wgt"))
	must := func(n *G.Node, err error) *G.Node {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	pooled := must(RoIAlign(fx, must(ToDevice(rois, dev)), RoIAlignConfig{2, 2, 0.5, 2, true}))
	attn := must(MSDeformAttn(vx, must(ToDevice(loc, dev)), must(ToDevice(wgt, dev)), levels))
	l1 := must(G.Sum(must(G.Square(must(ToHost(pooled))))))
	l2 := must(G.Sum(must(G.Square(must(ToHost(attn))))))
	loss := must(G.Add(l1, l2))
	grads, err := G.Grad(loss, fx, vx)
	if err != nil {
		t.Fatal(err)
	}
	// G.Read clones what it reads, and a clone of a device tensor is a host
	// copy made through the device's engine: read the gradients' values
	// directly (they are the last nodes of the tape, so no later op reuses
	// their registers).
	var lossVal G.Value
	G.Read(loss, &lossVal)
	m := G.NewTapeMachine(g, G.WithEngine(dev.Engine()))
	defer m.Close()

	var first, last float64
	var afterFirst backend.MemStats
	const steps = 20
	for step := range steps {
		scope, err := dev.BeginScope()
		if err != nil {
			t.Fatal(err)
		}
		if err := m.RunAll(); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		last = toFloat64s(t, lossVal)[0]
		if step == 0 {
			first = last
		}
		for i, p := range []*tensor.Dense{feat, value} {
			gv := grads[i].Value()
			if !backend.IsDevice(gv) {
				t.Fatalf("gradient %d is a host value", i)
			}
			if err := dev.Axpy(-0.05, gv.(*tensor.Dense), p); err != nil {
				t.Fatal(err)
			}
		}
		if err := scope.End(); err != nil {
			t.Fatal(err)
		}
		m.Reset()
		if step == 0 {
			afterFirst = dev.MemStats()
		}
	}
	end := dev.MemStats()
	t.Logf("loss %.4f -> %.4f; memory at start %+v, after step 1 %+v, after %d steps %+v", first, last, start, afterFirst, steps, end)
	if !(last < first) {
		t.Errorf("loss did not fall: %v -> %v", first, last)
	}
	if end.InUse != start.InUse {
		t.Errorf("bytes in use: %d at the start, %d after %d steps", start.InUse, end.InUse, steps)
	}
	if end.DriverAllocs != afterFirst.DriverAllocs || end.DriverFrees != afterFirst.DriverFrees {
		t.Errorf("steps 2..%d called the driver: allocs %d -> %d, frees %d -> %d", steps,
			afterFirst.DriverAllocs, end.DriverAllocs, afterFirst.DriverFrees, end.DriverFrees)
	}
}
