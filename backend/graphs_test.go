package backend

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"gorgonia.org/tensor"
)

// openGraphsFake opens a Device on a new fake driver with graphs on or
// off, whatever GraphsEnv says, and closes it when the test ends.
func openGraphsFake(t *testing.T, on bool) (*Device, *fakeDriver) {
	t.Helper()
	f := newFakeDriver(t)
	d := newDevice(withGraphs(f, on, false), fakeImages, false)
	t.Cleanup(func() { _ = d.Close() })
	if d.Graphs() != on {
		t.Fatalf("Graphs() = %v, want %v", d.Graphs(), on)
	}
	return d, f
}

// graphStep is a training step's shape of stream work on the fake: in a
// Scope, a copy of the parameters into a fresh tensor, a run of Axpys
// whose scalars change from step to step (as AdamW's step does), a cuBLAS
// product, a memset, and the result read back, which issues the work.
// n sets the size of the fresh tensors; the result is the parameters
// after the step.
func graphStep(t *testing.T, d *Device, w, x *tensor.Dense, step, n int) []float64 {
	return graphStepAxpys(t, d, w, x, step, n, 10)
}

// graphStepAxpys is graphStep with axpys Axpys.
func graphStepAxpys(t *testing.T, d *Device, w, x *tensor.Dense, step, n, axpys int) []float64 {
	t.Helper()
	s, err := d.BeginScope()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.End(); err != nil {
			t.Fatal(err)
		}
	}()
	tmp, err := d.clone(w)
	if err != nil {
		t.Fatal(err)
	}
	scratch, err := d.NewDense(tensor.Float32, n)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Zero(scratch); err != nil {
		t.Fatal(err)
	}
	for k := range axpys {
		alpha := 0.25*float64(step+1) - 0.125*float64(k)
		if err := d.Axpy(alpha, x, tmp); err != nil {
			t.Fatal(err)
		}
	}
	// w = 0.5 * x(4x4) . tmp(4x4) + w
	pw, _ := d.Ptr(w)
	px, _ := d.Ptr(x)
	pt, _ := d.Ptr(tmp)
	if err := d.Gemm(Gemm{M: 4, N: 4, K: 4, A: px, B: pt, C: pw, Alpha: 0.5, Beta: 1, Dtype: tensor.Float32}); err != nil {
		t.Fatal(err)
	}
	if err := d.Axpy(-0.01, tmp, w); err != nil {
		t.Fatal(err)
	}
	h, err := d.ToHost(w)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float64, 0, 16)
	for _, v := range h.Data().([]float32) {
		out = append(out, float64(v))
	}
	return out
}

func graphParams(t *testing.T, d *Device) (w, x *tensor.Dense) {
	vals := make([]float64, 16)
	for i := range vals {
		vals[i] = float64(i%5)/8 - 0.25
	}
	return toDevice(t, d, hostOf(tensor.Float32, vals)), toDevice(t, d, hostOf(tensor.Float32, slices.Repeat([]float64{0.5, -0.25}, 8)))
}

// TestGraphsReplayLikeDirect: steps whose work repeats are captured once
// and replayed, with the Axpys' changed scalars written into the graph,
// and give, step by step, what the same steps issued call by call give.
func TestGraphsReplayLikeDirect(t *testing.T) {
	direct, _ := openGraphsFake(t, false)
	replay, f := openGraphsFake(t, true)
	checkReplayLikeDirect(t, direct, replay)
	if err := replay.Close(); err != nil {
		t.Fatal(err)
	}
	if f.graphs != 0 {
		t.Errorf("after Close, %d graphs not destroyed", f.graphs)
	}
}

// checkReplayLikeDirect runs graphStep on direct (graphs off) and replay
// (graphs on) and compares them step by step, and what replay did.
func checkReplayLikeDirect(t *testing.T, direct, replay *Device) {
	t.Helper()
	dw, dx := graphParams(t, direct)
	rw, rx := graphParams(t, replay)
	const steps = 6
	for step := range steps {
		want := graphStep(t, direct, dw, dx, step, 64)
		got := graphStep(t, replay, rw, rx, step, 64)
		for i := range want {
			// The same kernels on the same values; on a GPU, cuBLAS
			// might pick another algorithm while capturing.
			if math.Abs(got[i]-want[i]) > 1e-6*max(1, math.Abs(want[i])) {
				t.Fatalf("step %d: with graphs %v, call by call %v", step, got, want)
			}
		}
	}
	st := replay.GraphStats()
	// Step 0 makes the cuBLAS handle, whose workspace ends every graph;
	// step 1 is issued call by call, step 2 repeats it and is captured,
	// the others are replayed, each with its ten new scalars.
	if st.Captures != 1 || st.Replays != steps-3 || st.Updated != 10*(steps-3) {
		t.Errorf("GraphStats = %+v; want 1 capture, %d replays, %d updated kernels", st, steps-3, 10*(steps-3))
	}
	if got := direct.GraphStats(); got != (GraphStats{}) {
		t.Errorf("graphs off: GraphStats = %+v, want zeros", got)
	}
}

// TestGraphsChangingWork: a stretch that differs from the step before's
// (here its memset's size) is issued call by call, right; a place whose
// captured stretch keeps changing rests for graphRest stretches, then is
// tried again.
func TestGraphsChangingWork(t *testing.T) {
	direct, _ := openGraphsFake(t, false)
	replay, _ := openGraphsFake(t, true)
	dw, dx := graphParams(t, direct)
	rw, rx := graphParams(t, replay)
	// Two steps alike (captured), then one of another size (a miss),
	// and so on: the third miss in a row rests the place.
	sizes := []int{64, 64, 32, 32, 64, 64, 32, 32, 64}
	for range graphRest + 2 {
		sizes = append(sizes, 64)
	}
	for step, n := range sizes {
		want := graphStep(t, direct, dw, dx, step, n)
		got := graphStep(t, replay, rw, rx, step, n)
		if !slices.Equal(got, want) {
			t.Fatalf("step %d: with graphs %v, call by call %v", step, got, want)
		}
		if step == 9+graphRest-2 {
			if st := replay.GraphStats(); st.Captures != 3 || st.Replays != 0 {
				t.Fatalf("after the rest: GraphStats = %+v; want 3 captures (then the place rests) and no replay", st)
			}
		}
	}
	// After the rest: recorded, captured, replayed.
	if st := replay.GraphStats(); st.Captures != 4 || st.Replays != 1 {
		t.Errorf("GraphStats = %+v; want a fourth capture and a replay after the rest", st)
	}
}

// TestGraphsLongRunsCut: a long run of work is issued in stretches of 32
// calls, then 64, then at most 256, each replayed as its own graph.
func TestGraphsLongRunsCut(t *testing.T) {
	direct, _ := openGraphsFake(t, false)
	replay, _ := openGraphsFake(t, true)
	dw, dx := graphParams(t, direct)
	rw, rx := graphParams(t, replay)
	const steps, axpys = 5, 500
	var before GraphStats
	for step := range steps {
		if step == steps-1 {
			before = replay.GraphStats()
		}
		want := graphStepAxpys(t, direct, dw, dx, step, 64, axpys)
		got := graphStepAxpys(t, replay, rw, rx, step, 64, axpys)
		if !slices.Equal(got, want) {
			t.Fatalf("step %d: with graphs %v, call by call %v", step, got, want)
		}
	}
	// 504 calls: 32 + 64 + 128 + 256 + 24.
	last := replay.GraphStats()
	if got := last.Replays - before.Replays; got != 5 || last.Direct != before.Direct {
		t.Errorf("the last step replayed %d stretches and issued %d call by call; want 5 replays", got, last.Direct-before.Direct)
	}
}

// TestGraphsCaptureFails: where the driver cannot capture, the work runs
// call by call and the place is not tried again.
func TestGraphsCaptureFails(t *testing.T) {
	direct, _ := openGraphsFake(t, false)
	replay, f := openGraphsFake(t, true)
	f.captureErr = errors.New("capture refused")
	dw, dx := graphParams(t, direct)
	rw, rx := graphParams(t, replay)
	for step := range 4 {
		want := graphStep(t, direct, dw, dx, step, 64)
		got := graphStep(t, replay, rw, rx, step, 64)
		if !slices.Equal(got, want) {
			t.Fatalf("step %d: with graphs %v, call by call %v", step, got, want)
		}
	}
	if st := replay.GraphStats(); st.Captures != 0 || st.Replays != 0 || st.Direct == 0 {
		t.Errorf("GraphStats = %+v; want everything issued call by call", st)
	}
}

// TestGraphsKernelFaultSurfaces: a kernel that faults while held back
// reports, as without graphs, at the next call that waits.
func TestGraphsKernelFaultSurfaces(t *testing.T) {
	d, _ := openGraphsFake(t, true)
	x := toDevice(t, d, hostOf(tensor.Float32, make([]float64, 8)))
	k, err := d.Kernel("elementwise", "fill_u64")
	if err != nil {
		t.Fatal(err)
	}
	p, _ := d.Ptr(x)
	// 1000 words from a 32-byte tensor (in a block of 512): outside every block.
	if err := Launch(k, LaunchConfig{Grid: Dim3{1, 1, 1}, Block: Dim3{32, 1, 1}}, fillParams{Out: p, N: 1000, Value: 1}); err != nil {
		t.Fatalf("Launch: %v (the fault should wait for the stream)", err)
	}
	err = d.Synchronize()
	var de *DriverError
	if !errors.As(err, &de) || de.Code != codeIllegalAddress {
		t.Errorf("Synchronize after a faulting kernel: %v, want CUDA_ERROR_ILLEGAL_ADDRESS", err)
	}
}

func TestGraphsEnv(t *testing.T) {
	for v, want := range map[string]bool{"": true, "1": true, "0": false, "true": true} {
		t.Setenv(GraphsEnv, v)
		if got, err := graphsFromEnv(); err != nil || got != want {
			t.Errorf("%s=%q: %v, %v; want %v", GraphsEnv, v, got, err, want)
		}
	}
	t.Setenv(GraphsEnv, "yes please")
	if _, err := graphsFromEnv(); err == nil {
		t.Errorf("%s=%q accepted", GraphsEnv, "yes please")
	}
	// STHENO_CUDA_SYNC=1 wants every launch's error at the launch: no graphs.
	if d := newDevice(withGraphs(newFakeDriver(t), true, true), fakeImages, true); d.Graphs() {
		t.Errorf("graphs on with synchronous launches")
	}
}

// TestGraphsFlush: Flush issues the work held back without a wait, and is
// a no-op without graphs.
func TestGraphsFlush(t *testing.T) {
	d, f := openGraphsFake(t, true)
	x := toDevice(t, d, hostOf(tensor.Float64, make([]float64, 4)))
	p, _ := d.Ptr(x)
	k, err := d.Kernel("elementwise", "fill_u64")
	if err != nil {
		t.Fatal(err)
	}
	if err := Launch(k, LaunchConfig{Grid: Dim3{1, 1, 1}, Block: Dim3{32, 1, 1}}, fillParams{Out: p, N: 4, Value: 7}); err != nil {
		t.Fatal(err)
	}
	word := func() byte {
		f.mu.Lock()
		defer f.mu.Unlock()
		b, _ := f.resolve(uint64(p), 8)
		return b[0]
	}
	if got := word(); got != 0 {
		t.Fatalf("before Flush the fake GPU ran the held-back fill: %d", got)
	}
	waits := d.Counters().Waits
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := word(); got != 7 {
		t.Errorf("after Flush the first word's low byte is %d, want 7", got)
	}
	if d.Counters().Waits != waits {
		t.Errorf("Flush waited for the stream")
	}
	off, _ := openGraphsFake(t, false)
	if err := off.Flush(); err != nil {
		t.Errorf("Flush without graphs: %v", err)
	}
}

// TestGraphsConcurrentUse: goroutines sharing a Device with graphs on, each
// queuing work on its own tensors and reading it back, get their own
// results: held-back work is issued in order and no goroutine's call
// lands in another's capture.
func TestGraphsConcurrentUse(t *testing.T) {
	d, _ := openGraphsFake(t, true)
	const workers, rounds, axpys = 4, 20, 12
	errs := make(chan error, workers)
	for w := range workers {
		x := toDevice(t, d, hostOf(tensor.Float32, slices.Repeat([]float64{1}, 16)))
		y := toDevice(t, d, hostOf(tensor.Float32, make([]float64, 16)))
		go func() {
			errs <- func() error {
				for r := range rounds {
					for range axpys {
						if err := d.Axpy(float64(w+1), x, y); err != nil {
							return err
						}
					}
					h, err := d.ToHost(y)
					if err != nil {
						return err
					}
					want := float32((w + 1) * axpys * (r + 1))
					for i, v := range h.Data().([]float32) {
						if v != want {
							return fmt.Errorf("worker %d round %d: y[%d] = %v, want %v", w, r, i, v, want)
						}
					}
				}
				return nil
			}()
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
