package backend

import (
	"fmt"
	"testing"

	"gorgonia.org/tensor"
)

// forEachBenchDevice runs b once per device kind whose timings mean
// something (a real GPU), as sub-benchmark impl=<name>.
func forEachBenchDevice(b *testing.B, f func(b *testing.B, d *Device)) {
	ran := false
	for _, k := range deviceKinds {
		if !k.bench {
			continue
		}
		ran = true
		b.Run("impl="+k.name, func(b *testing.B) { f(b, k.open(b)) })
	}
	if !ran {
		b.Skip("no CUDA device in this build (stheno_cuda tag)")
	}
}

func byteSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// BenchmarkAlloc measures an Alloc and Free pair: from the cache (the
// steady state of a training step), and with the cache released every time
// (what cuMemAlloc and cuMemFree cost without it).
func BenchmarkAlloc(b *testing.B) {
	forEachBenchDevice(b, func(b *testing.B, d *Device) {
		for _, cached := range []bool{true, false} {
			for _, n := range []int64{4 << 10, 1 << 20, 64 << 20} {
				b.Run(fmt.Sprintf("cache=%v/bytes=%s", cached, byteSize(n)), func(b *testing.B) {
					for b.Loop() {
						p, err := d.Alloc(n)
						if err != nil {
							b.Fatal(err)
						}
						if err := d.Free(p); err != nil {
							b.Fatal(err)
						}
						if !cached {
							if err := d.ReleaseCached(); err != nil {
								b.Fatal(err)
							}
						}
					}
					s := d.MemStats()
					b.ReportMetric(float64(s.DriverAllocs)/float64(b.N), "cuMemAlloc/op")
				})
			}
		}
	})
}

// BenchmarkCopy measures copy bandwidth: host to device (ToDevice's
// path, from pageable Go memory), device to host (ToHost's, including the
// wait), and device to device.
func BenchmarkCopy(b *testing.B) {
	forEachBenchDevice(b, func(b *testing.B, d *Device) {
		e := d.Engine()
		for _, n := range []int64{64 << 10, 1 << 20, 16 << 20, 256 << 20} {
			h := tensor.New(tensor.Of(tensor.Uint8), tensor.WithShape(int(n)))
			x, err := d.NewDense(tensor.Uint8, int(n))
			if err != nil {
				b.Fatal(err)
			}
			y, err := d.NewDense(tensor.Uint8, int(n))
			if err != nil {
				b.Fatal(err)
			}
			for _, c := range []struct {
				dir      string
				dst, src tensor.Memory
			}{{"HtoD", x, h}, {"DtoH", h, x}, {"DtoD", y, x}} {
				b.Run(fmt.Sprintf("dir=%s/bytes=%s", c.dir, byteSize(n)), func(b *testing.B) {
					b.SetBytes(n)
					for b.Loop() {
						if err := e.Memcpy(c.dst, c.src); err != nil {
							b.Fatal(err)
						}
					}
					// Copies on the device are queued: wait for the last.
					if err := d.Synchronize(); err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
				})
			}
			for _, v := range []*tensor.Dense{x, y} {
				if err := d.FreeDense(v); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

// BenchmarkLaunch measures queueing a small kernel (Engine.Add's path:
// kernel lookup, params check, launch) and, with sync=1, a launch that
// waits as under STHENO_CUDA_SYNC=1.
func BenchmarkLaunch(b *testing.B) {
	forEachBenchDevice(b, func(b *testing.B, d *Device) {
		x, err := d.NewDense(tensor.Float32, 256)
		if err != nil {
			b.Fatal(err)
		}
		k, err := d.Kernel(elementwiseModule, "add_f32")
		if err != nil {
			b.Fatal(err)
		}
		ptr := DevicePtr(rawAddr(x.Raw))
		p := addParams{Out: ptr, A: ptr, B: ptr, N: 256, BStride: 1}
		cfg := d.GridStride(256, elementwiseBlock)
		for _, wait := range []bool{false, true} {
			b.Run(fmt.Sprintf("sync=%v", map[bool]int{false: 0, true: 1}[wait]), func(b *testing.B) {
				d.syncLaunches = wait
				defer func() { d.syncLaunches = false }()
				for b.Loop() {
					if err := Launch(k, cfg, p); err != nil {
						b.Fatal(err)
					}
				}
				if err := d.Synchronize(); err != nil {
					b.Fatal(err)
				}
			})
		}
	})
}

// BenchmarkNewDense measures a device tensor's making and freeing from the
// cache: what every op's output costs the host.
func BenchmarkNewDense(b *testing.B) {
	forEachBenchDevice(b, func(b *testing.B, d *Device) {
		for b.Loop() {
			t, err := d.NewDense(tensor.Float32, 8, 256, 32, 32)
			if err != nil {
				b.Fatal(err)
			}
			if err := d.FreeDense(t); err != nil {
				b.Fatal(err)
			}
		}
	})
}
