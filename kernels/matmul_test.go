package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
)

// gemmCase is one batch of products for the GEMM tests; its String names
// it in failures.
type gemmCase struct {
	p GemmParams
}

func (c gemmCase) String() string {
	p := c.p
	return fmt.Sprintf("M=%d N=%d K=%d transA=%t transB=%t ld=%d,%d,%d batch=%d strides=%d,%d,%d alpha=%v beta=%v",
		p.M, p.N, p.K, p.TransA, p.TransB, p.LDA, p.LDB, p.LDC, p.Batch, p.StrideA, p.StrideB, p.StrideC, p.Alpha, p.Beta)
}

// gemmCases cover: sizes of 1 and around the micro-kernels' tiles (4, 6, 8,
// 16, 32) and the tiling (tileRows, colBlock); depths around the depth
// blocking (kcMax = 256); every transpose; padded row strides; batches with
// padded and shared (stride 0) operands; and the alpha and beta that take
// their own paths (0, 1, other).
func gemmCases() []gemmCase {
	var cs []gemmCase
	add := func(p GemmParams) { cs = append(cs, gemmCase{p}) }
	for _, s := range [][3]int{
		{1, 1, 1}, {1, 7, 3}, {5, 1, 9}, {4, 4, 4}, {6, 16, 2}, {8, 32, 1}, {7, 17, 33},
		{13, 35, 257}, {25, 9, 513}, {193, 40, 5}, {3, 260, 300},
	} {
		for _, ta := range []bool{false, true} {
			for _, tb := range []bool{false, true} {
				add(GemmParams{M: s[0], N: s[1], K: s[2], TransA: ta, TransB: tb, Alpha: 1})
			}
		}
	}
	for _, ab := range [][2]float64{{1, 1}, {-0.5, 0}, {2, -0.5}, {0, 0.5}, {0, 0}} {
		add(GemmParams{M: 9, N: 11, K: 20, TransB: true, Alpha: ab[0], Beta: ab[1]})
	}
	add(GemmParams{M: 5, N: 6, K: 0, Alpha: 1, Beta: 0.5})
	add(GemmParams{M: 0, N: 6, K: 3, Alpha: 1})
	// Padded row strides, and a batch with gaps between its matrices.
	add(GemmParams{M: 7, N: 10, K: 12, LDA: 15, LDB: 13, LDC: 11, Alpha: 1, Beta: 1})
	add(GemmParams{M: 7, N: 10, K: 12, TransA: true, TransB: true, LDA: 9, LDB: 14, LDC: 10, Alpha: 1})
	add(GemmParams{M: 6, N: 5, K: 9, Batch: 3, StrideA: 60, StrideB: 50, StrideC: 40, Alpha: 1})
	// Attention's shapes in small: q*k^T and p*v over heads.
	add(GemmParams{M: 30, N: 30, K: 8, TransB: true, Batch: 4, StrideA: 240, StrideB: 240, StrideC: 900, Alpha: 0.25})
	add(GemmParams{M: 30, N: 8, K: 30, Batch: 4, StrideA: 900, StrideB: 240, StrideC: 240, Alpha: 1})
	// A weight shared by the batch (StrideB 0), and a shared A.
	add(GemmParams{M: 10, N: 12, K: 7, TransB: true, Batch: 3, StrideA: 70, StrideC: 120, Alpha: 1, Beta: 1})
	add(GemmParams{M: 10, N: 12, K: 7, TransA: true, Batch: 2, StrideB: 84, StrideC: 125, Alpha: 1})
	return cs
}

// gemmRef is the definition of GemmParams, in float64, for one batch.
func gemmRef(p GemmParams, a, b, c []float64) {
	p = p.normalized()
	at := func(i, r, q int) float64 {
		if p.TransA {
			return a[i*p.StrideA+q*p.LDA+r]
		}
		return a[i*p.StrideA+r*p.LDA+q]
	}
	bt := func(i, q, j int) float64 {
		if p.TransB {
			return b[i*p.StrideB+j*p.LDB+q]
		}
		return b[i*p.StrideB+q*p.LDB+j]
	}
	for i := range p.Batch {
		for r := range p.M {
			for j := range p.N {
				var s float64
				for q := range p.K {
					s += at(i, r, q) * bt(i, q, j)
				}
				o := i*p.StrideC + r*p.LDC + j
				if p.Beta == 0 {
					c[o] = p.Alpha * s
				} else {
					c[o] = p.Alpha*s + p.Beta*c[o]
				}
			}
		}
	}
}

// gemmOperands draws A, B and C for c: multiples of 1/8 in [-1, 1], so that
// every product and sum is exact in float32 and the tests can ask for
// equality. Elements of C outside its matrices are NaN when sentinel, and
// C's matrices are NaN when beta is 0 (BLAS does not read them then).
func gemmOperands(rng *rand.Rand, c gemmCase) (a, b, cm []float64) {
	p := c.p.normalized()
	ar, ac := p.storedA()
	br, bc := p.storedB()
	a = dyadicFloats(rng, (p.Batch-1)*p.StrideA+footprint(ar, ac, p.LDA))
	b = dyadicFloats(rng, (p.Batch-1)*p.StrideB+footprint(br, bc, p.LDB))
	cm = make([]float64, (p.Batch-1)*p.StrideC+footprint(p.M, p.N, p.LDC)+3)
	for i := range cm {
		cm[i] = math.NaN()
	}
	for i := range p.Batch {
		for r := range p.M {
			row := cm[i*p.StrideC+r*p.LDC : i*p.StrideC+r*p.LDC+p.N]
			if p.Beta != 0 {
				copy(row, dyadicFloats(rng, p.N))
			}
		}
	}
	return a, b, cm
}

// Every micro-kernel's GEMM agrees exactly with the definition, and leaves
// C outside its matrices alone.
func TestGemmExact(t *testing.T) {
	testGemmExact[float32](t)
	testGemmExact[float64](t)
}

func testGemmExact[T Float](t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, c := range gemmCases() {
		a, b, c0 := gemmOperands(rng, c)
		want := append([]float64(nil), c0...)
		gemmRef(c.p, a, b, want)
		for _, mk := range microKernels[T]() {
			got := convertTo[T](c0)
			gemm(mk, c.p.normalized(), convertTo[T](a), convertTo[T](b), got)
			for i := range got {
				g, w := float64(got[i]), want[i]
				if g != w && !(math.IsNaN(g) && math.IsNaN(w)) {
					t.Fatalf("%T %s %v: c[%d] = %v, want %v", got[0], mk.name, c, i, g, w)
				}
			}
		}
	}
}

// Gemm's answer does not depend on the number of goroutines, bit for bit,
// on inputs whose sums do round.
func TestGemmDeterministic(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	rng := rand.New(rand.NewPCG(7, 8))
	for _, p := range []GemmParams{
		{M: 300, N: 70, K: 600, TransB: true, Alpha: 1, Beta: 1},
		{M: 40, N: 500, K: 300, TransA: true, Batch: 3, StrideA: 12000, StrideB: 150000, StrideC: 20000, Alpha: 0.5},
	} {
		q := p.normalized()
		ar, ac := q.storedA()
		br, bc := q.storedB()
		a := gemmRandSlice[float32](rng, (q.Batch-1)*q.StrideA+footprint(ar, ac, q.LDA))
		b := gemmRandSlice[float32](rng, (q.Batch-1)*q.StrideB+footprint(br, bc, q.LDB))
		c0 := gemmRandSlice[float32](rng, (q.Batch-1)*q.StrideC+footprint(q.M, q.N, q.LDC))
		var first []float32
		for _, procs := range []int{1, 2, 3, 8} {
			runtime.GOMAXPROCS(procs)
			c := append([]float32(nil), c0...)
			if err := Gemm(p, a, b, c); err != nil {
				t.Fatal(err)
			}
			if first == nil {
				first = c
				continue
			}
			for i := range c {
				if math.Float32bits(c[i]) != math.Float32bits(first[i]) {
					t.Fatalf("%v: GOMAXPROCS=%d: c[%d] = %v, with one goroutine %v", gemmCase{p}, procs, i, c[i], first[i])
				}
			}
		}
	}
}

func TestGemmCheck(t *testing.T) {
	ok := GemmParams{M: 2, N: 3, K: 4, Alpha: 1}
	for _, c := range []struct {
		p          GemmParams
		la, lb, lc int
		want       string
	}{
		{ok, 8, 12, 6, ""},
		{GemmParams{M: -1, N: 3, K: 4}, 8, 12, 6, "must not be negative"},
		{GemmParams{M: 2, N: 3, K: 4, LDC: -3}, 8, 12, 6, "strides must not be negative"},
		{GemmParams{M: 2, N: 3, K: 4, LDA: 3, Alpha: 1}, 8, 12, 6, "LDA = 3 is shorter than A's rows of 4"},
		{GemmParams{M: 2, N: 3, K: 4, TransB: true, LDB: 3, Alpha: 1}, 8, 12, 6, "LDB = 3 is shorter than B's rows of 4"},
		{ok, 7, 12, 6, "A has 7 elements, the batch needs 8"},
		{ok, 8, 11, 6, "B has 11 elements, the batch needs 12"},
		{ok, 8, 12, 5, "C has 5 elements, the batch needs 6"},
		{GemmParams{M: 2, N: 3, K: 4, Batch: 2, StrideA: 8, StrideB: 12, StrideC: 5, Alpha: 1}, 16, 24, 12, "overlap"},
		{GemmParams{M: 2, N: 3, K: 4, Batch: 2, StrideA: 8, StrideC: 6, Alpha: 1}, 16, 12, 12, ""},
		// Alpha 0: A and B are not read, so they may be absent.
		{GemmParams{M: 2, N: 3, K: 4, Beta: 1}, 0, 0, 6, ""},
	} {
		err := c.p.Check(c.la, c.lb, c.lc)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%v with %d, %d, %d elements: got %v, want %q", gemmCase{c.p}, c.la, c.lb, c.lc, err, c.want)
		}
	}
	c := []float64{1, 2, 3}
	if err := Gemm(GemmParams{M: 1, N: 3, K: 1, Alpha: 1}, []float64{1}, []float64{1, 1}, c); err == nil || c[0] != 1 {
		t.Errorf("Gemm with a short B: err %v, c %v; want an error and c untouched", err, c)
	}
}

func TestSumRowsAndBroadcastRows(t *testing.T) {
	testSumRows[float32](t)
	testSumRows[float64](t)
}

func testSumRows[T Float](t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for _, s := range [][2]int{{1, 1}, {3, 5}, {257, 3}, {600, 300}, {1, 513}} {
		rows, cols := s[0], s[1]
		src := dyadicFloats(rng, rows*cols)
		got := convertTo[T](dyadicFloats(rng, cols)) // overwritten
		SumRows(rows, cols, convertTo[T](src), got)
		for j := range cols {
			var want float64
			for r := range rows {
				want += src[r*cols+j]
			}
			if float64(got[j]) != want {
				t.Fatalf("%T %dx%d: column %d sums to %v, want %v", got[0], rows, cols, j, got[j], want)
			}
		}
		b := make([]T, rows*cols)
		BroadcastRows(rows, cols, got, b)
		for i, v := range b {
			if v != got[i%cols] {
				t.Fatalf("%T %dx%d: BroadcastRows[%d] = %v, want %v", v, rows, cols, i, v, got[i%cols])
			}
		}
	}
}

// BenchmarkGemm times Gemm on a detector's shapes: a Linear layer over
// 20000 tokens (x*w^T), its two gradients, and attention's batched q*k^T.
func BenchmarkGemm(b *testing.B) {
	for _, s := range []struct {
		name string
		p    GemmParams
	}{
		{"linear_fwd/m=20000/n=256/k=256", GemmParams{M: 20000, N: 256, K: 256, TransB: true, Alpha: 1}},
		{"linear_dx/m=20000/n=256/k=256", GemmParams{M: 20000, N: 256, K: 256, Alpha: 1}},
		{"linear_dw/m=256/n=256/k=20000", GemmParams{M: 256, N: 256, K: 20000, TransA: true, Alpha: 1}},
		{"attn_qk/batch=16/m=300/n=300/k=32", GemmParams{M: 300, N: 300, K: 32, TransB: true, Batch: 16, StrideA: 9600, StrideB: 9600, StrideC: 90000, Alpha: 1}},
	} {
		benchGemm[float32](b, s.name, s.p)
		benchGemm[float64](b, s.name, s.p)
	}
}

func benchGemm[T Float](b *testing.B, name string, p GemmParams) {
	var z T
	b.Run(fmt.Sprintf("dtype=%T/%s", z, name), func(b *testing.B) {
		rng := rand.New(rand.NewPCG(1, 2))
		q := p.normalized()
		ar, ac := q.storedA()
		br, bc := q.storedB()
		a := gemmRandSlice[T](rng, (q.Batch-1)*q.StrideA+footprint(ar, ac, q.LDA))
		bb := gemmRandSlice[T](rng, (q.Batch-1)*q.StrideB+footprint(br, bc, q.LDB))
		c := make([]T, (q.Batch-1)*q.StrideC+footprint(q.M, q.N, q.LDC))
		for b.Loop() {
			if err := Gemm(p, a, bb, c); err != nil {
				b.Fatal(err)
			}
		}
		flops := 2 * float64(q.Batch) * float64(q.M) * float64(q.N) * float64(q.K)
		b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	})
}
