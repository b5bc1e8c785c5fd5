package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/maskrcnn/model"
)

// openGPU opens the first GPU, or skips the test (visibly) where there is
// none or the build lacks the stheno_cuda tag.
func openGPU(t *testing.T) *backend.Device {
	t.Helper()
	dev, err := backend.Open(0)
	if errors.Is(err, backend.ErrNoDevice) {
		t.Skipf("no GPU: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

// gpuParityIters is how many iterations TestGPUTrainingFollowsCPU compares
// (STHENO_PARITY_ITERS overrides it).
func gpuParityIters(t *testing.T) int {
	if v := os.Getenv("STHENO_PARITY_ITERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 2 {
			t.Fatalf("STHENO_PARITY_ITERS=%q: want an integer >= 2", v)
		}
		return n
	}
	return 200
}

// The default model from the same seed and data trains on the GPU as on
// the CPU. Single iterations cannot be compared closely: the heads train
// on RoIs sampled from the step's proposals, and a proposal that moves
// across an IoU threshold or a tie in NMS changes the sample, so the runs'
// losses differ by a sample's worth from the first steps on, whatever the
// precision, and the two runs become two draws of the training. What must
// agree is the training: the mean of each loss over the iterations, within
// TolTraining, with cuBLAS's products and the convolutions in TF32 (as
// runs use it) and in full float32 (-tf32=false). The test prints how far
// apart the runs are, also over windows of windowIters iterations, whose
// means move more between draws (the classification loss of iterations
// 161-200 took 0.43 to 0.49 in six GPU runs).
func TestGPUTrainingFollowsCPU(t *testing.T) {
	const windowIters = 40
	dev := openGPU(t)
	iters := gpuParityIters(t)
	opts := func(dir string, d *backend.Device) Options {
		o := pinnedOptions(dir)
		o.Iters, o.EvalEvery = iters, iters
		o.Device = d
		return o
	}
	run := func(o Options) []model.Losses {
		t.Helper()
		res, err := Run(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		var out []model.Losses
		for _, p := range res.History.Losses {
			out = append(out, p.values())
		}
		return out
	}
	mean := func(ls []model.Losses) model.Losses {
		var m model.Losses
		for _, l := range ls {
			for k, v := range l {
				m[k] += v / float64(len(ls))
			}
		}
		return m
	}
	means := func(ls []model.Losses) []model.Losses {
		var out []model.Losses
		for w := 0; w+windowIters <= len(ls); w += windowIters {
			var m model.Losses
			for _, l := range ls[w : w+windowIters] {
				for k, v := range l {
					m[k] += v / windowIters
				}
			}
			out = append(out, m)
		}
		return out
	}
	cpu := run(opts(t.TempDir(), nil))
	for _, tf32 := range []bool{true, false} {
		t.Run(fmt.Sprintf("tf32=%v", tf32), func(t *testing.T) {
			if tf32 {
				dev.SetGemmMath(backend.GemmTF32)
			} else {
				dev.SetGemmMath(backend.GemmExact)
			}
			defer dev.SetGemmMath(backend.GemmTF32)
			gpu := run(opts(t.TempDir(), dev))
			if len(gpu) != len(cpu) {
				t.Fatalf("%d GPU iterations, %d CPU", len(gpu), len(cpu))
			}
			rel := func(a, b float64) float64 { return math.Abs(a-b) / math.Abs(b) }
			worst := 0.0
			for i := range cpu {
				worst = max(worst, rel(gpu[i][0], cpu[i][0]))
			}
			t.Logf("iteration 1's losses: CPU %.5f GPU %.5f; single iterations' total losses differ by up to %.1f%%", cpu[0], gpu[0], 100*worst)
			cm, gm := means(cpu), means(gpu)
			tol := autograd.TolTraining
			for w := range cm {
				t.Logf("iterations %3d-%3d: mean losses CPU %.4f GPU %.4f (total: %.2f%% apart)",
					w*windowIters+1, (w+1)*windowIters, cm[w], gm[w], 100*rel(gm[w][0], cm[w][0]))
			}
			ca, ga := mean(cpu), mean(gpu)
			t.Logf("iterations 1-%d: mean losses CPU %.4f GPU %.4f (total: %.2f%% apart)", len(cpu), ca, ga, 100*rel(ga[0], ca[0]))
			for k, name := range model.LossNames {
				if d := math.Abs(ga[k] - ca[k]); !(d <= tol.Abs+tol.Rel*math.Abs(ca[k])) {
					t.Errorf("iterations 1-%d: mean %s loss GPU %v, CPU %v: beyond %+v", len(cpu), name, ga[k], ca[k], tol)
				}
			}
		})
	}
}

// Checkpoints travel between the devices: a run trained on the CPU resumes
// on the GPU and back, restoring weights, BatchNorm statistics and AdamW's
// state bit for bit on the way; the GPU's checkpoint predicts on the CPU;
// and the device's memory stays flat across the steps.
func TestGPUCheckpointsTravel(t *testing.T) {
	dev := openGPU(t)
	cpuDir, gpuDir, backDir := t.TempDir(), t.TempDir(), t.TempDir()
	o := tinyOptions(cpuDir)
	o.Steps = nil
	o.Iters, o.EvalEvery, o.LogEvery = 4, 4, 1
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	cpuCkpt, err := LoadCheckpoint(filepath.Join(cpuDir, "checkpoint.gob"))
	if err != nil {
		t.Fatal(err)
	}

	// The round trip through the device is exact.
	params := model.NewParams(o.Seed, dev)
	net, err := model.Build(cpuCkpt.Run.Model, params, model.Train, cpuCkpt.Run.Batch)
	if err != nil {
		t.Fatal(err)
	}
	defer net.Close()
	if err := net.NewOptimizer(o.WeightDecay, o.ClipNorm); err != nil {
		t.Fatal(err)
	}
	if err := cpuCkpt.Restore(params, optimizer(net)); err != nil {
		t.Fatal(err)
	}
	ds, _, err := data.Load("", o.Seed, o.TrainImages, 0, o.Model.ImageSize)
	if err != nil {
		t.Fatal(err)
	}
	again, err := snapshot(cpuCkpt.Run, ds, cpuCkpt.Iter, params, net, cpuCkpt.History)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(again.Params, cpuCkpt.Params) || !reflect.DeepEqual(again.BNStats, cpuCkpt.BNStats) || !reflect.DeepEqual(again.Adam, cpuCkpt.Adam) {
		t.Fatal("a checkpoint restored on the GPU and saved again differs from the CPU's")
	}

	// Resume the CPU's run on the GPU, then the GPU's on the CPU.
	o.Out, o.Iters, o.Resume, o.Device = gpuDir, 24, filepath.Join(cpuDir, "checkpoint.gob"), dev
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Evaluated || res.Iters != 24 {
		t.Fatalf("the GPU's resumed run: %d iterations, evaluated %v", res.Iters, res.Evaluated)
	}
	m := dev.MemStats()
	t.Logf("GPU run: %v; device memory in use %d B, high-water mark %d B, %d driver allocations", res.Final, m.InUse, m.PeakInUse, m.DriverAllocs)
	o.Out, o.Iters, o.Resume, o.Device = backDir, 26, filepath.Join(gpuDir, "checkpoint.gob"), nil
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	// The GPU's checkpoint predicts on the CPU.
	imgs, preds := t.TempDir(), t.TempDir()
	rc := o.RunConfig
	rc.TrainImages, rc.ValImages = 1, 2
	if _, err := ExportSynthetic(imgs, rc); err != nil {
		t.Fatal(err)
	}
	if err := Infer(InferOptions{Checkpoint: filepath.Join(gpuDir, "checkpoint.gob"), Images: filepath.Join(imgs, "annotations.json"), Out: preds, Batch: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(preds, "predictions.json")); err != nil {
		t.Error(err)
	}

	// Memory is flat: a run gives back all it took, and a second run like
	// the first reaches the same high-water mark.
	o.Out, o.Iters, o.Resume, o.Device, o.ValImages = t.TempDir(), 20, "", dev, 2
	o.EvalEvery = 10
	var peaks []int64
	for range 2 {
		before := dev.MemStats()
		dev.ResetPeakMemory()
		if _, err := Run(context.Background(), o); err != nil {
			t.Fatal(err)
		}
		after := dev.MemStats()
		t.Logf("memory before a run %+v, after %+v", before, after)
		if after.InUse != before.InUse {
			t.Errorf("a run left %d bytes in use (%d before it)", after.InUse, before.InUse)
		}
		peaks = append(peaks, after.PeakInUse)
	}
	if peaks[1] != peaks[0] {
		t.Errorf("two runs alike reached high-water marks of %d and %d bytes", peaks[0], peaks[1])
	}
}
