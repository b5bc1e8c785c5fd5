package model

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/stheno-ml/stheno/examples/internal/benchutil"
)

// The r50 preset timed as ../shared/anchors/deformable_detr_model/
// dd_step.py times the official Deformable-DETR: the R50 model with 6+6
// layers and 300 queries at 91 classes; uniform random images; per image
// 6 targets, centres U[0.2, 0.8) and sizes U[0.05, 0.35) in normalised
// (cx, cy, w, h), labels uniform in [1, 90); AdamW in the reference's
// groups (lr 2e-4, the backbone and the linear projections at 2e-5,
// weight decay 1e-4) after clipping at 0.1; 3 warm-up steps.
// STHENO_DETR_BENCH=size=512,batch=8,refine=0,two_stage=0 (the default,
// the anchor's first configuration) chooses the work; refine=1 is box
// refinement, and refine=1,two_stage=1 the anchor's third configuration.
// kernels/bench/gpu-check.sh detr runs both sides.

// detrBench is a configuration of the benchmark.
type detrBench struct {
	size, batch      int
	refine, twoStage bool
}

// detrBenchCase reads STHENO_DETR_BENCH.
func detrBenchCase(b *testing.B) detrBench {
	c := detrBench{size: 512, batch: 8}
	v := os.Getenv("STHENO_DETR_BENCH")
	if v == "" {
		return c
	}
	flag := func(s string, dst *bool) error {
		r := 0
		if _, err := fmt.Sscan(s, &r); err != nil || r != 0 && r != 1 {
			return fmt.Errorf("not 0 or 1")
		}
		*dst = r == 1
		return nil
	}
	for _, kv := range strings.Split(v, ",") {
		key, val, _ := strings.Cut(kv, "=")
		var err error
		switch key {
		case "size":
			_, err = fmt.Sscan(val, &c.size)
		case "batch":
			_, err = fmt.Sscan(val, &c.batch)
		case "refine":
			err = flag(val, &c.refine)
		case "two_stage":
			err = flag(val, &c.twoStage)
		default:
			err = fmt.Errorf("unknown key")
		}
		if err != nil {
			b.Fatalf("STHENO_DETR_BENCH=%q: %q: want size=N,batch=N,refine=0|1,two_stage=0|1", v, kv)
		}
	}
	return c
}

// detrBenchBatch is the anchor's synthetic batch for numClasses classes.
func detrBenchBatch(rng *rand.Rand, size, n int) ([][]float32, []Target) {
	pix := make([][]float32, n)
	targets := make([]Target, n)
	for i := range n {
		pix[i] = make([]float32, 3*size*size)
		for j := range pix[i] {
			pix[i][j] = rng.Float32()
		}
		for range 6 {
			cx, cy := rng.Float64()*0.6+0.2, rng.Float64()*0.6+0.2
			w, h := rng.Float64()*0.3+0.05, rng.Float64()*0.3+0.05
			targets[i].Boxes = append(targets[i].Boxes, Box{cx, cy, w, h})
			targets[i].Labels = append(targets[i].Labels, 1+rng.IntN(89))
		}
	}
	return pix, targets
}

// BenchmarkGPUDETRStep: one training step (forward, Hungarian matching,
// the losses of every decoder layer, backward, clipping, AdamW) of the r50
// preset at the anchor's configuration. Metrics: ms and img/s per step,
// the peak device memory over the timed steps (the allocator's high-water
// mark, as torch.cuda.max_memory_allocated), kernel launches, GEMMs and
// host waits per step, and the host steps' ms per step (the matching; the
// top-k proposals under two stage).
func BenchmarkGPUDETRStep(b *testing.B) {
	dev := benchutil.GPU(b)
	defer dev.Close()
	c := detrBenchCase(b)
	size, batch := c.size, c.batch
	const classes = 91 // COCO's, as the anchor's dataset_file "coco"
	cfg := GPUConfig(classes, size)
	cfg.BoxRefine, cfg.TwoStage = c.refine, c.twoStage
	params := NewParams(1, dev)
	defer params.Free()
	n, err := Build(cfg, params, Train, batch)
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	if err := n.NewOptimizer(ReferenceOptimizer()); err != nil {
		b.Fatal(err)
	}
	pix, targets := detrBenchBatch(rand.New(rand.NewPCG(1, 2)), size, batch)
	it := 0
	step := func() {
		l, err := n.TrainStep(pix, targets, it, 2e-4)
		it++
		if err != nil {
			b.Fatal(err)
		}
		if !finite(l.Total) {
			b.Fatalf("losses %+v", l)
		}
	}
	ms := benchutil.Steps(b, dev, batch, 3, n.ResetHostTimes, step)
	host := benchutil.HostTimes(b, n.HostTimes(), b.N)
	b.Logf("%s: size %d batch %d refine %v two_stage %v, %d trainable parameters, %.1f ms/step; host steps per step: %s",
		dev, size, batch, c.refine, c.twoStage, params.Size(), ms, host)
}
