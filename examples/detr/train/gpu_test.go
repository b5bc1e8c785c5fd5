package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/examples/detr/model"
	"github.com/stheno-ml/stheno/examples/internal/data"
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

// The first training step on the GPU, in full float32, gives the CPU's
// losses: the same initial weights, batch and dropout masks (Philox on
// both), the same matching; with two stage, the same proposals.
func TestGPUFirstStepFollowsCPU(t *testing.T) {
	dev := openGPU(t)
	dev.SetGemmMath(backend.GemmExact)
	for _, twoStage := range []bool{false, true} {
		t.Run(fmt.Sprintf("two_stage=%v", twoStage), func(t *testing.T) { firstStepFollowsCPU(t, dev, twoStage) })
	}
}

func firstStepFollowsCPU(t *testing.T, dev *backend.Device, twoStage bool) {
	o := tinyOptions(t.TempDir())
	o.Model.Dropout = 0.1
	o.Model.TwoStage = twoStage
	ds, _, err := data.Load("", o.Seed, o.TrainImages, 0, o.Model.ImageSize)
	if err != nil {
		t.Fatal(err)
	}
	o.Model.NumClasses = len(ds.Classes)
	imgs := data.Batch(ds.Images, o.Seed, 0, o.Batch)
	pix := make([][]float32, len(imgs))
	targets := make([]model.Target, len(imgs))
	for i, img := range imgs {
		pix[i], targets[i] = img.Pix, TargetOf(img)
	}
	var losses [2]model.Losses
	for i, d := range []*backend.Device{nil, dev} {
		params := model.NewParams(o.Seed, d)
		net, err := model.Build(o.Model, params, model.Train, o.Batch)
		if err != nil {
			t.Fatal(err)
		}
		if err := net.NewOptimizer(o.optimizer()); err != nil {
			t.Fatal(err)
		}
		if losses[i], err = net.TrainStep(pix, targets, 0, o.LR); err != nil {
			t.Fatal(err)
		}
		net.Close()
		params.Free()
	}
	t.Logf("CPU %+v, GPU %+v", losses[0], losses[1])
	for _, pair := range [][2]float64{{losses[0].Total, losses[1].Total}, {losses[0].Class, losses[1].Class},
		{losses[0].Box, losses[1].Box}, {losses[0].GIoU, losses[1].GIoU}} {
		if math.Abs(pair[0]-pair[1]) > 1e-3*math.Abs(pair[0]) {
			t.Errorf("losses differ: CPU %+v, GPU %+v", losses[0], losses[1])
			break
		}
	}
}

// Checkpoints travel between the devices: a run trained on the CPU resumes
// on the GPU and back, restoring weights, BatchNorm statistics and AdamW's
// state bit for bit on the way; the GPU's checkpoint predicts on the CPU;
// and the device's memory stays flat: every step gives back what it took,
// and a run gives back everything.
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
	if err := net.NewOptimizer(cpuCkpt.Run.optimizer()); err != nil {
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

	// Memory is flat from step to step.
	var inUse []int64
	for it := range 30 {
		imgs := data.Batch(ds.Images, o.Seed, it, o.Batch)
		pix := make([][]float32, len(imgs))
		targets := make([]model.Target, len(imgs))
		for i, img := range imgs {
			pix[i], targets[i] = img.Pix, TargetOf(img)
		}
		if _, err := net.TrainStep(pix, targets, it, o.LR); err != nil {
			t.Fatal(err)
		}
		inUse = append(inUse, dev.MemStats().InUse)
	}
	if inUse[29] != inUse[1] {
		t.Errorf("device memory in use after each step grew: %v", inUse)
	}
	net.Close()
	params.Free()

	// Resume the CPU's run on the GPU, then the GPU's on the CPU.
	o.Out, o.Iters, o.Resume, o.Device = gpuDir, 24, filepath.Join(cpuDir, "checkpoint.gob"), dev
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Evaluated || res.Iters != 24 {
		t.Fatalf("the GPU's resumed run: %d iterations, evaluated %v", res.Iters, res.Evaluated)
	}
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

	// A run gives back all it took.
	o.Out, o.Iters, o.Resume, o.Device, o.ValImages = t.TempDir(), 20, "", dev, 2
	o.EvalEvery = 10
	before := dev.MemStats()
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	if after := dev.MemStats(); after.InUse != before.InUse {
		t.Errorf("a run left %d bytes in use (%d before it)", after.InUse, before.InUse)
	}
}

// Training steps replayed as CUDA graphs (backend.GraphsEnv, on by
// default) follow the same steps issued call by call: two Devices on the
// GPU, one with graphs and one without, train the same model from the same
// weights on the same batches. The GPU runs the same kernels either way;
// only the order of atomic sums (MSDeformAttn's backward) may differ, and
// such differences grow chaotically over steps once a matching decision
// flips. So each step starts both Devices from the same state (the one
// without graphs copied to the other: weights, BatchNorm statistics,
// AdamW's moments and step, in place, so that the replayed graphs keep
// their addresses) and compares that step alone. After the first steps
// the steps' work is replayed.
func TestGPUGraphsFollowDirectSteps(t *testing.T) {
	open := func(graphs string) *backend.Device {
		t.Setenv(backend.GraphsEnv, graphs)
		return openGPU(t)
	}
	devs := []*backend.Device{open("0"), open("1")}
	if devs[0].Graphs() || !devs[1].Graphs() {
		t.Fatalf("Graphs(): %v and %v, want false and true", devs[0].Graphs(), devs[1].Graphs())
	}
	o := tinyOptions(t.TempDir())
	o.Model.Dropout = 0.1
	ds, _, err := data.Load("", o.Seed, o.TrainImages, 0, o.Model.ImageSize)
	if err != nil {
		t.Fatal(err)
	}
	o.Model.NumClasses = len(ds.Classes)
	const steps = 8
	var params [2]*model.Params
	var nets [2]*model.Net
	for d, dev := range devs {
		params[d] = model.NewParams(o.Seed, dev)
		if nets[d], err = model.Build(o.Model, params[d], model.Train, o.Batch); err != nil {
			t.Fatal(err)
		}
		if err := nets[d].NewOptimizer(o.optimizer()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nets[d].Close(); params[d].Free() })
	}
	// sync copies the state of the Device without graphs to the other.
	sync := func() {
		t.Helper()
		for _, name := range params[0].Names() {
			v, err := params[0].HostValue(name)
			if err == nil {
				err = params[1].SetValue(name, v.Float32s())
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		for _, name := range params[0].BatchNorms() {
			m, v, err := params[0].HostRunningStats(name)
			if err == nil {
				err = params[1].SetRunningStats(name, m.Float32s(), v.Float32s())
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		n, moments, err := nets[0].OptimizerState()
		if err == nil {
			err = nets[1].SetOptimizerState(n, moments)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	var losses [2][]model.Losses
	for it := range steps {
		if it > 0 {
			sync()
		}
		imgs := data.Batch(ds.Images, o.Seed, it, o.Batch)
		pix := make([][]float32, len(imgs))
		targets := make([]model.Target, len(imgs))
		for i, img := range imgs {
			pix[i], targets[i] = img.Pix, TargetOf(img)
		}
		for d := range devs {
			l, err := nets[d].TrainStep(pix, targets, it, o.LR)
			if err != nil {
				t.Fatal(err)
			}
			losses[d] = append(losses[d], l)
		}
	}
	for it := range steps {
		a, b := losses[0][it], losses[1][it]
		for _, pair := range [][2]float64{{a.Total, b.Total}, {a.Class, b.Class}, {a.Box, b.Box}, {a.GIoU, b.GIoU}} {
			if math.Abs(pair[0]-pair[1]) > 1e-4*math.Abs(pair[0]) {
				t.Errorf("step %d: call by call %+v, with graphs %+v", it, a, b)
				break
			}
		}
	}
	st := devs[1].GraphStats()
	t.Logf("step %d: call by call %+v, with graphs %+v; graphs: %+v", steps-1, losses[0][steps-1], losses[1][steps-1], st)
	if st.Replays < steps-3 {
		t.Errorf("%d stretches replayed in %d steps: %+v", st.Replays, steps, st)
	}
}
