package ops

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

// adamwPair is one parameter twice: on the host (the CPU twin's) and on the
// device, with the same values.
type adamwPair struct {
	host, dev *testParam
}

// setDevice copies host tensor h into device tensor d (same shape).
func setDevice(t testing.TB, dev *backend.Device, d, h *tensor.Dense) {
	t.Helper()
	if err := dev.Engine().Memcpy(d, h); err != nil {
		t.Fatal(err)
	}
}

// AdamW on the GPU against its CPU twin, float64 to TolParity64 and float32
// to TolParity32, three steps on tensors of odd lengths around the chunks'
// edges in two groups: with clipping that bites, with clipping above the
// norm, without clipping and keeping the gradients. One parameter is a view
// of rows of a larger tensor, not 16-byte aligned (its chunks are read
// element by element). The third step hands in new gradient tensors, at
// other addresses: the table must follow. Parameters, moments, gradients
// and the norm are compared after every step.
func TestGPUAdamWParity(t *testing.T) {
	dev := gpu(t)
	shapes := [][]int{{3}, {5, 7}, {16384}, {16385}, {2, 16389}, {1}, {256, 300}}
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		for _, c := range []struct {
			name string
			cfg  func(*AdamWConfig)
		}{
			{"clipped", func(c *AdamWConfig) { c.MaxGradNorm = 0.5 }},
			{"clip_above_norm", func(c *AdamWConfig) { c.MaxGradNorm = 1e6 }},
			{"no_clip_keep_grads", func(c *AdamWConfig) { c.KeepGrads = true }},
		} {
			t.Run(fmt.Sprintf("%v/%s", dt, c.name), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(26, 5))
				cfg := DefaultAdamWConfig()
				c.cfg(&cfg)
				var pairs []adamwPair
				var owned []*tensor.Dense // device tensors to free
				defer func() {
					for _, d := range owned {
						dev.FreeDense(d)
					}
				}()
				devTensor := func(h *tensor.Dense) *tensor.Dense {
					d := toDev(t, dev, h)
					owned = append(owned, d)
					return d
				}
				for i, s := range shapes {
					h := &testParam{name: fmt.Sprint("p", i), val: randTensor(rng, dt, -1, 1, s...), grad: randTensor(rng, dt, -1, 1, s...)}
					d := &testParam{name: h.name, val: devTensor(h.val), grad: devTensor(h.grad)}
					pairs = append(pairs, adamwPair{h, d})
				}
				// The view: rows 1.. of a [9, 3] tensor, 3 elements past
				// its 16-byte aligned start.
				hv := &testParam{name: "view", val: randTensor(rng, dt, -1, 1, 8, 3), grad: randTensor(rng, dt, -1, 1, 8, 3)}
				whole := devTensor(tensor.New(tensor.Of(dt), tensor.WithShape(9, 3)))
				view, err := whole.Slice(G.S(1, 9))
				if err != nil {
					t.Fatal(err)
				}
				setDevice(t, dev, view.(*tensor.Dense), hv.val)
				pairs = append(pairs, adamwPair{hv, &testParam{name: "view", val: view.(*tensor.Dense), grad: devTensor(hv.grad)}})

				groups := func(dev bool) []ParamGroup {
					gs := []ParamGroup{{LR: 1e-3, WeightDecay: 0.05}, {LR: 1e-2}}
					for i, p := range pairs {
						q := p.host
						if dev {
							q = p.dev
						}
						gs[i%2].Params = append(gs[i%2].Params, q)
					}
					return gs
				}
				hostOpt, err := NewAdamW(groups(false), cfg)
				if err != nil {
					t.Fatal(err)
				}
				devOpt, err := NewAdamW(groups(true), cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer devOpt.Free()
				tol := parityTol(dt)
				for step := 1; step <= 3; step++ {
					for _, p := range pairs {
						g := randTensor(rng, dt, -1, 1, p.host.grad.Shape()...)
						if err := tensor.Copy(p.host.grad, g); err != nil {
							t.Fatal(err)
						}
						if step == 3 {
							p.dev.grad = devTensor(g)
						} else {
							setDevice(t, dev, p.dev.grad, g)
						}
					}
					hostModel, devModel := make([]G.ValueGrad, len(pairs)), make([]G.ValueGrad, len(pairs))
					for i, p := range pairs {
						hostModel[i], devModel[i] = p.host, p.dev
					}
					if err := hostOpt.Step(hostModel); err != nil {
						t.Fatal(err)
					}
					if err := devOpt.Step(devModel); err != nil {
						t.Fatal(err)
					}
					bitwise := true
					for _, p := range pairs {
						hm, hv, _ := hostOpt.Moments(p.host)
						dm, dv, _ := devOpt.Moments(p.dev)
						for _, cmp := range []struct {
							what      string
							host, dev *tensor.Dense
						}{{"value", p.host.val, p.dev.val}, {"m", hm, dm}, {"v", hv, dv}, {"gradient", p.host.grad, p.dev.grad}} {
							got, want := fromDev(t, dev, cmp.dev), toFloat64s(t, cmp.host)
							if err := tol.Compare(got, want); err != nil {
								t.Errorf("step %d: %s: %s: GPU vs CPU: %v", step, p.host.name, cmp.what, err)
							}
							bitwise = bitwise && slices.Equal(got, want)
						}
					}
					if cfg.MaxGradNorm > 0 {
						hn, err := hostOpt.GradNorm()
						if err != nil {
							t.Fatal(err)
						}
						dn, err := devOpt.GradNorm()
						if err != nil {
							t.Fatal(err)
						}
						if err := tol.Compare([]float64{dn}, []float64{hn}); err != nil {
							t.Errorf("step %d: the norm: GPU vs CPU: %v", step, err)
						}
						bitwise = bitwise && dn == hn
					}
					t.Logf("step %d: GPU and CPU bit for bit: %v", step, bitwise)
				}
			})
		}
	}
}

// A Scope that frees the optimiser's device state makes the next step an
// error, not a write into memory handed out again.
func TestGPUAdamWStateOutlivesScopes(t *testing.T) {
	dev := gpu(t)
	p := &testParam{name: "p", val: toDev(t, dev, fromFloat64s(tensor.Float32, []float64{1, 2}, 2)), grad: toDev(t, dev, fromFloat64s(tensor.Float32, []float64{1, 1}, 2))}
	defer dev.FreeDense(p.val)
	defer dev.FreeDense(p.grad)
	s, err := dev.BeginScope()
	if err != nil {
		t.Fatal(err)
	}
	opt, err := NewAdamW([]ParamGroup{{Params: valueGrads(p), LR: 0.1}}, DefaultAdamWConfig())
	if err != nil {
		s.End()
		t.Fatal(err)
	}
	if err := s.End(); err != nil {
		t.Fatal(err)
	}
	if err := opt.Step(valueGrads(p)); err == nil || !errors.Is(err, errAdamWFreed) {
		t.Errorf("a step after the Scope freed the state: %v", err)
	}
}

// detrR50Shapes returns the parameter shapes of DETR with a ResNet-50
// backbone as facebookresearch/detr builds it (models/detr.py, backbone.py,
// transformer.py; 41.6M parameters in 352 tensors): torchvision's
// resnet50 without its fc layer (conv weights, and the weight and bias of
// each BatchNorm: DETR freezes them as FrozenBatchNorm2d, counted here as
// a model that trains its norms would hold them), the 1x1 input
// projection 2048 -> 256, 6 encoder and 6 decoder layers of d_model 256,
// 8 heads and FFN 2048 (nn.MultiheadAttention's packed in_proj), the
// decoder's final LayerNorm, 100 query embeddings, the class head of 91+1
// classes and the 3-layer box MLP. It splits them as DETR's param_groups
// do, the backbone apart (lr 1e-5), and the rest into weights and into
// norms and biases (no weight decay). kernels/bench/anchors_adamw.py
// builds the same list.
func detrR50Shapes() (backbone, weights, normsBiases [][]int) {
	conv := func(out, in, k int) { backbone = append(backbone, []int{out, in, k, k}) }
	bn := func(c int) { backbone = append(backbone, []int{c}, []int{c}) }
	conv(64, 3, 7)
	bn(64)
	in := 64
	for stage, blocks := range []int{3, 4, 6, 3} {
		w := 64 << stage
		for b := range blocks {
			conv(w, in, 1)
			bn(w)
			conv(w, w, 3)
			bn(w)
			conv(4*w, w, 1)
			bn(4 * w)
			if b == 0 {
				conv(4*w, in, 1)
				bn(4 * w)
			}
			in = 4 * w
		}
	}
	const d, ffn = 256, 2048
	linear := func(out, in int) {
		weights = append(weights, []int{out, in})
		normsBiases = append(normsBiases, []int{out})
	}
	norm := func() { normsBiases = append(normsBiases, []int{d}, []int{d}) }
	attn := func() {
		linear(3*d, d) // in_proj
		linear(d, d)   // out_proj
	}
	weights = append(weights, []int{d, 2048, 1, 1}) // input_proj
	normsBiases = append(normsBiases, []int{d})
	for range 6 {
		attn()
		linear(ffn, d)
		linear(d, ffn)
		norm()
		norm()
	}
	for range 6 {
		attn()
		attn()
		linear(ffn, d)
		linear(d, ffn)
		norm()
		norm()
		norm()
	}
	norm()                                   // the decoder's final norm
	weights = append(weights, []int{100, d}) // query_embed
	linear(92, d)                            // class_embed
	linear(d, d)                             // bbox_embed
	linear(d, d)
	linear(4, d)
	return backbone, weights, normsBiases
}

// BenchmarkGPUAdamW times one AdamW step of DETR-R50's parameters
// (detrR50Shapes) on the GPU, float32: clipping on (DETR's
// clip_max_norm 0.1) or off, the gradients zeroed (the default, as
// gorgonia's solvers) or kept (as torch's step, whose zero_grad sets them
// to None for free). CUDA events around each of b.N steps after 5 untimed
// ones (-test.benchtime 30x for the suite's median of 30); it reports the
// median (ms), the compulsory bytes over it (GB/s: the step reads param,
// grad, m and v and writes param, m and v; zeroing writes grad; clipping
// reads grad once more) and its share of the device's copy bandwidth
// (%copy). kernels/bench/anchors_adamw.py times torch.optim.AdamW(fused=True)
// on the same shapes.
func BenchmarkGPUAdamW(b *testing.B) {
	dev := gpu(b)
	backbone, weights, normsBiases := detrR50Shapes()
	rng := rand.New(rand.NewPCG(1, 1))
	var owned []*tensor.Dense
	defer func() {
		for _, d := range owned {
			dev.FreeDense(d)
		}
	}()
	elems := 0
	group := func(shapes [][]int, lr, wd float64) ParamGroup {
		g := ParamGroup{LR: lr, WeightDecay: wd}
		for i, s := range shapes {
			n := tensor.Shape(s).TotalSize()
			elems += n
			val := toDev(b, dev, randTensor(rng, tensor.Float32, -0.1, 0.1, n))
			grad := toDev(b, dev, randTensor(rng, tensor.Float32, -1e-3, 1e-3, n))
			owned = append(owned, val, grad)
			g.Params = append(g.Params, &testParam{name: fmt.Sprint(i), val: val, grad: grad})
		}
		return g
	}
	groups := []ParamGroup{group(backbone, 1e-5, 1e-4), group(weights, 1e-4, 1e-4), group(normsBiases, 1e-4, 0)}
	var model []G.ValueGrad
	for _, g := range groups {
		model = append(model, g.Params...)
	}
	b.Logf("DETR-R50: %d parameters in %d tensors", elems, len(model))
	for _, clip := range []bool{true, false} {
		for _, zero := range []bool{true, false} {
			name := fmt.Sprintf("impl=cuda/case=detr_r50/clip=%s/zero_grad=%s", onOff(clip), onOff(zero))
			b.Run(name, func(b *testing.B) {
				cfg := DefaultAdamWConfig()
				if clip {
					cfg.MaxGradNorm = 0.1
				}
				cfg.KeepGrads = !zero
				opt, err := NewAdamW(groups, cfg)
				if err != nil {
					b.Fatal(err)
				}
				defer opt.Free()
				med := timeSteps(b, dev, func() error { return opt.Step(model) })
				perElem := 28.0
				if zero {
					perElem += 4
				}
				if clip {
					perElem += 4
				}
				reportBandwidth(b, dev, med, perElem*float64(elems))
			})
		}
	}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
