package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

// multiRoIGPUCase is a MultiLevelRoIAlign's pyramid, RoIs and config.
type multiRoIGPUCase struct {
	name    string
	n, c    int
	image   int   // the images' side, in pixels
	strides []int // per level, finest first
	k       int
	cfg     MultiLevelRoIAlignConfig // Scales set from strides
	empty   int                      // a level no RoI is of (-1: none)
}

// multiRoIGPUCases: Mask R-CNN's pyramid (P2-P5, canonical 224 on P4) with
// the box head's 7x7 and the mask head's 14x14 pooling (sampling 2: the
// NCHW kernels forward, in float32 roialign_fwd_nchw_cols), adaptive
// sampling (the channels-last kernels, and in float32 with C % 4 == 0 the
// vector ones), Columns, RoIs fewer and more than the channels-last
// kernels' spatial order needs (64), and a level without RoIs.
var multiRoIGPUCases = []multiRoIGPUCase{
	{name: "box_head", n: 2, c: 16, image: 256, strides: []int{4, 8, 16, 32}, k: 200, empty: -1,
		cfg: MultiLevelRoIAlignConfig{PooledH: 7, PooledW: 7, SamplingRatio: 2, Aligned: true, CanonicalSize: 224, CanonicalLevel: 2, Columns: true}},
	{name: "mask_head", n: 2, c: 8, image: 256, strides: []int{4, 8, 16, 32}, k: 40, empty: -1,
		cfg: MultiLevelRoIAlignConfig{PooledH: 14, PooledW: 14, SamplingRatio: 2, Aligned: true, CanonicalSize: 224, CanonicalLevel: 2}},
	{name: "adaptive", n: 2, c: 12, image: 128, strides: []int{4, 8, 16}, k: 90, empty: -1,
		cfg: MultiLevelRoIAlignConfig{PooledH: 3, PooledW: 5, SamplingRatio: 0, Aligned: true, CanonicalSize: 32, CanonicalLevel: 1}},
	{name: "legacy_empty_level", n: 3, c: 5, image: 96, strides: []int{4, 8, 16}, k: 30, empty: 2,
		cfg: MultiLevelRoIAlignConfig{PooledH: 4, PooledW: 3, SamplingRatio: 1, Aligned: false, CanonicalSize: 24, CanonicalLevel: 1, Columns: true}},
}

// shape is the case's multiRoIShape.
func (c multiRoIGPUCase) shape(dt tensor.Dtype) *multiRoIShape {
	s := &multiRoIShape{cfg: c.cfg, n: c.n, c: c.c, k: c.k, dt: dt}
	s.cfg.Scales = nil
	for _, st := range c.strides {
		s.cfg.Scales = append(s.cfg.Scales, 1/float64(st))
		s.hw = append(s.hw, [2]int{c.image / st, c.image / st})
	}
	return s
}

// rois draws the case's RoIs: sides from 2 pixels to twice the image
// (every level gets some, but an empty level's, which go to the level
// below), some reaching past the image, and an empty, an inverted, a NaN
// and an infinite box.
func (c multiRoIGPUCase) rois(rng *rand.Rand, s *multiRoIShape, dt tensor.Dtype) *tensor.Dense {
	v := make([]float64, 0, 5*c.k)
	img := float64(c.image)
	for range c.k {
		side := math.Exp(math.Log(2) + rng.Float64()*math.Log(img))
		a := math.Exp(rng.Float64() - 0.5)
		x, y := rng.Float64()*img*1.1-0.1*img, rng.Float64()*img*1.1-0.1*img
		w, h := side*a, side/a
		if c.empty >= 0 {
			for s.cfg.Level(x, y, x+w, y+h) == c.empty {
				w, h = w/2, h/2
			}
		}
		v = append(v, float64(rng.IntN(c.n)), x, y, x+w, y+h)
	}
	v[5*1+3] = v[5*1+1]                     // empty
	v[5*2+2], v[5*2+4] = v[5*2+4], v[5*2+2] // inverted
	v[5*3+4] = math.NaN()
	if c.empty != len(c.strides)-1 {
		v[5*4+3] = math.Inf(1)
	}
	return fromFloat64s(dt, v, c.k, 5)
}

// multiRoIGPUChecks returns the case's ops with inputs drawn for them: the
// forward (features..., rois) and each level's backward (rois, gradient
// of the rows).
func multiRoIGPUChecks(t testing.TB, rng *rand.Rand, c multiRoIGPUCase, dt tensor.Dtype) ([]*specOp, [][]*tensor.Dense) {
	t.Helper()
	s := c.shape(dt)
	rois := c.rois(rng, s, dt)
	fwd := []*tensor.Dense{}
	for l := range s.levels() {
		fwd = append(fwd, randTensor(rng, dt, -1, 1, s.featShape(l)...))
	}
	fwd = append(fwd, rois)
	ops, inputs := []*specOp{multiRoIOp(s)}, [][]*tensor.Dense{fwd}
	gy := randTensor(rng, dt, -1, 1, s.rowsShape()...)
	for l := range s.levels() {
		ops = append(ops, multiRoIGradOp(s, l))
		inputs = append(inputs, []*tensor.Dense{rois, gy})
	}
	return ops, inputs
}

// MultiLevelRoIAlign's forward op and every level's backward op on the
// GPU against their CPU twins, to TolParity32 and TolParity64: each RoI
// pooled from its level into its row, each level's gradient from its
// RoIs alone (an empty level's zero); the ops' levels are the CPU's, bit
// for bit (kernels.RoILevelSize), so no RoI changes level between the two.
func TestGPUMultiLevelRoIAlignParity(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(32, 30))
	for _, c := range multiRoIGPUCases {
		opsParity(t, dev, c.name, []tensor.Dtype{tensor.Float32, tensor.Float64}, parityTol, func(t *testing.T, dt tensor.Dtype) ([]*specOp, [][]*tensor.Dense) {
			return multiRoIGPUChecks(t, rng, c, dt)
		})
	}
}

// The forward with each of RoIAlign's forward kernels in turn (the
// variants included, where the build has them), and the backward with
// each backward: the level filter is in every kernel.
func TestGPUMultiLevelRoIAlignKernels(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(32, 31))
	c := multiRoIGPUCases[0]
	c.cfg.Columns = false
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		ops, inputs := multiRoIGPUChecks(t, rng, c, dt)
		s := c.shape(dt)
		for _, backward := range []bool{false, true} {
			kvs := roiAlignVariants(backward, dt)
			if !backward {
				kvs = append(kvs, roiAlignColsVariants(s.roiAlign(0))...)
			}
			for _, kv := range kvs {
				t.Run(fmt.Sprintf("%v/%s", dt, kv), func(t *testing.T) {
					skipUnbuiltVariant(t, kv.k.Module(), kv.k.Name())
					withRoIAlignKernel(dev, backward, kv, func() {
						if !backward {
							parityBy(t, dev, ops[0], []segment{{tol: parityTol(dt)}}, inputs[0]...)
							return
						}
						for l := range s.levels() {
							parityBy(t, dev, ops[1+l], []segment{{tol: parityTol(dt)}}, inputs[1+l]...)
						}
					})
				})
			}
		}
	}
}

// A training step's graph on the GPU (NewTapeMachine): the pyramid and the
// RoIs on the device, MultiLevelRoIAlign (rows, and Columns through its
// transpose), a loss on the device, G.Grad with respect to every level.
// The step queues its kernels and never waits for the GPU (the level
// assignment reads no RoI on the host); its loss and gradients match the
// same graph on the host.
func TestGPUMultiLevelRoIAlignGraph(t *testing.T) {
	dev := gpu(t)
	for _, c := range []multiRoIGPUCase{multiRoIGPUCases[0], multiRoIGPUCases[2]} {
		for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
			t.Run(fmt.Sprintf("%s/%v", c.name, dt), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(32, 32))
				s := c.shape(dt)
				var feats []*tensor.Dense
				for l := range s.levels() {
					feats = append(feats, randTensor(rng, dt, -1, 1, s.featShape(l)...))
				}
				rois := c.rois(rng, s, dt)
				run := func(onDev bool) (float64, [][]float64) {
					g := G.NewGraph()
					place := func(d *tensor.Dense, name string) *G.Node {
						if onDev {
							d = toDev(t, dev, d)
						}
						return G.NewTensor(g, dt, d.Dims(), G.WithShape(d.Shape()...), G.WithName(name), G.WithValue(d))
					}
					var fs G.Nodes
					for l, f := range feats {
						fs = append(fs, place(f, fmt.Sprintf("p%d", l)))
					}
					y := G.Must(MultiLevelRoIAlign(fs, place(rois, "rois"), s.cfg))
					loss := G.Must(Mean(G.Must(Square(y)), nil, false))
					grads, err := G.Grad(loss, fs...)
					if err != nil {
						t.Fatal(err)
					}
					var opts []G.VMOpt
					if onDev {
						opts = append(opts, G.WithEngine(dev.Engine()))
					}
					m, err := NewTapeMachine(g, opts...)
					if err != nil {
						t.Fatalf("device=%t: %v", onDev, err)
					}
					defer m.Close()
					var before backend.Counters
					if onDev {
						if err := dev.Synchronize(); err != nil {
							t.Fatal(err)
						}
						before = dev.Counters()
					}
					if err := m.RunAll(); err != nil {
						t.Fatalf("device=%t: %v", onDev, err)
					}
					if !onDev {
						out := [][]float64{}
						for _, gr := range grads {
							out = append(out, toFloat64s(t, gr.Value()))
						}
						return toFloat64s(t, loss.Value())[0], out
					}
					step := dev.Counters().Sub(before)
					if step.Waits != 0 || step.Launches == 0 {
						t.Errorf("the step waited for the GPU %d times and queued %d kernels; want no wait", step.Waits, step.Launches)
					}
					out := [][]float64{}
					for _, gr := range grads {
						out = append(out, fromDev(t, dev, gr.Value()))
					}
					return fromDev(t, dev, loss.Value())[0], out
				}
				wantLoss, wantGrads := run(false)
				gotLoss, gotGrads := run(true)
				tol := parityTol(dt)
				if err := tol.Compare([]float64{gotLoss}, []float64{wantLoss}); err != nil {
					t.Errorf("loss: %v", err)
				}
				for l := range wantGrads {
					if err := tol.Compare(gotGrads[l], wantGrads[l]); err != nil {
						t.Errorf("gradient of level %d: %v", l, err)
					}
				}
			})
		}
	}
}

// A bad batch index is reported by the next call that waits for the GPU,
// naming the op, by the forward and by the backward of the RoI's level.
func TestGPUMultiLevelRoIAlignRunTimeErrors(t *testing.T) {
	dev := gpu(t)
	if err := dev.Synchronize(); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(32, 33))
	c := multiRoIGPUCases[3]
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		ops, inputs := multiRoIGPUChecks(t, rng, c, dt)
		rv := toFloat64s(t, inputs[0][len(inputs[0])-1])
		for _, b := range []float64{float64(c.n), math.NaN()} {
			rv[5*7] = b
			rois := toDev(t, dev, fromFloat64s(dt, rv, c.k, 5))
			level := c.shape(dt).cfg.Level(rv[5*7+1], rv[5*7+2], rv[5*7+3], rv[5*7+4])
			for i, op := range ops {
				var in []G.Value
				for _, d := range inputs[i] {
					in = append(in, toDev(t, dev, d))
				}
				if i == 0 {
					in[len(in)-1] = rois
				} else {
					in[0] = rois
				}
				_, err := op.Do(in...)
				if err == nil {
					err = dev.Synchronize()
				}
				want := i == 0 || i-1 == level
				if got := err != nil && strings.Contains(err.Error(), "ops: MultiLevelRoIAlign") &&
					strings.Contains(err.Error(), fmt.Sprintf("a RoI has a batch index outside [0, %d) or NaN", c.n)); got != want {
					t.Errorf("%v, batch index %v, %v (the RoI's level %d): error %v, want one: %t", dt, b, op, level, err, want)
				}
				// The error is reported once.
				if err := dev.Synchronize(); err != nil {
					t.Errorf("again: %v", err)
				}
			}
		}
	}
}

// BenchmarkGPUMultiLevelRoIAlign times MultiLevelRoIAlign in float32 on
// Mask R-CNN's pyramid of two 800x1216 images (P2-P5, 256 channels) with
// its box head's 512 RoIs a image pooled to 7x7 (sampling 2, Columns) and
// its mask head's 128 a image pooled to 14x14. fwd is the forward op, bwd
// every level's backward op in turn. CUDA events around each call, the
// median of b.N (run with -test.benchtime 30x); GB/s of the compulsory
// bytes: the pooled rows written (fwd), read (bwd), and the RoIs' share of
// the pyramid read (fwd) or its gradients written (bwd), counted as the
// whole pyramid.
func BenchmarkGPUMultiLevelRoIAlign(b *testing.B) {
	pyramid := []int{4, 8, 16, 32}
	for _, c := range []struct {
		name   string
		k      int
		pooled int
	}{
		{"box_head_1024x7x7", 1024, 7},
		{"mask_head_256x14x14", 256, 14},
	} {
		dt := tensor.Float32
		rng := rand.New(rand.NewPCG(32, 34))
		s := &multiRoIShape{n: 2, c: 256, k: c.k, dt: dt, cfg: MultiLevelRoIAlignConfig{
			PooledH: c.pooled, PooledW: c.pooled, SamplingRatio: 2, Aligned: true, CanonicalSize: 224, CanonicalLevel: 2,
		}}
		for _, st := range pyramid {
			s.cfg.Scales = append(s.cfg.Scales, 1/float64(st))
			s.hw = append(s.hw, [2]int{800 / st, 1216 / st})
		}
		var in []*tensor.Dense
		bytes := 0.0
		for l := range s.levels() {
			f := randTensor(rng, dt, -1, 1, s.featShape(l)...)
			in = append(in, f)
			bytes += float64(f.Shape().TotalSize() * int(dt.Size()))
		}
		v := make([]float64, 0, 5*c.k)
		for range c.k {
			side := math.Exp(math.Log(16) + rng.Float64()*math.Log(40))
			x, y := rng.Float64()*(1216-side), rng.Float64()*(800-side)
			v = append(v, float64(rng.IntN(2)), x, y, x+side, y+side)
		}
		rois := fromFloat64s(dt, v, c.k, 5)
		in = append(in, rois)
		gy := randTensor(rng, dt, -1, 1, s.rowsShape()...)
		bytes += float64(gy.Shape().TotalSize() * int(dt.Size()))
		name := func(pass string) string {
			return fmt.Sprintf("impl=cuda/dtype=%v/case=%s/pass=%s", dt, c.name, pass)
		}
		b.Run(name("fwd"), func(b *testing.B) {
			runCase(b, "cuda", multiRoIOp(s), in, bytes)
		})
		b.Run(name("bwd"), func(b *testing.B) {
			dev := gpu(b)
			r, g := toDev(b, dev, rois), toDev(b, dev, gy)
			defer dev.FreeDense(r)
			defer dev.FreeDense(g)
			outs := make([]G.Value, s.levels())
			var grads []*specOp
			for l := range s.levels() {
				grads = append(grads, multiRoIGradOp(s, l))
			}
			med := timeSteps(b, dev, func() error {
				for l, op := range grads {
					var err error
					if outs[l], err = op.UsePreallocDo(outs[l], r, g); err != nil {
						return err
					}
				}
				return nil
			})
			for _, o := range outs {
				if d, ok := o.(*tensor.Dense); ok {
					dev.FreeDense(d)
				}
			}
			reportBandwidth(b, dev, med, bytes)
		})
	}
}
