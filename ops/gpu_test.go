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
	"github.com/stheno-ml/stheno/kernels/cuda"
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

// opsParity runs, for each dtype in dts, the ops checks gives (op i on
// inputs[i]) on dev and compares each with its CPU twin to tol(dt), in
// subtests named dtype/name/op.
func opsParity(t *testing.T, dev *backend.Device, name string, dts []tensor.Dtype, tol func(tensor.Dtype) autograd.Tolerance,
	checks func(t *testing.T, dt tensor.Dtype) ([]*specOp, [][]*tensor.Dense)) {
	for _, dt := range dts {
		t.Run(dt.String()+"/"+name, func(t *testing.T) {
			ops, inputs := checks(t, dt)
			for i, op := range ops {
				t.Run(op.kindName(), func(t *testing.T) {
					parityBy(t, dev, op, []segment{{tol: tol(dt)}}, inputs[i]...)
				})
			}
		})
	}
}

// exactTol is the zero tolerance of the kernels that promise their CPU
// twins' bits (NaN where the twin has NaN).
func exactTol(tensor.Dtype) autograd.Tolerance { return autograd.Tolerance{} }

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

func filled(n int, v float64) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = v
	}
	return s
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

// A machine built without G.WithEngine(dev.Engine()) gives its device
// outputs gorgonia's host engine; the op that reads one refuses it and says
// how to build the machine, and the value freed by that op's predecessor
// is not touched.
func TestGPUMachineWithoutDeviceEngine(t *testing.T) {
	dev := gpu(t)
	g := G.NewGraph()
	x := G.NodeFromAny(g, toDev(t, dev, fromFloat64s(tensor.Float32, []float64{-1, 0, 1, 2}, 4)), G.WithName("x"))
	y, err := Sigmoid(x)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Sigmoid(y); err != nil {
		t.Fatal(err)
	}
	m, err := NewTapeMachine(g)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	scope, err := dev.BeginScope()
	if err != nil {
		t.Fatal(err)
	}
	defer scope.End()
	err = m.RunAll()
	if err == nil || !strings.Contains(err.Error(), "ops: Sigmoid: x: backend:") ||
		!strings.Contains(err.Error(), "build the TapeMachine with G.WithEngine(dev.Engine())") {
		t.Errorf("got error %v, want Sigmoid's refusal of x naming G.WithEngine(dev.Engine())", err)
	}
}

// An op without device kernels refuses device inputs and says how to run
// it on the host.
func TestGPUHostOnlyOpsAdvise(t *testing.T) {
	dev := gpu(t)
	dt := tensor.Float64
	hostOnly := newOp(&opSpec{
		name: "HostOnly", config: "x",
		inputs: []argSpec{{name: "x", shape: tensor.Shape{2}}}, out: tensor.Shape{2}, dtype: dt,
		cpu: func(in []*tensor.Dense, out *tensor.Dense) error { return nil },
	})
	_, err := hostOnly.Do(toDev(t, dev, fromFloat64s(dt, []float64{1, 2}, 2)))
	if want := "ops: HostOnly: no GPU kernel yet; move its inputs to the host with ops.ToHost"; err == nil || err.Error() != want {
		t.Errorf("got error %v, want %q", err, want)
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
		t.Run(fmt.Sprintf("MultiLevelRoIAlign/seed=%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 23))
			for _, columns := range []bool{false, true} {
				cfg := pyramidCfg
				cfg.Columns = columns
				var inputs []autograd.Input
				for l, s := range cfg.Scales {
					side := int(64 * s)
					inputs = append(inputs, autograd.Input{Name: fmt.Sprintf("features[%d]", l),
						Value: randTensor(rng, tensor.Float64, -1, 1, 2, 2, side, side)})
				}
				inputs = append(inputs, autograd.Input{Name: "rois", Value: randomPyramidRoIs(rng, 2, 12), NoGrad: true})
				_, err := autograd.CheckGrad(func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
					d, err := toDevices(in, dev)
					if err != nil {
						return nil, err
					}
					y, err := MultiLevelRoIAlign(d[:len(d)-1], d[len(d)-1], cfg)
					if err != nil {
						return nil, err
					}
					return ToHost(y)
				}, inputs, seed, engine)
				if err != nil {
					t.Fatalf("columns=%t: %v", columns, err)
				}
			}
		})
		t.Run(fmt.Sprintf("ConvTranspose/seed=%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 24))
			// The depth-to-space path (2x2, stride 2) and the strided
			// data-gradient GEMM (3x3, stride 2, padding, output padding).
			for _, c := range []int{0, 2} {
				tc := convTransposeCases[c]
				inputs := []autograd.Input{
					{Name: "x", Value: randTensor(rng, tensor.Float64, -1, 1, tc.n, tc.ci, tc.h, tc.w)},
					{Name: "w", Value: randTensor(rng, tensor.Float64, -1, 1, tc.ci, tc.co, tc.kh, tc.kw)},
					{Name: "bias", Value: randTensor(rng, tensor.Float64, -0.5, 0.5, tc.co)},
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
					y, err := ConvTranspose(d[0], d[1], d[2], tc.cfg)
					if err != nil {
						return nil, err
					}
					return ToHost(y)
				}, inputs, seed, engine)
				if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
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
				d, err := toDevices(in, dev)
				if err != nil {
					return nil, err
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

// toDevices moves each of in to dev inside the graph.
func toDevices(in G.Nodes, dev *backend.Device) (G.Nodes, error) {
	out := make(G.Nodes, len(in))
	for i, n := range in {
		m, err := ToDevice(n, dev)
		if err != nil {
			return nil, err
		}
		out[i] = m
	}
	return out, nil
}

// skipUnbuiltVariant skips tb when module.name is a kernel variant
// (kernels/cuda's table says so) that the embedded modules do not hold
// (KernelInfo.Built): the shipped modules leave the variants out, and
// `make kernels VARIANTS=1` builds them in. It does not ask the driver,
// whose not-found answer compute-sanitizer would report as an error.
func skipUnbuiltVariant(tb testing.TB, module, name string) {
	tb.Helper()
	if info, ok := cuda.Lookup(module + "." + name); ok && !info.Built() {
		tb.Skipf("kernel variant %s.%s is not in this build (make kernels VARIANTS=1)", module, name)
	}
}
