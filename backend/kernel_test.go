package backend

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"gorgonia.org/tensor"
)

func TestCheckParams(t *testing.T) {
	type inner struct {
		A [2]float32
		B int32
	}
	for _, c := range []struct {
		name string
		typ  reflect.Type
		want string // "" for accepted, else part of the error
	}{
		{"plain", reflect.TypeFor[struct {
			X    DevicePtr
			N    int64
			C    int32
			Flag bool
			F    float64
		}](), ""},
		{"nested", reflect.TypeFor[struct {
			In  inner
			Arr [3]inner
		}](), ""},
		{"empty", reflect.TypeFor[struct{}](), ""},
		{"elementwise", reflect.TypeFor[addParams](), ""},
		{"not a struct", reflect.TypeFor[int64](), "must be a struct"},
		{"Go int", reflect.TypeFor[struct{ N int }](), ".N is int"},
		{"uintptr", reflect.TypeFor[struct{ P uintptr }](), ".P is uintptr"},
		{"Go pointer", reflect.TypeFor[struct{ P *float32 }](), "Go pointers"},
		{"unsafe pointer", reflect.TypeFor[struct{ P unsafe.Pointer }](), ".P is unsafe.Pointer"},
		{"slice", reflect.TypeFor[struct{ S []float32 }](), ".S is []float32"},
		{"string in array", reflect.TypeFor[struct{ A [2]string }](), ".A[] is string"},
		{"deep", reflect.TypeFor[struct{ In struct{ M map[int]int } }](), ".In.M is map"},
		{"too big", reflect.TypeFor[struct{ A [1025]float32 }](), "at most 4096"},
	} {
		_, err := checkParams(c.typ)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v rejected: %v", c.name, c.typ, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: checkParams(%v) = %v, want an error containing %q", c.name, c.typ, err, c.want)
		}
	}
}

// TestElementwiseParamsLayout pins the sizes elementwise.cu asserts.
func TestElementwiseParamsLayout(t *testing.T) {
	for _, c := range []struct {
		name string
		got  uintptr
		want uintptr
	}{
		{"FillParams", unsafe.Sizeof(fillParams{}), 24},
		{"AddParams", unsafe.Sizeof(addParams{}), 48},
		{"AxpyParams", unsafe.Sizeof(axpyParams{}), 32},
	} {
		if c.got != c.want {
			t.Errorf("%s: Go struct has %d bytes, elementwise.cu's has %d", c.name, c.got, c.want)
		}
	}
}

func TestGridStride(t *testing.T) {
	d := &Device{info: deviceInfo{sms: 10}}
	for _, c := range []struct {
		n     int64
		block uint32
		grid  uint32
	}{
		{0, 256, 0}, {-5, 256, 0}, {1, 256, 1}, {256, 256, 1}, {257, 256, 2},
		{1 << 40, 256, 10 * gridStrideBlocksPerSM}, {100, 0, 0},
	} {
		cfg := d.GridStride(c.n, c.block)
		if cfg.Grid != (Dim3{c.grid, 1, 1}) || cfg.Block != (Dim3{c.block, 1, 1}) {
			t.Errorf("GridStride(%d, %d) = %v, want grid %d", c.n, c.block, cfg, c.grid)
		}
	}
}

func TestKernelLookup(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		k, err := d.Kernel("elementwise", "add_f32")
		if err != nil {
			t.Fatal(err)
		}
		if k2, err := d.Kernel("elementwise", "add_f32"); err != nil || k2 != k {
			t.Errorf("second lookup = %p, %v; want the cached %p", k2, err, k)
		}
		if k.String() != "elementwise.add_f32" || k.Device() != d {
			t.Errorf("kernel %v on %v", k, k.Device())
		}
		for _, c := range []struct{ module, name, want string }{
			{"elementwise", "add_f16", `has no kernel "add_f16"`},
			{"nosuchmodule", "f", `no module "nosuchmodule"`},
		} {
			_, err := d.Kernel(c.module, c.name)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "GPU 0") ||
				!strings.Contains(err.Error(), c.module+"."+c.name) {
				t.Errorf("Kernel(%q, %q) = %v, want an error naming the GPU and the kernel, saying %q", c.module, c.name, err, c.want)
			}
		}
	})
}

// TestLaunchConfigErrors: errors found at launch time name the kernel with
// or without STHENO_CUDA_SYNC, and leave the Device usable.
func TestLaunchConfigErrors(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		k, err := d.Kernel("elementwise", "fill_u64")
		if err != nil {
			t.Fatal(err)
		}
		x, err := d.NewDense(tensor.Float64, 4)
		if err != nil {
			t.Fatal(err)
		}
		p := fillParams{Out: DevicePtr(rawAddr(x.Raw)), N: 4, Value: 1}
		for _, c := range []struct {
			name string
			cfg  LaunchConfig
			want string
		}{
			{"too many threads", LaunchConfig{Grid: Dim3{1, 1, 1}, Block: Dim3{2048, 1, 1}}, "2048 threads per block"},
			{"zero block", LaunchConfig{Grid: Dim3{1, 1, 1}, Block: Dim3{0, 1, 1}}, "0 threads per block"},
			{"too much shared memory", LaunchConfig{Grid: Dim3{1, 1, 1}, Block: Dim3{32, 1, 1}, SharedMem: 1 << 30}, "1073741824 bytes of dynamic shared memory"},
		} {
			err := Launch(k, c.cfg, p)
			if err == nil || !strings.Contains(err.Error(), "elementwise.fill_u64") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: Launch = %v, want an error naming the kernel and saying %q", c.name, err, c.want)
			}
		}
		if err := Launch(k, LaunchConfig{Block: Dim3{32, 1, 1}}, p); err != nil {
			t.Errorf("empty grid: %v, want nothing launched and no error", err)
		}
		// Beyond 48 KiB of dynamic shared memory only after opting in.
		_, optIn := d.MaxSharedMemory()
		big := LaunchConfig{Grid: Dim3{1, 1, 1}, Block: Dim3{32, 1, 1}, SharedMem: 64 << 10}
		if err := Launch(k, big, p); err == nil {
			t.Error("64 KiB of shared memory without opting in launched")
		}
		if err := k.SetMaxDynamicSharedMemory(optIn + 1); err == nil {
			t.Error("SetMaxDynamicSharedMemory beyond the opt-in limit succeeded")
		}
		if err := k.SetMaxDynamicSharedMemory(64 << 10); err != nil {
			t.Fatal(err)
		}
		if err := Launch(k, big, p); err != nil {
			t.Errorf("64 KiB of shared memory after opting in: %v", err)
		}
		if err := Launch(k, d.GridStride(4, 32), struct{ N int }{4}); err == nil || !strings.Contains(err.Error(), "is int") {
			t.Errorf("params with a Go int: %v, want an error", err)
		}
		if err := Launch(k, d.GridStride(4, 32), p); err != nil {
			t.Fatal(err)
		}
		h := toHost(t, d, x)
		if got := h.Float64s(); got[0] != 5e-324 || got[3] != 5e-324 {
			t.Errorf("fill with bit pattern 1 gave %v, want the smallest denormal", got)
		}
	})
}

// TestLaunchSharedMemoryLimit: on a fake GPU with sm_86's limits (48 KiB
// per block by default, 99 KiB opted in), Launch refuses a block that asks
// for more dynamic shared memory than its kernel may have, before the
// driver sees it (no DriverError), naming the kernel, the bytes and the
// limit; SetMaxDynamicSharedMemory moves the limit up to the opt-in one.
func TestLaunchSharedMemoryLimit(t *testing.T) {
	const byDefault, optIn = 48 << 10, 99 << 10
	drv := newFakeDriver(t)
	drv.inf.maxSharedPerBlock, drv.inf.maxSharedOptIn = byDefault, optIn
	d := newDevice(drv, fakeImages, false)
	t.Cleanup(func() { _ = d.Close() })
	k, err := d.Kernel("elementwise", "fill_u64")
	if err != nil {
		t.Fatal(err)
	}
	x, err := d.NewDense(tensor.Float64, 4)
	if err != nil {
		t.Fatal(err)
	}
	p := fillParams{Out: DevicePtr(rawAddr(x.Raw)), N: 4, Value: 1}
	launch := func(bytes int) error {
		return Launch(k, LaunchConfig{Grid: Dim3{1, 1, 1}, Block: Dim3{32, 1, 1}, SharedMem: uint32(bytes)}, p)
	}
	refused := func(bytes, limit int) {
		t.Helper()
		err := launch(bytes)
		var de *DriverError
		want := fmt.Sprintf("asks for %d bytes of dynamic shared memory per block; it may have %d", bytes, limit)
		if err == nil || errors.As(err, &de) || !strings.Contains(err.Error(), "elementwise.fill_u64") || !strings.Contains(err.Error(), want) {
			t.Errorf("Launch with %d bytes: %v, want a refusal before the driver naming the kernel and saying %q", bytes, err, want)
		}
	}
	if err := launch(byDefault); err != nil {
		t.Errorf("Launch with the default limit's %d bytes: %v", byDefault, err)
	}
	refused(byDefault+1, byDefault)
	if err := k.SetMaxDynamicSharedMemory(optIn + 1); err == nil {
		t.Errorf("SetMaxDynamicSharedMemory(%d) beyond the opt-in limit succeeded", optIn+1)
	}
	refused(byDefault+1, byDefault) // a refused opt-in changes nothing
	if err := k.SetMaxDynamicSharedMemory(optIn); err != nil {
		t.Fatal(err)
	}
	if err := launch(optIn); err != nil {
		t.Errorf("Launch with %d bytes after opting in: %v", optIn, err)
	}
	refused(optIn+1, optIn)
	// Another kernel of the module keeps its own, default limit.
	k2, err := d.Kernel("elementwise", "add_f32")
	if err != nil {
		t.Fatal(err)
	}
	err = Launch(k2, LaunchConfig{Grid: Dim3{1, 1, 1}, Block: Dim3{32, 1, 1}, SharedMem: byDefault + 1}, addParams{})
	if err == nil || !strings.Contains(err.Error(), "elementwise.add_f32") {
		t.Errorf("add_f32 with %d bytes: %v, want a refusal", byDefault+1, err)
	}
	if err := d.Synchronize(); err != nil {
		t.Error(err)
	}
}

// TestBadLaunch: a kernel that faults is reported by the next wait on the
// stream, naming STHENO_CUDA_SYNC; with STHENO_CUDA_SYNC=1 by the launch
// itself, naming the kernel. A fault is sticky for the whole CUDA context,
// so on a GPU each case runs in a child process.
func TestBadLaunch(t *testing.T) {
	for _, kind := range deviceKinds {
		t.Run("impl="+kind.name, func(t *testing.T) {
			for _, syncLaunches := range []bool{true, false} {
				name := "sync=0"
				if syncLaunches {
					name = "sync=1"
				}
				t.Run(name, func(t *testing.T) {
					if syncLaunches {
						t.Setenv(SyncEnv, "1")
					} else {
						t.Setenv(SyncEnv, "0")
					}
					if !inChild(t, kind) {
						return
					}
					d := kind.open(t)
					if d.SyncLaunches() != syncLaunches {
						t.Fatalf("SyncLaunches() = %v with %s=%s", d.SyncLaunches(), SyncEnv, os.Getenv(SyncEnv))
					}
					k, err := d.Kernel("elementwise", "fill_u64")
					if err != nil {
						t.Fatal(err)
					}
					// Address 0x100 is no device memory: the kernel faults.
					err = Launch(k, d.GridStride(1024, 256), fillParams{Out: 0x100, N: 1024, Value: 7})
					var de *DriverError
					if syncLaunches {
						if err == nil || !strings.Contains(err.Error(), "kernel elementwise.fill_u64") || !errors.As(err, &de) {
							t.Fatalf("Launch = %v, want the kernel's fault, naming it", err)
						}
						t.Logf("Launch: %v", err)
					} else {
						if err != nil {
							t.Fatalf("Launch = %v, want nil: the fault is asynchronous", err)
						}
						err = d.Synchronize()
						if err == nil || !strings.Contains(err.Error(), SyncEnv+"=1") || !errors.As(err, &de) {
							t.Fatalf("Synchronize = %v, want the fault with a hint to set %s", err, SyncEnv)
						}
						t.Logf("Synchronize: %v", err)
					}
					// The context is now unusable; close it here so that
					// the cleanup does not report the expected errors.
					_ = d.Close()
				})
			}
		})
	}
}

func TestSyncEnv(t *testing.T) {
	for _, c := range []struct {
		v    string
		want bool
		err  bool
	}{{"", false, false}, {"1", true, false}, {"0", false, false}, {"true", true, false}, {"yes", false, true}} {
		t.Setenv(SyncEnv, c.v)
		got, err := syncFromEnv()
		if got != c.want || (err != nil) != c.err {
			t.Errorf("%s=%q: %v, %v; want %v, error %v", SyncEnv, c.v, got, err, c.want, c.err)
		}
	}
}
