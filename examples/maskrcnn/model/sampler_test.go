package model

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/stheno-ml/stheno/autograd"
)

// samplerCase is what the training graph's "sample RoIs" host op sees in
// one step: the Net (built on the host, without a machine: the host op
// needs its configuration and anchors only), the
// RPN's outputs of the batch as the op's inputs (objectness logits
// ~ N(0, 1), deltas ~ N(0, 0.1^2), as an untrained RPN gives), the batch's
// ground truth (benchBatch's) and the packed output.
type samplerCase struct {
	net     *Net
	in      [][]float32
	targets []Target
	out     []float32
}

func newSamplerCase(tb testing.TB, cfg Config, batch int) *samplerCase {
	tb.Helper()
	n, err := build(cfg, NewParams(1, nil), Train, batch, nil, false)
	if err != nil {
		tb.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	var obj, del [][]float32
	for l := range n.anchors {
		os, ds := n.rpnLevelShapes(l)
		o, d := make([]float32, os.TotalSize()), make([]float32, ds.TotalSize())
		for i := range o {
			o[i] = float32(rng.NormFloat64())
		}
		for i := range d {
			d[i] = float32(0.1 * rng.NormFloat64())
		}
		obj, del = append(obj, o), append(del, d)
	}
	_, targets := benchBatch(rand.New(rand.NewPCG(1, 2)), cfg.ImageSize, batch)
	return &samplerCase{net: n, in: append(obj, del...), targets: targets,
		out: make([]float32, autograd.PackedSize(n.headTargetShapes()...))}
}

// run is one step's sampling, its RoIs drawn from a stream of the seed.
func (c *samplerCase) run(tb testing.TB, seed uint64) {
	c.net.step.targets, c.net.step.rng = c.targets, rand.New(rand.NewPCG(3, seed))
	if err := c.net.sampleHeads(c.in, c.out); err != nil {
		tb.Fatal(err)
	}
}

// sampleHeads gives the same output however many goroutines it runs on,
// and whatever steps ran before on the Net (it keeps buffers across
// steps), for images whose masks differ.
func TestSampleHeadsDeterministic(t *testing.T) {
	c := newSamplerCase(t, DefaultConfig(3, 64), 4)
	c.targets[2].Masks[0] = nil // no mask loss for this box
	c.run(t, 7)
	// What the step's mask head reads: the mask RoIs' targets and weights.
	masks := func() []float32 {
		n := c.net
		rows := n.step.maskRoIs * n.cfg.NumClasses * n.cfg.MaskSize() * n.cfg.MaskSize()
		return slices.Concat(n.maskTargets[:rows], n.maskWeights[:rows])
	}
	want, wantMasks, rows := slices.Clone(c.out), masks(), c.net.step.maskRoIs
	if rows == 0 {
		t.Fatal("no mask RoIs sampled")
	}
	for _, procs := range []int{1, 3} {
		old := runtime.GOMAXPROCS(procs)
		c.run(t, 8)
		c.run(t, 7)
		runtime.GOMAXPROCS(old)
		if c.net.step.maskRoIs != rows {
			t.Fatalf("GOMAXPROCS %d, after another step: %d mask RoIs, was %d", procs, c.net.step.maskRoIs, rows)
		}
		for j := range want {
			if c.out[j] != want[j] {
				t.Fatalf("GOMAXPROCS %d, after another step: value %d is %v, was %v", procs, j, c.out[j], want[j])
			}
		}
		if got := masks(); !slices.Equal(got, wantMasks) {
			t.Fatalf("GOMAXPROCS %d, after another step: the mask targets and weights changed", procs)
		}
	}
}

// BenchmarkSampleHeadsR50FPN: the training step's "sample RoIs" host op
// (proposals, NMS, RoI sampling, box and mask targets, packing) of the
// r50fpn preset at 512x512 x 8, on the CPU: the host op the GPU waits for
// in the middle of each step.
func BenchmarkSampleHeadsR50FPN(b *testing.B) {
	c := newSamplerCase(b, R50FPNConfig(3, 512), 8)
	c.run(b, 0)
	b.ResetTimer()
	for i := range b.N {
		c.run(b, uint64(i))
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1e3/float64(b.N), "ms/step")
}
