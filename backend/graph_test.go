package backend

import (
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// TestTapeMachine runs a small graph whose values live on the device
// through a TapeMachine built with the Device's engine: y = x + x, and the
// gradient of y with respect to x by Backpropagate. x feeds the Add twice,
// so Backpropagate sums two gradients with an Add of its own: gradient
// accumulation on the device. Each run reads the results back.
func TestTapeMachine(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
			g := G.NewGraph()
			x := G.NewTensor(g, dt, 2, G.WithShape(2, 3), G.WithName("x"))
			gy := G.NewTensor(g, dt, 2, G.WithShape(2, 3), G.WithName("gy"))
			y := G.Must(G.Add(x, x))
			grads, err := G.Backpropagate(G.Nodes{y}, G.Nodes{gy}, G.Nodes{x})
			if err != nil {
				t.Fatal(err)
			}
			m := G.NewTapeMachine(g, G.WithEngine(d.Engine()))
			for run := range 3 {
				hx := hostTensor(dt, []int{2, 3}, run)
				hgy := hostTensor(dt, []int{2, 3}, 10+run)
				for n, v := range map[*G.Node]*tensor.Dense{x: toDevice(t, d, hx), gy: toDevice(t, d, hgy)} {
					if err := G.Let(n, v); err != nil {
						t.Fatal(err)
					}
				}
				if err := m.RunAll(); err != nil {
					t.Fatalf("%v run %d: %v", dt, run, err)
				}
				var yv, gv G.Value
				G.Read(y, &yv)
				G.Read(grads[0], &gv)
				for _, c := range []struct {
					name string
					v    G.Value
					src  *tensor.Dense
				}{{"y = x + x", y.Value(), hx}, {"dx = gy + gy", grads[0].Value(), hgy}} {
					dv, ok := c.v.(*tensor.Dense)
					if !ok || !d.Owns(dv) {
						t.Fatalf("%v run %d: %s is %T, not a tensor of the device", dt, run, c.name, c.v)
					}
					got, want := floats(toHost(t, d, dv)), floats(c.src)
					for i := range want {
						if got[i] != 2*want[i] {
							t.Errorf("%v run %d: %s: element %d = %v, want %v", dt, run, c.name, i, got[i], 2*want[i])
						}
					}
				}
				m.Reset()
			}
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			t.Logf("%v: %+v", dt, d.MemStats())
		}
	})
}

// TestTapeMachineLimits documents what does not work with device values in
// a TapeMachine, so that a change in it shows.
func TestTapeMachineLimits(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		dt := tensor.Float32
		// 1. Gorgonia's own CPU ops (here HadamardProd) on device values: an error
		// from the engine, not a crash.
		g := G.NewGraph()
		x := G.NewTensor(g, dt, 2, G.WithShape(2, 3), G.WithName("x"))
		G.Must(G.HadamardProd(x, x))
		m := G.NewTapeMachine(g, G.WithEngine(d.Engine()))
		if err := G.Let(x, toDevice(t, d, hostTensor(dt, []int{2, 3}, 1))); err != nil {
			t.Fatal(err)
		}
		err := m.RunAll()
		if err == nil || !strings.Contains(err.Error(), "device tensor") {
			t.Errorf("Mul of device values: %v, want the engine's refusal", err)
		}
		t.Logf("Mul of device values: %v", err)
		m.Close()

		// 2. BindDualValues keeps gradients in dual values that gorgonia
		// allocates on the host: accumulating a device gradient into them
		// is a host/device mix, refused.
		g = G.NewGraph()
		w := G.NewTensor(g, dt, 2, G.WithShape(2, 3), G.WithName("w"),
			G.WithValue(toDevice(t, d, hostTensor(dt, []int{2, 3}, 1))))
		gy := G.NewTensor(g, dt, 2, G.WithShape(2, 3), G.WithName("gy"),
			G.WithValue(toDevice(t, d, hostTensor(dt, []int{2, 3}, 2))))
		y := G.Must(G.Add(w, w))
		if _, err := G.Backpropagate(G.Nodes{y}, G.Nodes{gy}, G.Nodes{w}); err != nil {
			t.Fatal(err)
		}
		m = G.NewTapeMachine(g, G.WithEngine(d.Engine()), G.BindDualValues(w))
		err = m.RunAll()
		t.Logf("BindDualValues with a device parameter: %v", err)
		if err == nil {
			t.Log("BindDualValues now works with device values: update the package documentation")
		}
		m.Close()

		// 3. A TapeMachine built without the Device's engine gives the
		// values its ops make gorgonia's StandardEngine: they stay device
		// tensors (IsDevice), but their Device cannot be found, and some of
		// StandardEngine's methods would read them on the host.
		g = G.NewGraph()
		x = G.NewTensor(g, dt, 2, G.WithShape(2, 3), G.WithName("x"))
		y = G.Must(G.Add(x, x))
		m = G.NewTapeMachine(g)
		if err := G.Let(x, toDevice(t, d, hostTensor(dt, []int{2, 3}, 1))); err != nil {
			t.Fatal(err)
		}
		if err := m.RunAll(); err != nil {
			t.Fatal(err) // x, made by ToDevice, still has the Device's engine
		}
		if dev, err := DeviceOf(y.Value()); !IsDevice(y.Value()) || dev != nil || err == nil || !strings.Contains(err.Error(), "G.WithEngine") {
			t.Errorf("output of a plain TapeMachine: IsDevice %v, DeviceOf %v, %v", IsDevice(y.Value()), dev, err)
		}
		m.Close()
	})
}

// TestTrainingSteps runs training steps as a training loop would: the
// parameter w lives on the device across steps; each step feeds inputs,
// runs forward and backward (w feeds two Adds, so its gradient is
// accumulated by Engine.Add), takes an SGD step with Axpy, and ends its
// Scope. After the first step no step calls cuMemAlloc or cuMemFree, and
// only w stays in use.
func TestTrainingSteps(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		const lr = 0.25
		dt := tensor.Float64
		shape := []int{64, 32}
		g := G.NewGraph()
		w := G.NewTensor(g, dt, 2, G.WithShape(shape...), G.WithName("w"))
		x := G.NewTensor(g, dt, 2, G.WithShape(shape...), G.WithName("x"))
		gy := G.NewTensor(g, dt, 2, G.WithShape(shape...), G.WithName("gy"))
		y := G.Must(G.Add(G.Must(G.Add(w, x)), w)) // y = 2w + x
		grads, err := G.Backpropagate(G.Nodes{y}, G.Nodes{gy}, G.Nodes{w})
		if err != nil {
			t.Fatal(err)
		}
		m := G.NewTapeMachine(g, G.WithEngine(d.Engine()))
		defer m.Close()

		hw := hostTensor(dt, shape, 0)
		wd := toDevice(t, d, hw) // made before any scope: kept across steps
		want := floats(hw)
		var warm MemStats
		for step := range 6 {
			s, err := d.BeginScope()
			if err != nil {
				t.Fatal(err)
			}
			hx, hgy := hostTensor(dt, shape, step), hostTensor(dt, shape, 100+step)
			for n, v := range map[*G.Node]*tensor.Dense{w: wd, x: toDevice(t, d, hx), gy: toDevice(t, d, hgy)} {
				if err := G.Let(n, v); err != nil {
					t.Fatal(err)
				}
			}
			if err := m.RunAll(); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			yv := floats(toHost(t, d, y.Value().(*tensor.Dense)))
			for i, v := range floats(hx) {
				if yv[i] != 2*want[i]+v {
					t.Fatalf("step %d: y[%d] = %v, want %v", step, i, yv[i], 2*want[i]+v)
				}
			}
			if err := d.Axpy(-lr, grads[0].Value().(*tensor.Dense), wd); err != nil {
				t.Fatal(err)
			}
			for i, v := range floats(hgy) {
				want[i] -= lr * 2 * v
			}
			if err := s.End(); err != nil {
				t.Fatal(err)
			}
			m.Reset()
			st := d.MemStats()
			if st.InUseBlocks != 1 {
				t.Errorf("step %d: %d blocks in use after End, want 1 (w)", step, st.InUseBlocks)
			}
			if step == 0 {
				warm = st
			} else if st.DriverAllocs != warm.DriverAllocs || st.DriverFrees != warm.DriverFrees {
				t.Errorf("step %d called the driver: %+v, after the first step %+v", step, st, warm)
			}
		}
		got := floats(toHost(t, d, wd))
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("w[%d] = %v after training, want %v", i, got[i], want[i])
			}
		}
		t.Logf("%+v", d.MemStats())
	})
}

func TestScope(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		before, err := d.NewDense(tensor.Float32, 10)
		if err != nil {
			t.Fatal(err)
		}
		s, err := d.BeginScope()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.BeginScope(); err == nil {
			t.Error("a second open scope was allowed")
		}
		a, _ := d.NewDense(tensor.Float32, 10)
		b, _ := d.NewDense(tensor.Float32, 20)
		raw, _ := d.Alloc(100)
		if err := s.Keep(b); err != nil {
			t.Fatal(err)
		}
		if err := d.FreeDense(a); err != nil { // freeing early is fine
			t.Fatal(err)
		}
		c, _ := d.NewDense(tensor.Float32, 30)
		if err := s.End(); err != nil {
			t.Fatal(err)
		}
		if c.Raw != nil || d.Owns(c) {
			t.Error("a tensor of the scope survived End")
		}
		if err := d.Free(raw); err == nil {
			t.Error("an Alloc of the scope survived End")
		}
		for _, v := range []*tensor.Dense{before, b} {
			if !d.Owns(v) {
				t.Errorf("%v tensor made before the scope or kept was freed", v.Shape())
			}
		}
		if st := d.MemStats(); st.InUseBlocks != 2 {
			t.Errorf("after End: %+v, want 2 blocks in use", st)
		}
		if err := s.End(); err == nil {
			t.Error("a second End succeeded")
		}
		s2, err := d.BeginScope()
		if err != nil {
			t.Fatal(err)
		}
		if err := s2.End(); err != nil {
			t.Fatal(err)
		}
	})
}

// Release frees tensors of the open scope early, empties them, and leaves
// alone what the scope does not hold.
func TestScopeRelease(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		if d.OpenScope() != nil {
			t.Fatal("a new device has an open scope")
		}
		before := toDevice(t, d, hostTensor(tensor.Float32, []int{10}, 1))
		s, err := d.BeginScope()
		if err != nil {
			t.Fatal(err)
		}
		defer s.End()
		if d.OpenScope() != s {
			t.Fatal("OpenScope is not the scope just opened")
		}
		a := toDevice(t, d, hostTensor(tensor.Float32, []int{10}, 2))
		b, _ := d.NewDense(tensor.Float32, 20)
		kept, _ := d.NewDense(tensor.Float32, 30)
		if err := s.Keep(kept); err != nil {
			t.Fatal(err)
		}
		view, err := b.Slice(tensor.S(0, 5))
		if err != nil {
			t.Fatal(err)
		}
		host := hostTensor(tensor.Float32, []int{4}, 3)
		inUse := d.MemStats().InUseBlocks
		n, err := s.Release(nil, before, kept, view.(*tensor.Dense), host, a, a)
		if err != nil || n != 1 {
			t.Fatalf("Release = %d, %v; want 1 (a only)", n, err)
		}
		if a.Raw != nil || d.Owns(a) {
			t.Error("a released tensor still holds its memory")
		}
		if got := d.MemStats().InUseBlocks; got != inUse-1 {
			t.Errorf("blocks in use %d -> %d, want one fewer", inUse, got)
		}
		for _, v := range []*tensor.Dense{before, kept, b} {
			if !d.Owns(v) {
				t.Errorf("%v tensor that the scope does not hold, or a view's owner, was released", v.Shape())
			}
		}
		if floats(host)[0] != floats(hostTensor(tensor.Float32, []int{4}, 3))[0] {
			t.Error("a host tensor changed")
		}
		// The block goes to the next request of its size class.
		c, err := d.NewDense(tensor.Float32, 10)
		if err != nil {
			t.Fatal(err)
		}
		if st := d.MemStats(); st.DriverAllocs != int64(st.InUseBlocks+st.CachedBlocks) {
			t.Errorf("%+v: a request after a release went to the driver", st)
		}
		if n, err := s.Release(c); n != 1 || err != nil {
			t.Errorf("Release(c) = %d, %v", n, err)
		}
		peak := d.MemStats().PeakInUse
		d.ResetPeakMemory()
		if st := d.MemStats(); st.PeakInUse != st.InUse || st.PeakInUse >= peak {
			t.Errorf("after ResetPeakMemory: %+v (peak before %d)", st, peak)
		}
	})
}

// The counters count launches, cuBLAS calls, waits for the stream and
// copies from the host, each once.
func TestCounters(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		start := d.Counters()
		x := toDevice(t, d, hostTensor(tensor.Float32, []int{6}, 1))
		y, err := d.Engine().Add(x, x)
		if err != nil {
			t.Fatal(err)
		}
		c := toDevice(t, d, hostTensor(tensor.Float32, []int{4}, 0))
		px, err := d.Ptr(x)
		if err != nil {
			t.Fatal(err)
		}
		pc, err := d.Ptr(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Gemm(Gemm{M: 2, N: 2, K: 3, Alpha: 1, A: px, B: px, C: pc, Dtype: tensor.Float32}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.ToHost(y.(*tensor.Dense)); err != nil {
			t.Fatal(err)
		}
		if err := d.Synchronize(); err != nil {
			t.Fatal(err)
		}
		got := d.Counters().Sub(start)
		want := Counters{Launches: 1, Gemms: 1, Waits: 2, CopiesToDevice: 2}
		if got != want {
			t.Errorf("counted %+v, want %+v", got, want)
		}
	})
}
