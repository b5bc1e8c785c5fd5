package backend

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"gorgonia.org/tensor"
)

// gemmBenchCases are the detector's GEMMs: a Linear layer over
// 20000 tokens of 256 channels (forward, and the two products of its
// backward), and attention's two batched products for 8 heads of 300
// queries and 32 channels.
var gemmBenchCases = []struct {
	name string
	g    Gemm // sizes and transposes; pointers and strides are filled in
}{
	{"linear_fwd_20000x256x256", Gemm{TransB: true, M: 20000, N: 256, K: 256}},    // y = x W^T
	{"linear_dx_20000x256x256", Gemm{M: 20000, N: 256, K: 256}},                   // dx = dy W
	{"linear_dw_256x256x20000", Gemm{TransA: true, M: 256, N: 256, K: 20000}},     // dW = dy^T x
	{"attn_qk_8x300x300x32", Gemm{TransB: true, M: 300, N: 300, K: 32, Batch: 8}}, // Q K^T per head
	{"attn_av_8x300x32x300", Gemm{M: 300, N: 32, K: 300, Batch: 8}},               // softmax(.) V per head
}

// tf32PeakTFLOPs is the dense TF32 tensor-core peak of d at its reported
// peak clock (2048 TF32 FLOP per clock per SM on Hopper, 1024 on A100), or
// 0 where not known; as ops' convolution benchmarks compute it.
func tf32PeakTFLOPs(d *Device) float64 {
	perSM := 0.0
	switch major, minor := d.ComputeCapability(); {
	case major == 9:
		perSM = 2048
	case major == 8 && minor == 0:
		perSM = 1024
	}
	return perSM * float64(d.SMCount()) * float64(d.ClockKHz()) * 1e3 / 1e12
}

// BenchmarkGPUGemm times Device.Gemm at the detector's shapes, float32 in
// both math modes: CUDA events around each of b.N calls after 5 untimed
// ones (run with -test.benchtime 30x for the suite's median of 30),
// reporting the median (ms), TFLOP/s (2*M*N*K*Batch per call) and, for
// TF32, the share of the tensor cores' dense TF32 peak (%peak).
func BenchmarkGPUGemm(b *testing.B) {
	forEachBenchDevice(b, func(b *testing.B, d *Device) {
		if lib, err := d.BLASLibrary(); err != nil {
			b.Fatal(err)
		} else {
			b.Logf("%v, %s", d, lib)
		}
		for _, c := range gemmBenchCases {
			for _, m := range []GemmMath{GemmTF32, GemmExact} {
				b.Run(fmt.Sprintf("case=%s/math=%v", c.name, m), func(b *testing.B) {
					benchGemm(b, d, c.g, m)
				})
			}
		}
	})
}

func benchGemm(b *testing.B, d *Device, g Gemm, m GemmMath) {
	g.Dtype, g.Alpha = tensor.Float32, 1
	batch := max(g.Batch, 1)
	g.StrideA, g.StrideB, g.StrideC = int64(g.M*g.K), int64(g.K*g.N), int64(g.M*g.N)
	var ts []*tensor.Dense
	defer func() {
		for _, x := range ts {
			if err := d.FreeDense(x); err != nil {
				b.Error(err)
			}
		}
	}()
	for i, n := range []int64{g.StrideA, g.StrideB, g.StrideC} {
		x := toDevice(b, d, hostTensor(tensor.Float32, []int{batch * int(n)}, i))
		ts = append(ts, x)
		p, err := d.Ptr(x)
		if err != nil {
			b.Fatal(err)
		}
		*[]*DevicePtr{&g.A, &g.B, &g.C}[i] = p
	}
	d.SetGemmMath(m)
	defer d.SetGemmMath(GemmTF32)
	for range 5 {
		if err := d.Gemm(g); err != nil {
			b.Fatal(err)
		}
	}
	times := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start, err := d.Record()
		if err != nil {
			b.Fatal(err)
		}
		if err := d.Gemm(g); err != nil {
			b.Fatal(err)
		}
		end, err := d.Record()
		if err != nil {
			b.Fatal(err)
		}
		t, err := d.Elapsed(start, end)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = start.Release(), end.Release()
		times = append(times, t)
	}
	b.StopTimer()
	slices.Sort(times)
	med := times[len(times)/2].Seconds()
	flops := 2 * float64(g.M) * float64(g.N) * float64(g.K) * float64(batch)
	b.ReportMetric(med*1e3, "ms")
	b.ReportMetric(flops/med/1e12, "TFLOP/s")
	if peak := tf32PeakTFLOPs(d); peak > 0 && m == GemmTF32 {
		b.ReportMetric(100*flops/med/1e12/peak, "%peak")
	}
}
