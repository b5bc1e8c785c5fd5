package model

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/examples/internal/benchutil"
	"github.com/stheno-ml/stheno/examples/internal/data"
)

// The r50fpn preset timed as ../shared/anchors/torchvision_maskrcnn/
// maskrcnn_step.py times torchvision's maskrcnn_resnet50_fpn (and
// kernels/bench/anchors_maskrcnn_infer.py its inference): random images,
// four random boxes of each image with box-shaped masks, three foreground
// classes, AdamW at lr 1e-4 and weight decay 1e-4 with no clipping, 5
// warm-up steps. Host steps that overlap the step (the RPN's targets,
// prepared one step ahead) still count in HostTimes.
// STHENO_MASKRCNN_BENCH=size=512,batch=8,tf32=1 (the default) chooses the
// work, and tf32=0 full-float32 convolutions (backend.GemmExact, the
// example's -tf32=false). kernels/bench/gpu-check.sh maskrcnn runs both sides.

// r50fpnBenchCase reads STHENO_MASKRCNN_BENCH.
func r50fpnBenchCase(b *testing.B) (size, batch int, tf32 bool) {
	size, batch, tf32 = 512, 8, true
	if v := os.Getenv("STHENO_MASKRCNN_BENCH"); v != "" {
		for _, kv := range strings.Split(v, ",") {
			var err error
			switch {
			case strings.HasPrefix(kv, "size="):
				_, err = fmt.Sscan(strings.TrimPrefix(kv, "size="), &size)
			case strings.HasPrefix(kv, "batch="):
				_, err = fmt.Sscan(strings.TrimPrefix(kv, "batch="), &batch)
			case kv == "tf32=0" || kv == "tf32=1":
				tf32 = kv == "tf32=1"
			default:
				err = fmt.Errorf("unknown key")
			}
			if err != nil {
				b.Fatalf("STHENO_MASKRCNN_BENCH=%q: %q: want size=N,batch=N,tf32=0|1", v, kv)
			}
		}
	}
	return size, batch, tf32
}

// benchBatch is the anchor's synthetic batch: uniform pixels, and per
// image four boxes at xy ~ U[0, 0.6 size), wh ~ U[16, 16 + 0.3 size),
// clipped at size-1, each with its box as mask and a random class.
func benchBatch(rng *rand.Rand, size, n int) ([][]float32, []Target) {
	pix := make([][]float32, n)
	targets := make([]Target, n)
	for i := range n {
		pix[i] = make([]float32, 3*size*size)
		for j := range pix[i] {
			pix[i][j] = rng.Float32()
		}
		for range 4 {
			x, y := rng.Float64()*float64(size)*0.6, rng.Float64()*float64(size)*0.6
			w, h := rng.Float64()*float64(size)*0.3+16, rng.Float64()*float64(size)*0.3+16
			box := Box{x, y, min(x+w, float64(size-1)), min(y+h, float64(size-1))}
			m := data.NewMask(size, size)
			for py := int(box[1]); py < int(box[3]); py++ {
				for px := int(box[0]); px < int(box[2]); px++ {
					m.Bits[py*size+px] = true
				}
			}
			targets[i].Boxes = append(targets[i].Boxes, box)
			targets[i].Classes = append(targets[i].Classes, rng.IntN(3))
			targets[i].Masks = append(targets[i].Masks, m)
		}
	}
	return pix, targets
}

// BenchmarkGPUR50FPNStep: one training step (forward, losses, backward,
// AdamW) of the r50fpn preset. Metrics: ms and img/s per step, the peak
// device memory over the timed steps (the allocator's high-water mark,
// as torch.cuda.max_memory_allocated), each host step's ms per step, and
// the mask RoIs a step's mask head ran on.
func BenchmarkGPUR50FPNStep(b *testing.B) {
	dev := benchutil.GPU(b)
	defer dev.Close()
	size, batch, tf32 := r50fpnBenchCase(b)
	if !tf32 {
		dev.SetGemmMath(backend.GemmExact)
	}
	params := NewParams(1, dev)
	defer params.Free()
	n, err := Build(R50FPNConfig(3, size), params, Train, batch)
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	if err := n.NewOptimizer(1e-4, 0); err != nil {
		b.Fatal(err)
	}
	pix, targets := benchBatch(rand.New(rand.NewPCG(1, 2)), size, batch)
	// As the example's training loop: the next step's anchors are
	// assigned while a step runs.
	seed := uint64(0)
	prepare := func() *Step {
		seed++
		return n.Prepare(pix, targets, rand.New(rand.NewPCG(3, seed)))
	}
	next := prepare()
	maskRoIs, steps := 0, 0
	step := func() {
		cur := next
		next = prepare()
		l, err := n.TrainPrepared(cur, 1e-4)
		if err != nil {
			b.Fatal(err)
		}
		if !finite(l[0]) {
			b.Fatalf("loss %v", l)
		}
		maskRoIs += n.step.maskRoIs
		steps++
	}
	reset := func() {
		n.ResetHostTimes()
		maskRoIs, steps = 0, 0
	}
	ms := benchutil.Steps(b, dev, batch, 5, reset, step)
	b.Logf("host steps per step: %s", benchutil.HostTimes(b, n.HostTimes(), b.N))
	// The mask head's work, the batch's foreground RoIs as torchvision's
	// (kernels/bench/anchors_maskrcnn_rois.py counts those).
	b.ReportMetric(float64(maskRoIs)/float64(steps), "mask-RoIs")
	b.Logf("%s: size %d batch %d, %d parameters, %.1f ms/step", dev, size, batch, params.Size(), ms)
}

// BenchmarkGPUR50FPNInfer: prediction with the r50fpn preset (its
// inference graph: proposals, box head, detections, mask head) on the
// same images, from the untrained model: the model's throughput (-infer
// also pastes the masks into the images and writes files).
func BenchmarkGPUR50FPNInfer(b *testing.B) {
	dev := benchutil.GPU(b)
	defer dev.Close()
	size, batch, tf32 := r50fpnBenchCase(b)
	if !tf32 {
		dev.SetGemmMath(backend.GemmExact)
	}
	params := NewParams(1, dev)
	defer params.Free()
	n, err := Build(R50FPNConfig(3, size), params, Infer, batch)
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	pix, _ := benchBatch(rand.New(rand.NewPCG(1, 2)), size, batch)
	for range 3 {
		if _, _, err := n.Predict(pix); err != nil {
			b.Fatal(err)
		}
	}
	dev.ResetPeakMemory()
	n.ResetHostTimes()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		if _, _, err := n.Predict(pix); err != nil {
			b.Fatal(err)
		}
	}
	wall := time.Since(start)
	b.StopTimer()
	ms := wall.Seconds() * 1e3 / float64(b.N)
	b.ReportMetric(ms, "ms")
	b.ReportMetric(float64(batch)*1e3/ms, "img/s")
	b.ReportMetric(float64(dev.MemStats().PeakInUse)/(1<<30), "peak-GiB")
	b.Logf("host steps per step: %s", benchutil.HostTimes(b, n.HostTimes(), b.N))
}
