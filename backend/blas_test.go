package backend

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"gorgonia.org/tensor"
)

// gemmCase is a Gemm to run and check against a row-major reference.
type gemmCase struct {
	name             string
	dt               tensor.Dtype
	transA, transB   bool
	m, n, k          int
	padA, padB, padC int  // elements past each stored row: LD = columns + pad
	explicitLD       bool // pass LD even when pad is 0 (else 0: packed)
	batch            int
	// gapA, gapB, gapC are elements between one problem's end and the
	// next one's start; -1 shares one matrix between problems (stride 0).
	gapA, gapB, gapC int64
	alpha, beta      float64
	nanC             bool // C starts as NaN (with Beta 0 it must not be read)
}

// gemmCases are the shapes, transposes, row strides, batches and scalars
// the table tests run. Every value is a multiple of 1/8 in [-1, 1] and
// every sum below 2^24/64 in size, so every product and sum is exact in
// float32, and also in TF32 (10 mantissa bits hold the inputs): results
// are compared for equality, on the fake and on the GPU in both math modes.
var gemmCases = []gemmCase{
	{name: "1x1x1", m: 1, n: 1, k: 1, alpha: 1},
	{name: "NN_7x5x3", m: 7, n: 5, k: 3, alpha: 1},
	{name: "NT_7x5x3", transB: true, m: 7, n: 5, k: 3, alpha: 1},
	{name: "TN_7x5x3", transA: true, m: 7, n: 5, k: 3, alpha: 1},
	{name: "TT_7x5x3", transA: true, transB: true, m: 7, n: 5, k: 3, alpha: 1},
	{name: "TT_7x5x3_f64", dt: tensor.Float64, transA: true, transB: true, m: 7, n: 5, k: 3, alpha: 1},
	{name: "NN_33x17x65_alpha_beta", m: 33, n: 17, k: 65, alpha: 0.5, beta: -1.5},
	{name: "NT_13x11x9_padded", transB: true, m: 13, n: 11, k: 9, padA: 3, padB: 2, padC: 5, alpha: 1, beta: 1},
	{name: "TN_13x11x9_padded_f64", dt: tensor.Float64, transA: true, m: 13, n: 11, k: 9, padA: 1, padB: 4, padC: 2, alpha: -2, beta: 0.25},
	{name: "TT_5x6x7_explicit_ld", transA: true, transB: true, m: 5, n: 6, k: 7, explicitLD: true, alpha: 1},
	{name: "batch1_strides_ignored", m: 4, n: 3, k: 2, batch: 1, gapA: 5, gapB: 6, gapC: 7, alpha: 1},
	{name: "batch3_NT_30x20x8_gaps", transB: true, m: 30, n: 20, k: 8, batch: 3, gapA: 1, gapB: 2, gapC: 3, alpha: 1, beta: 0.5},
	{name: "batch4_shared_A", m: 9, n: 10, k: 11, batch: 4, gapA: -1, alpha: 1},
	{name: "batch4_shared_B_TN_padded", transA: true, m: 9, n: 10, k: 11, padA: 2, padC: 1, batch: 4, gapB: -1, gapC: 4, alpha: 1, beta: -1},
	{name: "batch5_TT_f64", dt: tensor.Float64, transA: true, transB: true, m: 6, n: 7, k: 5, batch: 5, alpha: 0.5, beta: 2},
	{name: "beta0_nanC", m: 8, n: 9, k: 10, alpha: 1, nanC: true},
	{name: "beta0_nanC_batched_f64", dt: tensor.Float64, transB: true, m: 8, n: 9, k: 10, batch: 2, gapC: 1, alpha: 1, nanC: true},
	{name: "alpha0", m: 8, n: 9, k: 10, alpha: 0, beta: 0.5},
	{name: "K0_beta0_nanC", m: 6, n: 4, k: 0, alpha: 1, nanC: true},
	{name: "K0_beta", m: 4, n: 6, k: 0, padC: 2, alpha: 1, beta: -0.5},
	{name: "K0_beta1", m: 4, n: 6, k: 0, alpha: 1, beta: 1},
	{name: "K0_batched_f64", dt: tensor.Float64, m: 5, n: 3, k: 0, batch: 3, gapC: 2, alpha: 1, beta: 0.5},
	{name: "odd_129x127x200", transB: true, m: 129, n: 127, k: 200, padA: 1, padC: 3, alpha: 1, beta: 1},
	// The detector's attention shapes: 8 heads, 300 queries, 32 channels.
	{name: "attn_QKt_8x300x300x32", transB: true, m: 300, n: 300, k: 32, batch: 8, alpha: 0.125},
	{name: "attn_AV_8x300x32x300", m: 300, n: 32, k: 300, batch: 8, alpha: 1},
}

// gemmLayout is one operand of a gemmCase as stored.
type gemmLayout struct {
	rows, cols, ld int
	stride         int64 // between problems (0: shared)
	total          int   // elements to allocate
}

func layoutOf(rows, cols, pad int, gap int64, batch int) gemmLayout {
	l := gemmLayout{rows: rows, cols: cols, ld: cols + pad}
	one := int64(max(rows-1, 0)*l.ld + cols)
	if rows == 0 || cols == 0 {
		one = 0
	}
	if gap >= 0 {
		l.stride = one + gap
	}
	l.total = int(int64(max(batch, 1)-1)*l.stride + one)
	return l
}

func (c gemmCase) dtype() tensor.Dtype {
	if c.dt == (tensor.Dtype{}) {
		return tensor.Float32
	}
	return c.dt
}

func (c gemmCase) layouts() (a, b, cl gemmLayout) {
	ar, ac := c.m, c.k
	if c.transA {
		ar, ac = c.k, c.m
	}
	br, bc := c.k, c.n
	if c.transB {
		br, bc = c.n, c.k
	}
	return layoutOf(ar, ac, c.padA, c.gapA, c.batch),
		layoutOf(br, bc, c.padB, c.gapB, c.batch),
		layoutOf(c.m, c.n, c.padC, c.gapC, c.batch)
}

// eighth is an exact value in [-1, 1] that varies with i and seed.
func eighth(i, seed int) float64 { return float64((i*5+seed*3)%17-8) / 8 }

// gemmPad marks elements of C outside the matrices, which Gemm must not
// touch.
const gemmPad = 1234.5

// inputs returns A, B and C's values as float64: A and B all eighths, C
// eighths (or NaN) inside its matrices and gemmPad outside.
func (c gemmCase) inputs() (a, b, cv []float64) {
	la, lb, lc := c.layouts()
	a = make([]float64, la.total)
	for i := range a {
		a[i] = eighth(i, 1)
	}
	b = make([]float64, lb.total)
	for i := range b {
		b[i] = eighth(i, 2)
	}
	cv = make([]float64, lc.total)
	for i := range cv {
		cv[i] = gemmPad
	}
	for p := range max(c.batch, 1) {
		for i := range c.m {
			for j := range c.n {
				o := int64(p)*lc.stride + int64(i*lc.ld+j)
				cv[o] = eighth(int(o), 3)
				if c.nanC {
					cv[o] = math.NaN()
				}
			}
		}
	}
	return a, b, cv
}

// reference computes the case row-major from Gemm's definition.
func (c gemmCase) reference(a, b, cv []float64) []float64 {
	la, lb, lc := c.layouts()
	out := append([]float64(nil), cv...)
	at := func(x []float64, l gemmLayout, p int, trans bool, i, j int) float64 {
		if trans {
			i, j = j, i
		}
		return x[int64(p)*l.stride+int64(i*l.ld+j)]
	}
	for p := range max(c.batch, 1) {
		for i := range c.m {
			for j := range c.n {
				sum := 0.0
				for l := range c.k {
					sum += at(a, la, p, c.transA, i, l) * at(b, lb, p, c.transB, l, j)
				}
				o := int64(p)*lc.stride + int64(i*lc.ld+j)
				v := c.alpha * sum
				if c.beta != 0 {
					v += c.beta * cv[o]
				}
				out[o] = v
			}
		}
	}
	return out
}

// hostOf makes a host tensor of dt holding vals.
func hostOf(dt tensor.Dtype, vals []float64) *tensor.Dense {
	if dt == tensor.Float32 {
		v := make([]float32, len(vals))
		for i, x := range vals {
			v[i] = float32(x)
		}
		return tensor.New(tensor.WithBacking(v))
	}
	return tensor.New(tensor.WithBacking(append([]float64(nil), vals...)))
}

// run uploads the case's inputs, runs it on d and returns C's values.
func (c gemmCase) run(t *testing.T, d *Device) (got, want []float64) {
	t.Helper()
	dt := c.dtype()
	a, b, cv := c.inputs()
	want = c.reference(a, b, cv)
	la, lb, lc := c.layouts()
	ptr := func(vals []float64) (DevicePtr, *tensor.Dense) {
		if len(vals) == 0 {
			return 0, nil
		}
		x := toDevice(t, d, hostOf(dt, vals))
		p, err := d.Ptr(x)
		if err != nil {
			t.Fatal(err)
		}
		return p, x
	}
	pa, _ := ptr(a)
	pb, _ := ptr(b)
	pc, xc := ptr(cv)
	ld := func(l gemmLayout) int {
		if l.ld == l.cols && !c.explicitLD {
			return 0
		}
		return l.ld
	}
	g := Gemm{
		TransA: c.transA, TransB: c.transB, M: c.m, N: c.n, K: c.k,
		A: pa, B: pb, C: pc, LDA: ld(la), LDB: ld(lb), LDC: ld(lc),
		Batch: c.batch, StrideA: la.stride, StrideB: lb.stride, StrideC: lc.stride,
		Alpha: c.alpha, Beta: c.beta, Dtype: dt,
	}
	if err := d.Gemm(g); err != nil {
		t.Fatalf("Gemm(%+v): %v", g, err)
	}
	if xc == nil {
		return nil, want
	}
	return floats(toHost(t, d, xc)), want
}

// TestGemm runs the table on every device kind: the fake checks the
// row-major to column-major translation against cuBLAS's definition, the
// GPU checks cuBLAS itself, float32 cases in both math modes.
func TestGemm(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		for _, c := range gemmCases {
			modes := []GemmMath{GemmTF32}
			if c.dtype() == tensor.Float32 {
				modes = append(modes, GemmExact)
			}
			for _, m := range modes {
				t.Run(fmt.Sprintf("%s/math=%v", c.name, m), func(t *testing.T) {
					d.SetGemmMath(m)
					defer d.SetGemmMath(GemmTF32)
					got, want := c.run(t, d)
					for i := range want {
						if got[i] != want[i] && !(math.IsNaN(got[i]) && math.IsNaN(want[i])) {
							t.Fatalf("%+v: element %d of C is %v, want %v", c, i, got[i], want[i])
						}
					}
				})
			}
		}
	})
}

// TestGemmEmpty: an empty C (M or N zero) queues nothing, and empty
// matrices need no memory.
func TestGemmEmpty(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		for _, g := range []Gemm{
			{M: 0, N: 5, K: 3, Dtype: tensor.Float32},
			{M: 4, N: 0, K: 3, Dtype: tensor.Float64, Batch: 7},
			{M: 0, N: 0, K: 0, Dtype: tensor.Float32, TransA: true, TransB: true},
		} {
			if err := d.Gemm(g); err != nil {
				t.Errorf("Gemm(%+v): %v", g, err)
			}
		}
		if err := d.Synchronize(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestGemmErrors: every bad argument is an error naming the field and
// its allowed range, before cuBLAS sees it, and leaves the Device usable.
func TestGemmErrors(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		alloc := func(bytes int64) DevicePtr {
			p, err := d.Alloc(bytes)
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
		// Blocks of 512 bytes (the smallest size class): 128 float32s.
		a, b, c := alloc(512), alloc(512), alloc(512)
		freed := alloc(512)
		if err := d.Free(freed); err != nil {
			t.Fatal(err)
		}
		ok := Gemm{M: 4, N: 5, K: 6, A: a, B: b, C: c, Alpha: 1, Dtype: tensor.Float32}
		with := func(f func(g *Gemm)) Gemm { g := ok; f(&g); return g }
		for _, tc := range []struct {
			name string
			g    Gemm
			want string
		}{
			{"dtype", with(func(g *Gemm) { g.Dtype = tensor.Int }), "Gemm: Dtype is int: want tensor.Float32 or tensor.Float64"},
			{"no dtype", with(func(g *Gemm) { g.Dtype = tensor.Dtype{} }), "Gemm: Dtype is"},
			{"M<0", with(func(g *Gemm) { g.M = -1 }), "Gemm: M is -1: want 0 to 2147483647"},
			{"N>int32", with(func(g *Gemm) { g.N = 1 << 31 }), "Gemm: N is 2147483648: want 0 to 2147483647"},
			{"K<0", with(func(g *Gemm) { g.K = -3 }), "Gemm: K is -3: want 0 to 2147483647"},
			{"Batch<0", with(func(g *Gemm) { g.Batch = -1 }), "Gemm: Batch is -1: want 0 to 2147483647"},
			{"LDA<K", with(func(g *Gemm) { g.LDA = 5 }), "Gemm: LDA is 5: want 0 (packed) or 6 to 2147483647, A being stored 4 x 6 (M x K)"},
			{"LDA<M TransA", with(func(g *Gemm) { g.TransA, g.LDA = true, 3 }), "Gemm: LDA is 3: want 0 (packed) or 4 to 2147483647, A being stored 6 x 4 (K x M, TransA)"},
			{"LDB<N", with(func(g *Gemm) { g.LDB = 4 }), "Gemm: LDB is 4: want 0 (packed) or 5 to 2147483647, B being stored 6 x 5 (K x N)"},
			{"LDB<K TransB", with(func(g *Gemm) { g.TransB, g.LDB = true, 2 }), "Gemm: LDB is 2: want 0 (packed) or 6 to 2147483647, B being stored 5 x 6 (N x K, TransB)"},
			{"LDC<0", with(func(g *Gemm) { g.LDC = -1 }), "Gemm: LDC is -1: want 0 (packed) or 5 to 2147483647, C being stored 4 x 5 (M x N)"},
			{"LDC>int32", with(func(g *Gemm) { g.LDC = 1 << 31 }), "Gemm: LDC is 2147483648: want 0 (packed) or 5 to 2147483647"},
			{"StrideB<0", with(func(g *Gemm) { g.StrideB = -1 }), "Gemm: StrideB is -1: want 0 or more elements between problems"},
			{"StrideC overlaps", with(func(g *Gemm) { g.Batch, g.StrideA, g.StrideB, g.StrideC = 2, 24, 30, 19 }),
				"Gemm: StrideC is 19: want at least (M-1)*LDC + N = 20, so that the 2 problems' C do not overlap"},
			{"StrideC 0", with(func(g *Gemm) { g.Batch = 2 }), "Gemm: StrideC is 0: want at least (M-1)*LDC + N = 20"},
			{"A null", with(func(g *Gemm) { g.A = 0 }), "Gemm: A is a null pointer, but it has 4 x 6 elements"},
			{"C null", with(func(g *Gemm) { g.C = 0; g.K = 0 }), "Gemm: C is a null pointer, but it has 4 x 5 elements"},
			{"A misaligned", with(func(g *Gemm) { g.A = a + 2 }), fmt.Sprintf("Gemm: A (%#x) is not aligned to its 4-byte elements", uint64(a+2))},
			{"B misaligned f64", with(func(g *Gemm) { g.B, g.Dtype = b+4, tensor.Float64 }), "is not aligned to its 8-byte elements"},
			{"A past block", with(func(g *Gemm) { g.LDA = 42 }), fmt.Sprintf("Gemm (float32 NN M=4 N=5 K=6): A (%#x) spans 528 bytes (4 x 6, row stride 42, 1 problems 0 apart), past the end of its block of 512 bytes", uint64(a))},
			{"C past block batched", with(func(g *Gemm) { g.Batch, g.StrideC = 7, 20 }), fmt.Sprintf("C (%#x) spans 560 bytes (4 x 5, row stride 5, 7 problems 20 apart), past the end of its block of 512 bytes", uint64(c))},
			{"B freed", with(func(g *Gemm) { g.B = freed }), fmt.Sprintf("B (%#x) is in a block that has been freed", uint64(freed))},
			{"C foreign", with(func(g *Gemm) { g.C = 0x1000 }), "C (0x1000) is not memory of this device"},
			{"huge stride", with(func(g *Gemm) { g.Batch, g.StrideA, g.StrideC = 3, 1<<62, 20 }), "Gemm: A spans more than 1125899906842624 bytes (Batch 3, StrideA 4611686018427387904, LDA 6): more than any device holds"},
		} {
			err := d.Gemm(tc.g)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: Gemm(%+v) = %v, want an error containing %q", tc.name, tc.g, err, tc.want)
			} else if !strings.HasPrefix(err.Error(), "backend: GPU ") {
				t.Errorf("%s: error %q does not start with the package and GPU", tc.name, err)
			}
		}
		d.SetGemmMath(GemmMath(7))
		if err := d.Gemm(ok); err == nil || !strings.Contains(err.Error(), "Gemm: GemmMath is GemmMath(7): want GemmTF32 or GemmExact (SetGemmMath)") {
			t.Errorf("Gemm with GemmMath(7) = %v", err)
		}
		d.SetGemmMath(GemmTF32)
		// float64 ignores the math mode, so this one is fine.
		if err := d.Gemm(ok); err != nil {
			t.Errorf("a good Gemm after the bad ones: %v", err)
		}
		if err := d.Synchronize(); err != nil {
			t.Errorf("after the errors: %v", err)
		}
	})
}

// TestGemmCall checks on the fake what cuBLAS receives: the operands and
// sizes swapped for row-major, the math mode, and that the handle and its
// workspace are made once and destroyed by Close.
func TestGemmCall(t *testing.T) {
	d := openFake(t)
	f, _ := fakeOf(d)
	x := toDevice(t, d, hostOf(tensor.Float32, make([]float64, 64)))
	p, _ := d.Ptr(x)
	before := d.MemStats()
	// The call reaches cuBLAS when the Device issues its held-back work.
	gemm := func(g Gemm) {
		t.Helper()
		if err := d.Gemm(g); err != nil {
			t.Fatal(err)
		}
		if err := d.Synchronize(); err != nil {
			t.Fatal(err)
		}
	}
	s, err := d.BeginScope()
	if err != nil {
		t.Fatal(err)
	}
	g := Gemm{TransB: true, M: 2, N: 3, K: 4, A: p, B: p + 64, C: p + 128, LDA: 5, LDC: 6,
		Batch: 2, StrideA: 16, StrideB: 0, StrideC: 12, Alpha: 2, Beta: 3, Dtype: tensor.Float32}
	gemm(g)
	want := gemmCall{transA: true, transB: false, m: 3, n: 2, k: 4,
		a: p + 64, lda: 4, strideA: 0, b: p, ldb: 5, strideB: 16, c: p + 128, ldc: 6, strideC: 12,
		batch: 2, alpha: 2, beta: 3, dtype: tensor.Float32, tf32: true, elem: 4}
	if f.lastGemm != want {
		t.Errorf("cuBLAS got %+v,\nwant %+v", f.lastGemm, want)
	}
	if err := s.End(); err != nil {
		t.Fatal(err)
	}
	// The workspace (4 MiB before Hopper) belongs to the Device, not the Scope.
	if got := d.MemStats().InUse - before.InUse; got != 4<<20 {
		t.Errorf("after the first Gemm and the Scope's end, %d more bytes in use; want the 4 MiB workspace", got)
	}
	d.SetGemmMath(GemmExact)
	gemm(g)
	if f.lastGemm.tf32 {
		t.Errorf("GemmExact: cuBLAS was allowed TF32")
	}
	d.SetGemmMath(GemmTF32)
	exact := g
	exact.Exact = true
	gemm(exact)
	if f.lastGemm.tf32 {
		t.Errorf("Gemm.Exact on a GemmTF32 device: cuBLAS was allowed TF32")
	}
	g.Dtype, g.B, g.C, g.StrideC = tensor.Float64, p, p+128, 6
	g.Batch = 1
	gemm(g)
	if f.lastGemm.tf32 || f.lastGemm.batch != 1 {
		t.Errorf("float64: cuBLAS got %+v", f.lastGemm)
	}
	if lib, err := d.BLASLibrary(); err != nil || lib != "fake cuBLAS" {
		t.Errorf("BLASLibrary() = %q, %v", lib, err)
	}
	if f.handles != 1 {
		t.Errorf("%d cuBLAS handles; want one per Device", f.handles)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if f.handles != 0 {
		t.Errorf("Close left %d cuBLAS handles", f.handles)
	}
	if err := d.Gemm(g); !errors.Is(err, ErrClosed) {
		t.Errorf("Gemm after Close = %v, want ErrClosed", err)
	}
}

// TestGemmWithoutCUBLAS: where cuBLAS cannot be loaded, Gemm says why,
// every time, and everything else works.
func TestGemmWithoutCUBLAS(t *testing.T) {
	d := openFake(t)
	f, _ := fakeOf(d)
	f.blasErr = &LoadError{Library: "cuBLAS", Env: CUBLASEnv, Tried: []LoadAttempt{
		{Name: "libcublas.so.13", Err: errors.New("libcublas.so.13: cannot open shared object file: No such file or directory")},
	}}
	x := toDevice(t, d, hostOf(tensor.Float32, []float64{1, 2, 3, 4}))
	p, _ := d.Ptr(x)
	g := Gemm{M: 2, N: 2, K: 2, A: p, B: p, C: p, Alpha: 1, Dtype: tensor.Float32}
	for range 2 {
		err := d.Gemm(g)
		var le *LoadError
		if !errors.As(err, &le) || !strings.Contains(err.Error(), "Gemm: cannot load cuBLAS; tried, in order:\n\tlibcublas.so.13: cannot open shared object file") {
			t.Fatalf("Gemm without cuBLAS = %v", err)
		}
	}
	if _, err := d.BLASLibrary(); err == nil {
		t.Errorf("BLASLibrary without cuBLAS succeeded")
	}
	y, err := d.Engine().Add(x, x)
	if err != nil {
		t.Fatal(err)
	}
	if got := floats(toHost(t, d, y.(*tensor.Dense))); !reflect.DeepEqual(got, []float64{2, 4, 6, 8}) {
		t.Errorf("Add without cuBLAS = %v", got)
	}
	if err := d.Close(); err != nil {
		t.Errorf("Close without cuBLAS: %v", err)
	}
}
