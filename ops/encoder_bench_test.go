package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

// BenchmarkGPUEncoderStep times a whole training step of a stack shaped
// like Deformable-DETR's encoder, the PyTorch side of which is
// ../shared/anchors/encoder_stack/encoder_step.py (run in the same call by
// kernels/bench/gpu-check.sh's encoder step): per layer, Linear value,
// sampling-offset and attention-weight projections (offsets through a
// sigmoid as locations, weights softmaxed over levels x points),
// MSDeformAttn, the output Linear, residual Add and LayerNorm, an FFN
// (256 -> 1024 -> 256, ReLU), residual Add and LayerNorm; loss mean(x²);
// G.Grad, AdamW with clip_grad_norm_(0.1); levels 64², 32², 16², 8² (a
// 512x512 image at strides 8 to 64), 8 heads of 32, 4 levels x 4 points,
// d 256. Each step runs in its own Scope, as README's loop does, and the
// steps are queued back to back with one synchronisation at the end, as
// the anchor times them.
//
// It reports ms per step (wall time over the steps, the GPU's work
// included), host-ms (the host's time to queue a step: RunAll, the
// optimiser's step, Scope.End and Reset), host-us/node (that over the
// graph's nodes), idle-host-us/node (the same, of steps queued on an
// idle GPU, one at a time: no launch waits for room in the GPU's queue,
// so it is the host's own time), gpu-ms (CUDA events around the steps: the GPU's time,
// idle gaps included), peak-GiB (the allocator's high-water mark over the
// steps: parameters, AdamW's state and the step's intermediates), and per
// step the kernel launches, cuBLAS calls, waits for the GPU and the host's
// allocations (allocs/op). It logs an
// idle step's host time by part: RunAll, AdamW's Step, BeginScope with End
// and Reset, and the Flush of the launches held back at the step's end.
// machine=stheno is ops.NewTapeMachine, which frees intermediates after
// their last reader; machine=gorgonia is gorgonia's own, which keeps them
// until the Scope ends.
//
//	STHENO_ENCODER='n=8,layers=6;n=1,layers=1'   # the configurations (default: n=1,2,8 x 6 layers, and n=1 x 1 and 12 layers)
func BenchmarkGPUEncoderStep(b *testing.B) {
	dev := gpu(b)
	configs := [][2]int{{1, 1}, {1, 6}, {1, 12}, {2, 6}, {8, 6}}
	if env := os.Getenv("STHENO_ENCODER"); env != "" {
		configs = nil
		for _, item := range strings.Split(env, ";") {
			var n, l int
			if _, err := fmt.Sscanf(strings.TrimSpace(item), "n=%d,layers=%d", &n, &l); err != nil || n < 1 || l < 1 {
				b.Fatalf("STHENO_ENCODER: %q: want n=N,layers=L with positive integers", item)
			}
			configs = append(configs, [2]int{n, l})
		}
	}
	for _, c := range configs {
		for _, machine := range []string{"stheno", "gorgonia"} {
			b.Run(fmt.Sprintf("n=%d/layers=%d/machine=%s", c[0], c[1], machine), func(b *testing.B) {
				benchEncoderStep(b, dev, c[0], c[1], machine == "stheno")
			})
		}
	}
}

// encoderLevels are the anchor's feature maps.
var encoderLevels = []Level{{64, 64}, {32, 32}, {16, 16}, {8, 8}}

func benchEncoderStep(b *testing.B, dev *backend.Device, n, layers int, plan bool) {
	const d, heads, nl, pts, ffn = 256, 8, 4, 4, 1024
	s := 0
	for _, l := range encoderLevels {
		s += l.H * l.W
	}
	g := G.NewGraph()
	rng := rand.New(rand.NewPCG(1, uint64(n*100+layers)))
	dt := tensor.Float32
	var params G.Nodes
	// PyTorch's Linear initialisation: U(-1/sqrt(in), 1/sqrt(in)).
	param := func(name string, lo, hi float64, shape ...int) *G.Node {
		p := G.NodeFromAny(g, toDev(b, dev, randTensor(rng, dt, lo, hi, shape...)), G.WithName(name))
		params = append(params, p)
		return p
	}
	constant := func(name string, v float64, size int) *G.Node {
		return param(name, v, v, size)
	}
	linear := func(name string, x *G.Node, out, in int) *G.Node {
		k := 1 / math.Sqrt(float64(in))
		y, err := Linear(x, param(name+".w", -k, k, out, in), param(name+".b", -k, k, out))
		if err != nil {
			b.Fatal(err)
		}
		return y
	}
	must := func(x *G.Node, err error) *G.Node {
		b.Helper()
		if err != nil {
			b.Fatal(err)
		}
		return x
	}
	x := G.NodeFromAny(g, toDev(b, dev, randTensor(rng, dt, -1, 1, n, s, d)), G.WithName("tokens"))
	defer func() {
		// The next configuration starts from an empty device: its peak
		// is its own.
		for _, p := range append(params, x) {
			if err := dev.FreeDense(p.Value().(*tensor.Dense)); err != nil {
				b.Error(err)
			}
		}
		if err := dev.ReleaseCached(); err != nil {
			b.Error(err)
		}
	}()
	h := x
	for l := range layers {
		name := fmt.Sprintf("layer%d", l)
		v := must(G.Reshape(linear(name+".value", h, d, d), tensor.Shape{n, s, heads, d / heads}))
		loc := must(G.Reshape(must(Sigmoid(linear(name+".offset", h, heads*nl*pts*2, d))), tensor.Shape{n, s, heads, nl, pts, 2}))
		aw := must(G.Reshape(linear(name+".attn", h, heads*nl*pts, d), tensor.Shape{n, s, heads, nl * pts}))
		w := must(G.Reshape(must(Softmax(aw, -1)), tensor.Shape{n, s, heads, nl, pts}))
		a := must(MSDeformAttn(v, loc, w, encoderLevels))
		h = must(LayerNorm(must(Add(h, linear(name+".out", a, d, d))), constant(name+".ln1.w", 1, d), constant(name+".ln1.b", 0, d), 1e-5))
		f := linear(name+".ffn2", must(ReLU(linear(name+".ffn1", h, ffn, d))), d, ffn)
		h = must(LayerNorm(must(Add(h, f)), constant(name+".ln2.w", 1, d), constant(name+".ln2.b", 0, d), 1e-5))
	}
	loss := must(Mean(must(Square(h)), nil, false))
	grads, err := G.Grad(loss, params...)
	if err != nil {
		b.Fatal(err)
	}
	nodes := len(g.AllNodes())
	var m G.VM
	if plan {
		if m, err = NewTapeMachine(g, G.WithEngine(dev.Engine())); err != nil {
			b.Fatal(err)
		}
	} else {
		m = G.NewTapeMachine(g, G.WithEngine(dev.Engine()))
	}
	defer m.Close()
	pg, err := ParamsWithGrads(params, grads)
	if err != nil {
		b.Fatal(err)
	}
	cfg := DefaultAdamWConfig()
	cfg.MaxGradNorm, cfg.KeepGrads = 0.1, true
	opt, err := NewAdamW([]ParamGroup{{Params: pg, LR: 1e-4, WeightDecay: 1e-4}}, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer opt.Free()
	// host sums the steps' host time; machine, optimizer and scopes its
	// parts: RunAll, AdamW's Step, and BeginScope, End and Reset.
	var host, machine, optimizer, scopes time.Duration
	step := func() error {
		start := time.Now()
		scope, err := dev.BeginScope()
		if err != nil {
			return err
		}
		ran := time.Now()
		if err := m.RunAll(); err != nil {
			return err
		}
		stepped := time.Now()
		if err := opt.Step(pg); err != nil {
			return err
		}
		ending := time.Now()
		// The loss stays on the device until the step's end; the anchor
		// does not read it either.
		if err := scope.End(); err != nil {
			return err
		}
		m.Reset()
		end := time.Now()
		host += end.Sub(start)
		machine += stepped.Sub(ran)
		optimizer += ending.Sub(stepped)
		scopes += ran.Sub(start) + end.Sub(ending)
		return nil
	}
	for range 3 {
		if err := step(); err != nil {
			b.Fatal(err)
		}
	}
	if err := dev.Synchronize(); err != nil {
		b.Fatal(err)
	}
	// The loss of one more step, read once: a training step that learns.
	scope, err := dev.BeginScope()
	if err != nil {
		b.Fatal(err)
	}
	if err := m.RunAll(); err != nil {
		b.Fatal(err)
	}
	lossValue := fromDev(b, dev, loss.Value())[0]
	if err := scope.End(); err != nil {
		b.Fatal(err)
	}
	m.Reset()
	if math.IsNaN(lossValue) || math.IsInf(lossValue, 0) {
		b.Fatalf("loss %v", lossValue)
	}

	dev.ResetPeakMemory()
	host = 0
	counts, graphs := dev.Counters(), dev.GraphStats()
	first, err := dev.Record()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := step(); err != nil {
			b.Fatal(err)
		}
	}
	last, err := dev.Record()
	if err != nil {
		b.Fatal(err)
	}
	if err := dev.Synchronize(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	gpuTime, err := dev.Elapsed(first, last)
	if err != nil {
		b.Fatal(err)
	}
	first.Release()
	last.Release()
	per := dev.Counters().Sub(counts)
	replays := dev.GraphStats().Replays - graphs.Replays
	per.Waits-- // Elapsed's own
	steps := float64(b.N)
	queued := host

	// The host's own time a step, on an idle GPU: in the loop above a
	// launch may wait inside the driver for room in the GPU's queue, and
	// that wait is the GPU's time, not the host's. The step's last
	// launches, which the Device holds back until something needs them
	// (backend.GraphsEnv), are issued inside the time. Single steps vary
	// by tens of percent (the collector, the host's scheduling), so the
	// mean is over enough of them to be repeatable.
	const idleSteps = 50
	host, machine, optimizer, scopes = 0, 0, 0, 0
	var flush time.Duration
	for range idleSteps {
		if err := dev.Synchronize(); err != nil {
			b.Fatal(err)
		}
		if err := step(); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := dev.Flush(); err != nil {
			b.Fatal(err)
		}
		flush += time.Since(start)
	}
	host += flush
	if err := dev.Synchronize(); err != nil {
		b.Fatal(err)
	}
	idle := host
	host = queued
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e6/steps, "ms")
	b.ReportMetric(float64(host.Nanoseconds())/1e6/steps, "host-ms")
	b.ReportMetric(float64(host.Nanoseconds())/1e3/steps/float64(nodes), "host-us/node")
	b.ReportMetric(float64(idle.Nanoseconds())/1e3/idleSteps/float64(nodes), "idle-host-us/node")
	b.ReportMetric(gpuTime.Seconds()*1e3/steps, "gpu-ms")
	b.ReportMetric(float64(dev.MemStats().PeakInUse)/(1<<30), "peak-GiB")
	b.ReportMetric(float64(per.Launches)/steps, "launches")
	b.ReportMetric(float64(per.Gemms)/steps, "gemms")
	b.ReportMetric(float64(per.Waits)/steps, "waits")
	b.ReportMetric(float64(nodes), "nodes")
	b.ReportMetric(float64(replays)/steps, "graph-replays")
	b.Logf("n=%d layers=%d tokens=%d: %d nodes, %d parameters, loss %.5f; the cache after the steps: %+v",
		n, layers, n*s, nodes, len(params), lossValue, dev.MemStats())
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / idleSteps }
	b.Logf("n=%d layers=%d: an idle step's host time: RunAll %.1f us (%.2f us/node), AdamW's Step %.1f us, BeginScope+End+Reset %.1f us, Flush %.1f us",
		n, layers, us(machine), us(machine)/float64(nodes), us(optimizer), us(scopes), us(flush))
}
