package backend_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/backend"
)

// These tests run cuBLAS on the GPU against a float64 reference computed
// here, with the project's tolerance table (autograd imports backend, so
// they live in package backend_test). Without a GPU, or without the
// stheno_cuda tag, they skip.

func openGPU(t *testing.T) *backend.Device {
	t.Helper()
	d, err := backend.Open(0)
	if errors.Is(err, backend.ErrNoDevice) {
		t.Skipf("no CUDA device: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("closing: %v", err)
		}
	})
	lib, err := d.BLASLibrary()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%v, %s", d, lib)
	return d
}

// devFloats puts vals on d as dt and returns the tensor and its address.
func devFloats(t *testing.T, d *backend.Device, dt tensor.Dtype, vals []float64) (*tensor.Dense, backend.DevicePtr) {
	t.Helper()
	var h *tensor.Dense
	if dt == tensor.Float32 {
		v := make([]float32, len(vals))
		for i, x := range vals {
			v[i] = float32(x)
		}
		h = tensor.New(tensor.WithBacking(v))
	} else {
		h = tensor.New(tensor.WithBacking(append([]float64(nil), vals...)))
	}
	x, err := d.ToDevice(h)
	if err != nil {
		t.Fatal(err)
	}
	p, err := d.Ptr(x)
	if err != nil {
		t.Fatal(err)
	}
	return x, p
}

func hostFloats(t *testing.T, d *backend.Device, x *tensor.Dense) []float64 {
	t.Helper()
	h, err := d.ToHost(x)
	if err != nil {
		t.Fatal(err)
	}
	switch v := h.Data().(type) {
	case []float32:
		out := make([]float64, len(v))
		for i, x := range v {
			out[i] = float64(x)
		}
		return out
	case []float64:
		return v
	case float32: // gorgonia gives a one-element tensor's value alone
		return []float64{float64(v)}
	case float64:
		return []float64{v}
	}
	t.Fatalf("unexpected data %T", h.Data())
	return nil
}

// uniform returns n values uniform in [-1, 1), rounded to dt.
func uniform(rng *rand.Rand, dt tensor.Dtype, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = 2*rng.Float64() - 1
		if dt == tensor.Float32 {
			v[i] = float64(float32(v[i]))
		}
	}
	return v
}

// TestGPUGemmAccuracy compares cuBLAS with a float64 reference on random
// inputs in [-1, 1), at odd sizes, the detector's shapes and every
// transpose: float64 to TolParity64; float32 in GemmExact to TolParity32
// (an fp32 sum of K <= 300 products of order 1 is off by ~1e-6 near zero,
// more than TolForward32's Abs, while TF32's ~1e-3 is far above this
// bound, so an exact-mode call that used TF32 fails); float32 in GemmTF32
// to autograd.TolTF32For the sums' natural size (TolTF32 itself up to 5).
func TestGPUGemmAccuracy(t *testing.T) {
	d := openGPU(t)
	type shape struct {
		name           string
		transA, transB bool
		m, n, k, batch int
		alpha, beta    float64
	}
	shapes := []shape{
		{"1x1x1", false, false, 1, 1, 1, 1, 1, 0},
		{"NN_7x5x3", false, false, 7, 5, 3, 1, 1, 0},
		{"TN_33x17x65_beta", true, false, 33, 17, 65, 1, 1.5, -0.5},
		{"NT_129x127x200", false, true, 129, 127, 200, 1, 1, 0},
		{"TT_255x257x129_batch3_beta", true, true, 255, 257, 129, 3, 0.5, 1},
		{"linear_NT_2000x256x256", false, true, 2000, 256, 256, 1, 1, 0},
		{"attn_QKt_8x300x300x32", false, true, 300, 300, 32, 8, 0.125, 0},
		{"attn_AV_8x300x32x300", false, false, 300, 32, 300, 8, 1, 0},
	}
	for _, mode := range []struct {
		name string
		dt   tensor.Dtype
		math backend.GemmMath
	}{{"f64", tensor.Float64, backend.GemmTF32}, {"f32_exact", tensor.Float32, backend.GemmExact}, {"f32_tf32", tensor.Float32, backend.GemmTF32}} {
		for si, s := range shapes {
			t.Run(fmt.Sprintf("%s/%s", s.name, mode.name), func(t *testing.T) {
				d.SetGemmMath(mode.math)
				defer d.SetGemmMath(backend.GemmTF32)
				rng := rand.New(rand.NewPCG(uint64(si), 26))
				m, n, k, batch := s.m, s.n, s.k, s.batch
				a := uniform(rng, mode.dt, batch*m*k)
				b := uniform(rng, mode.dt, batch*k*n)
				c := uniform(rng, mode.dt, batch*m*n)
				xa, pa := devFloats(t, d, mode.dt, a)
				xb, pb := devFloats(t, d, mode.dt, b)
				xc, pc := devFloats(t, d, mode.dt, c)
				defer func() {
					for _, x := range []*tensor.Dense{xa, xb, xc} {
						if err := d.FreeDense(x); err != nil {
							t.Error(err)
						}
					}
				}()
				g := backend.Gemm{TransA: s.transA, TransB: s.transB, M: m, N: n, K: k, A: pa, B: pb, C: pc,
					Batch: batch, StrideA: int64(m * k), StrideB: int64(k * n), StrideC: int64(m * n),
					Alpha: s.alpha, Beta: s.beta, Dtype: mode.dt}
				if err := d.Gemm(g); err != nil {
					t.Fatal(err)
				}
				got := hostFloats(t, d, xc)
				want := make([]float64, len(c))
				for p := range batch {
					at := func(x []float64, off, ld int, trans bool, i, j int) float64 {
						if trans {
							i, j = j, i
						}
						return x[off+i*ld+j]
					}
					lda, ldb := k, n
					if s.transA {
						lda = m
					}
					if s.transB {
						ldb = k
					}
					for i := range m {
						for j := range n {
							sum := 0.0
							for l := range k {
								sum += at(a, p*m*k, lda, s.transA, i, l) * at(b, p*k*n, ldb, s.transB, l, j)
							}
							o := p*m*n + i*n + j
							want[o] = s.alpha*sum + s.beta*c[o]
						}
					}
				}
				var tol autograd.Tolerance
				switch {
				case mode.dt == tensor.Float64:
					tol = autograd.TolParity64
				case mode.math == backend.GemmExact:
					tol = autograd.TolParity32
				default:
					// Products of two U(-1, 1) values have rms 1/3.
					tol = autograd.TolTF32For(math.Abs(s.alpha) * math.Sqrt(float64(k)) / 3)
				}
				if err := tol.Compare(got, want); err != nil {
					t.Errorf("%v against the float64 reference, tolerance %+v: %v", g, tol, err)
				}
				t.Logf("%v: worst element used %.3g of %+v", g, tol.Worst(got, want), tol)
			})
		}
	}
}

// TestGPUGemmMath: GemmExact keeps float32's mantissa where TF32 would
// drop it. Every element of A is 1 + 2^-12, which TF32 (10 mantissa bits)
// rounds to 1, and B is ones: in exact math each C is exactly 64 + 2^-6.
// In TF32 mode cuBLAS may use tensor cores (C = 64) or not; the log says
// which it did.
func TestGPUGemmMath(t *testing.T) {
	d := openGPU(t)
	const m, n, k = 64, 64, 64
	a := make([]float64, m*k)
	for i := range a {
		a[i] = 1 + 1.0/4096
	}
	b := make([]float64, k*n)
	for i := range b {
		b[i] = 1
	}
	_, pa := devFloats(t, d, tensor.Float32, a)
	_, pb := devFloats(t, d, tensor.Float32, b)
	xc, pc := devFloats(t, d, tensor.Float32, make([]float64, m*n))
	for _, mode := range []backend.GemmMath{backend.GemmExact, backend.GemmTF32} {
		d.SetGemmMath(mode)
		g := backend.Gemm{M: m, N: n, K: k, A: pa, B: pb, C: pc, Alpha: 1, Dtype: tensor.Float32}
		if err := d.Gemm(g); err != nil {
			t.Fatal(err)
		}
		got := hostFloats(t, d, xc)
		exact, rounded := 0, 0
		for _, v := range got {
			switch v {
			case 64 + 1.0/64:
				exact++
			case 64:
				rounded++
			}
		}
		t.Logf("math=%v: %d of %d elements exact (64 + 2^-6), %d as TF32 makes them (64)", mode, exact, len(got), rounded)
		if mode == backend.GemmExact && exact != len(got) {
			t.Errorf("GemmExact: %d of %d elements are not 64 + 2^-6 (first: %v)", len(got)-exact, len(got), got[0])
		}
		if exact+rounded != len(got) {
			t.Errorf("math=%v: %d elements are neither 64 + 2^-6 nor 64", mode, len(got)-exact-rounded)
		}
	}
	d.SetGemmMath(backend.GemmTF32)
}
