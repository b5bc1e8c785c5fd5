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
// the CPU: the per-iteration losses of the two runs stay within
// TolTraining of each other, with cuBLAS's products in TF32 (as runs use
// it) and in full float32 (-tf32=false). TF32 products and convolutions and
// the GPU's atomic sums are the only differences; they compound over the
// iterations, and the test prints how far apart the runs drift.
func TestGPUTrainingFollowsCPU(t *testing.T) {
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
			worst, at := 0.0, 0
			for i := range cpu {
				for k := range cpu[i] {
					d := math.Abs(gpu[i][k]-cpu[i][k]) / (math.Abs(cpu[i][k]) + 1e-3)
					if d > worst || math.IsNaN(d) {
						worst, at = d, i
					}
				}
				if i == 0 || (i+1)%20 == 0 {
					t.Logf("iteration %3d: total loss CPU %.5f GPU %.5f (relative %.2e)", i+1, cpu[i][0], gpu[i][0],
						math.Abs(gpu[i][0]-cpu[i][0])/math.Abs(cpu[i][0]))
				}
			}
			t.Logf("largest relative difference of any loss: %.3e at iteration %d", worst, at+1)
			tol := autograd.TolTraining
			for i := range cpu {
				for k, name := range model.LossNames {
					if d := math.Abs(gpu[i][k] - cpu[i][k]); !(d <= tol.Abs+tol.Rel*math.Abs(cpu[i][k])) {
						t.Fatalf("iteration %d: %s loss GPU %v, CPU %v: beyond %+v", i+1, name, gpu[i][k], cpu[i][k], tol)
					}
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
	if err := cpuCkpt.restore(params, net); err != nil {
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
	if err := Infer(InferOptions{Checkpoint: filepath.Join(gpuDir, "checkpoint.gob"), Images: filepath.Join(t.TempDir(), "missing"), Out: t.TempDir(), Batch: 2}); err == nil {
		t.Error("Infer on a missing image directory succeeded")
	}

	// Memory is flat: after the first steps, more steps allocate nothing
	// from the driver and do not raise the high-water mark.
	o.Out, o.Iters, o.Resume, o.Device, o.ValImages = t.TempDir(), 40, "", dev, 0
	o.EvalEvery = 40
	dev.ResetPeakMemory()
	before := dev.MemStats()
	o.Iters = 20
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	warm := dev.MemStats()
	o.Iters, o.Resume = 40, filepath.Join(o.Out, "checkpoint.gob")
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	after := dev.MemStats()
	t.Logf("memory: before %+v\nafter 20 iterations %+v\nafter 20 more %+v", before, warm, after)
	if after.PeakInUse > warm.PeakInUse {
		t.Errorf("the high-water mark grew from %d to %d bytes over 20 more iterations", warm.PeakInUse, after.PeakInUse)
	}
}
