package backend

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"

	"gorgonia.org/tensor"
)

func TestRoundTrip(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		dtypes := []tensor.Dtype{tensor.Float32, tensor.Float64, tensor.Int32, tensor.Int64, tensor.Uint8, tensor.Bool}
		shapes := [][]int{{2, 3}, {}, {1}, {0, 5}, {7, 1, 3}, {1 << 20}, {1000003}}
		for _, dt := range dtypes {
			for i, shape := range shapes {
				h := hostTensor(dt, shape, i)
				x := toDevice(t, d, h)
				if !IsDevice(x) || !d.Owns(x) || x.Engine() != d.Engine() || x.Dtype() != dt || !x.Shape().Eq(h.Shape()) {
					t.Fatalf("%v %v: ToDevice gave %v %v, device %v, owned %v, engine %T",
						dt, shape, x.Dtype(), x.Shape(), IsDevice(x), d.Owns(x), x.Engine())
				}
				if IsDevice(h) {
					t.Fatalf("%v %v: host tensor reported on the device", dt, shape)
				}
				// Through a device-to-device copy as well.
				y, err := d.ToDevice(x)
				if err != nil {
					t.Fatal(err)
				}
				back := toHost(t, d, y)
				if msg := sameValues(back, h); msg != "" {
					t.Errorf("%v %v: round trip: %s", dt, shape, msg)
				}
				if back.Engine() == d.Engine() || IsDevice(back) {
					t.Errorf("%v %v: ToHost result has engine %T", dt, shape, back.Engine())
				}
				for _, v := range []*tensor.Dense{x, y} {
					if err := d.FreeDense(v); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		if s := d.MemStats(); s.InUse != 0 {
			t.Errorf("after freeing everything: %+v", s)
		}
	})
}

func TestRoundTripViews(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		h := hostTensor(tensor.Float32, []int{4, 5}, 1)
		// Rows 1..2 are contiguous; column 3 is not; h.T() is transposed.
		rows, err := h.Slice(tensor.S(1, 3))
		if err != nil {
			t.Fatal(err)
		}
		col, err := h.Slice(nil, tensor.S(3))
		if err != nil {
			t.Fatal(err)
		}
		tr := h.Clone().(*tensor.Dense)
		if err := tr.T(); err != nil {
			t.Fatal(err)
		}
		for name, v := range map[string]tensor.View{"rows": rows, "column": col, "transposed": tr} {
			hv := v.(*tensor.Dense)
			want := hv.Materialize().(*tensor.Dense)
			got := toHost(t, d, toDevice(t, d, hv))
			if msg := sameValues(got, want); msg != "" {
				t.Errorf("%s: %s", name, msg)
			}
		}
		// A device view of whole rows reads back; a column view is refused.
		x := toDevice(t, d, h)
		xrows, err := x.Slice(tensor.S(1, 3))
		if err != nil {
			t.Fatal(err)
		}
		want := rows.(*tensor.Dense).Materialize().(*tensor.Dense)
		if msg := sameValues(toHost(t, d, xrows.(*tensor.Dense)), want); msg != "" {
			t.Errorf("device rows view: %s", msg)
		}
		xcol, err := x.Slice(nil, tensor.S(3))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.ToHost(xcol.(*tensor.Dense)); err == nil || !strings.Contains(err.Error(), "non-contiguous") {
			t.Errorf("ToHost of a column view: %v, want an error", err)
		}
		if err := d.FreeDense(xrows.(*tensor.Dense)); err == nil || !strings.Contains(err.Error(), "view") {
			t.Errorf("FreeDense of a view: %v, want an error", err)
		}
		if err := d.FreeDense(x); err != nil {
			t.Fatal(err)
		}
		if _, err := d.ToHost(x); err == nil {
			t.Error("ToHost of a freed tensor succeeded")
		}
	})
}

func TestMemsetMemclr(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		e := d.Engine()
		for _, c := range []struct {
			dt  tensor.Dtype
			val any
		}{
			{tensor.Float32, float32(1.5)},
			{tensor.Float64, -2.25}, // 8 bytes: the fill kernel
			{tensor.Int64, int64(-3)},
			{tensor.Int16, int16(-7)},
			{tensor.Uint8, uint8(200)},
			{tensor.Bool, true},
		} {
			x, err := d.NewDense(c.dt, 3, 1001)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Memset(x, c.val); err != nil {
				t.Fatalf("Memset(%v, %v): %v", c.dt, c.val, err)
			}
			h := toHost(t, d, x)
			want := tensor.New(tensor.Of(c.dt), tensor.WithShape(3, 1001))
			if err := want.Memset(c.val); err != nil {
				t.Fatal(err)
			}
			if msg := sameValues(h, want); msg != "" {
				t.Errorf("Memset(%v, %v): %s", c.dt, c.val, msg[:min(len(msg), 200)])
			}
			e.Memclr(x)
			want.Zero()
			if msg := sameValues(toHost(t, d, x), want); msg != "" {
				t.Errorf("Memclr(%v): %s", c.dt, msg[:min(len(msg), 200)])
			}
			if err := d.FreeDense(x); err != nil {
				t.Fatal(err)
			}
		}
		x, err := d.NewDense(tensor.Float32, 8)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Memset(x, 1.0); err == nil {
			t.Error("Memset of a float32 tensor with a float64 succeeded")
		}
		if err := e.Memset(x, "a"); err == nil {
			t.Error("Memset with a string succeeded")
		}
		if err := d.Zero(x); err != nil {
			t.Fatal(err)
		}
		if got := floats(toHost(t, d, x)); got[7] != 0 {
			t.Errorf("Zero left %v", got)
		}
		// Raw device memory from Alloc, as a Memory.
		p, err := d.Alloc(4096)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Memset(Memory{p, 4096}, uint32(0xdeadbeef)); err != nil {
			t.Fatal(err)
		}
		if err := e.Free(Memory{p, 4096}, 4096); err != nil {
			t.Fatal(err)
		}
		// Host memory goes to the standard engine.
		h := tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(3))
		if err := e.Memset(h, 4.5); err != nil || h.Float64s()[2] != 4.5 {
			t.Errorf("host Memset: %v, %v", err, h.Float64s())
		}
		e.Memclr(h)
		if h.Float64s()[2] != 0 {
			t.Errorf("host Memclr left %v", h.Float64s())
		}
		if err := d.Synchronize(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestMemcpy(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		e := d.Engine()
		a := hostTensor(tensor.Float64, []int{10, 10}, 1)
		b := hostTensor(tensor.Float64, []int{10, 10}, 2)
		x, err := d.NewDense(tensor.Float64, 10, 10)
		if err != nil {
			t.Fatal(err)
		}
		y, err := d.NewDense(tensor.Float64, 10, 10)
		if err != nil {
			t.Fatal(err)
		}
		steps := []struct {
			name     string
			dst, src tensor.Memory
		}{{"HtoD", x, a}, {"DtoD", y, x}, {"DtoH", b, y}}
		for _, s := range steps {
			if err := e.Memcpy(s.dst, s.src); err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
		}
		if msg := sameValues(b, a); msg != "" {
			t.Errorf("host -> device -> device -> host: %s", msg)
		}
		// CopyTo goes through the source's engine: a device source works.
		c := tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(10, 10))
		if err := x.CopyTo(c); err != nil {
			t.Fatal(err)
		}
		if msg := sameValues(c, a); msg != "" {
			t.Errorf("CopyTo: %s", msg)
		}
		if err := e.Memcpy(x, tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(0))); err != nil {
			t.Errorf("copying nothing: %v", err)
		}
		if _, err := e.Accessible(x); err == nil {
			t.Error("device memory reported accessible")
		}
		if m, err := e.Accessible(a); err != nil || m != tensor.Memory(a) {
			t.Errorf("Accessible(host) = %v, %v", m, err)
		}
	})
}

// TestAllocatorReuse: a loop that allocates and frees the same sizes
// calls the driver only in its first iteration.
func TestAllocatorReuse(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		shapes := [][]int{{1}, {256, 256}, {3, 224, 224}, {1 << 20}, {2, 256, 200, 336}}
		step := func() {
			var vals []*tensor.Dense
			for _, s := range shapes {
				x, err := d.NewDense(tensor.Float32, s...)
				if err != nil {
					t.Fatal(err)
				}
				vals = append(vals, x)
			}
			raw, err := d.Alloc(12345)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range vals {
				if err := d.FreeDense(x); err != nil {
					t.Fatal(err)
				}
			}
			if err := d.Free(raw); err != nil {
				t.Fatal(err)
			}
		}
		step()
		warm := d.MemStats()
		for range 20 {
			step()
		}
		s := d.MemStats()
		if s.DriverAllocs != warm.DriverAllocs || s.DriverFrees != 0 {
			t.Errorf("steady state called the driver: %+v after warm-up %+v", s, warm)
		}
		if s.InUse != 0 || s.InUseBlocks != 0 || s.Cached != warm.Cached || s.PeakInUse != warm.PeakInUse {
			t.Errorf("steady state: %+v, want nothing in use and the warm-up's cache %+v", s, warm)
		}
		if err := d.ReleaseCached(); err != nil {
			t.Fatal(err)
		}
		if s := d.MemStats(); s.Cached != 0 || s.DriverFrees != s.DriverAllocs {
			t.Errorf("after ReleaseCached: %+v", s)
		}
		t.Logf("%+v", d.MemStats())
	})
}

// TestOutOfMemoryReleasesCache: when the driver is out of memory the
// allocator gives its cache back and tries again.
func TestOutOfMemoryReleasesCache(t *testing.T) {
	d := openFake(t)
	fakeGPU.Lock()
	saved := fakeGPU.total
	fakeGPU.total = fakeGPU.used + 64<<20
	fakeGPU.Unlock()
	defer func() {
		fakeGPU.Lock()
		fakeGPU.total = saved
		fakeGPU.Unlock()
	}()
	for _, n := range []int64{40 << 20, 20 << 20} {
		p, err := d.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Free(p); err != nil {
			t.Fatal(err)
		}
	}
	// 60 MiB cached of 64: 50 MiB fits only once the cache is released.
	p, err := d.Alloc(50 << 20)
	if err != nil {
		t.Fatalf("Alloc with a full cache: %v", err)
	}
	if s := d.MemStats(); s.Cached != 0 || s.InUse != 50<<20 || s.DriverFrees != 2 {
		t.Errorf("after the retry: %+v", s)
	}
	_, err = d.Alloc(50 << 20)
	var de *DriverError
	if err == nil || !errors.As(err, &de) || !de.OutOfMemory() {
		t.Errorf("Alloc beyond the device: %v, want an out-of-memory DriverError", err)
	}
	_ = d.Free(p)
}

func TestClose(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		// A second Device keeps the context alive, so that the driver's
		// free memory can be watched across the first one's Close.
		watcher := d
		d2 := openSameKind(t, d)
		free0, _, err := watcher.MemInfo()
		if err != nil {
			t.Fatal(err)
		}
		const n = 256 << 20
		x, err := d2.NewDense(tensor.Float32, n/4)
		if err != nil {
			t.Fatal(err)
		}
		y, err := d2.ToDevice(hostTensor(tensor.Float32, []int{1000}, 0))
		if err != nil {
			t.Fatal(err)
		}
		if err := d2.FreeDense(y); err != nil {
			t.Fatal(err)
		}
		free1, _, err := watcher.MemInfo()
		if err != nil {
			t.Fatal(err)
		}
		if free0-free1 < n {
			t.Errorf("free memory went from %d to %d with %d bytes allocated", free0, free1, n)
		}
		if err := d2.Close(); err != nil {
			t.Fatal(err)
		}
		if s := d2.MemStats(); s.InUse != 0 || s.Cached != 0 || s.DriverFrees != s.DriverAllocs {
			t.Errorf("after Close: %+v", s)
		}
		free2, _, err := watcher.MemInfo()
		if err != nil {
			t.Fatal(err)
		}
		// The driver may keep a little for itself; a block of ours is 256 MiB.
		if free0-free2 > 8<<20 {
			t.Errorf("free memory %d before, %d after Close", free0, free2)
		}
		if err := d2.Close(); !errors.Is(err, ErrClosed) {
			t.Errorf("second Close: %v, want ErrClosed", err)
		}
		for name, err := range map[string]error{
			"NewDense":    func() error { _, err := d2.NewDense(tensor.Float32, 1); return err }(),
			"Synchronize": d2.Synchronize(),
			"Kernel":      func() error { _, err := d2.Kernel("elementwise", "add_f32"); return err }(),
			"ToHost":      func() error { _, err := d2.ToHost(x); return err }(),
		} {
			if err == nil {
				t.Errorf("%s after Close succeeded", name)
			}
		}
		if dev, err := DeviceOf(x); dev != nil || err == nil {
			t.Errorf("DeviceOf(tensor of a closed device) = %v, %v; want an error", dev, err)
		}
	})
}

// openSameKind opens another Device of d's kind.
func openSameKind(tb testing.TB, d *Device) *Device {
	if _, ok := fakeOf(d); ok {
		return openFake(tb)
	}
	for _, k := range deviceKinds {
		if k.name == "cuda" {
			return k.open(tb)
		}
	}
	tb.Fatalf("no kind for %T", d.drv)
	return nil
}

// TestConcurrentLaunches: goroutines that are not locked to a thread (as
// the TapeMachine's are not) allocate, copy, launch and read back at once.
// The collector runs every few allocations meanwhile: a slice whose array
// the collector cannot see (tensor's Dense.Data, which HostData guards)
// is then freed and handed out again within the run, so that such a bug
// fails most runs instead of one in hundreds.
//
// Under the race detector, which finds a racy access the first time it
// happens, the collector keeps its pace and each worker makes a few
// iterations.
func TestConcurrentLaunches(t *testing.T) {
	iters := 20
	if raceEnabled {
		iters = 3
	} else {
		defer debug.SetGCPercent(debug.SetGCPercent(10))
	}
	forEachDevice(t, func(t *testing.T, d *Device) {
		e := d.Engine()
		const workers, n = 16, 10007
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- func() error {
					for i := range iters {
						runtime.Gosched() // invite the scheduler to move us
						a, err := d.ToDevice(hostTensor(tensor.Float32, []int{n}, w))
						if err != nil {
							return err
						}
						b, err := d.NewDense(tensor.Float32, n)
						if err != nil {
							return err
						}
						if err := e.Memset(b, float32(i)); err != nil {
							return err
						}
						s, err := e.Add(a, b) // s = a + i
						if err != nil {
							return err
						}
						if err := d.Axpy(2, b, s.(*tensor.Dense)); err != nil { // s = a + 3i
							return err
						}
						h, err := d.ToHost(s.(*tensor.Dense))
						if err != nil {
							return err
						}
						want := floats(hostTensor(tensor.Float32, []int{n}, w))
						for j, v := range floats(h) {
							if v != want[j]+3*float64(i) {
								return fmt.Errorf("worker %d, iteration %d: element %d = %v, want %v", w, i, j, v, want[j]+3*float64(i))
							}
						}
						for _, x := range []*tensor.Dense{a, b, s.(*tensor.Dense)} {
							if err := d.FreeDense(x); err != nil {
								return err
							}
						}
					}
					return nil
				}()
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		if s := d.MemStats(); s.InUse != 0 {
			t.Errorf("after all workers: %+v", s)
		}
	})
}

// Values live on their Device: set, read, removed, and dropped by Close.
func TestValues(t *testing.T) {
	type key struct{}
	d := openFake(t)
	if v := d.Value(key{}); v != nil {
		t.Fatalf("a new device holds %v", v)
	}
	d.SetValue(key{}, 3)
	if v := d.Value(key{}); v != 3 {
		t.Fatalf("Value = %v, want 3", v)
	}
	if other := openFake(t); other.Value(key{}) != nil {
		t.Error("a value leaked to another device")
	}
	d.SetValue(key{}, nil)
	if v := d.Value(key{}); v != nil {
		t.Fatalf("after SetValue(nil) Value = %v", v)
	}
	d.SetValue(key{}, "x")
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if v := d.Value(key{}); v != nil {
		t.Errorf("after Close Value = %v", v)
	}
}

// A device tensor cloned from the header of the first of its dtype and
// shape (wrap) is the tensor tensor.New builds: the same shape, strides,
// dtype, flags and engine, its own memory, and a header of its own.
func TestNewDenseClonesHeaders(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		built, err := d.NewDense(tensor.Float32, 2, 3, 4)
		if err != nil {
			t.Fatal(err)
		}
		var clones []*tensor.Dense
		for range 2 {
			c, err := d.NewDense(tensor.Float32, 2, 3, 4)
			if err != nil {
				t.Fatal(err)
			}
			clones = append(clones, c)
		}
		for i, c := range clones {
			if !c.Shape().Eq(built.Shape()) || !slices.Equal(c.Strides(), built.Strides()) || c.Dtype() != built.Dtype() ||
				c.DataOrder() != built.DataOrder() || c.IsNativelyAccessible() || !c.IsManuallyManaged() || c.IsView() ||
				c.Engine() != built.Engine() || len(c.Raw) != len(built.Raw) || !d.Owns(c) {
				t.Fatalf("clone %d: shape %v strides %v %v order %v accessible %v managed %v view %v engine %T %d bytes, owned %v; built: %v %v %v %v %d bytes",
					i, c.Shape(), c.Strides(), c.Dtype(), c.DataOrder(), c.IsNativelyAccessible(), c.IsManuallyManaged(), c.IsView(),
					c.Engine(), len(c.Raw), d.Owns(c), built.Shape(), built.Strides(), built.Dtype(), built.DataOrder(), len(built.Raw))
			}
			if c == built || rawAddr(c.Raw) == rawAddr(built.Raw) || i == 1 && rawAddr(c.Raw) == rawAddr(clones[0].Raw) {
				t.Fatalf("clone %d shares a header or memory", i)
			}
		}
		// A header of its own: reshaping one leaves the others alone.
		if err := clones[0].Reshape(6, 4); err != nil {
			t.Fatal(err)
		}
		if !built.Shape().Eq(tensor.Shape{2, 3, 4}) || !clones[1].Shape().Eq(tensor.Shape{2, 3, 4}) {
			t.Fatalf("reshaping a clone changed the others: %v, %v", built.Shape(), clones[1].Shape())
		}
		if !clones[0].Shape().Eq(tensor.Shape{6, 4}) || !slices.Equal(clones[0].Strides(), []int{4, 1}) {
			t.Fatalf("reshaped clone: shape %v strides %v, want (6, 4) and [4 1]", clones[0].Shape(), clones[0].Strides())
		}
		// Back to a higher rank than the clone was made with.
		if err := clones[0].Reshape(2, 3, 2, 2); err != nil {
			t.Fatal(err)
		}
		if !clones[0].Shape().Eq(tensor.Shape{2, 3, 2, 2}) || !slices.Equal(clones[0].Strides(), []int{12, 4, 2, 1}) ||
			!clones[1].Shape().Eq(tensor.Shape{2, 3, 4}) || !slices.Equal(clones[1].Strides(), []int{12, 4, 1}) {
			t.Fatalf("reshaped clone: %v %v; the other: %v %v", clones[0].Shape(), clones[0].Strides(), clones[1].Shape(), clones[1].Strides())
		}
		// The values go where each tensor's memory is.
		for i, v := range []*tensor.Dense{built, clones[1]} {
			h := tensor.New(tensor.WithShape(2, 3, 4), tensor.WithBacking(make([]float32, 24)))
			h.Float32s()[0] = float32(i + 1)
			if err := d.Engine().Memcpy(v, h); err != nil {
				t.Fatal(err)
			}
		}
		for i, v := range []*tensor.Dense{built, clones[1]} {
			h, err := d.ToHost(v)
			if err != nil {
				t.Fatal(err)
			}
			if got := h.Float32s()[0]; got != float32(i+1) {
				t.Fatalf("tensor %d holds %v, want %v", i, got, i+1)
			}
		}
		for _, v := range append(clones, built) {
			if err := d.FreeDense(v); err != nil {
				t.Fatal(err)
			}
		}
	})
}
