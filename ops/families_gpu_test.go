package ops

import (
	"math"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/backend"
)

// familyOnDevice builds family f's training graph with its parameters on
// dev, as README tells users to: parameters bound to device tensors, the
// step's data moved to the device in the graph, the loss on the device.
// It returns the graph's loss, its parameters and their gradients.
func familyOnDevice(t *testing.T, dev *backend.Device, f trainingFamily, seed uint64) (loss *G.Node, params, grads G.Nodes) {
	t.Helper()
	e := &familyEnv{g: G.NewGraph(), dt: tensor.Float32, rng: rand.New(rand.NewPCG(seed, 7)), dev: dev, t: t}
	e.adopt = func(p *G.Node) *G.Node {
		if err := G.Let(p, toDev(t, dev, p.Value().(*tensor.Dense))); err != nil {
			t.Fatal(err)
		}
		e.params = append(e.params, p)
		return p
	}
	loss = f.build(e)
	grads, err := G.Grad(loss, e.params...)
	if err != nil {
		t.Fatal(err)
	}
	return loss, e.params, grads
}

// TestGPUTrainingGraphs trains every op family's graph on the GPU the way
// README says to: ops.NewTapeMachine, ParamsWithGrads and AdamW, one Scope
// per step. The first step's loss and gradients equal (to TolParity32:
// the same kernels, whose atomic sums may add in another order) those of
// the same graph run by gorgonia's machine without the release plan, so
// the memory released during the step was dead; steps after the first
// wait for the GPU only where the test reads the loss (and, in training,
// once per BatchNorm layer), and hold less memory at their peak than the
// graph run without releases, the whole step's intermediates.
func TestGPUTrainingGraphs(t *testing.T) {
	dev := gpu(t)
	defer dev.SetGemmMath(dev.GemmMath())
	dev.SetGemmMath(backend.GemmExact) // TF32 would differ between the two runs only by the atomics too; exact keeps the comparison sharp
	for _, f := range trainingFamilies {
		t.Run(f.name, func(t *testing.T) {
			// The graph without the plan: gorgonia's machine, no releases.
			refLoss, _, refGrads := familyOnDevice(t, dev, f, 11)
			ref := G.NewTapeMachine(refLoss.Graph(), G.WithEngine(dev.Engine()))
			defer ref.Close()
			scope := openScope(t, dev)
			base := dev.MemStats().InUse
			dev.ResetPeakMemory()
			if err := ref.RunAll(); err != nil {
				t.Fatal(err)
			}
			refPeak := dev.MemStats().PeakInUse - base
			want := append([][]float64{fromDev(t, dev, refLoss.Value())}, devValues(t, dev, refGrads)...)
			if err := scope.End(); err != nil {
				t.Fatal(err)
			}

			loss, params, grads := familyOnDevice(t, dev, f, 11)
			m, err := NewTapeMachine(loss.Graph(), G.WithEngine(dev.Engine()))
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			pg, opt := familyOptimizer(t, params, grads)
			defer opt.Free()
			var losses []float64
			for step := range 4 {
				scope := openScope(t, dev)
				inUse := dev.MemStats().InUse
				dev.ResetPeakMemory()
				before := dev.Counters()
				if err := m.RunAll(); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				peak := dev.MemStats().PeakInUse - inUse
				if err := opt.Step(pg); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				queued := dev.Counters().Sub(before)
				l := fromDev(t, dev, loss.Value())[0] // the step's one wait
				waits := dev.Counters().Sub(before).Waits
				if step == 0 {
					for i, got := range append([][]float64{{l}}, devValues(t, dev, grads)...) {
						if err := autograd.TolParity32.Compare(got, want[i]); err != nil {
							what := "the loss"
							if i > 0 {
								what = "the gradient of " + params[i-1].Name()
							}
							t.Errorf("%s differs from the run without releases: %v", what, err)
						}
					}
				}
				if err := scope.End(); err != nil {
					t.Fatal(err)
				}
				m.Reset()
				losses = append(losses, l)
				if math.IsNaN(l) || math.IsInf(l, 0) {
					t.Fatalf("step %d: loss %v", step, l)
				}
				if step > 0 {
					// Waits: the loss read, and BatchNorm's running statistics.
					if maxWaits := int64(1); waits > maxWaits && !f.batchNorm {
						t.Errorf("step %d waited for the GPU %d times (%+v queued before the loss read); want %d, the loss read", step, waits, queued, maxWaits)
					}
					if step == 1 {
						t.Logf("a step: %+v, then %d waits in all; the run's peak %d bytes above the step's start, %d without releases",
							queued, waits, peak, refPeak)
					}
					if peak >= refPeak {
						t.Errorf("step %d's run peaked at %d bytes above the step's start, the graph without releases at %d", step, peak, refPeak)
					}
				}
			}
			if losses[len(losses)-1] == losses[0] {
				t.Errorf("losses %v: the parameters did not move", losses)
			}
			t.Logf("losses %v", losses)
		})
	}
}

// openScope opens a Scope on dev that the test's end closes if a failure
// leaves it open, so that later tests can open theirs.
func openScope(t *testing.T, dev *backend.Device) *backend.Scope {
	t.Helper()
	scope, err := dev.BeginScope()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if dev.OpenScope() == scope {
			scope.End()
		}
	})
	return scope
}

// devValues copies the nodes' device values to the host.
func devValues(t *testing.T, dev *backend.Device, ns G.Nodes) [][]float64 {
	t.Helper()
	out := make([][]float64, len(ns))
	for i, n := range ns {
		out[i] = fromDev(t, dev, n.Value())
	}
	return out
}
