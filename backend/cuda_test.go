//go:build stheno_cuda

package backend

import (
	"errors"
	"testing"
)

func init() {
	deviceKinds = append(deviceKinds, deviceKind{name: "cuda", open: openCUDA, isolate: true, bench: true})
}

// openCUDA opens GPU 0, skipping (visibly) when the machine has none, and
// closes it when the test ends.
func openCUDA(tb testing.TB) *Device {
	d, err := Open(0)
	if errors.Is(err, ErrNoDevice) {
		tb.Skipf("no CUDA device: %v", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Logf("%v, %s=%v", d, SyncEnv, d.SyncLaunches())
	tb.Cleanup(func() {
		if err := d.Close(); err != nil && !errors.Is(err, ErrClosed) {
			tb.Errorf("closing: %v", err)
		}
	})
	return d
}

// TestModulesEmbedded checks that every module of kernels/ is embedded and
// loads on this GPU (SASS for sm_80/sm_90 or PTX the driver can JIT).
func TestModulesEmbedded(t *testing.T) {
	d := openCUDA(t)
	for _, module := range []string{"elementwise"} {
		if _, err := d.Kernel(module, "fill_u64"); err != nil {
			t.Errorf("module %s: %v", module, err)
		}
	}
}

// TestGPUGraphsReplayLikeDirect: on the GPU, steps captured as CUDA graphs
// and replayed with new kernel arguments give what the same steps issued
// call by call give (graphs.go).
func TestGPUGraphsReplayLikeDirect(t *testing.T) {
	if !inChild(t, deviceKind{isolate: true}) {
		return
	}
	open := func(on string) *Device {
		t.Setenv(GraphsEnv, on)
		t.Setenv(SyncEnv, "0")
		return openCUDA(t)
	}
	direct, replay := open("0"), open("1")
	checkReplayLikeDirect(t, direct, replay)
}
