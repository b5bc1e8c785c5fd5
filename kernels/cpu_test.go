package kernels

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestChooseCPUKernels(t *testing.T) {
	offered := []string{"avx2", "portable"}
	for _, c := range []struct {
		value, want, err string
	}{
		{"", "avx2", ""},
		{"avx2", "avx2", ""},
		{"portable", "portable", ""},
		{"avx512", "avx2", "STHENO_CPU_KERNELS=avx512: this CPU cannot run the avx512 micro-kernels; it runs avx2 or portable"},
		{"AVX2", "avx2", `STHENO_CPU_KERNELS="AVX2" names no micro-kernels: the choices are avx512, avx2, portable; this CPU runs avx2 or portable`},
		{"go", "avx2", `STHENO_CPU_KERNELS="go" names no micro-kernels`},
	} {
		got, err := chooseCPUKernels(c.value, offered)
		if got != c.want || (err == nil) != (c.err == "") || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("%q: %q, %v; want %q and an error containing %q", c.value, got, err, c.want, c.err)
		}
	}
	if offers := CPUKernelChoices(); offers[len(offers)-1] != "portable" {
		t.Errorf("CPUKernelChoices() = %q: portable must always be there, last", offers)
	}
}

// fma32 is a*b + c rounded once to float32, as VFMADD231PS computes it.
// The product is exact in float64; the sum s is rounded to float64, with
// error e (Knuth's TwoSum), and s rounded to float32 is the answer unless s
// lies halfway between two float32s while e is not 0: then the exact sum
// is on e's side. For finite operands whose sum does not overflow.
func fma32(a, b, c float32) float32 {
	p := float64(a) * float64(b)
	s := p + float64(c)
	v := s - p
	e := (p - (s - v)) + (float64(c) - v)
	r := float32(s)
	if e == 0 || float64(r) == s {
		return r
	}
	toward := float32(math.Inf(1))
	if s < float64(r) {
		toward = float32(math.Inf(-1))
	}
	n := math.Nextafter32(r, toward) // the other float32 around s
	if float64(r)+float64(n) != 2*s {
		return r // not a tie: the nearest float32 of s is that of s+e
	}
	if (e > 0) == (n > r) {
		return n
	}
	return r
}

// fma32Big is fma32 the slow way: the sum exact in a big.Float, rounded to
// the nearest float32 (ties to even).
func fma32Big(a, b, c float32) float32 {
	const prec = 1200 // past the exponent range of two float32 terms
	x := new(big.Float).SetPrec(prec).SetFloat64(float64(a) * float64(b))
	x.Add(x, new(big.Float).SetPrec(prec).SetFloat64(float64(c)))
	f, _ := x.Float32()
	return f
}

func TestFMA32(t *testing.T) {
	h := float32(1 + 0x1p-12) // h*h = 1 + 2^-11 + 2^-24: a float32 tie
	cases := [][3]float32{
		{h, h, 0x1p-80}, {h, h, -0x1p-80}, {h, h, 0}, {-h, h, 0x1p-80}, {-h, h, -0x1p-80},
		{h, h, -(1 + 0x1p-11)}, {3, 1.0 / 3, -1}, {0x1p-70, 0x1p-70, 1},
	}
	rng := rand.New(rand.NewPCG(3, 5))
	for range 200000 {
		v := func() float32 { return float32(rng.NormFloat64() * math.Exp2(float64(rng.IntN(20)-10))) }
		cases = append(cases, [3]float32{v(), v(), v()})
	}
	for _, c := range cases {
		if got, want := fma32(c[0], c[1], c[2]), fma32Big(c[0], c[1], c[2]); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("fma32(%g, %g, %g) = %g, want %g", c[0], c[1], c[2], got, want)
		}
	}
}

// fmaKernel is the arithmetic of the assembly micro-kernels, element by
// element: an accumulator from zero, one fused multiply-add (one rounding)
// per step of p in order, then added to C when load.
func fmaKernel[T Float](mr, nr int) microKernel[T] {
	fma := func(a, b, c T) T { return T(math.FMA(float64(a), float64(b), float64(c))) }
	if _, ok := any(T(0)).(float32); ok {
		fma = func(a, b, c T) T { return T(fma32(float32(a), float32(b), float32(c))) }
	}
	return microKernel[T]{name: "fma", mr: mr, nr: nr, fn: func(k int, a, b, c []T, ldc int, load bool) {
		for i := range mr {
			for j := range nr {
				var s T
				for p := range k {
					s = fma(a[p*mr+i], b[p*nr+j], s)
				}
				if load {
					c[i*ldc+j] += s
				} else {
					c[i*ldc+j] = s
				}
			}
		}
	}}
}

// roundedKernel is fmaKernel with every product rounded before it is
// added: two roundings per step, which the conversion keeps Go from fusing.
func roundedKernel[T Float](mr, nr int) microKernel[T] {
	return microKernel[T]{name: "rounded", mr: mr, nr: nr, fn: func(k int, a, b, c []T, ldc int, load bool) {
		for i := range mr {
			for j := range nr {
				var s T
				for p := range k {
					s += T(a[p*mr+i] * b[p*nr+j])
				}
				if load {
					c[i*ldc+j] += s
				} else {
					c[i*ldc+j] = s
				}
			}
		}
	}}
}

// sameTile reports whether mk writes the tile ref does, bit for bit, on
// random inputs whose sums round (unlike TestMicroKernels' dyadic ones).
func sameTile[T Float](mk, ref microKernel[T], seed uint64) (bool, string) {
	rng := rand.New(rand.NewPCG(seed, 11))
	for _, k := range []int{1, 2, 7, 64, 257} {
		for _, load := range []bool{false, true} {
			a := gemmRandSlice[T](rng, k*mk.mr)
			b := gemmRandSlice[T](rng, k*mk.nr)
			ldc := mk.nr + 3
			c0 := gemmRandSlice[T](rng, mk.mr*ldc)
			got, want := slices.Clone(c0), slices.Clone(c0)
			mk.fn(k, a, b, got, ldc, load)
			ref.fn(k, a, b, want, ldc, load)
			for i := range got {
				if bitsOf(got[i]) != bitsOf(want[i]) {
					return false, fmt.Sprintf("k=%d load=%t: c[%d] = %v, %s gives %v", k, load, i, got[i], ref.name, want[i])
				}
			}
		}
	}
	return true, ""
}

func bitsOf[T Float](v T) uint64 {
	if f, ok := any(v).(float32); ok {
		return uint64(math.Float32bits(f))
	}
	return math.Float64bits(float64(v))
}

// fused reports whether the micro-kernel of the choice name computes as
// the assembly kernels do, one rounding per multiply-add, in both
// precisions.
func fused(name string) bool {
	k32, k64 := kernelNamed[float32](name), kernelNamed[float64](name)
	ok32, _ := sameTile(k32, fmaKernel[float32](k32.mr, k32.nr), 1)
	ok64, _ := sameTile(k64, fmaKernel[float64](k64.mr, k64.nr), 1)
	return ok32 && ok64
}

// mulAdd is a*b + c as this build compiles it: its operands arrive in
// registers, where Go fuses a multiply and an add into one rounding if it
// fuses any (arm64; x86-64 built for GOAMD64=v3 or later).
//
//go:noinline
func mulAdd(a, b, c float64) float64 { return a*b + c }

// goFuses reports whether this build fuses multiply-adds: with a = b =
// 1+2^-27 and c = -(1+2^-26), the product rounded to float64 cancels c
// exactly, the exact product leaves 2^-54.
func goFuses() bool { return mulAdd(1+0x1p-27, 1+0x1p-27, -(1+0x1p-26)) != 0 }

// Every assembly micro-kernel computes each element of its tile as one
// chain of fused multiply-adds over p, from zero, then adds it to C: bit
// for bit fmaKernel, on inputs whose every operation rounds. The tile's
// shape (6x16 for avx2, 8x32 for avx512) decides which elements one call
// computes, not how, so the kernels give the same bits. The portable
// kernel's c += a*b is what Go makes of it: fmaKernel's bits where Go fuses
// multiply-adds, roundedKernel's (a multiply and an add, each rounded)
// where it does not, as on x86-64 built for Go's default GOAMD64=v1.
func TestMicroKernelsRounding(t *testing.T) {
	testMicroKernelsRounding[float32](t)
	testMicroKernelsRounding[float64](t)
}

func testMicroKernelsRounding[T Float](t *testing.T) {
	for _, name := range cpuKernelNames {
		t.Run(fmt.Sprintf("%T/%s", T(0), name), func(t *testing.T) {
			if !slices.Contains(cpuOffered, name) {
				t.Skipf("this CPU cannot run the %s micro-kernels", name)
			}
			mk := kernelNamed[T](name)
			ref := fmaKernel[T](mk.mr, mk.nr)
			if name == "portable" && !goFuses() {
				ref = roundedKernel[T](mk.mr, mk.nr)
			}
			if ok, diff := sameTile(mk, ref, 2); !ok {
				t.Errorf("%s: %s", mk.name, diff)
			}
		})
	}
}

// reproChildEnv marks a child process of TestCPUKernelsReproducible.
const reproChildEnv = "STHENO_TEST_CPU_KERNELS_CHILD"

// reproCase is one computation of the reproducibility test; gemm says
// whether it runs on the micro-kernels.
type reproCase struct {
	name string
	gemm bool
	run  func() [][]byte
}

func bitsBytes[T Float](s []T) []byte {
	var out []byte
	for _, v := range s {
		if f, ok := any(v).(float32); ok {
			out = binary.LittleEndian.AppendUint32(out, math.Float32bits(f))
		} else {
			out = binary.LittleEndian.AppendUint64(out, math.Float64bits(float64(v)))
		}
	}
	return out
}

func randOf[T Float](rng *rand.Rand, n int) []T { return gemmRandSlice[T](rng, n) }

// reproCases are Gemm, the convolutions and their gradients, and
// BatchNorm's forward and backward, on random inputs in both precisions:
// reductions over several depth blocks, transposes, batches, alpha and
// beta, strides, pads, ReLU, both packings of the filter gradient, and
// rows whose length is no multiple of the vector helpers'.
func reproCases() []reproCase {
	return append(reproCasesOf[float32](), reproCasesOf[float64]()...)
}

func reproCasesOf[T Float]() []reproCase {
	var cs []reproCase
	typ := fmt.Sprintf("%T", T(0))
	for i, p := range []GemmParams{
		{M: 300, N: 70, K: 600, TransB: true, Alpha: 1, Beta: 1},
		{M: 40, N: 50, K: 300, TransA: true, Batch: 3, StrideA: 12000, StrideB: 15000, StrideC: 2000, Alpha: 0.5},
		{M: 7, N: 5, K: 3, Alpha: 1},
	} {
		cs = append(cs, reproCase{fmt.Sprintf("%s/gemm%d", typ, i), true, func() [][]byte {
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			q := p.normalized()
			ar, ac := q.storedA()
			br, bc := q.storedB()
			a := randOf[T](rng, (q.Batch-1)*q.StrideA+footprint(ar, ac, q.LDA))
			b := randOf[T](rng, (q.Batch-1)*q.StrideB+footprint(br, bc, q.LDB))
			c := randOf[T](rng, (q.Batch-1)*q.StrideC+footprint(q.M, q.N, q.LDC))
			if err := Gemm(p, a, b, c); err != nil {
				panic(err)
			}
			return [][]byte{bitsBytes(c)}
		}})
	}
	for i, p := range []ConvParams{
		convTestParams(2, 19, 17, 23, 21, 3, 3, 1, 1, 1, 1, 1, 1, true),
		convTestParams(2, 30, 9, 10, 17, 3, 3, 2, 1, 1, 1, 1, 1, false),
		convTestParams(1, 6, 20, 20, 30, 1, 1, 1, 1, 0, 0, 1, 1, true),
	} {
		cs = append(cs, reproCase{fmt.Sprintf("%s/conv%d", typ, i), true, func() [][]byte {
			rng := rand.New(rand.NewPCG(uint64(i), 2))
			x := randOf[T](rng, p.N*p.Cin*p.H*p.W)
			w := randOf[T](rng, p.Cout*p.Cin*p.KH*p.KW)
			bias := randOf[T](rng, p.Cout)
			dy := randOf[T](rng, p.N*p.Cout*p.OutH*p.OutW)
			y, dx, dw, db := make([]T, len(dy)), make([]T, len(x)), make([]T, len(w)), make([]T, p.Cout)
			ConvForward(p, x, w, bias, y)
			ConvBackwardData(p, w, y, dy, dx)
			ConvBackwardFilter(p, x, y, dy, dw, db)
			return [][]byte{bitsBytes(y), bitsBytes(dx), bitsBytes(dw), bitsBytes(db)}
		}})
	}
	for i, p := range []BatchNormParams{
		{N: 3, C: 5, HW: 7 * 9, Eps: 1e-5, Momentum: 0.1, Training: true, ReLU: true},
		{N: 2, C: 4, HW: 16, Eps: 1e-5, Momentum: 0.1, Training: true},
	} {
		cs = append(cs, reproCase{fmt.Sprintf("%s/batchnorm%d", typ, i), false, func() [][]byte {
			rng := rand.New(rand.NewPCG(uint64(i), 3))
			n := p.N * p.C * p.HW
			z, res, dy := randOf[T](rng, n), randOf[T](rng, n), randOf[T](rng, n)
			gamma, beta := randOf[T](rng, p.C), randOf[T](rng, p.C)
			runMean, runVar := make([]T, p.C), make([]T, p.C)
			for c := range runVar {
				runVar[c] = 1
			}
			coef := make([]T, p.C*BNCoefStride)
			y := make([]T, n)
			BatchNormCoef(p, z, gamma, beta, runMean, runVar, coef)
			BatchNormApply(p, z, coef, res, y)
			dz, dgamma, dbeta := make([]T, n), make([]T, p.C), make([]T, p.C)
			BatchNormBackward(p, z, gamma, coef, res, dy, dz, dgamma, dbeta)
			return [][]byte{bitsBytes(y), bitsBytes(runMean), bitsBytes(runVar), bitsBytes(dz), bitsBytes(dgamma), bitsBytes(dbeta)}
		}})
	}
	return cs
}

// reproChild prints, for the child process, the micro-kernels in use and a
// digest of every case's outputs.
func reproChild() {
	name, err := CPUKernels()
	fmt.Printf("kernels %s %v\n", name, err)
	for _, c := range reproCases() {
		h := sha256.New()
		for _, out := range c.run() {
			h.Write(out)
		}
		fmt.Printf("case %s %x\n", c.name, h.Sum(nil))
	}
}

// runReproChild runs this test binary again as a child of test, with
// STHENO_CPU_KERNELS=kernels and GOMAXPROCS=procs, and returns the
// kernels it reported and its digests by case.
func runReproChild(t *testing.T, test, kernels string, procs int) (string, map[string]string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), reproChildEnv+"=1", CPUKernelsEnv+"="+kernels, fmt.Sprintf("GOMAXPROCS=%d", procs))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s=%s GOMAXPROCS=%d: %v\n%s", CPUKernelsEnv, kernels, procs, err, out)
	}
	used := ""
	digests := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 2 && f[0] == "kernels":
			used = strings.Join(f[1:], " ")
		case len(f) == 3 && f[0] == "case":
			digests[f[1]] = f[2]
		}
	}
	return used, digests
}

// The CPU twins' results are the same bits whatever the number of
// goroutines, and whatever the micro-kernels as long as they compute alike:
// with STHENO_CPU_KERNELS set to each choice this CPU offers and GOMAXPROCS
// 1, 2 and 7, each in a process of its own (the choice is made once, when
// the program starts), Gemm, the convolutions and their gradients and
// BatchNorm give one digest per case for every GOMAXPROCS, and one for
// every choice whose micro-kernel rounds as the assembly kernels do
// (fused); BatchNorm, which runs no micro-kernel, one for every choice.
func TestCPUKernelsReproducible(t *testing.T) {
	if os.Getenv(reproChildEnv) == "1" {
		reproChild()
		return
	}
	results := map[string]map[string]string{} // choice -> case -> digest
	for _, name := range cpuKernelNames {
		t.Run(name, func(t *testing.T) {
			if !slices.Contains(cpuOffered, name) {
				t.Skipf("this CPU cannot run the %s micro-kernels", name)
			}
			var first map[string]string
			for _, procs := range []int{1, 2, 7} {
				used, digests := runReproChild(t, "TestCPUKernelsReproducible", name, procs)
				if used != name+" <nil>" {
					t.Fatalf("%s=%s GOMAXPROCS=%d: the child reports the kernels %q", CPUKernelsEnv, name, procs, used)
				}
				if len(digests) != len(reproCases()) {
					t.Fatalf("%s=%s GOMAXPROCS=%d: %d digests, want %d", CPUKernelsEnv, name, procs, len(digests), len(reproCases()))
				}
				if first == nil {
					first = digests
					continue
				}
				for _, c := range reproCases() {
					if digests[c.name] != first[c.name] {
						t.Errorf("%s: GOMAXPROCS=%d gives other bits than GOMAXPROCS=1", c.name, procs)
					}
				}
			}
			results[name] = first
		})
	}
	var names []string
	for _, name := range cpuKernelNames {
		if results[name] != nil {
			names = append(names, name)
		}
	}
	for i, a := range names {
		for _, b := range names[i+1:] {
			fa, fb := fused(a), fused(b)
			alike := fa == fb
			var differ []string
			for _, c := range reproCases() {
				if results[a][c.name] == results[b][c.name] {
					continue
				}
				differ = append(differ, c.name)
				if alike || !c.gemm {
					t.Errorf("%s: %s and %s give other bits", c.name, a, b)
				}
			}
			if !alike {
				t.Logf("%s (fused multiply-adds: %t) and %s (%t) round differently; they differ in %d of %d cases: %s",
					a, fa, b, fb, len(differ), len(reproCases()), strings.Join(differ, " "))
			}
		}
	}
}

// tileOutputs runs Gemm and the convolutions with both gradients on the
// micro-kernel mk: depths over kcMax, widths over colBlock, transposes, a
// batch, alpha and beta, strides, pads, ReLU, both packings of the filter
// gradient. Small, so that fmaKernel runs them quickly.
func tileOutputs[T Float](mk microKernel[T]) map[string][]T {
	out := map[string][]T{}
	for i, p := range []GemmParams{
		{M: 13, N: 300, K: 600, TransB: true, Alpha: 1, Beta: 1},
		{M: 20, N: 70, K: 300, TransA: true, Batch: 2, StrideA: 6000, StrideB: 21000, StrideC: 1400, Alpha: 0.5},
	} {
		rng := rand.New(rand.NewPCG(uint64(i), 4))
		q := p.normalized()
		ar, ac := q.storedA()
		br, bc := q.storedB()
		a := randOf[T](rng, (q.Batch-1)*q.StrideA+footprint(ar, ac, q.LDA))
		b := randOf[T](rng, (q.Batch-1)*q.StrideB+footprint(br, bc, q.LDB))
		c := randOf[T](rng, (q.Batch-1)*q.StrideC+footprint(q.M, q.N, q.LDC))
		gemm(mk, q, a, b, c)
		out[fmt.Sprintf("gemm%d", i)] = c
	}
	for i, p := range []ConvParams{
		convTestParams(2, 7, 17, 17, 11, 3, 3, 1, 1, 1, 1, 1, 1, true),
		convTestParams(1, 30, 6, 7, 9, 3, 3, 2, 1, 1, 1, 1, 1, false),
		convTestParams(2, 20, 8, 8, 5, 3, 3, 1, 1, 1, 1, 1, 1, true),
	} {
		rng := rand.New(rand.NewPCG(uint64(i), 5))
		x := randOf[T](rng, p.N*p.Cin*p.H*p.W)
		w := randOf[T](rng, p.Cout*p.Cin*p.KH*p.KW)
		bias := randOf[T](rng, p.Cout)
		dy := randOf[T](rng, p.N*p.Cout*p.OutH*p.OutW)
		y, dx, dw, db := make([]T, len(dy)), make([]T, len(x)), make([]T, len(w)), make([]T, p.Cout)
		convForward(mk, p, x, w, bias, y)
		convBackwardData(mk, p, w, y, dy, dx)
		convBackwardFilter(mk, p, x, y, dy, dw, db)
		for name, v := range map[string][]T{"y": y, "dx": dx, "dw": dw, "db": db} {
			out[fmt.Sprintf("conv%d/%s", i, name)] = v
		}
	}
	return out
}

// The blocking around the micro-kernels does not depend on their tile:
// fmaKernel in the tiles of every assembly kernel (avx512's 8x32 and 8x16,
// avx2's 6x16 and 6x8) and in 4x4, at GOMAXPROCS 1 and 7, gives Gemm and
// the convolutions the bits of the fused micro-kernel this CPU runs (of
// fmaKernel in 6x16 where it runs none). With TestMicroKernelsRounding,
// which holds each assembly kernel to fmaKernel in its own tile, this is
// why avx512 and avx2 agree, checked on CPUs without AVX-512 too.
func TestTileShapesAgree(t *testing.T) {
	testTileShapesAgree[float32](t)
	testTileShapesAgree[float64](t)
}

func testTileShapesAgree[T Float](t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	ref := fmaKernel[T](6, 16)
	for _, name := range cpuOffered {
		if fused(name) {
			ref = kernelNamed[T](name)
			break
		}
	}
	runtime.GOMAXPROCS(1)
	want := tileOutputs(ref)
	for _, tile := range [][2]int{{8, 32}, {8, 16}, {6, 16}, {6, 8}, {4, 4}} {
		for _, procs := range []int{1, 7} {
			runtime.GOMAXPROCS(procs)
			got := tileOutputs(fmaKernel[T](tile[0], tile[1]))
			for name, w := range want {
				for i := range w {
					if bitsOf(got[name][i]) != bitsOf(w[i]) {
						t.Errorf("%T %s, fmaKernel %dx%d, GOMAXPROCS=%d: element %d is %v, %s gives %v",
							w[0], name, tile[0], tile[1], procs, i, got[name][i], ref.name, w[i])
						break
					}
				}
			}
		}
	}
}
