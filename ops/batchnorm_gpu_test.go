package ops

import (
	"fmt"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/backend"
)

// bnStepsNet is two ConvBN layers in training (the second with the first's
// output as its residual), a loss mean(y²) and its gradients, as a
// training graph on the host or on a GPU.
type bnStepsNet struct {
	g    *G.ExprGraph
	x    *G.Node
	loss *G.Node
	bns  [2]*BatchNorm
	m    G.VM
}

// bnStepsShape: x [2, 3, 9, 10], 4 channels each layer.
var bnStepsShape = struct{ n, cin, h, w, c int }{2, 3, 9, 10, 4}

func newBNStepsNet(t *testing.T, dev *backend.Device, dt tensor.Dtype, params []*tensor.Dense) *bnStepsNet {
	t.Helper()
	s := bnStepsShape
	net := &bnStepsNet{g: G.NewGraph()}
	place := func(d *tensor.Dense, name string) *G.Node {
		if dev != nil {
			d = toDev(t, dev, d)
		}
		return G.NewTensor(net.g, dt, d.Dims(), G.WithShape(d.Shape()...), G.WithName(name), G.WithValue(d))
	}
	net.x = G.NewTensor(net.g, dt, 4, G.WithShape(s.n, s.cin, s.h, s.w), G.WithName("x"))
	var nodes G.Nodes
	for i, p := range params {
		nodes = append(nodes, place(p, fmt.Sprintf("p%d", i)))
	}
	for l := range 2 {
		net.bns[l] = &BatchNorm{
			Gamma: nodes[2+2*l], Beta: nodes[3+2*l],
			RunningMean: fromFloat64s(dt, filled(s.c, 0), s.c), RunningVar: fromFloat64s(dt, filled(s.c, 1), s.c),
			Momentum: 0.2, Eps: 1e-3, Training: true,
		}
	}
	cfg := ConvConfig{Pad: [2]int{1, 1}, Act: ActReLU}
	y1 := G.Must(ConvBN(net.x, nodes[0], net.bns[0], nil, cfg))
	y2 := G.Must(ConvBN(y1, nodes[1], net.bns[1], y1, cfg))
	net.loss = G.Must(Mean(G.Must(Square(y2)), nil, false))
	if _, err := G.Grad(net.loss, nodes...); err != nil {
		t.Fatal(err)
	}
	var opts []G.VMOpt
	if dev != nil {
		opts = append(opts, G.WithEngine(dev.Engine()))
	}
	var err error
	if net.m, err = NewTapeMachine(net.g, opts...); err != nil {
		t.Fatal(err)
	}
	return net
}

// Training steps on the GPU with the running statistics on the device
// (BatchNorm.RunningStatsToDevice, called inside the first step's Scope,
// which must keep them) and in host memory, against the same steps on the
// CPU: after each step the running statistics match the CPU's; with
// device statistics no step waits for the GPU (the kernels update them in
// place), with host statistics each step waits once per layer (the count
// sees the waits). After RunningStatsToHost the statistics are the CPU's
// again, in host memory, and a further step on the GPU updates them there.
// The first layer's statistics are of integer x and w (exact in TF32):
// TolParity32 and TolParity64; the second's read the first's output, in
// float32 rounded to TF32 by the convolution: TolTF32.
func TestGPUBatchNormRunningStatsSteps(t *testing.T) {
	dev := gpu(t)
	s := bnStepsShape
	const steps = 3
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for _, onDevice := range []bool{true, false} {
			t.Run(fmt.Sprintf("%v/running-on-gpu=%t", dt, onDevice), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(32, 40))
				params := []*tensor.Dense{
					intTensor(rng, dt, -1, 1, s.c, s.cin, 3, 3), intTensor(rng, dt, -1, 1, s.c, s.c, 3, 3),
					randTensor(rng, dt, 0.5, 1.5, s.c), randTensor(rng, dt, -0.5, 0.5, s.c),
					randTensor(rng, dt, 0.5, 1.5, s.c), randTensor(rng, dt, -0.5, 0.5, s.c),
				}
				var xs []*tensor.Dense
				for range steps + 1 {
					xs = append(xs, intTensor(rng, dt, -2, 2, s.n, s.cin, s.h, s.w))
				}
				cpu := newBNStepsNet(t, nil, dt, params)
				defer cpu.m.Close()
				gpuNet := newBNStepsNet(t, dev, dt, params)
				defer gpuNet.m.Close()
				tols := [2]autograd.Tolerance{parityTol(dt), parityTol(dt)}
				if dt == tensor.Float32 {
					tols[1] = autograd.TolTF32
				}
				compare := func(step int) {
					t.Helper()
					for l, bn := range gpuNet.bns {
						gm, gv, err := bn.CopyRunningStats()
						if err != nil {
							t.Fatal(err)
						}
						cm, cv := cpu.bns[l].RunningMean, cpu.bns[l].RunningVar
						if err := tols[l].Compare(toFloat64s(t, gm), toFloat64s(t, cm)); err != nil {
							t.Errorf("step %d, layer %d: running mean: %v", step, l, err)
						}
						if err := tols[l].Compare(toFloat64s(t, gv), toFloat64s(t, cv)); err != nil {
							t.Errorf("step %d, layer %d: running variance: %v", step, l, err)
						}
					}
				}
				for step := range steps + 1 {
					if err := G.Let(cpu.x, xs[step]); err != nil {
						t.Fatal(err)
					}
					if err := cpu.m.RunAll(); err != nil {
						t.Fatal(err)
					}
					cpu.m.Reset()
					scope, err := dev.BeginScope()
					if err != nil {
						t.Fatal(err)
					}
					if step == 0 && onDevice {
						for _, bn := range gpuNet.bns {
							if err := bn.RunningStatsToDevice(dev); err != nil {
								t.Fatal(err)
							}
						}
					}
					if step == steps && onDevice {
						// Back to the host: the last step updates them there.
						for _, bn := range gpuNet.bns {
							if err := bn.RunningStatsToHost(); err != nil {
								t.Fatal(err)
							}
							if backend.IsDevice(bn.RunningMean) || backend.IsDevice(bn.RunningVar) {
								t.Fatal("RunningStatsToHost left them on the GPU")
							}
						}
					}
					if err := G.Let(gpuNet.x, toDev(t, dev, xs[step])); err != nil {
						t.Fatal(err)
					}
					if err := dev.Synchronize(); err != nil {
						t.Fatal(err)
					}
					before := dev.Counters()
					if err := gpuNet.m.RunAll(); err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
					waits := dev.Counters().Sub(before).Waits
					onGPU := onDevice && step < steps
					switch {
					case onGPU && waits != 0:
						t.Errorf("step %d waited for the GPU %d times with the running statistics on it, want none", step, waits)
					case !onGPU && waits != 2:
						t.Errorf("step %d waited for the GPU %d times with the running statistics in host memory, want 2 (one a layer)", step, waits)
					}
					for _, bn := range gpuNet.bns {
						if backend.IsDevice(bn.RunningMean) != onGPU || backend.IsDevice(bn.RunningVar) != onGPU {
							t.Errorf("step %d: running statistics on the GPU: %t and %t, want %t", step,
								backend.IsDevice(bn.RunningMean), backend.IsDevice(bn.RunningVar), onGPU)
						}
					}
					if err := tols[1].Compare(fromDev(t, dev, gpuNet.loss.Value()), toFloat64s(t, cpu.loss.Value())); err != nil {
						t.Errorf("step %d: loss: %v", step, err)
					}
					if err := scope.End(); err != nil {
						t.Fatal(err)
					}
					gpuNet.m.Reset()
					// After the Scope: the statistics it kept are still there.
					compare(step)
				}
			})
		}
	}
}
